"""Supervised fine-tuning of causal LMs on transformers + TRL + PEFT: fms-hf-tuning's ``sft_trainer`` CLI and
Python API (README: "Python API"). ``main()`` builds the trackers and hands them to ``train(trackers=...)``."""

import argparse
import dataclasses
import glob
import json
import logging
import os
import sys
import time
from types import UnionType
from typing import Any, NamedTuple

if __package__ in (None, ""):
    # `python tuning/sft_trainer.py`: import from the repository; the script's folder would shadow `config`, `data`...
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [path for path in sys.path if os.path.abspath(path or ".") != _here]
    sys.path.insert(0, os.path.dirname(_here))

if __name__ == "__main__":
    # Before the heavy imports: a SIGTERM or Ctrl-C while they load still ends the job as `interrupted`.
    from tuning.utils.error_logging import install_early_signal_handlers

    install_early_signal_handlers()

import torch
import transformers
from safetensors import SafetensorError, safe_open
from transformers import HfArgumentParser, TrainerCallback
from transformers.utils import is_flash_attn_2_available

from tuning.config.configs import DataArguments, ModelArguments, TrainingArguments
from tuning.config.peft_config import PEFT_METHODS, LoraConfig, PromptTuningConfig, to_peft_config
from tuning.config.tracker_configs import AimConfig, FileLoggingTrackerConfig, TrackerConfigFactory
from tuning.data.formatting import format_file
from tuning.data.loading import check_data_file
from tuning.data.masking import tokenize_and_mask
from tuning.data.tokenizer_data_utils import tokenizer_and_embedding_resize
from tuning.trackers.tracker import Tracker
from tuning.trackers.tracker_factory import (
    build_trackers,
    closed_on_failure,
    hf_callbacks,
    tracker_config_classes,
    tracker_configs_from,
)
from tuning.utils.config_utils import get_json_config, json_object
from tuning.utils.data_type_utils import get_torch_dtype
from tuning.utils.error_logging import TrainingInterrupted, UserInputError, run_with_error_reporting
from tuning.utils.graceful_stop import GracefulStopCallback

logger = logging.getLogger("tuning.sft_trainer")

# Names from earlier fms-hf-tuning releases and transformers 4, accepted in JSON job configs as on the CLI.
KEY_ALIASES = {"data_path": "training_data_path", "evaluation_strategy": "eval_strategy", "tracker": "trackers"}
# What train() uses when not told otherwise: the file logger with its defaults (fms-hf-tuning's default too).
DEFAULT_TRACKER_CONFIGS = TrackerConfigFactory(file_logger_config=FileLoggingTrackerConfig())
# fms-hf-tuning features this package does not have; train() rejects them by these argument names.
UNSUPPORTED_FEATURES = {
    "trainer_controller_args": "the trainer controller",
    "quantized_lora_config": "fms-acceleration's quantized LoRA",
    "fusedops_kernels_config": "fms-acceleration's fused ops and kernels",
}


class _UpstreamValues(NamedTuple):
    model_args: ModelArguments
    data_args: DataArguments
    training_args: TrainingArguments
    trainer_controller_args: None
    tune_config: LoraConfig | PromptTuningConfig | None
    file_logger_config: FileLoggingTrackerConfig
    aim_config: AimConfig
    quantized_lora_config: None
    fusedops_kernels_config: None
    exp_metadata: str | None


class ParsedArguments(_UpstreamValues):
    """fms-hf-tuning's ten values of ``parse_arguments`` in its order, plus ``tracker_configs`` and
    ``experiment_metadata`` (a dict) by name."""

    tracker_configs: TrackerConfigFactory

    @property
    def experiment_metadata(self) -> dict | None:
        return None if self.exp_metadata is None else json.loads(self.exp_metadata)


class _ArgumentParser(HfArgumentParser):
    """Raise instead of exiting so that bad flags are reported like any other user error."""

    def error(self, message: str):
        raise UserInputError(message)


_PARSER_DATACLASSES = (ModelArguments, DataArguments, TrainingArguments, LoraConfig, PromptTuningConfig)


def get_parser() -> HfArgumentParser:
    """The CLI parser: the argument dataclasses, every registered tracker's config and the plain flags."""
    parser = _ArgumentParser((*_PARSER_DATACLASSES, *tracker_config_classes().values()))
    parser.add_argument("--peft_method", choices=PEFT_METHODS, default=None, help="lora, pt or none (default).")
    parser.add_argument("--use_peft", action="store_true", help="Same as --peft_method lora (the oldest spelling).")
    parser.add_argument("--exp_metadata", default=None, help="JSON object recorded as the run's searchable params.")
    return parser


