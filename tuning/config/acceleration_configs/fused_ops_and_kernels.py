"""``--fused_lora`` and ``--fast_kernels`` (fms-acceleration's kernels), as in v3.1.0."""

from dataclasses import dataclass

from tuning.config.acceleration_configs.utils import unsupported


@dataclass
class FusedOpsAndKernelsConfig:
    fused_lora: list[str] | None = unsupported("fused LoRA kernels")
    fast_kernels: list[str] | None = unsupported("fast loss, RMS norm and RoPE kernels")
