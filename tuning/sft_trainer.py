"""Supervised fine-tuning of causal LMs on transformers + TRL + PEFT: fms-hf-tuning v3.1.0's ``sft_trainer`` CLI and
Python API (docs/cli-and-api.md). ``main()`` parses, builds the trackers and hands them to ``train(trackers=...)``,
and saves to ``--save_model_dir`` as v3.1.0 does."""

import argparse
import copy
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
    # `python tuning/sft_trainer.py`: import from the repository (the prologue takes the script's folder off the path).
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

if __name__ == "__main__":
    from tuning.prologue import prologue

    early_helpers = prologue(sys.argv[1:], script=__file__ if __package__ in (None, "") else None)

import torch
import transformers
from accelerate.utils import set_seed
from datasets import IterableDataset
from safetensors import SafetensorError, safe_open
from transformers import HfArgumentParser, TrainerCallback
from transformers.utils import is_flash_attn_2_available

from tuning.config.acceleration_configs import (
    AttentionAndDistributedPackingConfig,
    FastMoeConfig,
    FusedOpsAndKernelsConfig,
    QuantizedLoraConfig,
)
from tuning.config.configs import (
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
    check_lora_targets,
    to_peft_config,
)
from tuning.config.tracker_configs import AimConfig, FileLoggingTrackerConfig, TrackerConfigFactory, TrackerConfigs
from tuning.config.unsupported import PLAIN_FLAGS, refuse_unsupported
from tuning.data.cache import removes_data_caches
from tuning.data.data_config import forget_job_data_config
from tuning.data.data_handlers import DataHandler
from tuning.data.labels import check_invocation
from tuning.data.prepared_cache import Preparation
from tuning.data.setup_dataprocessor import (
    check_data_arguments,
    check_vision_arguments,
    data_source,
    prepare_vision_data,
    prepare_with_cache,
)
from tuning.data.tokenizer_utils import tokenizer_and_embedding_resize
from tuning.data.vision import (
    images_per_row,
    is_vision_config,
    is_vision_data_config,
)
from tuning.trackers.tracker import Tracker
from tuning.trackers.tracker_factory import (
    AVAILABLE_TRACKERS,
    build_trackers,
    closed_on_failure,
    external_tracker_config_classes,
    hf_callbacks,
)
from tuning.utils.acceleration import (
    LoadSettings,
    expert_counts,
    load_settings,
    loaded_experts_implementation,
    local_experts,
    name_expert_count,
    world_size,
)
from tuning.utils.checkpoints import (
    COMPLETED_FILE,
    checkpoint_problem,
    clear_run_complete,
    mark_run_complete,
    newest_complete_checkpoint,
    reached_the_end,
    run_completion,
    trained_steps,
    trainer_state,
)
from tuning.utils.config_utils import get_json_config, json_object
from tuning.utils.data_type_utils import get_torch_dtype
from tuning.utils.error_logging import TrainingInterrupted, UserInputError, run_with_error_reporting
from tuning.utils.graceful_stop import GracefulStopCallback
from tuning.utils.prologue import resume_collector
from tuning.utils.sharded_state import ShardedTrainingState, check_resume_layout
from tuning.utils.tokens_per_second import TokensPerSecondCallback

logger = logging.getLogger("tuning.sft_trainer")

# Names from earlier fms-hf-tuning releases and transformers 4, accepted in JSON job configs as on the CLI.
KEY_ALIASES = {"data_path": "training_data_path", "evaluation_strategy": "eval_strategy", "tracker": "trackers"}
# What train() uses when not told otherwise: the file logger with its defaults (fms-hf-tuning's default too).
DEFAULT_TRACKER_CONFIGS = TrackerConfigs()
# Attention implementations that keep the sequences of a padding-free row apart: flash attention by the row's
# position_ids, sdpa and eager by the block-diagonal mask transformers builds from them when no attention mask is given.
PADDING_FREE_ATTENTION = ("flash_attention_2", "flash_attention_3", "sdpa", "eager")
# LoRA's modules on a vision-language model when --target_modules is not given: the language model's attention
# query and value projections (fms-hf-tuning's documented choice for LLaVA and granite-vision), never the vision tower.
VISION_LORA_TARGETS = r".*language_model.*\.(q_proj|v_proj)"
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


