"""From data flags to training rows, fms-hf-tuning v3.1.0's entry points: ``process_dataargs`` runs a data config
(``--data_config_path``) or the data config the plain flags make (``_process_raw_data_args``, as v3.1.0 builds it);
``prepare_training_datasets`` (``prepare_with_cache``, which ``train()`` calls, through the processed-data cache)
ends every dataset as ``input_ids``/``labels`` rows, tokenising text columns with loss masking
(``tuning.data.masking``) and trimming pretokenised rows to the maximum length.

A run from the plain flags on JSON or JSON lines files with ``--dataset_text_field`` or
``--data_formatter_template`` takes the streaming reader straight to the tokeniser (``tuning.data.formatting``): the
same rows as the ``apply_custom_jinja_template`` handler would make, with errors naming the record's file and line
and memory bounded by a batch whatever the file's size."""

import logging
import time
from pathlib import Path
from typing import Any

from datasets import Dataset, IterableDataset

from tuning.data import prepared_cache
from tuning.data.data_config import (
    DataConfig,
    DataHandlerConfig,
    DataPreProcessorConfig,
    DataSetConfig,
    job_data_config,
)
from tuning.data.data_handlers import IGNORE_INDEX, DataHandler
from tuning.data.data_preprocessing_utils import get_data_collator
from tuning.data.data_processors import (
    check_data_config,
    check_data_path_flags,
    get_datapreprocessor,
    is_hub_dataset_id,
    load_data_path,
    ranks_in_turn,
)
from tuning.data.formatting import format_file, text_value
from tuning.data.labels import LabelLoss, check_label_loss
from tuning.data.loading import expand_data_path, iter_records
from tuning.data.masking import tokenize_and_mask
from tuning.data.utils import get_loader_for_filepath
from tuning.data.vision import (
    MULTIMODAL_HANDLER,
    VisionDataCollator,
    check_vision_dataset,
    data_path_dir,
    find_conversation_column,
    trainable_vision_rows,
    undecoded_images,
)
from tuning.utils.error_logging import UserInputError

logger = logging.getLogger(__name__)

DEFAULT_INPUT_COLUMN = "input"
DEFAULT_OUTPUT_COLUMN = "output"
TRAINING_COLUMNS = ("input_ids", "labels")


def _column_names(path: str) -> set[str]:
    """The columns of a data path, read from its first record (JSON) or its schema (a Hub dataset's, streamed)."""
    if not is_hub_dataset_id(path):
        files = expand_data_path(path)
        if all(get_loader_for_filepath(file) == "json" for file in files):
            return set(next(iter_records(files[0]))[1])
    streamed = load_data_path(path, streaming=True)
    if streamed.column_names is None:  # a schema known only once read (a Hub dataset's): the first row's keys
        return set(next(iter(streamed), {}))
    return set(streamed.column_names)


def is_pretokenized_dataset(data: str | Dataset | IterableDataset | None) -> bool:
    """Whether ``data`` (a data path or a dataset) has ``input_ids`` and ``labels`` columns."""
    if not data:
        return False
    columns = _column_names(data) if isinstance(data, str) else set(data.column_names or [])
    return {"input_ids", "labels"} <= columns


def _pretokenized_handlers(data_args, eval_present: bool, eval_tokenized: bool):
    formatting = [
        flag
        for flag in (
            "response_template",
            "data_formatter_template",
            "dataset_text_field",
            "instruction_template",
            "dataset_conversation_field",
        )
        if getattr(data_args, flag)
    ]
    if formatting:
        raise UserInputError(
            f"--{', --'.join(formatting)}: not applicable to pretokenized data (input_ids and labels columns)"
        )
    if eval_present and not eval_tokenized:
        raise UserInputError("validation data should be pretokenized to be used along with pretokenized train data")
    return [], None


def _formatting_handlers(data_args):
    if data_args.dataset_text_field and data_args.data_formatter_template:
        raise UserInputError("dataset_text_field and data_formatter_template are mutually exclusive options")
    if data_args.dataset_text_field:
        field = data_args.dataset_text_field
        template = f"{{{{ element['{field}'] }}}}{{{{ eos_token }}}}"
    else:
        field = data_args.dataset_text_field = "text"
        template = data_args.data_formatter_template
    arguments = {
        "fn_kwargs": {"formatted_text_column_name": field, "template": template},
        "batched": False,
        "remove_columns": "all",
    }
    return [DataHandlerConfig("apply_custom_jinja_template", arguments=arguments)], field


