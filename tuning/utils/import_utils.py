"""Whether optional packages are installed (fms-hf-tuning v3.1.0's ``tuning.utils.import_utils``)."""

import importlib.util


def is_fms_accelerate_available(plugins: str | list[str] | None = None) -> bool:
    """fms-acceleration (and each named ``fms_acceleration_<plugin>``) is importable. tuning-bench runs none of its
    plugins; v3.1.0's tests use this to skip the cases that need them."""
    names = ["fms_acceleration"]
    if plugins is not None:
        names += [f"fms_acceleration_{plugin}" for plugin in ([plugins] if isinstance(plugins, str) else plugins)]
    return all(importlib.util.find_spec(name) is not None for name in names)
