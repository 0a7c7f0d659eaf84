"""fms-hf-tuning v3.1.0's fms-acceleration argument dataclasses, with its module paths, names and flags
(``--padding_free huggingface``, ``--multipack 16``, ``--fast_moe 1``...). The flags parse so that v3.1.0 command
lines and job configs are read whole; ``tuning.config.unsupported`` refuses the features tuning-bench does not have."""

from tuning.config.acceleration_configs.attention_and_distributed_packing import AttentionAndDistributedPackingConfig
from tuning.config.acceleration_configs.fast_moe import FastMoeConfig
from tuning.config.acceleration_configs.fused_ops_and_kernels import FusedOpsAndKernelsConfig
from tuning.config.acceleration_configs.quantized_lora_config import QuantizedLoraConfig

__all__ = [
    "AttentionAndDistributedPackingConfig",
    "FastMoeConfig",
    "FusedOpsAndKernelsConfig",
    "QuantizedLoraConfig",
]
