"""Supervised fine-tuning of causal LMs on transformers + TRL + PEFT: fms-hf-tuning v3.1.0's ``sft_trainer`` CLI and
Python API (docs/cli-and-api.md). ``main()`` parses, builds the trackers and hands them to ``train(trackers=...)``,
and saves to ``--save_model_dir`` as v3.1.0 does."""

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
    # Aim's and MLflow's helper processes import their libraries while this process imports torch.
    from tuning.trackers import start_helpers

    start_helpers(sys.argv[1:])

import torch
import transformers
from safetensors import SafetensorError, safe_open
from transformers import HfArgumentParser, TrainerCallback
from transformers.trainer_utils import get_last_checkpoint
from transformers.utils import is_flash_attn_2_available

from tuning.config.acceleration_configs import (
    AttentionAndDistributedPackingConfig,
    FastMoeConfig,
    FusedOpsAndKernelsConfig,
    QuantizedLoraConfig,
)
from tuning.config.configs import (
    UNSUPPORTED_FLAGS,
    DataArguments,
    ModelArguments,
    TrainerControllerArguments,
    TrainingArguments,
)
from tuning.config.peft_config import (
    PEFT_METHODS,
    QUANTIZATION_METHODS,
    LoraConfig,
    Mxfp4Config,
    PromptTuningConfig,
    to_peft_config,
)
from tuning.config.tracker_configs import AimConfig, FileLoggingTrackerConfig, TrackerConfigFactory, TrackerConfigs
from tuning.data.cache import removes_data_caches
from tuning.data.data_handlers import DataHandler
from tuning.data.setup_dataprocessor import check_data_arguments, prepare_training_datasets
from tuning.data.tokenizer_utils import tokenizer_and_embedding_resize
from tuning.trackers.tracker import Tracker
from tuning.trackers.tracker_factory import (
    AVAILABLE_TRACKERS,
    build_trackers,
    closed_on_failure,
    external_tracker_config_classes,
    hf_callbacks,
)
from tuning.utils.config_utils import get_json_config, json_object
from tuning.utils.data_type_utils import get_torch_dtype
from tuning.utils.error_logging import TrainingInterrupted, UserInputError, run_with_error_reporting
from tuning.utils.graceful_stop import GracefulStopCallback
from tuning.utils.tokens_per_second import TokensPerSecondCallback

logger = logging.getLogger("tuning.sft_trainer")

# Names from earlier fms-hf-tuning releases and transformers 4, accepted in JSON job configs as on the CLI.
KEY_ALIASES = {"data_path": "training_data_path", "evaluation_strategy": "eval_strategy", "tracker": "trackers"}
# What train() uses when not told otherwise: the file logger with its defaults (fms-hf-tuning's default too).
DEFAULT_TRACKER_CONFIGS = TrackerConfigs()
# train()'s arguments for fms-hf-tuning features this package does not have: refused unless None or, for argument
# dataclasses, left at their defaults (what parse_arguments returns when their flags are not given).
UNSUPPORTED_FEATURES = {
    "quantization_config": "MXFP4 quantized models",
    "trainer_controller_args": "the trainer controller",
    "quantized_lora_config": "fms-acceleration's quantized LoRA",
    "fusedops_kernels_config": "fms-acceleration's fused ops and kernels",
    "attention_and_distributed_packing_config": "fms-acceleration's padding-free attention and multipack",
    "fast_moe_config": "fms-acceleration's fast MoE",
}
# The plain flags beside the dataclasses: name → value when not given.
_PLAIN_FLAGS = {
    "peft_method": None,
    "use_peft": False,
    "quantization_method": None,
    "alora_invocation_string": None,
    "exp_metadata": None,
}


