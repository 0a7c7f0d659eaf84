"""PEFT argument dataclasses with fms-hf-tuning v3.1.0's flags, converted to peft configs by
:func:`to_peft_config`."""

from dataclasses import dataclass, field
from typing import Any, Literal

from tuning.errors import UserInputError

PEFT_METHODS = ("lora", "pt", "none", "alora")  # alora: LoRA with peft's alora_invocation_tokens
QUANTIZATION_METHODS = ("mxfp4", "none")  # mxfp4 parses, and is refused as unsupported


def _flag(help_text: str, default: Any = None) -> Any:
    return field(default=default, metadata={"help": help_text})


@dataclass
class LoraConfig:
    """``peft.LoraConfig``'s fields that a command line can give, with fms-hf-tuning's defaults (alpha 32,
    dropout 0.05); each is handed to peft as given."""

    r: int = _flag("LoRA rank.", 8)
    lora_alpha: int = _flag("LoRA scaling alpha.", 32)
    target_modules: list[str] | None = _flag(
        "Module names to adapt, or 'all-linear'; unset: peft's choice for the model's architecture."
    )
    exclude_modules: list[str] | None = _flag("Module names not to adapt.")
    lora_dropout: float = _flag("LoRA dropout.", 0.05)
    fan_in_fan_out: bool = _flag("The layers store weights as (fan_in, fan_out), as GPT-2's Conv1D does.", False)
    bias: Literal["none", "all", "lora_only"] = _flag("Which biases to train: none, all or lora_only.", "none")
    use_rslora: bool = _flag("Rank-stabilised LoRA scaling (alpha / sqrt(r)).", False)
    modules_to_save: list[str] | None = _flag("Modules trained in full and saved beside the adapter.")
    init_lora_weights: bool = _flag("Initialise B to zero, so that the adapter starts as a no-op.", True)
    layers_to_transform: list[int] | None = _flag("Indexes of the only layers to adapt.")
    layers_pattern: list[str] | None = _flag("Name of the layer list that --layers_to_transform indexes.")
    trainable_token_indices: list[int] | None = _flag("Token ids whose embeddings are trained.")
    use_dora: bool = _flag("Weight-decomposed LoRA (DoRA).", False)
    lora_bias: bool = _flag("Train a bias in LoRA's B matrix.", False)
    target_parameters: list[str] | None = _flag("Parameter names to adapt (for parameters outside nn.Linear).")


@dataclass
class PromptTuningConfig:
    prompt_tuning_init: str = _flag("TEXT or RANDOM initialisation.", "TEXT")
    num_virtual_tokens: int = _flag("Number of virtual tokens.", 8)
    prompt_tuning_init_text: str = _flag(
        "Text the virtual tokens start from when --prompt_tuning_init TEXT.",
        "Classify if the tweet is a complaint or not:",
    )


@dataclass
class Mxfp4Config:
    dequantize: bool = _flag("Not supported: MXFP4 quantized models (--quantization_method mxfp4).", True)


EMBEDDING_MODULES = ("embed_tokens", "lm_head")


def touches_embeddings(config: Any) -> bool:
    """Whether a LoRA config (ours or peft's) adapts or fully trains the input or output embeddings."""
    named = [*(getattr(config, "modules_to_save", None) or []), *_listed(getattr(config, "target_modules", None))]
    return any(name in EMBEDDING_MODULES for name in named)


def _listed(targets: Any) -> list[str]:
    return [] if targets is None or isinstance(targets, str) else list(targets)


def check_lora_targets(config: Any, model_name_or_path: str | None = None) -> None:
    """TRL 1.x computes the loss from ``lm_head.weight`` directly, so it refuses a LoRA adapter on ``lm_head`` once
    the model has loaded: refused here first, in one line, with what to do instead. That includes ``embed_tokens``
    of a model that ties its embeddings (its config read, not its weights), since keeping them tied (fms-hf-tuning
    3.2's ``ensure_weight_tying``) puts the same adapter on ``lm_head``."""
    targets = _listed(getattr(config, "target_modules", None))
    instead = "train the embeddings in full with --modules_to_save embed_tokens (kept tied) instead"
    if "lm_head" in targets:
        raise UserInputError(
            "--target_modules lm_head: TRL computes the loss from lm_head.weight directly, so it refuses a LoRA "
            f"adapter on lm_head; leave it out, or {instead}"
        )
    if "embed_tokens" in targets and model_name_or_path and _ties_embeddings(model_name_or_path):
        raise UserInputError(
            f"--target_modules embed_tokens: {model_name_or_path} ties lm_head to embed_tokens, so keeping them "
            "tied puts the adapter on lm_head too, which TRL refuses (it computes the loss from lm_head.weight "
            f"directly); leave embed_tokens out, or {instead}"
        )


def _ties_embeddings(model_name_or_path: str) -> bool:
    """Whether the model's config ties its output embeddings to its input ones (False when it cannot be read)."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(model_name_or_path)
    except (OSError, ValueError):
        return False
    return bool(getattr(config.get_text_config(), "tie_word_embeddings", False))


def to_peft_config(config: LoraConfig | PromptTuningConfig, tokenizer_name_or_path: str | None):
    """Translate our CLI dataclass into the peft library's config."""
    import peft

    task = peft.TaskType.CAUSAL_LM
    if isinstance(config, LoraConfig):
        targets = "all-linear" if config.target_modules == ["all-linear"] else config.target_modules
        fields = {name: value for name, value in vars(config).items() if name != "alora_invocation_string"}
        converted = peft.LoraConfig(**{**fields, "target_modules": targets}, task_type=task)
        if touches_embeddings(converted):
            # As fms-hf-tuning 3.2: a model that ties its output embeddings to its input ones keeps them tied while
            # training and in the saved adapter (peft ignores it, with a warning, for a model without tied weights).
            converted.ensure_weight_tying = True
        return converted
    init = peft.PromptTuningInit[config.prompt_tuning_init.upper()]
    return peft.PromptTuningConfig(
        **{**vars(config), "prompt_tuning_init": init}, tokenizer_name_or_path=tokenizer_name_or_path, task_type=task
    )