def _chat_handlers(data_args, tokenizer_kwargs: dict):
    field = data_args.dataset_text_field = data_args.dataset_text_field or "text"
    fn_kwargs = {"formatted_text_column_name": field, "tokenizer_kwargs": tokenizer_kwargs}
    if data_args.dataset_conversation_field:
        fn_kwargs["conversation_column_name"] = data_args.dataset_conversation_field
    arguments = {"fn_kwargs": fn_kwargs, "batched": False, "remove_columns": "all"}
    return [DataHandlerConfig("apply_tokenizer_chat_template", arguments=arguments)], field


def _input_output_handlers(tokenizer_kwargs: dict):
    fn_kwargs = {
        "input_column_name": DEFAULT_INPUT_COLUMN,
        "output_column_name": DEFAULT_OUTPUT_COLUMN,
        "tokenizer_kwargs": tokenizer_kwargs,
    }
    arguments = {"fn_kwargs": fn_kwargs, "batched": False, "remove_columns": "all"}
    return [DataHandlerConfig("tokenize_and_apply_input_masking", arguments=arguments)], None


def raw_data_config(data_args, max_seq_length: int) -> tuple[DataConfig, str | None]:
    """The data config the plain flags stand for (v3.1.0's ``_process_raw_data_args``), and the text column the
    handlers leave (None when they leave tokenised rows). Vision data (``--dataset_image_field``) has no handler."""
    if not isinstance(data_args.training_data_path, str) or not data_args.training_data_path:
        raise UserInputError("--training_data_path (or --data_path) is required without --data_config_path")
    eval_present = bool(data_args.validation_data_path)
    tokenizer_kwargs = {"max_length": max_seq_length, "truncation": True}
    if data_args.dataset_image_field:  # vision rows go as they are: the collator tokenises each batch
        handlers, field = [], data_args.dataset_text_field
    elif is_pretokenized_dataset(data_args.training_data_path):
        handlers, field = _pretokenized_handlers(
            data_args, eval_present, is_pretokenized_dataset(data_args.validation_data_path)
        )
    elif data_args.instruction_template and data_args.response_template:
        handlers, field = _chat_handlers(data_args, tokenizer_kwargs)
    elif data_args.data_formatter_template or data_args.dataset_text_field:
        handlers, field = _formatting_handlers(data_args)
    else:
        handlers, field = _input_output_handlers(tokenizer_kwargs)
    configs = [
        DataSetConfig(
            name="training_data",
            data_paths=[data_args.training_data_path],
            data_handlers=handlers or None,
            split={"train": 1.0, "validation": 0.0},
        )
    ]
    if eval_present:
        configs.append(
            DataSetConfig(
                name="validation_data",
                data_paths=[data_args.validation_data_path],
                data_handlers=handlers or None,
                split={"train": 0.0, "validation": 1.0},
            )
        )
    return DataConfig(dataprocessor=DataPreProcessorConfig(), datasets=configs), field


def _apply_chat_template(tokenizer, chat_template: str | None) -> None:
    if chat_template is not None:
        if tokenizer.chat_template and tokenizer.chat_template != chat_template:
            logger.warning("the tokenizer's chat template is replaced by the one given")
        tokenizer.chat_template = chat_template


def process_dataconfig_file(
    data_args,
    train_args,
    tokenizer,
    additional_data_handlers: dict[str, DataHandler] | None = None,
    processor=None,
    is_multipack: bool = False,
    is_padding_free: bool = False,
):
    """``(train_dataset, eval_dataset, dataset_text_field, sampling_weights)`` of ``--data_config_path``."""
    data_config = job_data_config(data_args)
    if data_args.training_data_path is not None or data_args.validation_data_path is not None:
        raise UserInputError(
            "--training_data_path and --validation_data_path must not be given with --data_config_path: "
            "list the data in the data config"
        )
    data_processor = get_datapreprocessor(data_config.dataprocessor, tokenizer, processor, additional_data_handlers)
    if data_config.dataprocessor.streaming:
        if is_padding_free:
            raise UserInputError("padding-free training is not supported with streaming=true in the data config")
        if train_args.max_steps < 1:
            raise UserInputError("--max_steps must be set when streaming is set in data preprocessor config")
        if is_multipack:
            raise UserInputError("multipack is not compatible with streaming=true")
    _apply_chat_template(tokenizer, data_config.dataprocessor.chat_template)
    train_dataset, eval_dataset, weights = data_processor.process_dataset_configs(data_config.datasets)
    return train_dataset, eval_dataset, data_args.dataset_text_field, weights


