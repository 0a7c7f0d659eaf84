"""``--auto_gptq`` and ``--bnb_qlora`` as in v3.1.0 (``--bnb_qlora nf4``, ``--auto_gptq triton_v2``): LoRA on a
quantised base model, through transformers' own quantisers (bitsandbytes; GPTQ through gptqmodel)."""

from dataclasses import dataclass

from tuning.config.acceleration_configs.utils import flag, nested

BNB_QUANT_TYPES = ("nf4", "fp4")


@dataclass
class AutoGPTQLoraConfig:
    """A GPTQ-quantised checkpoint (``from_quantized``) trained with LoRA; ``kernel`` as v3.1.0 accepts it."""

    kernel: str = "triton_v2"
    from_quantized: bool = True

    def __post_init__(self):
        if self.kernel != "triton_v2":
            raise ValueError("only 'triton_v2' kernel currently supported.")
        if not self.from_quantized:
            raise ValueError("only 'from_quantized' == True currently supported.")


@dataclass
class BNBQLoraConfig:
    """The base model loaded 4-bit by bitsandbytes (``quant_type`` nf4 or fp4, double quantisation), LoRA on top."""

    quant_type: str = "nf4"
    no_peft_model: bool = False

    def __post_init__(self):
        if self.quant_type not in BNB_QUANT_TYPES:
            raise ValueError("quant_type can only be either 'nf4' or 'fp4'.")


@dataclass
class QuantizedLoraConfig:
    auto_gptq: list[str] | None = flag(
        "LoRA on a GPTQ-quantised checkpoint (value: triton_v2); needs gptqmodel, optimum and a CUDA GPU."
    )
    bnb_qlora: list[str] | None = flag(
        "QLoRA: load the base model 4-bit with bitsandbytes (value: nf4 or fp4), LoRA on top; needs the 'qlora' extra."
    )

    def __post_init__(self):
        self.auto_gptq = nested(AutoGPTQLoraConfig, self.auto_gptq, "auto_gptq")
        self.bnb_qlora = nested(BNBQLoraConfig, self.bnb_qlora, "bnb_qlora")
