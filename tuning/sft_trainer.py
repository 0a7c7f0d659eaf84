"""Supervised fine-tuning of causal LMs: the fms-hf-tuning ``sft_trainer`` CLI, on transformers + TRL + PEFT.

Arguments → ``train()`` → ``main()``: ``train()`` takes parsed dataclasses plus the callbacks and trackers it is
given and never creates a tracker itself; ``main()`` parses argv (or a JSON job config), builds the requested
trackers and hands them in. Wrappers call ``train()`` directly with their own callbacks.
"""

import dataclasses
import gc
import json
import logging
import os
import sys
import time
from typing import Any, NamedTuple

if __package__ in (None, ""):
    # Run as `python tuning/sft_trainer.py`: import the package from the repository, not the script's folder
    # (whose `config`, `data` and `utils` would otherwise shadow top-level modules).
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [path for path in sys.path if os.path.abspath(path or ".") != _here]
    sys.path.insert(0, os.path.dirname(_here))

import transformers
from transformers import HfArgumentParser

from tuning.config.configs import DataArguments, ModelArguments, TrainingArguments
from tuning.config.peft_config import PEFT_METHODS, LoraConfig, PromptTuningConfig, to_peft_config
from tuning.config.tracker_configs import TrackerConfigFactory
from tuning.data.formatting import format_texts
from tuning.data.loading import load_records
from tuning.data.masking import tokenize_and_mask
from tuning.trackers import Tracker, build_trackers
from tuning.trackers.tracker_factory import tracker_config_classes, tracker_configs_from
from tuning.utils.config_utils import read_job_config
from tuning.utils.error_logging import (
    GracefulStopCallback,
    TrainingInterrupted,
    UserInputError,
    run_with_error_reporting,
)

logger = logging.getLogger("tuning.sft_trainer")

TORCH_DTYPES = ("bfloat16", "float16", "float32")
# Names from earlier fms-hf-tuning releases and transformers 4, accepted in JSON job configs as on the CLI.
KEY_ALIASES = {"data_path": "training_data_path", "evaluation_strategy": "eval_strategy", "tracker": "trackers"}


class ParsedArguments(NamedTuple):
    model_args: ModelArguments
    data_args: DataArguments
    training_args: TrainingArguments
    peft_config: LoraConfig | PromptTuningConfig | None
    tracker_configs: TrackerConfigFactory
    exp_metadata: dict | None


class _ArgumentParser(HfArgumentParser):
    """Raise instead of exiting so that bad flags are reported like any other user error."""

    def error(self, message: str):
        raise UserInputError(message)


def get_parser() -> HfArgumentParser:
    parser = _ArgumentParser(
        (
            ModelArguments,
            DataArguments,
            TrainingArguments,
            LoraConfig,
            PromptTuningConfig,
            *tracker_config_classes(),
        )
    )
    parser.add_argument("--peft_method", choices=PEFT_METHODS, default=None, help="lora, pt or none (default).")
    parser.add_argument("--use_peft", action="store_true", help="Same as --peft_method lora (the oldest spelling).")
    parser.add_argument("--exp_metadata", default=None, help="JSON object recorded as the run's searchable params.")
    return parser


def _parse_exp_metadata(value: Any) -> dict | None:
    if value is None or isinstance(value, dict):
        return value
    try:
        metadata = json.loads(value)
    except (TypeError, json.JSONDecodeError) as exc:
        raise UserInputError(f"--exp_metadata is not valid JSON: {exc}") from exc
    if not isinstance(metadata, dict):
        raise UserInputError(f"--exp_metadata must be a JSON object, got {type(metadata).__name__}")
    return metadata


def _unescape_newlines(value: str | None) -> str | None:
    """A ``\\n`` typed inside shell double quotes arrives as backslash + n; users mean a newline."""
    return value.replace("\\n", "\n") if value else value