def _process_raw_data_args(
    data_args,
    tokenizer,
    packing: bool,
    max_seq_length: int,
    additional_data_handlers: dict[str, DataHandler] | None = None,
    is_padding_free: bool = False,
    processor=None,
):
    """``(train_dataset, eval_dataset, dataset_text_field, sampling_weights)`` of the plain flags."""
    if data_args.data_config_path is not None:
        raise UserInputError(
            "--training_data_path and --validation_data_path must not be given with --data_config_path"
        )
    if (
        not packing
        and not is_padding_free
        and not data_args.response_template
        and (data_args.dataset_text_field or data_args.data_formatter_template)
        and not is_pretokenized_dataset(data_args.training_data_path)
    ):
        raise UserInputError(
            "--response_template is required with --dataset_text_field or --data_formatter_template unless "
            "--packing is on (training on every token)"
        )
    config, field = raw_data_config(data_args, max_seq_length)
    data_processor = get_datapreprocessor(config.dataprocessor, tokenizer, processor, additional_data_handlers)
    train_dataset, eval_dataset, weights = data_processor.process_dataset_configs(config.datasets)
    return train_dataset, eval_dataset, field, weights


def dump_dataset(output_dir: Path, nshards: int, d: Dataset | IterableDataset | None, name: str) -> None:
    """Write ``d`` to ``output_dir/name/ds_00000.parquet``... in ``nshards`` Parquet shards."""
    if d is None:
        return
    if isinstance(d, IterableDataset):
        d = Dataset.from_generator(lambda: (yield from d), features=d.features)
    d = d.flatten_indices()
    folder = Path(output_dir) / name
    folder.mkdir(parents=True, exist_ok=True)
    for index in range(nshards):
        d.shard(num_shards=nshards, index=index).to_parquet(str(folder / f"ds_{index:05d}.parquet"))
    logger.info("saved %s in %d Parquet shard(s) to %s", name, nshards, folder)


def require_evaluation_data(train_args, eval_data, source: str = "--validation_data_path") -> None:
    """Refuse (``UserInputError``) an ``eval_strategy`` other than ``no`` without evaluation data, naming ``source``,
    where it would come from."""
    if train_args.eval_strategy != "no" and eval_data is None:
        raise UserInputError(
            f"eval_strategy is '{train_args.eval_strategy}' but no evaluation dataset was given: add {source} or set "
            "--eval_strategy no"
        )


def write_processed_datasets(data_args, train_args, train_dataset, eval_dataset) -> None:
    """``--do_dataprocessing_only``'s result: the datasets written into ``output_dir`` as v3.1.0 writes them."""
    dump_dir = Path(train_args.output_dir).absolute()
    dump_dataset(dump_dir, data_args.num_train_dataset_shards, train_dataset, "train_dataset")
    dump_dataset(dump_dir, data_args.num_eval_dataset_shards, eval_dataset, "validataion_dataset")  # v3.1.0's name