def _exp_metadata_json(value: Any) -> str | None:
    """``exp_metadata`` as a JSON string, as fms-hf-tuning hands it on (a job config may hold an object)."""
    if value is None:
        return None
    text = value if isinstance(value, str) else json.dumps(value)
    json_object(text, "--exp_metadata")
    return text


def _parse_job_config(parser: HfArgumentParser, json_config: dict) -> tuple[list, argparse.Namespace]:
    """The dataclasses and plain flags of a JSON job config; keys that are no flag are ignored with one warning."""
    config = {KEY_ALIASES.get(key, key): value for key, value in json_config.items()}
    flags = {name: config.pop(name, parser.get_default(name)) for name in ("peft_method", "use_peft", "exp_metadata")}
    if isinstance(config.get("trackers"), str):
        config["trackers"] = [config["trackers"]]
    known = {spec.name for dtype in parser.dataclass_types for spec in dataclasses.fields(dtype) if spec.init}
    if unknown := sorted(set(config) - known):
        logger.warning("ignoring job config keys that are no sft_trainer flag: %s", ", ".join(unknown))
    try:
        dataclass_args = parser.parse_dict(config, allow_extra_keys=True)
    except (ValueError, TypeError) as exc:
        raise UserInputError(f"invalid job config: {exc}") from exc
    return list(dataclass_args), argparse.Namespace(**flags)


def parse_arguments(parser: HfArgumentParser, json_config: dict | None = None) -> ParsedArguments:
    """Parse ``json_config`` (same keys as the flags) when given and not empty, else argv."""
    if json_config:
        dataclass_args, flags = _parse_job_config(parser, json_config)
    else:
        *dataclass_args, flags, remaining = parser.parse_args_into_dataclasses(return_remaining_strings=True)
        if remaining:
            raise UserInputError(f"unrecognized arguments: {' '.join(remaining)}")
    model_args, data_args, training_args, lora_config, prompt_config = dataclass_args[: len(_PARSER_DATACLASSES)]
    tracker_configs = tracker_configs_from(
        dict(zip(tracker_config_classes(), dataclass_args[len(_PARSER_DATACLASSES) :], strict=True))
    )

    peft_method = flags.peft_method or ("lora" if flags.use_peft else "none")
    if peft_method not in PEFT_METHODS:
        raise UserInputError(f"unknown peft_method {peft_method!r}; choose one of {list(PEFT_METHODS)}")
    tune_config = {"lora": lora_config, "pt": prompt_config}.get(peft_method)
    _warn_unused_peft_flags(peft_method, lora_config, prompt_config)

    for name in ("response_template", "data_formatter_template"):
        if value := getattr(data_args, name):  # a \\n typed inside shell double quotes means a newline
            setattr(data_args, name, value.replace("\\n", "\n"))
    parsed = ParsedArguments(
        model_args,
        data_args,
        training_args,
        None,
        tune_config,
        tracker_configs.file_logger_config,
        tracker_configs.aim_config,
        None,
        None,
        _exp_metadata_json(flags.exp_metadata),
    )
    parsed.tracker_configs = tracker_configs
    return parsed


def _warn_unused_peft_flags(peft_method: str, lora_config: LoraConfig, prompt_config: PromptTuningConfig) -> None:
    """Warn about the PEFT flags set away from their defaults that the chosen method ignores."""
    for method, config in (("lora", lora_config), ("pt", prompt_config)):
        defaults = vars(type(config)())
        ignored = " ".join(f"--{name}" for name, value in vars(config).items() if value != defaults[name])
        if ignored and method != peft_method:
            logger.warning("ignoring %s: only for --peft_method %s; this run has %s", ignored, method, peft_method)


def check_output_dir(path: str) -> None:
    """``--output_dir`` must be a directory or creatable as one: no regular file at it or above it."""
    existing = os.path.abspath(path)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise UserInputError(f"--output_dir {path}: {existing} is a file, not a directory")