def parse_arguments(parser: HfArgumentParser, json_config: dict | None = None) -> ParsedArguments:
    """Parse argv, or ``json_config`` (same keys as the flags) when given."""
    if json_config is not None:
        config = {KEY_ALIASES.get(key, key): value for key, value in json_config.items()}
        peft_method = config.pop("peft_method", None)
        use_peft = config.pop("use_peft", False)
        exp_metadata = config.pop("exp_metadata", None)
        if isinstance(config.get("trackers"), str):
            config["trackers"] = [config["trackers"]]
        try:
            dataclass_args = parser.parse_dict(config)
        except (ValueError, TypeError) as exc:
            raise UserInputError(f"invalid job config: {exc}") from exc
    else:
        *dataclass_args, extras, remaining = parser.parse_args_into_dataclasses(return_remaining_strings=True)
        if remaining:
            raise UserInputError(f"unrecognized arguments: {' '.join(remaining)}")
        peft_method, use_peft, exp_metadata = extras.peft_method, extras.use_peft, extras.exp_metadata
    model_args, data_args, training_args, lora_config, prompt_config, *tracker_configs = dataclass_args

    peft_method = peft_method or ("lora" if use_peft else "none")
    if peft_method not in PEFT_METHODS:
        raise UserInputError(f"unknown peft_method {peft_method!r}; choose one of {list(PEFT_METHODS)}")
    peft_config = {"lora": lora_config, "pt": prompt_config}.get(peft_method)

    data_args.response_template = _unescape_newlines(data_args.response_template)
    data_args.data_formatter_template = _unescape_newlines(data_args.data_formatter_template)
    return ParsedArguments(
        model_args,
        data_args,
        training_args,
        peft_config,
        tracker_configs_from(tracker_configs),
        _parse_exp_metadata(exp_metadata),
    )


def _looks_local(path: str) -> bool:
    """Hub ids are ``name`` or ``org/name``; anything else must exist on disk."""
    return os.path.isabs(path) or path.startswith((".", "~")) or path.count("/") > 1


def validate_arguments(model_args: ModelArguments, data_args: DataArguments, train_args: TrainingArguments) -> None:
    """Cheap checks that fail in seconds, before the tokenizer or the model is loaded."""
    if not model_args.model_name_or_path:
        raise UserInputError("--model_name_or_path is required")
    for flag, path in (
        ("--model_name_or_path", model_args.model_name_or_path),
        ("--tokenizer_name_or_path", model_args.tokenizer_name_or_path),
    ):
        if path and not os.path.exists(path) and (_looks_local(path) or os.environ.get("HF_HUB_OFFLINE") == "1"):
            raise UserInputError(f"{flag} {path} does not exist")
    if model_args.torch_dtype not in TORCH_DTYPES:
        raise UserInputError(f"--torch_dtype {model_args.torch_dtype!r} is not one of {list(TORCH_DTYPES)}")
    if not data_args.training_data_path:
        raise UserInputError("--training_data_path (or --data_path) is required")
    for path in (data_args.training_data_path, data_args.validation_data_path):
        if path and not os.path.isfile(path):
            raise UserInputError(f"data file not found: {path}")
    if (data_args.dataset_text_field is None) == (data_args.data_formatter_template is None):
        raise UserInputError("give exactly one of --dataset_text_field and --data_formatter_template")
    if not train_args.packing and not data_args.response_template:
        raise UserInputError("--response_template is required unless --packing is on")
    if train_args.max_steps <= 0 and train_args.num_train_epochs <= 0:
        raise UserInputError(f"--num_train_epochs must be positive, got {train_args.num_train_epochs}")
    if train_args.max_seq_length <= 0:
        raise UserInputError(f"--max_seq_length must be positive, got {train_args.max_seq_length}")


def _build_dataset(path: str, data_args: DataArguments, tokenizer, max_length: int):
    texts = format_texts(
        load_records(path),
        tokenizer.eos_token,
        dataset_text_field=data_args.dataset_text_field,
        template=data_args.data_formatter_template,
        source=path,
    )
    return tokenize_and_mask(texts, tokenizer, max_length, data_args.response_template, source=path)


def _attention_implementation(use_flash_attn: bool) -> str:
    if not use_flash_attn:
        return "sdpa"
    import torch
    from transformers.utils import is_flash_attn_2_available

    if torch.cuda.is_available() and is_flash_attn_2_available():
        return "flash_attention_2"
    logger.warning("flash attention 2 is not available here (needs CUDA and flash-attn); using sdpa instead")
    return "sdpa"