def process_dataargs(
    data_args,
    tokenizer,
    train_args,
    additional_data_handlers: dict[str, DataHandler] | None = None,
    is_padding_free: bool = False,
    processor=None,
    is_multipack: bool = False,
    odm_config=None,
):
    """v3.1.0's ``(train_dataset, eval_dataset, dataset_text_field, data_collator, max_seq_length,
    dataset_kwargs)``; with ``--do_dataprocessing_only`` the datasets are written to ``output_dir`` and the last four
    are None. With a vision-language model's ``processor``, the vision data of the flags or data config
    (``prepare_vision_datasets``), its collator, and ``{"skip_prepare_dataset": True}``, as
    v3.1.0 returns them."""
    if odm_config is not None:
        raise UserInputError("online data mixing (odm) needs fms-acceleration and is not supported by tuning-bench")
    max_seq_length = min(train_args.max_seq_length, tokenizer.model_max_length)
    if processor is not None:
        (train_dataset, eval_dataset), collator = prepare_vision_data(
            data_args, train_args, processor, max_seq_length, additional_data_handlers=additional_data_handlers
        )
        if data_args.do_dataprocessing_only:
            return train_dataset, eval_dataset, None, None, None, None
        return (
            train_dataset,
            eval_dataset,
            data_args.dataset_text_field,
            collator,
            max_seq_length,
            {"skip_prepare_dataset": True},
        )
    _apply_chat_template(tokenizer, getattr(data_args, "chat_template", None))
    if data_args.data_config_path:
        train_dataset, eval_dataset, field, _ = process_dataconfig_file(
            data_args, train_args, tokenizer, additional_data_handlers, processor, is_multipack, is_padding_free
        )
    else:
        train_dataset, eval_dataset, field, _ = _process_raw_data_args(
            data_args,
            tokenizer,
            train_args.packing,
            max_seq_length,
            additional_data_handlers,
            is_padding_free,
            processor,
        )
    require_evaluation_data(train_args, eval_dataset, "--validation_data_path (or a validation split)")
    if data_args.do_dataprocessing_only:
        if train_dataset is not None and "input_ids" in (train_dataset.column_names or []):
            train_dataset = trainable_rows(train_dataset, max_seq_length, data_source(data_args, "training"))
        if eval_dataset is not None and "input_ids" in (eval_dataset.column_names or []):
            eval_dataset = trainable_rows(eval_dataset, max_seq_length, data_source(data_args, "validation"))
        write_processed_datasets(data_args, train_args, train_dataset, eval_dataset)
        return train_dataset, eval_dataset, None, None, None, None
    tokenized = is_pretokenized_dataset(train_dataset or eval_dataset)
    collator = get_data_collator(
        train_args.packing,
        data_args.response_template,
        tokenizer,
        tokenized,
        max_seq_length,
        data_args.instruction_template,
        is_padding_free=is_padding_free,
    )
    return train_dataset, eval_dataset, field, collator, max_seq_length, {}


# --- training rows: what train() hands the trainer --------------------------------------------------------------


def _texts(dataset, field: str, source: str):
    if field not in (dataset.column_names or []):
        raise UserInputError(f"{source} has no text column '{field}' (columns: {dataset.column_names})")
    index = 0
    for batch in dataset.iter(batch_size=1000):
        for value in batch[field]:
            yield text_value(value, f"column '{field}'", f"row {index} of {source}")
            index += 1


def data_source(data_args, which: str) -> str:
    """How messages name the ``which`` ("training" or "validation") data: its flag and path, or the data config's."""
    if data_args.data_config_path:
        return f"the {which} data of --data_config_path {data_args.data_config_path}"
    return f"--{which}_data_path {getattr(data_args, f'{which}_data_path')}"


def _trim(row: dict, max_length: int) -> dict:
    input_ids = list(row["input_ids"])[:max_length]
    labels = list(row["labels"] if row.get("labels") is not None else row["input_ids"])[:max_length]
    return {"input_ids": input_ids, "labels": labels}


def _keeps_a_label(row: dict, max_length: int) -> bool:
    return any(label != IGNORE_INDEX for label in row["labels"][:max_length])


def _count_loss(loss: LabelLoss, row: dict, max_length: int) -> None:
    """Count a row that keeps no label within ``max_length`` (``row`` as it came, before trimming): its prompt (the
    tokens before its first label) filled ``max_length``, or it came without a label; one as long as ``max_length``
    with no label was cut before (by a handler's truncation), its prompt at least that long."""
    labels = row["labels"] if row.get("labels") is not None else row["input_ids"]
    prompt = next((index for index, label in enumerate(labels) if label != IGNORE_INDEX), None)
    if prompt is not None:
        loss.add_truncated(prompt)
    elif len(labels) >= max_length:
        loss.add_truncated(len(labels), at_least=True)
    else:
        loss.unlabelled += 1


