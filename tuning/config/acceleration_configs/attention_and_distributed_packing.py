"""``--padding_free`` and ``--multipack``, as in v3.1.0."""

from dataclasses import dataclass

from tuning.config.acceleration_configs.utils import unsupported


@dataclass
class AttentionAndDistributedPackingConfig:
    padding_free: list[str] | None = unsupported("padding-free attention")
    multipack: list[str] | None = unsupported("multipack sampling")
