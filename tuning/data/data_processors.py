"""The data processor of fms-hf-tuning v3.1.0's framework: loads each dataset of a data config, splits it, runs its
handlers, and mixes the datasets into one training (and one validation) dataset, all with ``datasets``.

JSON and JSON lines files go through the line-numbered reader (``tuning.data.loading``: a bad line is named by file
and line; memory is bounded by a record), written to an Arrow cache of this run (``tuning.data.cache``: removed
however the run ends); Parquet, Arrow, CSV and text files, folders and globs through ``datasets``' own builders,
cached in such a directory too; a Hugging Face Hub dataset id (a path that names nothing here, ``is_hub_dataset_id``)
through ``datasets.load_dataset(id)``, as v3.1.0 takes it, cached in such a directory as well."""

import contextlib
import contextvars
import functools
import logging
import os
import uuid
from collections.abc import Mapping

import datasets
import pyarrow
from datasets import Dataset, DatasetDict, IterableDataset, IterableDatasetDict
from datasets.exceptions import DatasetGenerationError, DatasetNotFoundError

from tuning.data.cache import new_cache_dir
from tuning.data.data_config import DataConfig, DataPreProcessorConfig, DataSetConfig
from tuning.data.data_handlers import (
    AVAILABLE_DATA_HANDLERS,
    DataHandler,
    DataHandlerType,
    RowError,
    check_tokenized_row,
    handler_argument_problem,
    prepare_multimodal_data_processor,
)
from tuning.data.loading import (
    GLOB_CHARACTERS,
    InputFileNotFoundError,
    MalformedDataError,
    expand_data_path,
    files_dir,
    iter_records,
)
from tuning.data.utils import (
    DATA_FILE_BUILDERS,
    get_loader_for_filepath,
    maybe_align_datasets,
    try_concatenate_datasets,
)
from tuning.utils.error_logging import UserInputError, one_line
from tuning.utils.processes import children_die_with_this_process

logger = logging.getLogger(__name__)
TRAIN_SPLIT, EVAL_SPLIT = "train", "test"  # datasets' names; a data config's "validation" is "test" here
JSON_BUILDER = "json"


class UnreadableDataError(MalformedDataError, pyarrow.ArrowInvalid):
    """Files a ``datasets`` builder cannot read (a Parquet file given to the Arrow builder): also pyarrow's
    ``ArrowInvalid``, which fms-hf-tuning v3.1.0 lets through there."""


# huggingface_hub's reading of its offline switches: these values turn them on.
_TRUE_VALUES = ("1", "ON", "YES", "TRUE")


class HubUnreachableError(ConnectionError):
    """The Hugging Face Hub could not be reached to load a dataset id. Not the input's fault (the id may be right), so
    a system fault; of no category of its own, so ``internal``, as any failed download is: ``communication`` is kept
    for the ranks' collective backends (NCCL, gloo, c10d), not outside services."""


def looks_like_hub_dataset_id(path: str) -> bool:
    """Whether ``path`` is shaped as a Hub dataset id (``name`` or ``org/name``), the model path's rule: not absolute,
    not starting with ``.`` or ``~``, at most one ``/``; and no glob characters, nor a data file's extension
    (``train.jsonl`` is a file to v3.1.0 too)."""
    return (
        bool(path)
        and not os.path.isabs(path)
        and not path.startswith((".", "~"))
        and path.count("/") <= 1
        and not any(char in path for char in GLOB_CHARACTERS)
        and get_loader_for_filepath(path) not in DATA_FILE_BUILDERS
    )


def is_hub_dataset_id(path: str) -> bool:
    """Whether the data path ``path`` is read as a Hub dataset id: it names nothing here, and looks like one."""
    return looks_like_hub_dataset_id(path) and not os.path.exists(path)


def hub_offline_switch() -> str | None:
    """``NAME=value`` of the environment variable that puts the Hub offline for ``datasets``, or None when online."""
    for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        value = os.environ.get(name, "")
        if value.strip().upper() in _TRUE_VALUES:
            return f"{name}={value}"
    return None


