"""Argument dataclasses of the sft_trainer CLI, with fms-hf-tuning v3.1.0's field names and defaults and older
names as aliases; every transformers ``TrainingArguments`` flag is available through the subclass below. Flags of
features tuning-bench does not implement parse; ``tuning.config.unsupported`` refuses them, set to anything but
their default, before any model work."""

import logging
from dataclasses import dataclass, field

import torch
import transformers
from transformers.trainer_utils import IntervalStrategy, SaveStrategy

from tuning.config.tracker_configs import FILE_LOGGING_TRACKER, NO_TRACKING
from tuning.errors import UserInputError

logger = logging.getLogger(__name__)


@dataclass
class ModelArguments:
    model_name_or_path: str | None = field(
        default=None, metadata={"help": "Local path (or hub id, when online) of the causal LM to tune."}
    )
    tokenizer_name_or_path: str | None = field(default=None, metadata={"help": "Tokenizer; defaults to the model's."})
    use_flash_attn: bool = field(
        default=True,
        metadata={"help": "Use flash attention 2 when installed on a GPU; falls back to sdpa with a warning."},
    )
    # As in v3.1.0: torch.bfloat16 unless given; a name given on the command line or in a job config stays a string
    # (get_torch_dtype reads both), and Python callers may set a torch.dtype.
    torch_dtype: str = field(default=torch.bfloat16, metadata={"help": "Model dtype: bfloat16, float16 or float32."})
    embedding_size_multiple_of: int = field(
        default=1, metadata={"help": "Resize token embeddings to a multiple of this after adding special tokens."}
    )
    flash_attn_implementation: str = field(
        default="flash_attention_2",
        metadata={"help": "Attention implementation used when --use_flash_attn finds flash attention available."},
    )

    def __post_init__(self):
        if not self.tokenizer_name_or_path:
            self.tokenizer_name_or_path = self.model_name_or_path


@dataclass
class DataArguments:
    training_data_path: str | None = field(
        default=None,
        metadata={
            "help": "Training data: a JSON, JSON lines, Parquet, Arrow or CSV file, a folder of them or a glob.",
            "aliases": ["--data_path"],
        },
    )
    validation_data_path: str | None = field(default=None, metadata={"help": "Validation data (same formats)."})
    dataset_text_field: str | None = field(default=None, metadata={"help": "Record field holding the training text."})
    data_formatter_template: str | None = field(
        default=None,
        metadata={"help": "Template building the text from record fields, e.g. '### Input: {{input}}'."},
    )
    response_template: str | None = field(
        default=None,
        metadata={"help": "Marks where the response starts; the loss covers only what follows it."},
    )
    add_special_tokens: list[str] | None = field(
        default=None, metadata={"help": "Special tokens to add to the tokenizer (the embeddings grow to match)."}
    )
    data_config_path: str | None = field(
        default=None,
        metadata={
            "help": "Data config (YAML/JSON): datasets, their handlers, sampling ratios, splits (docs/cli-and-api.md)."
        },
    )
    chat_template: str | None = field(
        default=None, metadata={"help": "Chat template (Jinja2) replacing the tokenizer's, for chat data."}
    )
    dataset_conversation_field: str | None = field(
        default=None, metadata={"help": "Column holding the chat turns (default: the whole record)."}
    )
    instruction_template: str | None = field(
        default=None,
        metadata={"help": "Chat data: marks where a user turn starts; with --response_template, only replies train."},
    )
    do_dataprocessing_only: bool = field(
        default=False, metadata={"help": "Write the processed datasets to --output_dir as Parquet and exit."}
    )
    num_train_dataset_shards: int = field(
        default=1, metadata={"help": "Parquet shards of --do_dataprocessing_only's train data."}
    )
    num_eval_dataset_shards: int = field(default=1, metadata={"help": "Parquet shards of its validation data."})
    # tuning-bench's own (docs/cli-and-api.md).
    data_cache_dir: str | None = field(
        default=None,
        metadata={
            "help": "Processed-data cache: runs preparing the same rows share them (default "
            "$TUNING_DATA_CACHE_DIR, else tuning-bench/prepared-data beside the datasets cache; 'none': off)."
        },
    )
    data_cache_max_gb: float | None = field(
        default=None,
        metadata={
            "help": "The processed-data cache's size limit in GB: least recently used entries go beyond it "
            "(default $TUNING_DATA_CACHE_MAX_GB, else 50)."
        },
    )
    dataset_num_proc: int | None = field(
        default=None,
        metadata={
            "help": "Processes tokenising the data (default: the cores this process may use, at most 8; data of "
            "fewer than 20,000 texts is tokenised in the process itself)."
        },
    )
    # fms-hf-tuning v3.1.0 flags of features tuning-bench does not implement (tuning.config.unsupported).
    dataset_image_field: str | None = field(
        default=None,
        metadata={
            "help": "The image column of vision-language data (one image or a list per row); the conversations "
            "are in --dataset_text_field (found when not named: messages, conversation, chat or turns)."
        },
    )