def get_parser(*wrapper_dataclasses: type) -> HfArgumentParser:
    """The CLI parser: fms-hf-tuning v3.1.0's argument dataclasses and plain flags, this package's aliases, and the
    config of every tracker registered from outside the package. ``wrapper_dataclasses``: a wrapper's own flags
    (bench_train's), parsed by the same parser; ``parse_arguments_by_type`` hands them back."""
    parser = _ArgumentParser(
        (*_PARSER_DATACLASSES, *external_tracker_config_classes().values(), *wrapper_dataclasses),
        description=f"Fine-tune a causal LM. Trackers (--trackers): {', '.join(AVAILABLE_TRACKERS)}.",
    )
    parser.add_argument(
        "--peft_method", type=str.lower, choices=PEFT_METHODS, default=None, help="lora, pt or none (default)."
    )
    parser.add_argument("--use_peft", action="store_true", help="Same as --peft_method lora (the oldest spelling).")
    parser.add_argument(
        "--quantization_method", type=str.lower, choices=QUANTIZATION_METHODS, default=None, help="Not supported."
    )
    parser.add_argument(
        "--alora_invocation_string",
        default=None,
        help="--peft_method alora: the text whose tokens activate the adapter (peft's alora_invocation_tokens).",
    )
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
    return parse_arguments_by_type(parser, json_config, args=args)[0]


def parse_arguments_by_type(
    parser: HfArgumentParser, json_config: dict | None = None, *, args: list[str] | None = None
) -> tuple[ParsedArguments, dict[type, Any]]:
    """``parse_arguments``, and every dataclass the parser filled keyed by its class (a wrapper's own flags too)."""
    if json_config:
        dataclass_args, flags = _parse_job_config(parser, json_config)
    else:
        try:
            *dataclass_args, flags, remaining = parser.parse_args_into_dataclasses(
                args=args, return_remaining_strings=True
            )
        except ValueError as exc:  # a value a flag's dataclass refuses (--fast_moe 0): its reason names the flag
            raise UserInputError(" ".join(str(exc).split())) from None
        if remaining:
            logger.warning("ignoring command-line arguments that are no sft_trainer flag: %s", " ".join(remaining))
    parsed = dict(zip(parser.dataclass_types, dataclass_args, strict=True))
    model_args, data_args, training_args = parsed[ModelArguments], parsed[DataArguments], parsed[TrainingArguments]
    lora_config, prompt_config, mxfp4_config = parsed[LoraConfig], parsed[PromptTuningConfig], parsed[Mxfp4Config]
    tracker_configs = parsed[TrackerConfigs]
    for name, config_class in external_tracker_config_classes().items():
        setattr(tracker_configs, f"{name}_config", parsed[config_class])

    peft_method = flags.peft_method or ("lora" if flags.use_peft else "none")
    if peft_method not in PEFT_METHODS:
        raise UserInputError(f"unknown peft_method {peft_method!r}; choose one of {list(PEFT_METHODS)}")
    refuse_unsupported(
        model_args=model_args,
        data_args=data_args,
        train_args=training_args,
        trainer_controller_args=parsed[TrainerControllerArguments],
        quantization_config=mxfp4_config if changed_fields(mxfp4_config) else None,
        quantized_lora_config=parsed[QuantizedLoraConfig],
        fusedops_kernels_config=parsed[FusedOpsAndKernelsConfig],
        attention_and_distributed_packing_config=parsed[AttentionAndDistributedPackingConfig],
        fast_moe_config=parsed[FastMoeConfig],
        **{PLAIN_FLAGS: argparse.Namespace(**{**vars(flags), "peft_method": peft_method})},
    )
    tune_config = {"lora": lora_config, "alora": lora_config, "pt": prompt_config}.get(peft_method)
    if peft_method == "alora":  # as v3.1.0: the string rides on the LoRA config; train() turns it into tokens
        if not flags.alora_invocation_string:
            raise UserInputError("--peft_method alora needs --alora_invocation_string (the text that activates it)")
        tune_config.alora_invocation_string = flags.alora_invocation_string
    elif flags.alora_invocation_string is not None:
        logger.warning("ignoring --alora_invocation_string: only for --peft_method alora; this run has %s", peft_method)
    _warn_unused_peft_flags("lora" if peft_method == "alora" else peft_method, lora_config, prompt_config)

    for name in ("response_template", "data_formatter_template", "chat_template", "instruction_template"):
        if value := getattr(data_args, name):  # a \\n typed inside shell double quotes means a newline
            setattr(data_args, name, value.replace("\\n", "\n"))
    arguments = ParsedArguments(
        model_args=model_args,
        data_args=data_args,
        training_args=training_args,
        trainer_controller_args=parsed[TrainerControllerArguments],
        tune_config=tune_config,
        quantization_config=None,
        quantized_lora_config=parsed[QuantizedLoraConfig],
        fusedops_kernels_config=parsed[FusedOpsAndKernelsConfig],
        attention_and_distributed_packing_config=parsed[AttentionAndDistributedPackingConfig],
        fast_moe_config=parsed[FastMoeConfig],
        tracker_configs=tracker_configs,
        exp_metadata=_exp_metadata_json(flags.exp_metadata),
    )
    return arguments, parsed


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