def check_model_files(flag: str, path: str) -> None:
    """Name a damaged JSON file or safetensors file (a cut-short copy) of a local model directory; reads the JSON
    files and the safetensors headers only."""
    if not os.path.isdir(path):
        return
    for json_file in sorted(glob.glob(os.path.join(path, "*.json"))):
        try:
            with open(json_file, encoding="utf-8") as handle:
                json.load(handle)
        except (OSError, ValueError) as exc:  # ValueError: JSONDecodeError and UnicodeDecodeError
            raise UserInputError(f"{flag} {path}: {json_file} is not valid JSON: {exc}") from exc
    for weights in sorted(glob.glob(os.path.join(path, "*.safetensors"))):
        try:
            with safe_open(weights, framework="np"):
                pass
        except (OSError, SafetensorError) as exc:
            raise UserInputError(f"{flag} {path}: {weights} is not a complete safetensors file: {exc}") from exc


def _is_number(value: Any, kinds: type | UnionType) -> bool:
    """``value`` is one of ``kinds``; bools are ints to ``isinstance``, but no numbers here."""
    return isinstance(value, kinds) and not isinstance(value, bool)


def validate_arguments(model_args: ModelArguments, data_args: DataArguments, train_args: TrainingArguments) -> None:
    """Cheap checks that fail in seconds, before the tokenizer or the model is loaded."""
    if not model_args.model_name_or_path:
        raise UserInputError("--model_name_or_path is required")
    for flag, path in (
        ("--model_name_or_path", model_args.model_name_or_path),
        ("--tokenizer_name_or_path", model_args.tokenizer_name_or_path),
    ):
        if not path:
            continue
        local = os.path.isabs(path) or path.startswith((".", "~")) or path.count("/") > 1  # hub ids: name, org/name
        if not os.path.exists(path) and (local or os.environ.get("HF_HUB_OFFLINE") == "1"):
            raise UserInputError(f"{flag} {path} does not exist")
        check_model_files(flag, path)
    if train_args.output_dir:
        check_output_dir(train_args.output_dir)
    try:
        get_torch_dtype(model_args.torch_dtype)
    except UserInputError as exc:
        raise UserInputError(f"--torch_dtype: {exc}") from exc
    if not data_args.training_data_path:
        raise UserInputError("--training_data_path (or --data_path) is required")
    for path in (data_args.training_data_path, data_args.validation_data_path):
        if path:
            check_data_file(path)
    if (data_args.dataset_text_field is None) == (data_args.data_formatter_template is None):
        raise UserInputError("give exactly one of --dataset_text_field and --data_formatter_template")
    if not train_args.packing and not data_args.response_template:
        raise UserInputError("--response_template is required unless --packing is on")
    epochs, accumulation = train_args.num_train_epochs, train_args.gradient_accumulation_steps
    if train_args.max_steps <= 0 and (not _is_number(epochs, int | float) or epochs <= 0):
        raise UserInputError(f"num_train_epochs has to be an integer/float >= 1, got {epochs!r}")
    if not _is_number(accumulation, int) or accumulation <= 0:
        raise UserInputError(f"gradient_accumulation_steps has to be an integer >= 1, got {accumulation!r}")
    for flag in ("max_seq_length", "per_device_train_batch_size", "per_device_eval_batch_size"):
        if getattr(train_args, flag) <= 0:
            raise UserInputError(f"--{flag} must be positive, got {getattr(train_args, flag)}")
    if train_args.max_steps < -1:  # -1 (and 0) mean "train --num_train_epochs", as in transformers
        raise UserInputError(f"--max_steps must be a number of steps or -1 (all epochs), got {train_args.max_steps}")


def _build_dataset(path: str, data_args: DataArguments, tokenizer, max_length: int):
    texts = format_file(path, tokenizer.eos_token, data_args.dataset_text_field, data_args.data_formatter_template)
    return tokenize_and_mask(texts, tokenizer, max_length, data_args.response_template, source=path)


