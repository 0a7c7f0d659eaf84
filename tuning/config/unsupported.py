"""The one rule for features tuning-bench does not implement: every flag it accepts changes the training as it says,
or the job is refused (``UserInputError``, exit 1) before the model loads. ``UNSUPPORTED`` is the table (one row per
flag, docs/cli-and-api.md's "Not supported" lists the same flags) and ``refuse_unsupported`` the one function that
applies it; ``parse_arguments``, ``validate_arguments`` and ``train()`` each call it with what they hold, so that
every entry point (CLI, ``train()``, bench_train, sweeps) refuses the same flags with the same message, whichever way
the configs travel. A feature that becomes supported loses its row here, and its flag then reaches ``train()``.
"""

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

from tuning.config.acceleration_configs import needs
from tuning.errors import UserInputError

# ``Unsupported.value`` when any value but the flag's default asks for the feature.
ANY_BUT_DEFAULT = "<any but the default>"
# Where the parser's plain flags (beside its dataclasses) are handed to ``refuse_unsupported``.
PLAIN_FLAGS = "flags"


class Unsupported(NamedTuple):
    """One refused flag: ``name`` is a field of the argument ``where`` (a ``train()`` keyword, or ``PLAIN_FLAGS``)
    and, except for fields of ``peft_config``, also the command-line flag ``--name``. A row with ``missing`` refuses
    only where that function names something the feature needs and this machine lacks (a library, a GPU), and its
    message names it; ``example`` is a command line's value that asks for the feature (for the docs and tests)."""

    feature: str
    name: str
    where: str
    value: Any = ANY_BUT_DEFAULT  # the value that asks for the feature
    missing: Callable[[], list[str]] | None = None
    example: tuple[str, ...] = ()

    def refuses_here(self) -> bool:
        """Whether this machine refuses the row: always, or when something it needs is missing."""
        return self.missing is None or bool(self.missing())


UNSUPPORTED: tuple[Unsupported, ...] = (
    Unsupported("GPTQ LoRA", "auto_gptq", "quantized_lora_config", missing=needs.gptq_missing, example=("triton_v2",)),
    Unsupported("QLoRA", "bnb_qlora", "quantized_lora_config", missing=needs.bitsandbytes_missing, example=("nf4",)),
    Unsupported(
        "fused LoRA kernels",
        "fused_lora",
        "fusedops_kernels_config",
        missing=needs.kernels_missing,
        example=("auto_gptq", "True"),
    ),
    Unsupported(
        "fast loss, RMS norm and RoPE kernels",
        "fast_kernels",
        "fusedops_kernels_config",
        missing=needs.kernels_missing,
        example=("True", "True", "True"),
    ),
    Unsupported("multipack sampling", "multipack", "attention_and_distributed_packing_config", example=("16",)),
    Unsupported("MXFP4 quantized models", "quantization_method", PLAIN_FLAGS, "mxfp4"),
    Unsupported("MXFP4 quantized models", "dequantize", "quantization_config"),
    Unsupported("the trainer controller", "trainer_controller_config_file", "trainer_controller_args"),
)
# ``train()`` keywords that ask for a feature by being given at all (not None, not empty).
UNSUPPORTED_KEYWORDS = {
    "quantization_config": "MXFP4 quantized models",
}
# Arguments that are always there and hold supported flags too: never refused as a whole.
_GENERAL = {"model_args", "data_args", "train_args", "peft_config", PLAIN_FLAGS}


def refuse_unsupported(**arguments: Any) -> None:
    """Raise ``UserInputError`` for the first argument that asks for a feature of ``UNSUPPORTED`` or
    ``UNSUPPORTED_KEYWORDS``: ``--name value: feature is not supported by tuning-bench``. ``arguments``: ``train()``'s
    keywords by name and/or ``PLAIN_FLAGS``, an object with the parser's plain flags; those not given are not checked.
    An argument dataclass left at its defaults asks for nothing; a keyword of unsupported features given as anything
    but its dataclass is refused as a whole."""
    for row in UNSUPPORTED:
        holder = arguments.get(row.where)
        if holder is None:
            continue
        if not hasattr(holder, row.name):
            if row.where not in _GENERAL and not dataclasses.is_dataclass(holder):
                features = sorted({other.feature for other in UNSUPPORTED if other.where == row.where})
                raise UserInputError(f"{row.where}: {' and '.join(features)} is not supported by tuning-bench")
            continue
        value = getattr(holder, row.name)
        if not _asks_for(row, holder, value):
            continue
        if row.missing is None:
            raise UserInputError(f"{_shown(row, value)}: {row.feature} is not supported by tuning-bench")
        if missing := row.missing():
            raise UserInputError(
                f"{_shown(row, value)}: {row.feature} is not supported by tuning-bench without "
                f"{' and '.join(missing)}, which this machine lacks"
            )
    for keyword, feature in UNSUPPORTED_KEYWORDS.items():
        if arguments.get(keyword) not in (None, {}):
            raise UserInputError(f"{keyword}: {feature} is not supported by tuning-bench")


def _asks_for(row: Unsupported, holder: Any, value: Any) -> bool:
    if row.value != ANY_BUT_DEFAULT:
        return str(value).lower() == row.value
    return value != default_of(holder, row.name)


def default_of(holder: Any, name: str) -> Any:
    """The declared default of field ``name`` of dataclass ``holder``; None for anything else (the plain flags)."""
    if dataclasses.is_dataclass(holder):
        for spec in dataclasses.fields(holder):
            if spec.name == name:
                return spec.default if spec.default_factory is dataclasses.MISSING else spec.default_factory()
    return None


def _shown(row: Unsupported, value: Any) -> str:
    """The argument as its user wrote it: ``--name value`` (a list's items separated by spaces)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):  # a parsed v3.1.0 flag: its fields' values
        value = _flag_values(value)
    text = " ".join(map(str, value)) if isinstance(value, list | tuple) else str(value)
    name = f"{row.where}.{row.name}" if row.where == "peft_config" else f"--{row.name}"
    return f"{name} {text}"


def _flag_values(parsed: Any) -> list[Any]:
    """The values of a parsed v3.1.0 flag as written: its fields in order, without trailing ones left at their
    defaults (``--bnb_qlora nf4``), the first always."""
    specs = [spec for spec in dataclasses.fields(parsed) if spec.init]
    values = [getattr(parsed, spec.name) for spec in specs]
    while len(values) > 1 and values[-1] == default_of(parsed, specs[len(values) - 1].name):
        values.pop()
    return values


def refused_flags() -> list[str]:
    """The command-line flags the rule refuses, in table order."""
    return [row.name for row in UNSUPPORTED if row.where != "peft_config"]
