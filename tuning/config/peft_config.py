"""PEFT argument dataclasses, converted to peft configs by :func:`to_peft_config`."""

from dataclasses import dataclass, field

PEFT_METHODS = ("lora", "pt", "none")


@dataclass
class LoraConfig:
    r: int = field(default=8, metadata={"help": "LoRA rank."})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA scaling alpha."})
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "v_proj"],
        metadata={"help": "Module names to adapt, or 'all-linear'."},
    )
    lora_dropout: float = field(default=0.05, metadata={"help": "LoRA dropout."})


@dataclass
class PromptTuningConfig:
    prompt_tuning_init: str = field(default="TEXT", metadata={"help": "TEXT or RANDOM initialisation."})
    num_virtual_tokens: int = field(default=8, metadata={"help": "Number of virtual tokens."})
    prompt_tuning_init_text: str = field(
        default="Classify if the tweet is a complaint or not:",
        metadata={"help": "Text the virtual tokens start from when --prompt_tuning_init TEXT."},
    )


def to_peft_config(config: LoraConfig | PromptTuningConfig, tokenizer_name_or_path: str | None):
    """Translate our CLI dataclass into the peft library's config."""
    import peft

    task = peft.TaskType.CAUSAL_LM
    if isinstance(config, LoraConfig):
        targets = "all-linear" if config.target_modules == ["all-linear"] else config.target_modules
        return peft.LoraConfig(**{**vars(config), "target_modules": targets}, task_type=task)
    init = peft.PromptTuningInit[config.prompt_tuning_init.upper()]
    return peft.PromptTuningConfig(
        **{**vars(config), "prompt_tuning_init": init}, tokenizer_name_or_path=tokenizer_name_or_path, task_type=task
    )
