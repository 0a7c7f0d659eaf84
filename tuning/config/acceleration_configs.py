"""fms-hf-tuning v3.1.0's fms-acceleration argument dataclasses, with its names and flags (``--padding_free
huggingface``, ``--multipack 16``, ``--fast_moe 1``...). tuning-bench has none of these features: the flags parse so
that v3.1.0 command lines and job configs are read whole, and ``tuning.config.unsupported`` refuses any of them set."""

from dataclasses import dataclass, field
from typing import Any


def _unsupported(feature: str) -> Any:
    return field(default=None, metadata={"help": f"Not supported by tuning-bench: {feature}."})


@dataclass
class QuantizedLoraConfig:
    auto_gptq: list[str] | None = _unsupported("quantized LoRA on auto_gptq base layers")
    bnb_qlora: list[str] | None = _unsupported("quantized LoRA on bitsandbytes base layers")


@dataclass
class FusedOpsAndKernelsConfig:
    fused_lora: list[str] | None = _unsupported("fused LoRA kernels")
    fast_kernels: list[str] | None = _unsupported("fast loss, RMS norm and RoPE kernels")


@dataclass
class AttentionAndDistributedPackingConfig:
    padding_free: list[str] | None = _unsupported("padding-free attention")
    multipack: list[str] | None = _unsupported("multipack sampling")


@dataclass
class FastMoeConfig:
    fast_moe: list[str] | None = _unsupported("fast mixture-of-experts kernels")