def check_hub_dataset_id(path: str, label: str) -> None:
    """Refuse the Hub dataset id ``path`` (of ``label``: a flag, a data config's dataset) when the Hub is offline: data
    found nowhere, so ``InputFileNotFoundError`` (``datasets``' ``DatasetNotFoundError``, as v3.1.0 raises for a
    training data path that does not exist)."""
    switch = hub_offline_switch()
    if switch:
        raise InputFileNotFoundError(
            f"{label}: {path} is no local file, folder or glob, and the Hugging Face Hub is offline ({switch}), so "
            "it cannot be loaded as a Hub dataset id"
        )


def check_data_path(path: str, label: str, builder: str | None = None) -> None:
    """Before the model loads: a data path names local data (a missing one: ``InputFileNotFoundError``), or without a
    ``builder`` is a Hub dataset id, refused when the Hub is offline."""
    if builder is None and is_hub_dataset_id(path):
        check_hub_dataset_id(path, label)
    else:
        expand_data_path(path)


def check_data_path_flags(data_args) -> None:
    """``--training_data_path`` and ``--validation_data_path``, each given one checked (``check_data_path``) under its
    flag's name."""
    for flag, path in (
        ("--training_data_path", data_args.training_data_path),
        ("--validation_data_path", data_args.validation_data_path),
    ):
        if path:
            check_data_path(path, flag)


def load_hub_dataset(path: str, streaming: bool = False, split: str | None = None) -> Dataset | IterableDataset:
    """The ``split`` (default train) of the Hub dataset ``path``; not streamed, it is cached in a directory of this
    run (``new_cache_dir``), removed with the run's other data caches."""
    from huggingface_hub.utils import httpx  # the Hub client's HTTP library: its failures may come through as is

    check_hub_dataset_id(path, "data path")
    kwargs = {"split": split or TRAIN_SPLIT, "streaming": streaming}
    if not streaming:
        kwargs["cache_dir"] = new_cache_dir(datasets.config.HF_DATASETS_CACHE)
    try:
        return datasets.load_dataset(path, **kwargs)
    except FileNotFoundError as exc:  # DatasetNotFoundError among them
        raise InputFileNotFoundError(
            f"data path {path}: no local file, folder or glob, nor a Hub dataset: {one_line(exc)}"
        ) from exc
    except (ConnectionError, TimeoutError, httpx.TransportError) as exc:
        raise HubUnreachableError(
            f"Hub dataset {path}: the Hugging Face Hub could not be reached ({type(exc).__name__}: {one_line(exc)})"
        ) from None
    except DatasetGenerationError as exc:
        cause = exc.__cause__ or exc
        raise UnreadableDataError(f"Hub dataset {path} is not readable: {one_line(cause)}") from exc
    except ValueError as exc:  # an unknown split, a bad slice
        raise UserInputError(f"Hub dataset {path}: {one_line(exc)}") from exc


def _json_rows(paths: list[str]):
    """The records of ``paths``, each with the first record's keys (a key a record lacks is null, as ``datasets``'
    own JSON builder reads it): the handlers then name the field and the row."""
    keys = None
    for path in paths:
        for _, record in iter_records(path):
            if keys is None:
                keys = list(record)
            elif len(record) != len(keys) or any(key not in record for key in keys):
                record = {key: record.get(key) for key in keys}
            yield record