class ParsedArguments(NamedTuple):
    """fms-hf-tuning v3.1.0's twelve values of ``parse_arguments`` in its order; by name also ``experiment_metadata``
    (a dict) and the 2.x tracker sections ``file_logger_config`` and ``aim_config``."""

    model_args: ModelArguments
    data_args: DataArguments
    training_args: TrainingArguments
    trainer_controller_args: TrainerControllerArguments
    tune_config: LoraConfig | PromptTuningConfig | None
    quantization_config: Mxfp4Config | None
    quantized_lora_config: QuantizedLoraConfig
    fusedops_kernels_config: FusedOpsAndKernelsConfig
    attention_and_distributed_packing_config: AttentionAndDistributedPackingConfig
    fast_moe_config: FastMoeConfig
    tracker_configs: TrackerConfigs
    exp_metadata: str | None

    @property
    def experiment_metadata(self) -> dict | None:
        return None if self.exp_metadata is None else json.loads(self.exp_metadata)

    @property
    def file_logger_config(self) -> FileLoggingTrackerConfig:
        return self.tracker_configs.file_logger_config

    @property
    def aim_config(self) -> AimConfig:
        return self.tracker_configs.aim_config


class _ArgumentParser(HfArgumentParser):
    """Raise instead of exiting so that bad flags are reported like any other user error."""

    def error(self, message: str):
        raise UserInputError(message)


_PARSER_DATACLASSES = (
    ModelArguments,
    DataArguments,
    TrainingArguments,
    TrainerControllerArguments,
    LoraConfig,
    PromptTuningConfig,
    Mxfp4Config,
    QuantizedLoraConfig,
    FusedOpsAndKernelsConfig,
    AttentionAndDistributedPackingConfig,
    FastMoeConfig,
    TrackerConfigs,
)


def get_parser() -> HfArgumentParser:
    """The CLI parser: fms-hf-tuning v3.1.0's argument dataclasses and plain flags, this package's aliases, and the
    config of every tracker registered from outside the package."""
    parser = _ArgumentParser(
        (*_PARSER_DATACLASSES, *external_tracker_config_classes().values()),
        description=f"Fine-tune a causal LM. Trackers (--trackers): {', '.join(AVAILABLE_TRACKERS)}.",
    )
    parser.add_argument(
        "--peft_method", type=str.lower, choices=PEFT_METHODS, default=None, help="lora, pt or none (default)."
    )
    parser.add_argument("--use_peft", action="store_true", help="Same as --peft_method lora (the oldest spelling).")
    parser.add_argument(
        "--quantization_method", type=str.lower, choices=QUANTIZATION_METHODS, default=None, help="Not supported."
    )
    parser.add_argument("--alora_invocation_string", default=None, help="Not supported: aLoRA.")
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
    flags = {name: config.pop(name, default) for name, default in _PLAIN_FLAGS.items()}
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