# The attribute of the training arguments holding what validate_arguments passed with them: checked once per job.
VALIDATED_ATTRIBUTE = "_tuning_validated"


def validate_arguments(
    model_args: ModelArguments,
    data_args: DataArguments,
    train_args: TrainingArguments,
    additional_data_handlers: dict | None = None,
) -> None:
    """Cheap checks that fail in seconds, before the tokenizer or the model is loaded (the data config among them:
    its file, datasets, paths and handlers, ``additional_data_handlers`` counted). Once per job: arguments that
    passed, unchanged since, are not checked again (the CLI and bench_train check them before building trackers,
    then ``train()`` is handed them), so that no file header is read twice. The memo travels with the job's own
    ``train_args`` (the very objects that passed, and copies of them as they were), never in this module."""
    arguments = (model_args, data_args, train_args, additional_data_handlers)
    if (memo := vars(train_args).get(VALIDATED_ATTRIBUTE)) is not None:
        checked, as_checked = memo
        if all(a is b for a, b in zip(arguments, checked, strict=True)) and arguments == as_checked:
            return
    _check_arguments(model_args, data_args, train_args, additional_data_handlers)
    vars(train_args).pop(VALIDATED_ATTRIBUTE, None)  # not into the copies
    vars(train_args)[VALIDATED_ATTRIBUTE] = (arguments, tuple(copy.copy(argument) for argument in arguments))


def _check_arguments(
    model_args: ModelArguments,
    data_args: DataArguments,
    train_args: TrainingArguments,
    additional_data_handlers: dict | None,
) -> None:
    refuse_unsupported(model_args=model_args, data_args=data_args, train_args=train_args)
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
    if data_args.dataset_image_field or is_vision_data_config(data_args):
        check_vision_arguments(data_args, train_args, additional_data_handlers)
        check_vision_model(model_args, data_args)
    else:
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
    resume_checkpoint(train_args)


def _model_config(model_args: ModelArguments, cache_dir: str | None = None) -> Any:
    """The model's config, or None where it cannot be read here (a Hub id offline: loading the model says why)."""
    try:
        return transformers.AutoConfig.from_pretrained(model_args.model_name_or_path, cache_dir=cache_dir)
    except (OSError, ValueError):
        return None


def check_vision_model(model_args: ModelArguments, data_args: DataArguments) -> None:
    """Vision data (``--dataset_image_field``, or a data config's multimodal handler) needs a vision-language model:
    refuse a text-only one before anything loads."""
    config = _model_config(model_args)
    if config is not None and not is_vision_config(config):
        asked = (
            f"--dataset_image_field {data_args.dataset_image_field}"
            if data_args.dataset_image_field
            else f"--data_config_path {data_args.data_config_path} (prepare_multimodal_data_processor)"
        )
        raise UserInputError(
            f"{asked}: {model_args.model_name_or_path} is a text-only model ({type(config).__name__}); images need "
            "a vision-language model"
        )


def load_processor(model_args: ModelArguments, cache_dir: str | None = None):
    """The processor of a vision-language model (its tokenizer, image processor and chat template); a user error
    when the model has none."""
    from transformers import AutoProcessor, ProcessorMixin

    path = model_args.tokenizer_name_or_path or model_args.model_name_or_path
    try:
        processor = AutoProcessor.from_pretrained(path, cache_dir=cache_dir)
    except (OSError, ValueError, TypeError) as exc:
        raise UserInputError(
            f"{path}: a vision-language model needs its processor, which fails to load: {exc}"
        ) from exc
    if not isinstance(processor, ProcessorMixin):
        raise UserInputError(
            f"{path}: a vision-language model needs its processor (processor_config.json with an image processor); "
            f"only a {type(processor).__name__} is there"
        )
    return processor


