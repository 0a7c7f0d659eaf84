"""``--fast_moe`` as in v3.1.0: ``--fast_moe 2`` (the expert-parallel degree) or ``--fast_moe True``. Here it loads a
mixture-of-experts model with transformers' grouped-GEMM experts and, with a degree above 1 under torchrun, shards the
experts over that many ranks (``tuning.utils.acceleration``)."""

from dataclasses import dataclass, field

from tuning.config.acceleration_configs.utils import flag, nested


@dataclass
class FastMoe:
    """v3.1.0's parsed ``--fast_moe``: ``ep_degree`` ranks share the experts; ``True`` means degree 1 without
    distributing the experts (``disable_distributed``), as upstream reads it."""

    ep_degree: int | bool = 1
    disable_distributed: bool = field(default=False, metadata={"help": "True when --fast_moe True."})

    def __post_init__(self):
        if isinstance(self.ep_degree, bool):
            self.disable_distributed = self.ep_degree
            self.ep_degree = 1
        if self.ep_degree < 1:
            raise ValueError(f"--fast_moe {self.ep_degree}: the expert-parallel degree is at least 1")


@dataclass
class FastMoeConfig:
    fast_moe: list[str] | None = flag(
        "Mixture-of-experts models: load with grouped-GEMM experts; the value is the expert-parallel degree "
        "(ranks that share the experts, dividing the expert count and the world size), or True (degree 1)."
    )

    def __post_init__(self):
        self.fast_moe = nested(FastMoe, self.fast_moe, "fast_moe")