def parse_arguments(
    parser: HfArgumentParser, json_config: dict | None = None, *, args: list[str] | None = None
) -> ParsedArguments:
    """Parse ``json_config`` (same keys as the flags) when given and not empty, else the flags in ``args`` (default:
    the command line's), so that a wrapper hands over its share of the flags without touching ``sys.argv``. What is
    no flag (a leftover command-line string, an unknown job-config key) is ignored with one warning naming it, as
    fms-hf-tuning ignores it (silently there)."""
    if json_config:
        dataclass_args, flags = _parse_job_config(parser, json_config)
    else:
        *dataclass_args, flags, remaining = parser.parse_args_into_dataclasses(args=args, return_remaining_strings=True)
        if remaining:
            logger.warning("ignoring command-line arguments that are no sft_trainer flag: %s", " ".join(remaining))
    own = dataclass_args[: len(_PARSER_DATACLASSES)]
    (model_args, data_args, training_args, controller_args, lora_config, prompt_config, mxfp4_config) = own[:7]
    tracker_configs = own[-1]
    for name, config in zip(external_tracker_config_classes(), dataclass_args[len(_PARSER_DATACLASSES) :], strict=True):
        setattr(tracker_configs, f"{name}_config", config)

    peft_method = flags.peft_method or ("lora" if flags.use_peft else "none")
    if peft_method not in PEFT_METHODS:
        raise UserInputError(f"unknown peft_method {peft_method!r}; choose one of {list(PEFT_METHODS)}")
    if peft_method == "alora" or flags.alora_invocation_string is not None:
        raise UserInputError("--peft_method alora (--alora_invocation_string): aLoRA is not supported by tuning-bench")
    if (flags.quantization_method or "none") != "none":
        raise UserInputError(
            f"--quantization_method {flags.quantization_method}: quantized models are not supported by tuning-bench"
        )
    if changed_fields(mxfp4_config):
        raise UserInputError("--dequantize: MXFP4 quantized models are not supported by tuning-bench")
    tune_config = {"lora": lora_config, "pt": prompt_config}.get(peft_method)
    _warn_unused_peft_flags(peft_method, lora_config, prompt_config)

    for name in ("response_template", "data_formatter_template", "chat_template", "instruction_template"):
        if value := getattr(data_args, name):  # a \\n typed inside shell double quotes means a newline
            setattr(data_args, name, value.replace("\\n", "\n"))
    return ParsedArguments(
        model_args,
        data_args,
        training_args,
        controller_args,
        tune_config,
        None,
        *own[7:11],
        tracker_configs,
        _exp_metadata_json(flags.exp_metadata),
    )


def _warn_unused_peft_flags(peft_method: str, lora_config: LoraConfig, prompt_config: PromptTuningConfig) -> None:
    """Warn about the PEFT flags set away from their defaults that the chosen method ignores."""
    for method, config in (("lora", lora_config), ("pt", prompt_config)):
        ignored = " ".join(f"--{name}" for name in changed_fields(config))
        if ignored and method != peft_method:
            logger.warning("ignoring %s: only for --peft_method %s; this run has %s", ignored, method, peft_method)


def changed_fields(config: Any) -> list[str]:
    """The init fields of dataclass instance ``config`` whose values differ from their declared defaults."""
    changed = []
    for spec in dataclasses.fields(config):
        default = spec.default if spec.default_factory is dataclasses.MISSING else spec.default_factory()
        if spec.init and getattr(config, spec.name) != default:
            changed.append(spec.name)
    return changed


def check_supported(arguments: dict[str, Any]) -> None:
    """Refuse ``train()``'s arguments for features not implemented here (``UNSUPPORTED_FEATURES``), naming them;
    an argument dataclass left at its defaults is no request for the feature."""
    for argument, value in arguments.items():
        if value is None or value == {}:
            continue
        flags = changed_fields(value) if dataclasses.is_dataclass(value) and argument != "quantization_config" else None
        if flags == []:
            continue
        named = f"{argument} (--{', --'.join(flags)})" if flags else argument
        raise UserInputError(f"{named}: {UNSUPPORTED_FEATURES[argument]} is not supported by tuning-bench")


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


def validate_arguments(
    model_args: ModelArguments,
    data_args: DataArguments,
    train_args: TrainingArguments,
    additional_data_handlers: dict | None = None,
) -> None:
    """Cheap checks that fail in seconds, before the tokenizer or the model is loaded (the data config among them:
    its file, datasets, paths and handlers, ``additional_data_handlers`` counted)."""
    for name, feature in UNSUPPORTED_FLAGS.items():
        args = data_args if hasattr(data_args, name) else train_args
        spec = next(spec for spec in dataclasses.fields(args) if spec.name == name)
        if getattr(args, name) != spec.default:
            raise UserInputError(f"--{name} {getattr(args, name)}: not supported by tuning-bench ({feature})")
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
    check_data_arguments(data_args, additional_data_handlers, train_args.packing)
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
    checkpoint = resume_checkpoint(train_args)
    if checkpoint is not None and not os.path.isdir(checkpoint):
        raise UserInputError(f"--resume_from_checkpoint {checkpoint} is not a directory")


