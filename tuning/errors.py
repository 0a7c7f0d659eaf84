"""The ground floor of failures: the exception types this package raises, the categories every failure is sorted
into and their exit codes (docs/errors.md). Standard library only, so that any module (``tuning.config`` too) can
import it; the classifier, the reports and the termination log are built on it in ``tuning.utils.error_logging``,
which is also where users import these names from (fms-hf-tuning's ``USER_ERROR_EXIT_CODE``...).
"""

import enum
import logging
import os
import signal

logger = logging.getLogger("tuning.utils.error_logging")


class UserInputError(ValueError):
    """A problem with what the user supplied (arguments, files, data): exits with a user-fault code."""


class InputFileNotFoundError(UserInputError, FileNotFoundError):
    """A file the user named is missing or is not a file; ``except FileNotFoundError`` catches it, as upstream's."""


class InputKeyError(UserInputError, KeyError):
    """A key the user named (a text field, a template placeholder) is missing from the data; a ``KeyError``."""

    __str__ = Exception.__str__  # KeyError's quotes its argument, meant to be a bare key; ours is a sentence


class TrainingInterrupted(Exception):
    """Raised after training stopped early on a signal, so the run ends as ``interrupted`` with 128+signal."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(f"training stopped by {signal.Signals(signum).name}")


class SignalInterrupt(BaseException):
    """A stop signal raised in the main thread by ``install_early_signal_handlers``; a ``BaseException``, as
    ``KeyboardInterrupt`` is, so that a library's ``except Exception`` cannot swallow the stop."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(f"stopped by {signal.Signals(signum).name}")


class TrainingStalled(RuntimeError):
    """Raised or reported by a stall watchdog when training makes no progress: category ``hang``."""


class StorageError(OSError):
    """A result (a dump, a checkpoint) could not be written where asked for lack of room: category ``storage``."""


class ErrorCategory(enum.StrEnum):
    """Why a run failed, as reports and termination logs carry it. In order of priority: when several exceptions of
    a chain match, the most specific root cause wins (an OOM wrapped in a ValueError is still an OOM)."""

    GPU_OOM = "gpu_oom"
    HOST_OOM = "host_oom"
    DEVICE_ERROR = "device_error"
    COMMUNICATION = "communication"
    HANG = "hang"
    STORAGE = "storage"
    INTERRUPTED = "interrupted"
    USER_ERROR = "user_error"
    INTERNAL = "internal"


# Reports name an exception by its class's module (``exception_type``): these keep their public home's.
for _public in (
    UserInputError,
    InputFileNotFoundError,
    InputKeyError,
    TrainingInterrupted,
    SignalInterrupt,
    TrainingStalled,
    StorageError,
    ErrorCategory,
):
    _public.__module__ = "tuning.utils.error_logging"

# fms-hf-tuning's two exit codes, kept as the defaults of its two categories.
USER_ERROR_EXIT_CODE = 1
INTERNAL_ERROR_EXIT_CODE = 203

DEFAULT_EXIT_CODES = {
    ErrorCategory.USER_ERROR: USER_ERROR_EXIT_CODE,
    ErrorCategory.INTERNAL: INTERNAL_ERROR_EXIT_CODE,
    ErrorCategory.GPU_OOM: 204,
    ErrorCategory.HOST_OOM: 205,
    ErrorCategory.COMMUNICATION: 206,
    ErrorCategory.DEVICE_ERROR: 207,
    ErrorCategory.HANG: 208,
    ErrorCategory.STORAGE: 209,
    ErrorCategory.INTERRUPTED: 128 + signal.SIGTERM,
}
EXIT_CODE_ENV_PREFIX = "TUNING_EXIT_CODE_"


def exit_code_for(category: ErrorCategory | str, signum: int | None = None) -> int:
    """``TUNING_EXIT_CODE_<CATEGORY>`` if valid, else the default (128+``signum`` for ``interrupted``)."""
    category = ErrorCategory(category)
    low, high = (1, 127) if category is ErrorCategory.USER_ERROR else (128, 254)
    name = EXIT_CODE_ENV_PREFIX + category.name
    raw = os.environ.get(name, "").strip()
    if raw:
        if raw.isdecimal() and low <= int(raw) <= high:
            return int(raw)
        logger.warning("Ignoring %s=%r: it must be an integer from %d to %d", name, raw, low, high)
    if category is ErrorCategory.INTERRUPTED and signum is not None:
        return 128 + int(signum)
    return DEFAULT_EXIT_CODES[category]
