"""``--fast_moe`` (fms-acceleration's mixture-of-experts kernels), as in v3.1.0."""

from dataclasses import dataclass

from tuning.config.acceleration_configs.utils import unsupported


@dataclass
class FastMoe:
    """v3.1.0's parsed form of ``--fast_moe`` (the expert-parallel degree), for code that builds a ``FastMoeConfig``
    from Python; any ``fast_moe`` set is refused like the flag."""

    ep_degree: int | bool = 1


@dataclass
class FastMoeConfig:
    fast_moe: list[str] | None = unsupported("fast mixture-of-experts kernels")
