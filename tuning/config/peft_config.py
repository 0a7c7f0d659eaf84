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


def to_peft_config(config: LoraConfig | PromptTuningConfig | None, tokenizer_name_or_path: str | None):
    """Translate our CLI dataclass into the peft library's config (None for full fine-tuning)."""
    if config is None:
        return None
    import peft

    if isinstance(config, LoraConfig):
        targets = config.target_modules
        if targets == ["all-linear"]:
            targets = "all-linear"
        return peft.LoraConfig(
            r=config.r,
            lora_alpha=config.lora_alpha,
            target_modules=targets,
            lora_dropout=config.lora_dropout,
            task_type=peft.TaskType.CAUSAL_LM,
        )
    return peft.PromptTuningConfig(
        prompt_tuning_init=peft.PromptTuningInit[config.prompt_tuning_init.upper()],
        num_virtual_tokens=config.num_virtual_tokens,
        prompt_tuning_init_text=config.prompt_tuning_init_text,
        tokenizer_name_or_path=tokenizer_name_or_path,
        task_type=peft.TaskType.CAUSAL_LM,
    )