def _attention_implementation(use_flash_attn: bool) -> str:
    if not use_flash_attn:
        return "sdpa"
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
    trainer_controller_args: Any = None,
    tracker_configs: TrackerConfigFactory | None = DEFAULT_TRACKER_CONFIGS,
    additional_callbacks: list[TrainerCallback] | None = None,
    exp_metadata: dict | None = None,
    quantized_lora_config: Any = None,
    fusedops_kernels_config: Any = None,
    *,
    callbacks: list[TrainerCallback] | None = None,
    trackers: list[Tracker] | None = None,
) -> tuple[transformers.trainer_utils.TrainOutput, dict[str, float]]:
    """Fine-tune and save the model (or adapter) into ``output_dir``; returns the train output and the additional
    metrics (README: "Python API")."""
    if callbacks is not None and additional_callbacks is not None:
        raise UserInputError("give additional_callbacks or callbacks (the same argument), not both")
    additional_callbacks = list((callbacks if additional_callbacks is None else additional_callbacks) or [])
    tracker_configs = DEFAULT_TRACKER_CONFIGS if tracker_configs is None else tracker_configs
    unsupported = (trainer_controller_args, quantized_lora_config, fusedops_kernels_config)
    for argument, value in zip(UNSUPPORTED_FEATURES, unsupported, strict=True):
        if value is not None:
            raise UserInputError(f"{argument}: {UNSUPPORTED_FEATURES[argument]} is not supported by tuning-bench")
    if not isinstance(tracker_configs, TrackerConfigFactory):
        raise UserInputError(
            f"tracker configs should adhere to the TrackerConfigFactory type, got {type(tracker_configs).__name__}"
        )
    wrong = [type(callback).__name__ for callback in additional_callbacks if not isinstance(callback, TrainerCallback)]
    if wrong:
        raise UserInputError(f"additional callbacks should be of type TrainerCallback, got {', '.join(wrong)}")
    if exp_metadata is not None and not isinstance(exp_metadata, dict):
        raise UserInputError(f"exp metadata passed should be a dict with valid json, got {type(exp_metadata).__name__}")
    validate_arguments(model_args, data_args, train_args)
    if trackers is not None:  # the caller's: it closes them
        return _train(model_args, data_args, train_args, peft_config, exp_metadata, trackers, additional_callbacks)
    trackers = build_trackers(train_args.trackers, tracker_configs)
    with closed_on_failure(trackers):
        callbacks = [*hf_callbacks(trackers), *additional_callbacks]
        return _train(model_args, data_args, train_args, peft_config, exp_metadata, trackers, callbacks)


def _train(
    model_args: ModelArguments,
    data_args: DataArguments,
    train_args: TrainingArguments,
    peft_config: LoraConfig | PromptTuningConfig | Any | None,
    exp_metadata: dict | None,
    trackers: list[Tracker],
    trainer_callbacks: list[TrainerCallback],
) -> tuple[transformers.trainer_utils.TrainOutput, dict[str, float]]:
    """``train()`` once its arguments are checked and its trackers built."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTTrainer

    if exp_metadata:
        for tracker in trackers:
            tracker.set_params(exp_metadata, "experiment_metadata")

    tokenizer = AutoTokenizer.from_pretrained(
        model_args.tokenizer_name_or_path or model_args.model_name_or_path, cache_dir=train_args.cache_dir
    )
    added_tokens = tokenizer.add_special_tokens({"eos_token": "</s>"}) if tokenizer.eos_token is None else 0
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    max_length = min(train_args.max_seq_length, tokenizer.model_max_length)

    train_dataset = _build_dataset(data_args.training_data_path, data_args, tokenizer, max_length)
    eval_path = data_args.validation_data_path
    eval_dataset = _build_dataset(eval_path, data_args, tokenizer, max_length) if eval_path else None

    load_start = time.time()
    model = AutoModelForCausalLM.from_pretrained(
        model_args.model_name_or_path,
        dtype=get_torch_dtype(model_args.torch_dtype),
        attn_implementation=_attention_implementation(model_args.use_flash_attn),
        cache_dir=train_args.cache_dir,
    )
    if added_tokens:
        tokenizer_and_embedding_resize({}, tokenizer, model, model_args.embedding_size_multiple_of)
    additional_metrics = {"model_load_time": time.time() - load_start}
    for tracker in trackers:
        tracker.track(additional_metrics["model_load_time"], "model_load_time")

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
        callbacks=trainer_callbacks,
    )
    train_output = trainer.train()
    trainer.save_model(train_args.output_dir)
    return train_output, additional_metrics


def main() -> int:
    """The CLI: every failure ends in a classified exit status, a termination log line and a stderr marker."""

    def run() -> None:
        args = parse_arguments(get_parser(), get_json_config())
        validate_arguments(args.model_args, args.data_args, args.training_args)
        trackers = build_trackers(args.training_args.trackers, args.tracker_configs)
        graceful_stop = GracefulStopCallback()
        with closed_on_failure(trackers):
            train(
                args.model_args,
                args.data_args,
                args.training_args,
                args.tune_config,
                additional_callbacks=[*hf_callbacks(trackers), graceful_stop],
                exp_metadata=args.experiment_metadata,
                trackers=trackers,
            )
            if graceful_stop.received_signal is not None:
                raise TrainingInterrupted(graceful_stop.received_signal)

    return run_with_error_reporting(run)


if __name__ == "__main__":
    sys.exit(main())
