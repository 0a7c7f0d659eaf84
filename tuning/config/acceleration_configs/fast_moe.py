"""``--fast_moe`` as in v3.1.0: ``--fast_moe 2`` (the expert-parallel degree) or ``--fast_moe True``; ``--fast_moe
False`` is off, as if not given. Here it loads a
mixture-of-experts model with transformers' grouped-GEMM experts and, with a degree above 1 under torchrun, shards the
experts over that many ranks (``tuning.utils.acceleration``)."""

from argparse import ArgumentTypeError
from dataclasses import dataclass, field
from typing import Any

from tuning.config.acceleration_configs.utils import bool_or_int, flag, nested


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
            raise ValueError("the expert-parallel degree is at least 1 (or True)")


@dataclass
class FastMoeConfig:
    fast_moe: list[str] | None = flag(
        "Mixture-of-experts models: load with grouped-GEMM experts; the value is the expert-parallel degree "
        "(ranks that share the experts, dividing the expert count and the world size), or True (degree 1)."
    )

    def __post_init__(self):
        values = self.fast_moe if isinstance(self.fast_moe, list | tuple) else [self.fast_moe]
        if len(values) == 1 and _switched_off(values[0]):  # --fast_moe False: the feature off, as not given
            self.fast_moe = None
        self.fast_moe = nested(FastMoe, self.fast_moe, "fast_moe")


def _switched_off(value: Any) -> bool:
    """``value`` is a boolean False (``False``, ``"false"``, ``"no"``...), not the count 0 (refused as a degree)."""
    try:
        return bool_or_int(value) is False
    except (ValueError, ArgumentTypeError):
        return False