def resume_checkpoint(train_args: TrainingArguments) -> str | None:
    """Where training resumes from, as fms-hf-tuning v3.1.0 reads ``--resume_from_checkpoint``: unset or "true", the
    last ``checkpoint-N`` in ``output_dir`` (None when there is none: a fresh start); "false", None; else the path."""
    value = train_args.resume_from_checkpoint
    if value is None or str(value).lower() == "true":
        output_dir = train_args.output_dir
        return get_last_checkpoint(output_dir) if output_dir and os.path.isdir(output_dir) else None
    return None if str(value).lower() == "false" else value


def _attention_implementation(model_args: ModelArguments) -> str:
    if not model_args.use_flash_attn:
        return "sdpa"
    if torch.cuda.is_available() and is_flash_attn_2_available():
        return model_args.flash_attn_implementation
    logger.warning("flash attention 2 is not available here (needs CUDA and flash-attn); using sdpa instead")
    return "sdpa"


def _to_sft_config(train_args: TrainingArguments, max_length: int):
    """TRL needs its own SFTConfig; copy every transformers field so TRL's defaults (bf16, gradient
    checkpointing on) never override what the user asked for. Our datasets come truncated to ``max_length`` with
    fully masked rows dropped: without packing (TRL's only remaining step) TRL is told to make no pass of its own."""
    from trl import SFTConfig

    values = {
        spec.name: getattr(train_args, spec.name)
        for spec in dataclasses.fields(transformers.TrainingArguments)
        if spec.init
    }
    prepared = {"skip_prepare_dataset": not train_args.packing}
    return SFTConfig(**values, max_length=max_length, packing=train_args.packing, dataset_kwargs=prepared)


@removes_data_caches
def train(
    model_args: ModelArguments,
    data_args: DataArguments,
    train_args: TrainingArguments,
    peft_config: LoraConfig | PromptTuningConfig | Any | None = None,
    quantization_config: Mxfp4Config | None = None,
    trainer_controller_args: TrainerControllerArguments | None = None,
    tracker_configs: TrackerConfigs | TrackerConfigFactory | None = DEFAULT_TRACKER_CONFIGS,
    additional_callbacks: list[TrainerCallback] | None = None,
    exp_metadata: dict | None = None,
    quantized_lora_config: QuantizedLoraConfig | None = None,
    fusedops_kernels_config: FusedOpsAndKernelsConfig | None = None,
    attention_and_distributed_packing_config: AttentionAndDistributedPackingConfig | None = None,
    fast_moe_config: FastMoeConfig | None = None,
    additional_data_handlers: dict | None = None,
    *,
    callbacks: list[TrainerCallback] | None = None,
    trackers: list[Tracker] | None = None,
) -> tuple[Any, dict[str, Any], None]:
    """Fine-tune (resuming as ``--resume_from_checkpoint`` says); checkpoints go to ``output_dir`` by
    ``save_strategy``, the final model nowhere (``save()`` writes it). Returns fms-hf-tuning v3.1.0's ``(trainer,
    {"added_tokens_info": ..., "model_load_time": ...}, None)``, the last being the trainer controller it lacks;
    ``(None, None, None)`` with ``--do_dataprocessing_only``, after writing the processed data to ``output_dir``.
    ``additional_data_handlers`` (name → ``DataHandler``) are registered for the data config's handler lists.

    Trackers: built from ``train_args.trackers`` and ``tracker_configs`` unless given as ``trackers``; either way
    their callbacks are installed after ``additional_callbacks`` (a callback already among those is not added again).
    Trackers built here are closed with the failure as their outcome when this raises; the caller closes its own.
    """
    if callbacks is not None and additional_callbacks is not None:
        raise UserInputError("give additional_callbacks or callbacks (the same argument), not both")
    additional_callbacks = list((callbacks if additional_callbacks is None else additional_callbacks) or [])
    tracker_configs = DEFAULT_TRACKER_CONFIGS if tracker_configs is None else tracker_configs
    check_supported(
        {
            "quantization_config": quantization_config,
            "trainer_controller_args": trainer_controller_args,
            "quantized_lora_config": quantized_lora_config,
            "fusedops_kernels_config": fusedops_kernels_config,
            "attention_and_distributed_packing_config": attention_and_distributed_packing_config,
            "fast_moe_config": fast_moe_config,
        }
    )
    handlers = additional_data_handlers
    if handlers is not None and (
        not isinstance(handlers, dict)
        or not all(isinstance(name, str) and isinstance(handler, DataHandler) for name, handler in handlers.items())
    ):
        raise UserInputError(  # v3.1.0's words, which callers match
            "Handler should be of type tuning.data_handler.DataHandler, and name of str: additional_data_handlers "
            f"should be a dict of name to tuning.data.data_handlers.DataHandler, got {handlers!r}"
        )
    if not isinstance(tracker_configs, TrackerConfigs | TrackerConfigFactory):
        raise UserInputError(
            f"tracker configs should adhere to the TrackerConfigs type, got {type(tracker_configs).__name__}"
        )
    wrong = [type(callback).__name__ for callback in additional_callbacks if not isinstance(callback, TrainerCallback)]
    if wrong:
        raise UserInputError(f"additional callbacks should be of type TrainerCallback, got {', '.join(wrong)}")
    if exp_metadata is not None and not isinstance(exp_metadata, dict):
        raise UserInputError(f"exp metadata passed should be a dict with valid json, got {type(exp_metadata).__name__}")
    validate_arguments(model_args, data_args, train_args, additional_data_handlers)
    run = (model_args, data_args, train_args, peft_config, exp_metadata)
    if trackers is not None:  # the caller's: it closes them
        return _train(*run, trackers, additional_callbacks, additional_data_handlers)
    trackers = build_trackers(train_args.trackers, tracker_configs)
    with closed_on_failure(trackers):
        return _train(*run, trackers, additional_callbacks, additional_data_handlers)


