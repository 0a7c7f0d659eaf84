"""``--padding_free`` and ``--multipack``, as in v3.1.0: the flags parse into v3.1.0's ``PaddingFree`` and
``MultiPack``. Padding-free training is TRL's own (``SFTConfig(padding_free=True)``); multipack is refused."""

from dataclasses import dataclass, field, is_dataclass

from tuning.config.acceleration_configs.utils import nested, unsupported

PADDING_FREE_METHODS = ("huggingface",)


@dataclass
class PaddingFree:
    """How padding-free batches are made: ``huggingface``, the only method, i.e. TRL's collator and transformers'
    masks for packed ``position_ids``."""

    method: str = "huggingface"

    def __post_init__(self):
        if self.method not in PADDING_FREE_METHODS:
            raise ValueError(f"--padding_free {self.method}: only 'huggingface' method currently supported.")


@dataclass
class MultiPack:
    """fms-acceleration's multipack sampler (its number of processes); refused by ``train()``."""

    num_processes: int = 16


@dataclass
class AttentionAndDistributedPackingConfig:
    """The flags take v3.1.0's values (``--padding_free huggingface``, ``--multipack 16``); ``padding_free``
    becomes a ``PaddingFree`` once parsed, ``multipack`` a ``MultiPack`` (refused whatever it holds); Python callers
    may give ``PaddingFree`` and ``MultiPack`` directly. (The fields are annotated with what the
    parser reads: it takes one type per flag.)"""

    padding_free: list[str] | None = field(
        default=None,
        metadata={
            "help": "Train padding-free: the batch's sequences are concatenated into one row, without pad tokens "
            "(value: huggingface; needs sdpa, eager or flash attention, no --packing, no prompt tuning)."
        },
    )
    multipack: list[str] | None = unsupported("multipack sampling")

    def __post_init__(self):
        if self.padding_free is not None and not is_dataclass(self.padding_free):
            self.padding_free = PaddingFree(*_as_list(self.padding_free))
        self.multipack = nested(MultiPack, self.multipack, "multipack")

    @property
    def is_padding_free(self) -> bool:
        return self.padding_free is not None

    @property
    def is_multipack(self) -> bool:
        return self.multipack is not None


def _as_list(value) -> list:
    """A flag's values: a job config may give one value instead of a list."""
    return list(value) if isinstance(value, list | tuple) else [value]
