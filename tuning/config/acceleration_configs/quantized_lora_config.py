"""``--auto_gptq`` and ``--bnb_qlora`` (fms-acceleration's quantized LoRA), as in v3.1.0."""

from dataclasses import dataclass

from tuning.config.acceleration_configs.utils import unsupported


@dataclass
class QuantizedLoraConfig:
    auto_gptq: list[str] | None = unsupported("quantized LoRA on auto_gptq base layers")
    bnb_qlora: list[str] | None = unsupported("quantized LoRA on bitsandbytes base layers")
