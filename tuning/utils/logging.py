"""fms-hf-tuning's ``tuning.utils.logging.set_log_level``: one log level for Python's loggers and transformers'."""

import logging
import os

import transformers

from tuning.utils.error_logging import UserInputError

DEFAULT_LOG_LEVEL = "info"  # v3.1.0's level when neither the flag nor LOG_LEVEL sets one


def set_log_level(logger_name: str = "fms-hf-tuning", level: str | None = None) -> tuple[logging.Logger, str]:
    """Apply ``level`` (transformers' ``--log_level``; "passive" or None: ``LOG_LEVEL`` from the environment, else
    info, as in v3.1.0) to the root logger and to transformers; returns the logger named ``logger_name`` and the level
    used."""
    if level in (None, "passive"):
        level = os.environ.get("TRANSFORMERS_VERBOSITY") or os.environ.get("LOG_LEVEL") or DEFAULT_LOG_LEVEL
    level = level.lower()
    levels = transformers.logging.get_log_levels_dict()
    if level not in levels:
        raise UserInputError(f"--log_level {level}: choose one of {', '.join(levels)} or passive")
    logging.basicConfig(level=levels[level])
    logging.getLogger().setLevel(levels[level])
    transformers.logging.set_verbosity(levels[level])
    return logging.getLogger(logger_name), level