def trainable_rows(rows, max_length: int, source: str, untrimmed=None):
    """The tokenised ``rows`` that keep a label within ``max_length`` tokens. None kept is a user error saying why
    (``tuning.data.labels``: truncation, with the longest prompt's length read from ``untrimmed``, the rows before
    they were cut; or no label at all); some dropped, one warning with the count."""
    if "labels" not in (rows.column_names or []):
        return rows
    kept = rows.filter(_keeps_a_label, fn_kwargs={"max_length": max_length}, desc="Dropping rows without labels")
    if isinstance(rows, IterableDataset):
        return kept
    if len(kept) < len(rows):
        loss = LabelLoss()
        for row in untrimmed if untrimmed is not None else rows:
            if not _keeps_a_label(row, max_length):
                _count_loss(loss, row, max_length)
        check_label_loss(loss, len(rows), source, max_length)
    return kept


def to_training_rows(dataset, data_args, tokenizer, max_length: int, field: str | None, source: str):
    """``dataset`` as ``input_ids``/``labels`` rows of at most ``max_length`` tokens with something to learn: text
    columns tokenised with masking by the response (and instruction) template, tokenised rows trimmed."""
    if dataset is None:
        return None
    columns = set(dataset.column_names or [])
    if "input_ids" in columns:
        extra = sorted(columns - set(TRAINING_COLUMNS))
        rows = dataset.map(_trim, fn_kwargs={"max_length": max_length}, remove_columns=extra or None)
        return trainable_rows(rows, max_length, source, dataset)
    if field is None:
        field = data_args.dataset_text_field or "text"
    return tokenize_and_mask(
        _texts(dataset, field, source),
        tokenizer,
        max_length,
        data_args.response_template,
        source=source,
        instruction_template=data_args.instruction_template,
        num_proc=getattr(data_args, "dataset_num_proc", None),
    )


def _is_plain_json_text_run(data_args) -> bool:
    """Plain flags, a text field or template, and JSON/JSON lines files: the streaming formatter's case."""
    if data_args.data_config_path or not (data_args.dataset_text_field or data_args.data_formatter_template):
        return False
    if data_args.instruction_template or data_args.dataset_conversation_field:
        return False
    paths = [data_args.training_data_path, data_args.validation_data_path]
    try:
        files = [file for path in paths if path for file in expand_data_path(path)]
    except UserInputError:
        return False
    if not all(get_loader_for_filepath(file) == "json" for file in files):
        return False
    return not is_pretokenized_dataset(data_args.training_data_path)


def _formatted_texts(paths: list[str], eos_token: str, data_args):
    for path in paths:
        yield from format_file(path, eos_token, data_args.dataset_text_field, data_args.data_formatter_template)


def prepare_training_datasets(
    data_args, train_args, tokenizer, max_length: int, additional_data_handlers: dict | None = None
):
    """``(train_rows, eval_rows)`` for the trainer (eval None without validation data), or None after writing the
    processed datasets with ``--do_dataprocessing_only``."""
    return prepare_with_cache(data_args, train_args, tokenizer, max_length, additional_data_handlers)[0]


def prepare_with_cache(
    data_args, train_args, tokenizer, max_length: int, additional_data_handlers: dict | None = None
) -> tuple[tuple | None, prepared_cache.Preparation]:
    """``prepare_training_datasets``' result, from the processed-data cache (``--data_cache_dir``,
    ``tuning.data.prepared_cache``) when an earlier run prepared the same rows, and how it came (the dump's
    ``data.cache``)."""
    _apply_chat_template(tokenizer, data_args.chat_template)
    if data_args.do_dataprocessing_only:
        started = time.perf_counter()
        rows = _prepare_rows(data_args, train_args, tokenizer, max_length, additional_data_handlers)
        return rows, prepared_cache.Preparation("bypass", seconds=time.perf_counter() - started)
    with ranks_in_turn():  # under torchrun the main process builds the entry, the other ranks then read it
        return prepared_cache.load_or_build(
            prepared_cache.resolve_cache_dir(getattr(data_args, "data_cache_dir", None)),
            lambda: prepared_cache.cache_key(data_args, train_args, tokenizer, max_length, additional_data_handlers),
            lambda: _prepare_rows(data_args, train_args, tokenizer, max_length, additional_data_handlers),
            getattr(data_args, "data_cache_max_gb", None),
        )