@dataclass
class TrainingArguments(transformers.TrainingArguments):
    # Redeclared only to accept the name that fms-hf-tuning era scripts still type.
    eval_strategy: IntervalStrategy | str = field(
        default="no",
        metadata={"help": "Evaluation strategy: no, steps or epoch.", "aliases": ["--evaluation_strategy"]},
    )
    # fms-hf-tuning logs and saves once per epoch unless told otherwise.
    logging_strategy: IntervalStrategy | str = field(default="epoch", metadata={"help": "Logging: no, steps or epoch."})
    save_strategy: SaveStrategy | str = field(default="epoch", metadata={"help": "Saving: no, steps, epoch or best."})
    cache_dir: str | None = field(default=None, metadata={"help": "Cache directory for model loading."})
    max_seq_length: int = field(default=4096, metadata={"help": "Max sequence length, capped at the tokenizer's."})
    packing: bool = field(default=False, metadata={"help": "Pack several examples into each sequence."})
    # transformers 5 folded warmup_ratio into warmup_steps (a float below 1 is a ratio); keep the old flag.
    warmup_ratio: float | None = field(
        default=None, metadata={"help": "Fraction of total steps used for linear warmup (sets warmup_steps)."}
    )
    trackers: list[str] = field(
        default_factory=lambda: [FILE_LOGGING_TRACKER],
        metadata={
            "help": f"Trackers to use, separated by spaces (the list is in the description above); "
            f"{FILE_LOGGING_TRACKER} is always on unless '{NO_TRACKING}' is given alone.",
            "aliases": ["--tracker"],
        },
    )
    save_on_preemption: bool = field(
        default=True,
        metadata={
            "help": "On SIGTERM/SIGINT, write a checkpoint of the step training stops at (unless --save_strategy no), "
            "so that a restart resumes from it (docs/errors.md)."
        },
    )
    # Redeclared so that a bare --resume_from_checkpoint means "true", as the docs' v3.1.0 usage suggests.
    resume_from_checkpoint: str | None = field(
        default=None,
        metadata={
            "help": "Unset or true (also given bare): the newest complete checkpoint in output_dir; false: a fresh "
            "start; else a checkpoint's path.",
            "nargs": "?",
            "const": "true",
        },
    )
    save_model_dir: str | None = field(
        default=None, metadata={"help": "Directory the final model is saved to; unset: no final save."}
    )
    # Removed from transformers 5; fms-hf-tuning callers (IBM ado) still pass it.
    include_tokens_per_second: bool = field(
        default=False,
        metadata={"help": "Add train_tokens_per_second to the final metrics, as transformers 4 computed it."},
    )
    enable_reduce_loss_sum: bool = field(
        default=False,
        metadata={
            "help": "Sum the token losses of each micro-batch instead of averaging them (v3.1.0's experimental loss "
            "reduction, so that every token weighs the same under gradient accumulation)."
        },
    )

    def __post_init__(self):
        if isinstance(self.trackers, str):  # trackers="aim" from Python: one name, not its characters
            self.trackers = [self.trackers]
        # Without an accelerator, transformers 5 trains distributed (torchrun, gloo) only with use_cpu set, and
        # rejects fms-hf-tuning's usual --bf16 True without it: on a CPU-only machine, the CPU is what users mean.
        if not self.use_cpu and not _has_accelerator():
            logger.info("no accelerator found: training on the CPU (use_cpu=True)")
            self.use_cpu = True
        if self.warmup_ratio is not None:
            if not 0 <= self.warmup_ratio < 1:
                raise UserInputError(f"--warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
            self.warmup_steps = self.warmup_ratio
        super().__post_init__()


@dataclass
class TrainerControllerArguments:
    trainer_controller_config_file: str | None = field(
        default=None, metadata={"help": "Not supported: the trainer controller's rules file."}
    )


# Flags of fms-hf-tuning features not implemented here: refused when set to anything but their default.
UNSUPPORTED_FLAGS = {
    "enable_reduce_loss_sum": "sum loss reduction",
}


def _has_accelerator() -> bool:
    import torch
    from transformers.utils import is_torch_xla_available

    return torch.cuda.is_available() or is_torch_xla_available() or torch.accelerator.is_available()