def _without_nulls(value):
    """``value`` with null entries of mappings left out, at any depth: a field a record lacks and a null one compare
    alike, as the loaded rows hold them."""
    if isinstance(value, Mapping):  # a dict, or the lazy row datasets hands a handler
        return {key: _without_nulls(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [_without_nulls(item) for item in value]
    return value


def locate_row(paths: list[str], builder: str | None, row: dict) -> str | None:
    """Where ``row`` is in its data files: ``FILE line N`` (JSON lines), ``FILE record I (line N)`` (a JSON array) or
    ``FILE row N`` (Parquet, CSV, Arrow; counted from 1, a CSV header not counted); None when not found (a Hub
    dataset, or a row an earlier handler changed). Read again only when a row is bad, so it costs nothing otherwise."""
    wanted = _without_nulls(row)
    for path in paths:
        if builder is None and is_hub_dataset_id(path):
            continue
        for file in expand_data_path(path):
            kind = builder or get_loader_for_filepath(file)
            if kind == JSON_BUILDER:
                for index, (line, record) in enumerate(iter_records(file)):
                    if _without_nulls(record) == wanted:
                        with open(file, "rb") as handle:
                            array = handle.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"[")
                        return f"{file} record {index} (line {line})" if array else f"{file} line {line}"
                continue
            streamed = datasets.load_dataset(kind, data_files=[file], split=TRAIN_SPLIT, streaming=True)
            for number, record in enumerate(streamed, 1):
                if _without_nulls(record) == wanted:
                    return f"{file} row {number}"
    return None


class RowChecked:
    """A handler's op that turns its ``RowError`` into a user error naming the dataset, the file and the row (its
    line for JSON lines, its row number for other files, else its index in the dataset) and the field."""

    def __init__(self, op, dataset: DataSetConfig, handler: str, with_indices: bool):
        self.op, self.dataset, self.handler, self.with_indices = op, dataset, handler, with_indices

    def __call__(self, element, index, **fn_kwargs):
        try:
            return self.op(element, index, **fn_kwargs) if self.with_indices else self.op(element, **fn_kwargs)
        except RowError as exc:
            row = element
            if exc.batch_row is not None:
                row = {key: values[exc.batch_row] for key, values in element.items()}
                index = index[exc.batch_row]
            where = locate_row(self.dataset.data_paths, self.dataset.builder, row) or f"row {index}"
            raise UserInputError(f"dataset '{self.dataset.name}': {where}: {exc} ({self.handler})") from None


def load_json_files(paths: list[str], streaming: bool = False) -> Dataset | IterableDataset:
    """JSON arrays or JSON lines files as one dataset, read record by record (errors name the file and line)."""
    generator = functools.partial(_json_rows, list(paths))
    if streaming:  # the columns from the first record, so that handlers can name them; what is bad fails now
        first = [next(iter_records(path))[1] for path in paths][0]
        return IterableDataset.from_generator(generator, features=Dataset.from_list([first]).features)
    try:
        return Dataset.from_generator(
            generator, cache_dir=new_cache_dir(datasets.config.HF_DATASETS_CACHE), fingerprint=uuid.uuid4().hex
        )
    except DatasetGenerationError as exc:
        if isinstance(exc.__cause__, UserInputError):
            raise exc.__cause__ from None
        raise


def load_data_path(path: str, builder: str | None = None, streaming: bool = False, split: str | None = None):
    """One data path (file, folder or glob) as a dataset, by ``builder`` or else by the files' extensions; without a
    ``builder``, a path naming nothing here that looks like a Hub dataset id is loaded from the Hub."""
    if builder is None and is_hub_dataset_id(path):
        return load_hub_dataset(path, streaming, split)
    files = expand_data_path(path)
    builders = {builder} if builder else {get_loader_for_filepath(file) for file in files}
    if builders == {JSON_BUILDER}:
        loaded = load_json_files(files, streaming)
    else:
        if len(builders) != 1 or "" in builders or any(name.startswith(".") for name in builders):
            raise UserInputError(
                f"data path {path}: cannot tell how to read {sorted(builders)} files; give one 'builder' "
                "(json, parquet, arrow, csv, text) or files of one kind"
            )
        (name,) = builders
        kwargs = {"data_files": files, "split": TRAIN_SPLIT, "streaming": streaming}
        if not streaming:
            kwargs["cache_dir"] = new_cache_dir(datasets.config.HF_DATASETS_CACHE)
        try:
            loaded = datasets.load_dataset(name, **kwargs)
        except (DatasetNotFoundError, FileNotFoundError) as exc:
            raise InputFileNotFoundError(f"data path {path} with builder {name}: {exc}") from exc
        except (DatasetGenerationError, pyarrow.ArrowInvalid) as exc:
            cause = exc.__cause__ if isinstance(exc, DatasetGenerationError) and exc.__cause__ else exc
            raise UnreadableDataError(f"data path {path} is not readable by builder {name}: {cause}") from exc
        except ValueError as exc:
            raise UserInputError(f"data path {path} with builder {name}: {exc}") from exc
    if split and split != TRAIN_SPLIT:
        if streaming:
            raise UserInputError(f"split {split!r} of a streaming dataset is not supported")
        loaded = _slice(loaded, split)
    return loaded


def local_split_problem(split: str, rows: int = 1) -> str | None:
    """What is wrong with ``split`` for local data files (``rows`` long), which have one split, train, or a slice of
    it (``datasets``' split syntax: ``train[:50%]``); None when nothing is."""
    try:
        datasets.ReadInstruction.from_spec(split).to_absolute({TRAIN_SPLIT: rows})
    except (ValueError, KeyError) as exc:
        return f"split {split!r}: local data files have one split, train (or a slice of it: train[:50%]): {exc}"
    return None


def _slice(dataset: Dataset, split: str) -> Dataset:
    """``train[:N]``-style slices (``datasets``' split syntax) of a loaded dataset."""
    if problem := local_split_problem(split, len(dataset)):
        raise UserInputError(problem)
    absolute = datasets.ReadInstruction.from_spec(split).to_absolute({TRAIN_SPLIT: len(dataset)})[0]
    start, stop = absolute.from_ or 0, absolute.to if absolute.to is not None else len(dataset)
    return dataset.select(range(start, stop))


_in_turn: contextvars.ContextVar[bool] = contextvars.ContextVar("ranks_in_turn", default=False)


@contextlib.contextmanager
def ranks_in_turn():
    """Under torchrun, the main process runs the body first, then the other ranks (which read what it cached); the
    outermost call orders them, nested calls run as they are (each rank meets the same barriers)."""
    if _in_turn.get():
        yield
        return
    from accelerate.state import PartialState

    token = _in_turn.set(True)
    try:
        with PartialState().main_process_first():
            yield
    finally:
        _in_turn.reset(token)


class DataPreProcessor:
    """Runs the data config's datasets through their handlers (registered by name) and mixes them."""

    def __init__(self, processor_config: DataPreProcessorConfig, tokenizer, processor=None):
        self.processor_config = processor_config
        self.tokenizer = tokenizer
        self.processor = processor
        self.registered_handlers: dict[str, DataHandler] = dict(AVAILABLE_DATA_HANDLERS)

    def register_data_handler(self, name: str, handler: DataHandler) -> None:
        if not isinstance(name, str) or not isinstance(handler, DataHandler):
            raise UserInputError(
                "Handler should be of type tuning.data_handler.DataHandler, and name of str: got "
                f"{type(name).__name__} and {type(handler).__name__}"
            )
        if name in self.registered_handlers:
            logger.warning("data handler %r is replaced by the one given", name)
        self.registered_handlers[name] = handler

    def register_data_handlers(self, handlers: dict[str, DataHandler] | None) -> None:
        if handlers is None:
            return
        if not isinstance(handlers, dict):
            raise UserInputError(
                f"Handler should be of type tuning.data_handler.DataHandler, and name of str: got {type(handlers)}"
            )
        for name, handler in handlers.items():
            self.register_data_handler(name, handler)

    def _get_registered_datahandler(self, name: str) -> DataHandler:
        if name not in self.registered_handlers:
            raise UserInputError(
                f"Data handler requested {name} is not registered. Registered handlers are "
                + ", ".join(self.registered_handlers)
            )
        return self.registered_handlers[name]

    def load_dataset(
        self,
        datasetconfig: DataSetConfig | None,
        streaming: bool,
        splitName: str | None = None,  # noqa: N803 (v3.1.0's name)
        datafile: str | None = None,
        **kwargs,
    ):
        """The rows of a dataset config's paths (joined), or of one ``datafile``."""
        if datafile and datasetconfig:
            raise ValueError("Both datafile and datasetconfig should not be set")
        if not datafile and not datasetconfig:
            raise ValueError("Either datafile or datasetconfig must be set")
        if datafile:
            return load_data_path(datafile, streaming=False, split=splitName)
        split = datasetconfig.dataset_split_name or splitName
        try:
            loaded = [
                load_data_path(path, datasetconfig.builder, streaming, split) for path in datasetconfig.data_paths
            ]
        except UserInputError as exc:
            if split and str(exc).startswith(f"split {split!r}"):  # name the dataset and the key it came from
                key = "dataset_split_name" if datasetconfig.dataset_split_name else "splitName"
                raise UserInputError(f"dataset '{datasetconfig.name}': key '{key}': {exc}") from None
            raise
        return try_concatenate_datasets(loaded)

    def split_dataset(self, dataset_config: DataSetConfig, dataset):
        """The ``split`` of a dataset config: train and validation ("test") parts, shuffled with the seed."""
        train_size = dataset_config.split.get("train", 0.0)
        eval_size = dataset_config.split.get("validation", 0.0)
        total = train_size + eval_size
        if not 0 < total <= 1.0 + 1e-9:
            raise UserInputError(
                f"dataset {dataset_config.name}: split train + validation must be in (0, 1], got {total}"
            )
        if isinstance(dataset, DatasetDict | IterableDatasetDict):
            if list(dataset) != [TRAIN_SPLIT]:
                logger.warning("dataset %s has splits %s: used as it is, not split", dataset_config.name, list(dataset))
                return dataset
            dataset = dataset[TRAIN_SPLIT]
        container = IterableDatasetDict if isinstance(dataset, IterableDataset) else DatasetDict
        if train_size == 1.0:
            return container({TRAIN_SPLIT: dataset})
        if eval_size == 1.0:
            return container({EVAL_SPLIT: dataset})
        if isinstance(dataset, IterableDataset):
            raise UserInputError(
                f"dataset {dataset_config.name}: a partial split of a streaming dataset is not supported; give "
                "train or validation 1.0, or set streaming to false"
            )
        parts = dataset.train_test_split(
            train_size=train_size or None,
            test_size=eval_size or None,
            shuffle=dataset_config.shuffle is not False,
            seed=self.processor_config.seed,
        )
        if not train_size:
            del parts[TRAIN_SPLIT]
        elif not eval_size:
            del parts[EVAL_SPLIT]
        return parts

    def _execute_data_handlers(
        self,
        raw_datasets,
        data_handler_config,
        datasetName: str,  # noqa: N803
        dataset_config: DataSetConfig | None = None,
    ):
        name = data_handler_config.name
        kwargs = dict(data_handler_config.arguments or {})
        handler = self._get_registered_datahandler(name)
        if problem := handler_argument_problem(handler, kwargs):
            raise UserInputError(f"dataset {datasetName}: data handler {name}: {problem}")
        streaming = isinstance(raw_datasets, IterableDatasetDict)
        if kwargs.get("batched") and not handler.allows_batching:
            raise UserInputError(f"dataset {datasetName}: data handler {name} does not take batched=True")
        kwargs.setdefault("batched", handler.allows_batching)
        if streaming:
            kwargs.pop("num_proc", None)
        kind = handler.handler_type
        if kind is not DataHandlerType.MAP and "remove_columns" in kwargs:
            logger.warning("data handler %s takes no remove_columns; ignored", name)
            kwargs.pop("remove_columns")
        if kind in (DataHandlerType.REMOVE, DataHandlerType.SELECT, DataHandlerType.RENAME):
            key = "column_mapping" if kind is DataHandlerType.RENAME else "column_names"
            value = kwargs.get(key)
            expected = dict if kind is DataHandlerType.RENAME else list
            if not isinstance(value, expected):
                raise UserInputError(
                    f"dataset {datasetName}: data handler {name} needs '{key}' ({expected.__name__}), got {value!r}"
                )
            method = {
                DataHandlerType.REMOVE: "remove_columns",
                DataHandlerType.SELECT: "select_columns",
                DataHandlerType.RENAME: "rename_columns",
            }[kind]
            return getattr(raw_datasets, method)(value)
        fn_kwargs = dict(kwargs.pop("fn_kwargs", None) or {})
        if not streaming:
            kwargs.setdefault("desc", handler.desc)
        dataset_config = dataset_config or DataSetConfig(name=datasetName, data_paths=[])
        op = RowChecked(handler.op, dataset_config, f"data handler {name}", bool(kwargs.get("with_indices")))
        kwargs["with_indices"] = True
        if kind is DataHandlerType.FILTER:
            with children_die_with_this_process():  # a SIGKILLed run leaves no num_proc worker behind
                return raw_datasets.filter(op, fn_kwargs=fn_kwargs, **kwargs)
        if kind is not DataHandlerType.MAP:
            raise UserInputError(f"data handler {name} has an unknown type {kind}")
        fn_kwargs["tokenizer"] = self.tokenizer
        if self.processor is not None:
            fn_kwargs["processor"] = self.processor
            if handler.op is prepare_multimodal_data_processor:  # relative image paths: beside the dataset's files
                fn_kwargs.setdefault("image_dir", files_dir(dataset_config.data_paths))
        processed = {}
        for split, dataset in raw_datasets.items():
            split_kwargs = dict(kwargs)
            if split_kwargs.get("remove_columns") == "all":
                if dataset.column_names is None:
                    raise UserInputError(
                        f"dataset {datasetName}: the columns of split {split} are not known, so remove_columns "
                        "'all' cannot apply; list the columns"
                    )
                split_kwargs["remove_columns"] = dataset.column_names
            with children_die_with_this_process():
                processed[split] = dataset.map(op, fn_kwargs=fn_kwargs, **split_kwargs)
        return IterableDatasetDict(processed) if streaming else DatasetDict(processed)

    def _check_tokenized_rows(self, raw: DatasetDict, config: DataSetConfig) -> None:
        """Pretokenized data (an ``input_ids`` column), checked row by row before use (``check_tokenized_row``)."""
        vocab_size = len(self.tokenizer) if self.tokenizer is not None else None
        check = RowChecked(check_tokenized_row, config, "pretokenized rows", False)
        for dataset in raw.values():
            if "input_ids" in (dataset.column_names or []):
                dataset.map(check, with_indices=True, fn_kwargs={"vocab_size": vocab_size}, desc="Checking token rows")

    def _prepare_processed_datasets(self, dataset_configs: list[DataSetConfig]) -> list[tuple[DataSetConfig, dict]]:
        if not dataset_configs:
            raise UserInputError("No dataset configs provided.")
        processed = []
        for config in dataset_configs:
            loaded = self.load_dataset(config, bool(self.processor_config.streaming))
            if config.split is not None:
                loaded = self.split_dataset(config, loaded)
            streaming = isinstance(loaded, IterableDataset | IterableDatasetDict)
            raw = IterableDatasetDict() if streaming else DatasetDict()
            if isinstance(loaded, Dataset | IterableDataset):
                raw[TRAIN_SPLIT] = loaded
            else:
                for split, dataset in loaded.items():
                    if split in (TRAIN_SPLIT, EVAL_SPLIT):
                        raw[split] = dataset
            if self.processor is not None:  # vision: images decode where errors name the row (tuning.data.vision)
                from tuning.data.vision import undecoded_images

                for split in list(raw):
                    raw[split] = undecoded_images(raw[split])
            if not streaming:
                self._check_tokenized_rows(raw, config)
            for handler_config in config.data_handlers or []:
                raw = self._execute_data_handlers(raw, handler_config, config.name, config)
            processed.append((config, raw))
        return processed

    def _validate_sampling_ratios(self, sampling_ratios: list[float], train_datasets: list) -> bool:
        ratios = list(sampling_ratios)
        if not ratios:
            return False
        if len(ratios) != len(list(train_datasets)):
            raise UserInputError(
                "Sampling probability should be specified for all datasets with train split "
                f"({len(ratios)} ratios for {len(list(train_datasets))} datasets)"
            )
        if abs(sum(ratios) - 1.0) > 1e-6:
            raise UserInputError(f"Sampling probabilities for train datasets don't sum to 1: {ratios}")
        return True

    def _process_dataset_configs(self, dataset_configs: list[DataSetConfig]):
        train, evaluation, ratios = [], [], []
        for config, raw in self._prepare_processed_datasets(dataset_configs):
            if TRAIN_SPLIT in raw:
                train.append(raw[TRAIN_SPLIT])
                if config.sampling:
                    ratios.append(config.sampling)
            if EVAL_SPLIT in raw:
                evaluation.append(raw[EVAL_SPLIT])
        if not train:
            raise UserInputError("the datasets have no train split: check the data config's split ratios")
        mix = self._validate_sampling_ratios(ratios, train)
        maybe_align_datasets(train)
        maybe_align_datasets(evaluation)
        if len(train) == 1:
            train_dataset = train[0]
        elif mix:
            train_dataset = datasets.interleave_datasets(
                train,
                probabilities=ratios,
                seed=self.processor_config.seed,
                stopping_strategy=self.processor_config.sampling_stopping_strategy,
            )
        else:
            train_dataset = datasets.concatenate_datasets(train)
        eval_dataset = None
        if evaluation:
            eval_dataset = evaluation[0] if len(evaluation) == 1 else datasets.concatenate_datasets(evaluation)
        return train_dataset, eval_dataset, None

    def process_dataset_configs(self, dataset_configs: list[DataSetConfig]):
        """``(train_dataset, eval_dataset, sampling_weights)``; the main process goes first under torchrun, so that
        the other ranks read what it cached."""
        with ranks_in_turn():
            return self._process_dataset_configs(dataset_configs)


def get_datapreprocessor(
    processor_config: DataPreProcessorConfig,
    tokenizer,
    processor=None,
    additional_data_handlers: dict[str, DataHandler] | None = None,
) -> DataPreProcessor:
    """The processor for ``processor_config`` with the built-in handlers and ``additional_data_handlers``."""
    if processor_config.type not in (None, "default"):
        raise UserInputError(f"dataprocessor type {processor_config.type!r} is not supported by tuning-bench")
    data_processor = DataPreProcessor(processor_config, tokenizer, processor)
    data_processor.register_data_handlers(additional_data_handlers)
    return data_processor


def check_data_config(config: DataConfig, source: str, handler_names) -> None:
    """What can be checked before the model loads: each data path exists (or a glob matches, or it is a Hub dataset
    id and the Hub is online), each handler is registered (``handler_names``; when a mapping of names to handlers,
    its arguments are known to it and none it needs is missing), and sampling ratios are given for all datasets or
    none, summing to 1."""
    for dataset in config.datasets:
        label = f"data config {source}: dataset '{dataset.name}'"
        for path in dataset.data_paths:
            where = f"{label}: key 'data_paths'"
            try:
                check_data_path(path, where, dataset.builder)
            except InputFileNotFoundError as exc:
                if str(exc).startswith(where):  # a Hub id's refusal names where it stands already
                    raise
                raise InputFileNotFoundError(f"{where}: {exc}") from None
            local = dataset.builder is not None or not is_hub_dataset_id(path)
            if dataset.dataset_split_name and local and (problem := local_split_problem(dataset.dataset_split_name)):
                raise UserInputError(f"{label}: key 'dataset_split_name': {problem}")
        for index, handler in enumerate(dataset.data_handlers or []):
            if handler.name not in handler_names:
                raise UserInputError(
                    f"{label}: key 'data_handlers[{index}]': unknown handler '{handler.name}'; known: "
                    + ", ".join(sorted(handler_names))
                )
            known = handler_names.get(handler.name) if isinstance(handler_names, Mapping) else None
            if known is not None and (problem := handler_argument_problem(known, handler.arguments)):
                raise UserInputError(f"{label}: key 'data_handlers[{index}]': handler '{handler.name}': {problem}")
    training = [d for d in config.datasets if not d.split or d.split.get("train", 0) > 0]
    ratios = [d.sampling for d in training if d.sampling]
    if ratios and len(ratios) != len(training):
        raise UserInputError(
            f"data config {source}: key 'sampling': give a ratio for every training dataset or none "
            f"({len(ratios)} of {len(training)} have one)"
        )
    if ratios and abs(sum(ratios) - 1.0) > 1e-6:
        raise UserInputError(f"data config {source}: key 'sampling': the ratios {ratios} sum to {sum(ratios)}, not 1")