def _prepare_rows(data_args, train_args, tokenizer, max_length: int, additional_data_handlers: dict | None):
    if _is_plain_json_text_run(data_args) and not data_args.do_dataprocessing_only:
        if data_args.dataset_text_field and data_args.data_formatter_template:
            raise UserInputError("dataset_text_field and data_formatter_template are mutually exclusive options")
        rows = []
        for which, path in (("training", data_args.training_data_path), ("validation", data_args.validation_data_path)):
            if not path:
                rows.append(None)
                continue
            texts = _formatted_texts(expand_data_path(path), tokenizer.eos_token, data_args)
            rows.append(
                tokenize_and_mask(
                    texts,
                    tokenizer,
                    max_length,
                    data_args.response_template,
                    source=data_source(data_args, which),
                    num_proc=getattr(data_args, "dataset_num_proc", None),
                )
            )
        require_evaluation_data(train_args, rows[1])
        return rows[0], rows[1]
    train_dataset, eval_dataset, field, *rest = process_dataargs(
        data_args, tokenizer, train_args, additional_data_handlers
    )
    if data_args.do_dataprocessing_only:
        return None
    return (
        to_training_rows(train_dataset, data_args, tokenizer, max_length, field, data_source(data_args, "training")),
        to_training_rows(eval_dataset, data_args, tokenizer, max_length, field, data_source(data_args, "validation")),
    )


def check_data_arguments(data_args, additional_data_handlers: dict | None = None, packing: bool = False) -> None:
    """The data checks that need no tokenizer or model: the data config parses and names existing data and known
    handlers; or the plain flags name existing data and make sense together."""
    num_proc = getattr(data_args, "dataset_num_proc", None)
    if num_proc is not None and (not isinstance(num_proc, int) or num_proc < 1):
        raise UserInputError(f"--dataset_num_proc must be a whole number of processes, at least 1: got {num_proc!r}")
    prepared_cache.check_data_cache_flags(data_args)
    if data_args.data_config_path:
        if data_args.training_data_path or data_args.validation_data_path:
            raise UserInputError(
                "--training_data_path and --validation_data_path must not be given with --data_config_path: "
                "list the data in the data config"
            )
        config = job_data_config(data_args)
        handlers = dict(get_datapreprocessor(DataPreProcessorConfig(), None).registered_handlers)
        handlers.update(additional_data_handlers or {})
        check_data_config(config, data_args.data_config_path, handlers)
        return
    if not data_args.training_data_path:
        raise UserInputError("--training_data_path (or --data_path), or --data_config_path, is required")
    check_data_path_flags(data_args)
    if data_args.dataset_text_field and data_args.data_formatter_template:
        raise UserInputError("give exactly one of --dataset_text_field and --data_formatter_template, not both")
    if data_args.instruction_template and not data_args.response_template:
        raise UserInputError("--instruction_template needs --response_template (chat data)")
    text = data_args.dataset_text_field or data_args.data_formatter_template
    if text and not data_args.response_template and not packing:
        raise UserInputError(
            "--response_template is required with --dataset_text_field or --data_formatter_template unless "
            "--packing is on (training on every token)"
        )


def check_vision_arguments(data_args, train_args, additional_data_handlers: dict | None = None) -> None:
    """The checks of a vision run that need no model: where its data is (files, or a data config: that it parses
    and names existing data and known handlers), and no packing (a row's image tokens and pixels cannot be cut apart
    or joined with another row's)."""
    if train_args.packing:
        raise UserInputError("--packing with --dataset_image_field: vision-language rows cannot be packed")
    if data_args.data_config_path:
        check_data_arguments(data_args, additional_data_handlers)
        return
    if not data_args.training_data_path:
        raise UserInputError("--training_data_path (or --data_path) is required")
    check_data_path_flags(data_args)


