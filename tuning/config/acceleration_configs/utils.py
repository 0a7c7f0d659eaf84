"""What the fms-acceleration argument dataclasses share."""

from dataclasses import field
from typing import Any


def unsupported(feature: str) -> Any:
    """A flag that parses (so that v3.1.0 command lines and job configs are read whole) for a feature that
    ``train()`` refuses when set."""
    return field(default=None, metadata={"help": f"Not supported by tuning-bench: {feature}."})