def _resume_choice(train_args: TrainingArguments) -> tuple[str | None, list[tuple[str, str]]]:
    """``resume_checkpoint``'s answer and the newer checkpoints it skipped, each with its problem."""
    value = train_args.resume_from_checkpoint
    if value is None or str(value).lower() == "true":
        return newest_complete_checkpoint(train_args.output_dir) if train_args.output_dir else (None, [])
    if str(value).lower() == "false":
        return None, []
    if not os.path.isdir(value):
        raise UserInputError(f"--resume_from_checkpoint {value} is not a directory")
    if problem := checkpoint_problem(value):
        raise UserInputError(f"--resume_from_checkpoint {value} is not a complete checkpoint: {problem}")
    return value, []


def resume_checkpoint(train_args: TrainingArguments) -> str | None:
    """Where training resumes from, as fms-hf-tuning v3.1.0 reads ``--resume_from_checkpoint``, complete checkpoints
    only (``tuning.utils.checkpoints``): unset or "true", the newest complete ``checkpoint-N`` in ``output_dir`` (None
    when there is none: a fresh start); "false", None; else the path, a user error unless a complete checkpoint."""
    return _resume_choice(train_args)[0]


class FinishedRun(NamedTuple):
    """A job whose output directory says it trained to its final step already: the step, and the one line saying so."""

    global_step: int
    message: str


def finished_run(train_args: TrainingArguments) -> FinishedRun | None:
    """Whether the job has nothing left to train (None: it trains): resuming (``--resume_from_checkpoint`` unset, true
    or a path), the checkpoint it would resume from, or ``output_dir``'s completed mark (``COMPLETED_FILE`` of
    ``tuning.utils.checkpoints``, written when a run trains to its final step) when none is named, got to
    ``--max_steps`` (or past it) or, without it, to the final step of ``--num_train_epochs``. Resuming such a
    checkpoint would train a step beyond the end (transformers takes a step before it checks), replacing the model."""
    value = train_args.resume_from_checkpoint
    if value is not None and str(value).lower() == "false":
        return None
    checkpoint = resume_checkpoint(train_args)
    found = [(trainer_state(checkpoint), os.path.basename(os.path.normpath(checkpoint)))] if checkpoint else []
    if (value is None or str(value).lower() == "true") and (mark := run_completion(train_args.output_dir)):
        found.append((mark, f"its completed mark ({os.path.join(train_args.output_dir, COMPLETED_FILE)})"))
    end = f"--max_steps {train_args.max_steps}" if train_args.max_steps > 0 else "its final step"
    for state, source in found:
        if reached_the_end(state, train_args.max_steps, train_args.num_train_epochs):
            step = state["global_step"]
            return FinishedRun(
                step,
                f"already complete: {train_args.output_dir} holds {source} at step {step}, at or past {end}; "
                "nothing trained (to train again: --resume_from_checkpoint false or another --output_dir)",
            )
    return None


def vision_lora(peft_config: Any) -> Any:
    """A LoRA config for a vision-language model: ``VISION_LORA_TARGETS`` where no --target_modules was given."""
    if isinstance(peft_config, LoraConfig) and peft_config.target_modules is None:
        return dataclasses.replace(peft_config, target_modules=VISION_LORA_TARGETS)
    return peft_config


def _attention_implementation(model_args: ModelArguments, quiet: bool = False) -> str:
    """``--flash_attn_implementation`` with ``--use_flash_attn`` where flash attention 2 can run, else sdpa (with a
    warning unless ``quiet``, when flash attention was asked for)."""
    if not model_args.use_flash_attn:
        return "sdpa"
    if torch.cuda.is_available() and is_flash_attn_2_available():
        return model_args.flash_attn_implementation
    if not quiet:
        logger.warning("flash attention 2 is not available here (needs CUDA and flash-attn); using sdpa instead")
    return "sdpa"


