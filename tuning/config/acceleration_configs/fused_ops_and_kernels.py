"""``--fused_lora`` and ``--fast_kernels`` as in v3.1.0 (``--fused_lora auto_gptq True``, ``--fast_kernels True True
True``): here they load the model with transformers' kernels integration (``use_kernels``), which needs the
``kernels`` library and a CUDA GPU; elsewhere they are refused, naming what is missing."""

from dataclasses import dataclass

from tuning.config.acceleration_configs.utils import flag, nested

FUSED_LORA_BASE_LAYERS = ("auto_gptq", "bitsandbytes")


@dataclass
class FusedLoraConfig:
    base_layer: str | None = None
    fused_lora: bool = False

    def __post_init__(self):
        if self.base_layer is not None and self.base_layer not in FUSED_LORA_BASE_LAYERS:
            raise ValueError(f"base_layer set to invalid value '{self.base_layer}'")
        if self.base_layer is not None and not self.fused_lora:
            raise ValueError(f"base_layer set to '{self.base_layer}' so fused_lora must be set to True")


@dataclass
class FastKernelsConfig:
    fast_loss: bool = False
    fast_rms_layernorm: bool = False
    fast_rope_embeddings: bool = False


@dataclass
class FusedOpsAndKernelsConfig:
    fused_lora: list[str] | None = flag(
        "Fused LoRA kernels (values: base layer, True); through transformers' kernels: needs 'kernels' and a GPU."
    )
    fast_kernels: list[str] | None = flag(
        "Fast loss, RMS norm and RoPE kernels (three switches); through transformers' kernels: needs 'kernels' "
        "and a GPU."
    )

    def __post_init__(self):
        self.fused_lora = nested(FusedLoraConfig, self.fused_lora, "fused_lora")
        self.fast_kernels = nested(FastKernelsConfig, self.fast_kernels, "fast_kernels")