def _data_config_datasets(data_args, train_args, processor, additional_data_handlers) -> list[tuple[str, Any]]:
    """``--data_config_path``'s (source, dataset) pairs, training then validation (None where absent), its handlers
    run with the processor (``prepare_multimodal_data_processor`` among them, if the config has it)."""
    train, evaluation, _, _ = process_dataconfig_file(
        data_args, train_args, processor.tokenizer, additional_data_handlers, processor
    )
    if isinstance(train, IterableDataset) or isinstance(evaluation, IterableDataset):
        raise UserInputError(
            f"--data_config_path {data_args.data_config_path}: streaming vision data is not supported (each image "
            "is checked before training)"
        )
    source = f"--data_config_path {data_args.data_config_path}"
    return [(f"{source} (training data)", train), (f"{source} (validation data)", evaluation)]


def _fields(data_args, dataset, source: str) -> tuple[str, str]:
    """The conversation (or rendered text) and image columns: the flags', else those the multimodal handler left in
    the rows' ``fields_name``; the conversations else found (``find_conversation_column``)."""
    named = (dataset[0].get("fields_name") if len(dataset) else None) or {}
    text = data_args.dataset_conversation_field or data_args.dataset_text_field or named.get("dataset_text_field")
    image = data_args.dataset_image_field or named.get("dataset_image_field")
    if not image:
        raise UserInputError(
            f"{source}: which column holds the images? Give --dataset_image_field (or run "
            f"{MULTIMODAL_HANDLER} with fields_name)"
        )
    return text or find_conversation_column(dataset, source), image


def prepare_vision_datasets(
    data_args,
    train_args,
    processor=None,
    max_images: int | None = None,
    additional_data_handlers: dict | None = None,
) -> tuple[Any, Any]:
    """``(train, eval)`` datasets of messages (or rendered text) and images, checked (eval None without validation
    data): from ``--training_data_path`` and ``--validation_data_path`` as they are, or from ``--data_config_path``
    through its handlers. The conversations are in ``--dataset_conversation_field``, else ``--dataset_text_field``,
    else the column a multimodal handler named, else the column ``find_conversation_column`` finds in the training
    data; ``data_args.dataset_text_field`` and ``dataset_image_field`` are set to the columns used."""
    base_dir = data_path_dir(data_args)
    if data_args.data_config_path:
        sources = _data_config_datasets(data_args, train_args, processor, additional_data_handlers)
    else:
        sources = []
        for flag, path in (
            ("--training_data_path", data_args.training_data_path),
            ("--validation_data_path", data_args.validation_data_path),
        ):
            sources.append((f"{flag} {path}", undecoded_images(load_data_path(path)) if path else None))
    for source, dataset in sources:
        if dataset is None:
            continue
        data_args.dataset_text_field, data_args.dataset_image_field = _fields(data_args, dataset, source)
        check_vision_dataset(
            dataset,
            data_args.dataset_text_field,
            data_args.dataset_image_field,
            source,
            base_dir,
            processor,
            max_images,
        )
    datasets = [dataset for _, dataset in sources]
    require_evaluation_data(train_args, datasets[1])
    return datasets[0], datasets[1]


def prepare_vision_data(
    data_args,
    train_args,
    processor,
    max_length: int,
    max_images: int | None = None,
    additional_data_handlers: dict | None = None,
) -> tuple[tuple[Any, Any], VisionDataCollator | None]:
    """A vision run's ``((train, eval), collator)``: ``--chat_template`` set on the processor, the rows checked
    (``prepare_vision_datasets``), those with no assistant token within ``max_length`` left out
    (``trainable_vision_rows``: none left is a user error), and their collator; with ``--do_dataprocessing_only``
    the rows written to ``output_dir`` instead and no collator (images and tokens are made batch by batch, by the
    collator)."""
    if getattr(data_args, "chat_template", None):
        processor.chat_template = data_args.chat_template
    datasets = prepare_vision_datasets(data_args, train_args, processor, max_images, additional_data_handlers)
    collator = VisionDataCollator(
        processor,
        data_args.dataset_text_field,
        data_args.dataset_image_field,
        data_path_dir(data_args),
        max_length,
        max_images,
    )
    datasets = tuple(
        None if dataset is None else trainable_vision_rows(dataset, collator, data_source(data_args, which))
        for which, dataset in zip(("training", "validation"), datasets, strict=True)
    )
    if data_args.do_dataprocessing_only:
        write_processed_datasets(data_args, train_args, *datasets)
        return datasets, None
    return datasets, collator