def _to_sft_config(train_args: TrainingArguments, max_length: int, padding_free: bool = False, vision: bool = False):
    """TRL needs its own SFTConfig; copy every transformers field so TRL's defaults (bf16, gradient
    checkpointing on) never override what the user asked for. Our datasets come truncated to ``max_length`` with
    fully masked rows dropped: without packing (TRL's only remaining step) TRL is told to make no pass of its own.
    Padding-free, TRL gets no ``max_length`` (it refuses one without packing, which it would not enforce): the
    rows are truncated already. Vision rows reach the collator raw (messages and images: no column is removed),
    which cuts its batches to ``max_length`` itself (never through image tokens)."""
    from trl import SFTConfig

    values = {
        spec.name: getattr(train_args, spec.name)
        for spec in dataclasses.fields(transformers.TrainingArguments)
        if spec.init
    }
    prepared = {"skip_prepare_dataset": not train_args.packing}
    if vision:
        values["remove_unused_columns"] = False
    return SFTConfig(
        **values,
        max_length=None if padding_free or vision else max_length,
        packing=train_args.packing,
        padding_free=padding_free,
        dataset_kwargs=prepared,
    )


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
    ``save_strategy`` (and at a SIGTERM, ``--save_on_preemption``), the final model nowhere (``save()`` writes it).
    Returns fms-hf-tuning v3.1.0's ``(trainer, {"added_tokens_info": ..., "model_load_time": ...,
    "resumed_from_checkpoint": path or None, "resumed_from_step": global step or None}, None)``, the last being the
    trainer controller it lacks; ``(None, None, None)`` with ``--do_dataprocessing_only``, after writing the processed
    data to ``output_dir``; ``(None, {..., "already_complete": True, "resumed_from_step": N}, None)``, training
    nothing, for a job whose output directory says it finished already (``finished_run``: a rerun, resume on).
    ``additional_data_handlers`` (name → ``DataHandler``) are registered for the data config's
    handler lists.

    Trackers: built from ``train_args.trackers`` and ``tracker_configs`` unless given as ``trackers``; either way
    their callbacks are installed after ``additional_callbacks`` (a callback already among those is not added again).
    Trackers built here are closed with the failure as their outcome when this raises; the caller closes its own.
    """
    resume_collector()  # paused by a training script's prologue for its imports
    if callbacks is not None and additional_callbacks is not None:
        raise UserInputError("give additional_callbacks or callbacks (the same argument), not both")
    additional_callbacks = list((callbacks if additional_callbacks is None else additional_callbacks) or [])
    tracker_configs = DEFAULT_TRACKER_CONFIGS if tracker_configs is None else tracker_configs
    refuse_unsupported(
        peft_config=peft_config,
        quantization_config=quantization_config,
        trainer_controller_args=trainer_controller_args,
        quantized_lora_config=quantized_lora_config,
        fusedops_kernels_config=fusedops_kernels_config,
        attention_and_distributed_packing_config=attention_and_distributed_packing_config,
        fast_moe_config=fast_moe_config,
    )
    check_lora_targets(peft_config, model_args.model_name_or_path)
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
    try:  # the data config, read once for the job's start: the next job with these arguments reads it anew
        validate_arguments(
            model_args, data_args, train_args, additional_data_handlers
        )  # once: not again after the CLI's or bench_train's
        load = load_settings(
            model_args.model_name_or_path,
            train_args.cache_dir,
            peft_config,
            get_torch_dtype(model_args.torch_dtype),
            quantized_lora_config,
            fusedops_kernels_config,
            fast_moe_config,
        )
        padding_free = attention_and_distributed_packing_config is not None and (
            attention_and_distributed_packing_config.is_padding_free
        )
        if padding_free:
            if data_args.dataset_image_field:
                raise UserInputError("--padding_free with --dataset_image_field: vision-language rows are padded")
            check_padding_free(model_args, train_args, peft_config)
        run = (model_args, data_args, train_args, peft_config, exp_metadata)
        if trackers is not None:  # the caller's: it closes them
            return _train(*run, trackers, additional_callbacks, padding_free, additional_data_handlers, load)
        trackers = build_trackers(train_args.trackers, tracker_configs)
        with closed_on_failure(trackers):
            return _train(*run, trackers, additional_callbacks, padding_free, additional_data_handlers, load)
    finally:
        forget_job_data_config(data_args)


def check_padding_free(model_args: ModelArguments, train_args: TrainingArguments, peft_config: Any) -> None:
    """Refuse, before the model loads, what cannot train padding-free correctly (``--padding_free huggingface``)."""
    if train_args.packing:
        raise UserInputError(
            "--padding_free with --packing: padding-free batches are the packing (TRL's collator concatenates the "
            "batch's sequences); give one of them"
        )
    if train_args.use_cache:
        raise UserInputError(
            "--padding_free with --use_cache True: the sequences of a padding-free row are kept apart only "
            "without a KV cache; leave --use_cache off"
        )
    if isinstance(peft_config, PromptTuningConfig) or getattr(peft_config, "is_prompt_learning", False):
        raise UserInputError(
            "--padding_free with --peft_method pt: prompt tuning prepends virtual tokens to each sequence, "
            "which a padding-free row has no place for; use LoRA or full fine-tuning"
        )
    attention = _attention_implementation(model_args, quiet=True)
    if attention not in PADDING_FREE_ATTENTION:
        raise UserInputError(
            f"--padding_free needs an attention implementation that keeps packed sequences apart by their "
            f"position_ids ({', '.join(PADDING_FREE_ATTENTION)}); --flash_attn_implementation gives {attention}"
        )


def _train(
    model_args: ModelArguments,
    data_args: DataArguments,
    train_args: TrainingArguments,
    peft_config: LoraConfig | PromptTuningConfig | Any | None,
    exp_metadata: dict | None,
    trackers: list[Tracker],
    additional_callbacks: list[TrainerCallback],
    padding_free: bool,
    additional_data_handlers: dict | None = None,
    load: LoadSettings | None = None,
) -> tuple[Any, dict[str, Any], None]:
    """``train()`` once its arguments are checked and its trackers built; ``load``: the acceleration flags'
    ``from_pretrained`` keywords."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoTokenizer

    from tuning.trainer import TuningTrainer

    placed = {id(callback) for callback in additional_callbacks}
    trainer_callbacks = [*additional_callbacks, *(c for c in hf_callbacks(trackers) if id(c) not in placed)]
    if train_args.include_tokens_per_second:  # first: every later callback's final log carries the figure
        trainer_callbacks.insert(0, TokensPerSecondCallback())
    if exp_metadata:
        for tracker in trackers:
            tracker.set_params(exp_metadata, "experiment_metadata")

    if not data_args.do_dataprocessing_only and (finished := finished_run(train_args)):
        logger.warning("%s", finished.message)  # before any data is prepared or model loaded
        info = {"added_tokens_info": None, "model_load_time": None, "resumed_from_checkpoint": None}
        return None, {**info, "resumed_from_step": finished.global_step, "already_complete": True}, None

    data_start = time.time()  # the tokenizer (or processor) and the datasets: data preparation, as trackers get it
    config = _model_config(model_args, train_args.cache_dir)
    vision = bool(data_args.dataset_image_field) or (config is not None and is_vision_config(config))
    processor = load_processor(model_args, train_args.cache_dir) if vision else None
    if processor is not None:
        tokenizer = processor.tokenizer
    else:
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

    data_collator = None
    if data_args.dataset_image_field or (vision and is_vision_data_config(data_args)):
        prepared, data_collator = prepare_vision_data(
            data_args, train_args, processor, max_length, images_per_row(config), additional_data_handlers
        )
        if data_args.do_dataprocessing_only:
            prepared = None
        preparation = Preparation("bypass")  # images are read and tokenised batch by batch, by the collator
    else:
        prepared, preparation = prepare_with_cache(
            data_args, train_args, tokenizer, max_length, additional_data_handlers
        )
    for tracker in trackers:
        tracker.track(time.time() - data_start, "data_preparation_time")
        tracker.set_params(preparation.as_dict(), "data_cache")
    if prepared is None:  # --do_dataprocessing_only: the processed data is in output_dir
        logger.info("only data processing was asked for: the datasets are in %s", train_args.output_dir)
        return None, None, None
    train_dataset, eval_dataset = prepared
    peft_config = with_alora_invocation_tokens(peft_config, tokenizer)
    check_alora_rows(peft_config, train_dataset, data_collator, data_source(data_args, "training"))

    checkpoint, skipped = _resume_choice(train_args)  # decided before the model loads
    for folder, problem in skipped:
        logger.warning("skipping %s: %s", folder, problem)
    load = load or LoadSettings()
    layout = {"world_size": world_size(), "ep_degree": load.ep_degree} if load.sharded else None
    resumed_from_step, sharded_resume = None, False
    if checkpoint is not None:
        sharded_resume = check_resume_layout(checkpoint, layout)  # a user error before the model loads
        resumed_from_step = trained_steps(checkpoint)
        logger.warning("resuming from %s (global step %d)", os.path.basename(checkpoint), resumed_from_step)

    # Experts sharded at load time: transformers cannot load a checkpoint into the sharded model, so a resumed run
    # loads it from the checkpoint itself (a whole Hugging Face model: fast MoE checkpoints hold only the model).
    weights_from = checkpoint if checkpoint is not None and load.sharded and peft_config is None else None
    load_start = time.time()
    model_class = AutoModelForImageTextToText if vision else AutoModelForCausalLM
    model = model_class.from_pretrained(
        weights_from or model_args.model_name_or_path,
        dtype=get_torch_dtype(model_args.torch_dtype),
        attn_implementation=_attention_implementation(model_args),
        cache_dir=train_args.cache_dir,
        **load.keywords,
    )
    name_expert_count(model)
    if load.prepare_for_kbit_training:  # --bnb_qlora QUANT True: peft readies the 4-bit model as v3.1.0's TRL did
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(
            model,
            use_gradient_checkpointing=train_args.gradient_checkpointing,
            gradient_checkpointing_kwargs=train_args.gradient_checkpointing_kwargs,
        )
    for tracker in trackers:  # what the loaded model runs, whatever the flags asked (the dump's config says it)
        tracker.set_params({"experts_implementation": loaded_experts_implementation(model)}, "loaded_model")
    if load.sharded:
        logger.warning(
            "--fast_moe %d: rank %s holds %s of the %d experts of each layer",
            load.ep_degree,
            os.environ.get("RANK", "0"),
            local_experts(model),
            expert_counts(model.config)[0],
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
    if vision:
        peft_config = vision_lora(peft_config)
    if isinstance(peft_config, LoraConfig | PromptTuningConfig):
        peft_config = to_peft_config(peft_config, model_args.tokenizer_name_or_path or model_args.model_name_or_path)
    if added_tokens_info["num_new_tokens"] > 0:
        peft_config = with_new_token_rows_trained(peft_config, model)
    sft_config = _to_sft_config(train_args, max_length, padding_free, bool(data_collator))
    sharded_state = None
    if layout is not None:  # transformers saves a model sharded at load time only: its optimizer state is ours
        if sharded_resume or not sft_config.save_only_model:
            sharded_state = ShardedTrainingState(layout, resume_from=checkpoint if sharded_resume else None)
            trainer_callbacks.append(sharded_state)
        sft_config.save_only_model = True
    trainer = TuningTrainer(
        model=model,
        args=sft_config,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        data_collator=data_collator,
        processing_class=processor or tokenizer,
        peft_config=peft_config,
        callbacks=trainer_callbacks,
        save_on_preemption=train_args.save_on_preemption,
        reduce_loss_sum=train_args.enable_reduce_loss_sum,
        weights_from_checkpoint=weights_from,
        safetensors_folders=load.experts_implementation is not None,  # fast MoE, as fms-hf-tuning 3.2
        sharded_state=sharded_state,
    )
    # As fms-hf-tuning 3.2: each rank its own random stream (dropout masks), once the trainer is built.
    set_seed(train_args.seed, device_specific=True)
    if trainer.is_world_process_zero():  # training again: a finished run's mark no longer holds
        clear_run_complete(train_args.output_dir)
    trainer.train(resume_from_checkpoint=checkpoint)
    state = trainer.state
    if trainer.is_world_process_zero() and state.max_steps > 0 and state.global_step >= state.max_steps:
        mark_run_complete(train_args.output_dir, state.global_step, state.max_steps, state.num_train_epochs)
    info = {
        "added_tokens_info": added_tokens_info,
        "model_load_time": model_load_time,
        "resumed_from_checkpoint": checkpoint,
        "resumed_from_step": resumed_from_step,
        "already_complete": False,
    }
    return trainer, info, None


def with_alora_invocation_tokens(peft_config: Any, tokenizer) -> Any:
    """v3.1.0's aLoRA: a LoRA config carrying ``alora_invocation_string`` (``--peft_method alora``) gets the string's
    tokens as peft's ``alora_invocation_tokens`` (a copy: the caller's config stays as given)."""
    text = getattr(peft_config, "alora_invocation_string", None)
    if text is None:
        return peft_config
    tokens = tokenizer.encode(text, add_special_tokens=False) if text else []
    if not tokens:
        raise UserInputError(f"--alora_invocation_string {text!r}: produces no tokens with this tokenizer")
    peft_config = copy.copy(peft_config)
    peft_config.alora_invocation_tokens = tokens
    return peft_config


def check_alora_rows(peft_config: Any, train_dataset: Any, vision_collator: Any, source: str) -> None:
    """aLoRA's adapter acts only from its invocation tokens on: refuse training data where no row holds them as the
    data tokenises them (``tuning.data.labels.check_invocation``; vision rows as the collator renders their text),
    warn how many rows lack them. A streamed dataset is not read ahead."""
    tokens = getattr(peft_config, "alora_invocation_tokens", None)
    if not tokens or train_dataset is None or isinstance(train_dataset, IterableDataset):
        return
    if vision_collator is not None:
        rows = (vision_collator.text_tokens(row) for row in train_dataset)
    else:
        rows = (ids for batch in train_dataset.iter(batch_size=1000) for ids in batch["input_ids"])
    check_invocation(rows, tokens, getattr(peft_config, "alora_invocation_string", None), source)


def with_new_token_rows_trained(peft_config: Any, model) -> Any:
    """A LoRA config that also trains and saves the embedding rows of tokens added to the vocabulary (fms-hf-tuning
    3.2): the input embeddings join ``modules_to_save``, with ``ensure_weight_tying`` where the model ties its output
    embeddings to them (3.2 sets it always; peft warns when there is nothing to tie); untied output embeddings join
    too (3.2 leaves them out), else their new rows would stay random and unsaved. Unchanged when not LoRA, or when
    the embeddings are targeted already."""
    import peft

    if not isinstance(peft_config, peft.LoraConfig):
        return peft_config
    names = {id(module): name.rsplit(".", 1)[-1] for name, module in model.named_modules() if name}
    input_embeddings, output_embeddings = model.get_input_embeddings(), model.get_output_embeddings()
    embedding_names = [names[id(input_embeddings)]]
    tied = output_embeddings is None or output_embeddings.weight is input_embeddings.weight
    if not tied:
        embedding_names.append(names[id(output_embeddings)])
    targets = peft_config.target_modules
    if not isinstance(targets, str) and any(name in (targets or ()) for name in ("embed_tokens", "lm_head")):
        return peft_config
    peft_config = copy.deepcopy(peft_config)  # a caller's config stays as given
    saved = list(peft_config.modules_to_save or [])
    peft_config.modules_to_save = saved + [name for name in embedding_names if name not in saved]
    peft_config.ensure_weight_tying = tied  # the saved copy of the input embeddings is the output one too
    logger.info("new tokens: %s trained in full and saved with the adapter", ", ".join(embedding_names))
    return peft_config


def save(path: str, trainer, tc_callback: Any = None, log_level: str = "WARNING", args: Any = None) -> None:
    """Write the trained model (or adapter) and its tokenizer to ``path`` (fms-hf-tuning v3.1.0's ``save``;
    ``tc_callback`` and ``args`` are accepted for it, and unused: there is no trainer controller here)."""
    logger.log(logging.getLevelName("WARNING" if log_level == "passive" else log_level.upper()), "saving to %s", path)
    os.makedirs(path, exist_ok=True)
    trainer.save_model(path)


def main(early_helpers: Any = None) -> int:
    """The CLI: every failure ends in a classified exit status, a termination log line and a stderr marker.
    ``early_helpers``: the tracker helpers the script's prologue started, for its trackers to adopt."""

    def run() -> None:
        args = parse_arguments(get_parser(), get_json_config())
        training_args = args.training_args
        validate_arguments(args.model_args, args.data_args, training_args)
        # The CLI's trackers, handed to train().
        trackers = build_trackers(training_args.trackers, args.tracker_configs, early_helpers)
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
        if args.data_args.do_dataprocessing_only or train_info["already_complete"]:
            return
        if training_args.save_model_dir:
            save(training_args.save_model_dir, trainer, None, training_args.log_level, training_args)
        if isinstance(args.tune_config, LoraConfig):  # as fms-hf-tuning: beside the adapter and in output_dir
            for directory in filter(None, (training_args.save_model_dir, training_args.output_dir)):
                with open(os.path.join(directory, "added_tokens_info.json"), "w", encoding="utf-8") as handle:
                    json.dump(train_info["added_tokens_info"], handle)

    return run_with_error_reporting(run)


if __name__ == "__main__":
    sys.exit(main(early_helpers))