def _train(
    model_args: ModelArguments,
    data_args: DataArguments,
    train_args: TrainingArguments,
    peft_config: LoraConfig | PromptTuningConfig | Any | None,
    exp_metadata: dict | None,
    trackers: list[Tracker],
    additional_callbacks: list[TrainerCallback],
    additional_data_handlers: dict | None = None,
) -> tuple[Any, dict[str, Any], None]:
    """``train()`` once its arguments are checked and its trackers built."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tuning.trainer import TuningTrainer

    placed = {id(callback) for callback in additional_callbacks}
    trainer_callbacks = [*additional_callbacks, *(c for c in hf_callbacks(trackers) if id(c) not in placed)]
    if train_args.include_tokens_per_second:  # first: every later callback's final log carries the figure
        trainer_callbacks.insert(0, TokensPerSecondCallback())
    if exp_metadata:
        for tracker in trackers:
            tracker.set_params(exp_metadata, "experiment_metadata")

    tokenizer = AutoTokenizer.from_pretrained(
        model_args.tokenizer_name_or_path or model_args.model_name_or_path, cache_dir=train_args.cache_dir
    )
    special_tokens = {"eos_token": "</s>"} if tokenizer.eos_token is None else {}
    if data_args.add_special_tokens:
        special_tokens["extra_special_tokens"] = list(data_args.add_special_tokens)
    added_tokens = tokenizer.add_special_tokens(special_tokens, replace_extra_special_tokens=False)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    max_length = min(train_args.max_seq_length, tokenizer.model_max_length)

    prepared = prepare_training_datasets(data_args, train_args, tokenizer, max_length, additional_data_handlers)
    if prepared is None:  # --do_dataprocessing_only: the processed data is in output_dir
        logger.info("only data processing was asked for: the datasets are in %s", train_args.output_dir)
        return None, None, None
    train_dataset, eval_dataset = prepared

    load_start = time.time()
    model = AutoModelForCausalLM.from_pretrained(
        model_args.model_name_or_path,
        dtype=get_torch_dtype(model_args.torch_dtype),
        attn_implementation=_attention_implementation(model_args),
        cache_dir=train_args.cache_dir,
    )
    embedding_size = model.get_input_embeddings().weight.shape[0]
    added_tokens_info = {"num_new_tokens": added_tokens, "new_embedding_size": embedding_size}
    if added_tokens or len(tokenizer) > embedding_size:  # a tokenizer (chat data's) with tokens the model lacks
        resized = tokenizer_and_embedding_resize({}, tokenizer, model, model_args.embedding_size_multiple_of)
        # As v3.1.0 reports them: the tokens added, and the rows added to reach the multiple.
        added_tokens_info = {**resized, "num_new_tokens": added_tokens + resized["num_new_tokens"]}
    model_load_time = time.time() - load_start
    for tracker in trackers:
        tracker.track(model_load_time, "model_load_time")

    if train_args.fsdp and train_args.use_cpu:
        logger.warning("accelerate applies FSDP on accelerators only: this CPU run trains with plain DDP")
    if isinstance(peft_config, LoraConfig | PromptTuningConfig):
        peft_config = to_peft_config(peft_config, model_args.tokenizer_name_or_path or model_args.model_name_or_path)
    trainer = TuningTrainer(
        model=model,
        args=_to_sft_config(train_args, max_length),
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=trainer_callbacks,
    )
    trainer.train(resume_from_checkpoint=resume_checkpoint(train_args))
    return trainer, {"added_tokens_info": added_tokens_info, "model_load_time": model_load_time}, None


def save(path: str, trainer, tc_callback: Any = None, log_level: str = "WARNING", args: Any = None) -> None:
    """Write the trained model (or adapter) and its tokenizer to ``path`` (fms-hf-tuning v3.1.0's ``save``;
    ``tc_callback`` and ``args`` are accepted for it, and unused: there is no trainer controller here)."""
    logger.log(logging.getLevelName("WARNING" if log_level == "passive" else log_level.upper()), "saving to %s", path)
    os.makedirs(path, exist_ok=True)
    trainer.save_model(path)


def main() -> int:
    """The CLI: every failure ends in a classified exit status, a termination log line and a stderr marker."""

    def run() -> None:
        args = parse_arguments(get_parser(), get_json_config())
        training_args = args.training_args
        validate_arguments(args.model_args, args.data_args, training_args)
        trackers = build_trackers(training_args.trackers, args.tracker_configs)  # the CLI's, handed to train()
        graceful_stop = GracefulStopCallback()
        with closed_on_failure(trackers):
            trainer, train_info, _ = train(
                args.model_args,
                args.data_args,
                training_args,
                args.tune_config,
                args.quantization_config,
                args.trainer_controller_args,
                args.tracker_configs,
                [graceful_stop],
                args.experiment_metadata,
                args.quantized_lora_config,
                args.fusedops_kernels_config,
                args.attention_and_distributed_packing_config,
                args.fast_moe_config,
                trackers=trackers,
            )
            if graceful_stop.received_signal is not None:
                raise TrainingInterrupted(graceful_stop.received_signal)
        if args.data_args.do_dataprocessing_only:
            return
        if training_args.save_model_dir:
            save(training_args.save_model_dir, trainer, None, training_args.log_level, training_args)
        if isinstance(args.tune_config, LoraConfig):  # as fms-hf-tuning: beside the adapter and in output_dir
            for directory in filter(None, (training_args.save_model_dir, training_args.output_dir)):
                with open(os.path.join(directory, "added_tokens_info.json"), "w", encoding="utf-8") as handle:
                    json.dump(train_info["added_tokens_info"], handle)

    return run_with_error_reporting(run)


if __name__ == "__main__":
    sys.exit(main())
