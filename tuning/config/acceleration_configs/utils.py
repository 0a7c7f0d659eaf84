"""What the fms-acceleration argument dataclasses share."""

import dataclasses
import typing
from argparse import ArgumentTypeError
from dataclasses import field
from typing import Any

# The words HfArgumentParser reads as booleans (the parser, which the config floor does not import, uses them too).
_TRUE_WORDS, _FALSE_WORDS = ("yes", "true", "t", "y", "1"), ("no", "false", "f", "n", "0")


def string_to_bool(text: str) -> bool:
    """A flag's boolean word as HfArgumentParser reads it; ArgumentTypeError for another word."""
    if text.lower() in _TRUE_WORDS:
        return True
    if text.lower() in _FALSE_WORDS:
        return False
    raise ArgumentTypeError(f"a boolean expected (yes/no, true/false, t/f, y/n, 1/0), got {text!r}")


def unsupported(feature: str) -> Any:
    """A flag that parses (so that v3.1.0 command lines and job configs are read whole) for a feature that
    ``train()`` refuses when set."""
    return field(default=None, metadata={"help": f"Not supported by tuning-bench: {feature}."})


def flag(help_text: str) -> Any:
    """A flag whose values (``--name v1 v2 ...``) become the fields, in order, of a v3.1.0 nested dataclass."""
    return field(default=None, metadata={"help": help_text})


def bool_or_int(value: Any) -> int | bool:
    """v3.1.0's reading of a value that is a count or a switch: ``"2"`` → 2, ``"true"`` → True; a signed number
    (``"-2"``) is a count too, for its own check to refuse by what it is."""
    if isinstance(value, bool | int):
        return value
    text = str(value).strip()
    if text.lstrip("+-").isdigit():
        return int(text)
    try:
        return string_to_bool(text)
    except ArgumentTypeError:
        raise ArgumentTypeError(f"a number or a boolean (true/false, yes/no...) expected, got {text!r}") from None


def nested(cls: type, values: Any, flag: str) -> Any:
    """``values`` (a flag's strings, a job config's list or scalar, or the dataclass itself) as an instance of the
    v3.1.0 dataclass ``cls``, each value read as its field's type; None stays None. A value it refuses raises
    ValueError naming ``--flag`` and the values, with v3.1.0's reason."""
    if values is None or isinstance(values, cls):
        return values
    values = list(values) if isinstance(values, list | tuple) else [values]
    hints = typing.get_type_hints(cls)
    specs = [spec for spec in dataclasses.fields(cls) if spec.init][: len(values)]
    try:
        return cls(*(_cast(hints[spec.name], value) for spec, value in zip(specs, values, strict=False)))
    except (ValueError, ArgumentTypeError) as exc:
        raise ValueError(f"--{flag} {' '.join(map(str, values))}: {exc}") from exc


def _cast(kind: Any, value: Any) -> Any:
    if kind is bool:
        return value if isinstance(value, bool) else string_to_bool(str(value))
    if kind == int | bool:
        return bool_or_int(value)
    if kind is int:
        return int(value)
    return value