def _to_sft_config(train_args: TrainingArguments, max_length: int):
    """TRL needs its own SFTConfig; copy every transformers field so TRL's defaults (bf16, gradient
    checkpointing on) never override what the user asked for."""
    from trl import SFTConfig

    values = {
        spec.name: getattr(train_args, spec.name)
        for spec in dataclasses.fields(transformers.TrainingArguments)
        if spec.init
    }
    return SFTConfig(**values, max_length=max_length, packing=train_args.packing)


def train(
    model_args: ModelArguments,
    data_args: DataArguments,
    train_args: TrainingArguments,
    peft_config: LoraConfig | PromptTuningConfig | Any | None = None,
    callbacks: list[transformers.TrainerCallback] | None = None,
    trackers: list[Tracker] | None = None,
    exp_metadata: dict | None = None,
) -> tuple[transformers.trainer_utils.TrainOutput, dict[str, float]]:
    """Fine-tune and save the model (or adapter) into ``output_dir``.

    ``callbacks`` are given to the trainer exactly as passed; ``trackers`` receive the metrics that are not trainer
    logs (``model_load_time``) and ``exp_metadata``. Returns the train output and those additional metrics.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTTrainer

    validate_arguments(model_args, data_args, train_args)
    trackers = trackers or []
    if exp_metadata:
        for tracker in trackers:
            tracker.set_params(exp_metadata, "experiment_metadata")

    tokenizer = AutoTokenizer.from_pretrained(
        model_args.tokenizer_name_or_path or model_args.model_name_or_path, cache_dir=train_args.cache_dir
    )
    added_tokens = 0
    if tokenizer.eos_token is None:
        added_tokens += tokenizer.add_special_tokens({"eos_token": "</s>"})
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    max_length = min(train_args.max_seq_length, tokenizer.model_max_length)

    train_dataset = _build_dataset(data_args.training_data_path, data_args, tokenizer, max_length)
    eval_dataset = None
    if data_args.validation_data_path:
        eval_dataset = _build_dataset(data_args.validation_data_path, data_args, tokenizer, max_length)

    load_start = time.time()
    model = AutoModelForCausalLM.from_pretrained(
        model_args.model_name_or_path,
        dtype=getattr(torch, model_args.torch_dtype),
        attn_implementation=_attention_implementation(model_args.use_flash_attn),
        cache_dir=train_args.cache_dir,
    )
    if added_tokens:
        model.resize_token_embeddings(len(tokenizer), pad_to_multiple_of=model_args.embedding_size_multiple_of)
    additional_metrics = {"model_load_time": time.time() - load_start}
    for name, value in additional_metrics.items():
        for tracker in trackers:
            tracker.track(value, name)

    if train_args.fsdp and train_args.use_cpu:
        logger.warning("accelerate applies FSDP on accelerators only: this CPU run trains with plain DDP")
    if isinstance(peft_config, LoraConfig | PromptTuningConfig):
        peft_config = to_peft_config(peft_config, model_args.tokenizer_name_or_path or model_args.model_name_or_path)
    trainer = SFTTrainer(
        model=model,
        args=_to_sft_config(train_args, max_length),
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=callbacks,
    )
    train_output = trainer.train()
    trainer.save_model(train_args.output_dir)
    return train_output, additional_metrics


def main() -> int:
    """The CLI: every failure ends in a classified exit status, a termination log line and a stderr marker."""
    # The ~440k objects the imports made live as long as the job: exempt them from the garbage collector's full
    # passes, which otherwise rescan them all, costing ~0.5 s per job on a CPU.
    gc.freeze()

    def run() -> None:
        parser = get_parser()
        args = parse_arguments(parser, read_job_config())
        validate_arguments(args.model_args, args.data_args, args.training_args)
        trackers = build_trackers(args.training_args.trackers, args.tracker_configs, args.training_args.output_dir)
        callbacks = [callback for tracker in trackers if (callback := tracker.get_hf_callback()) is not None]
        graceful_stop = GracefulStopCallback()
        train(
            args.model_args,
            args.data_args,
            args.training_args,
            peft_config=args.peft_config,
            callbacks=[*callbacks, graceful_stop],
            trackers=trackers,
            exp_metadata=args.exp_metadata,
        )
        if graceful_stop.received_signal is not None:
            raise TrainingInterrupted(graceful_stop.received_signal)

    return run_with_error_reporting(run)


if __name__ == "__main__":
    sys.exit(main())
