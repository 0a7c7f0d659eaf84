"""The tracker interface every backend implements."""

import functools
import numbers
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from tuning.utils.error_logging import SignalInterrupt, TrainingInterrupted

if TYPE_CHECKING:  # importing transformers takes seconds; tuning.trackers stays light without it
    from transformers import TrainerCallback

_LOG_PREFIXES = ("train_", "eval_", "test_")
# The backends the trackers' helper children run (``python -m tuning.trackers.helper_child module:Class``): each
# tracker names its own, and the registry the ones the prologue starts early, both from here, which the child's own
# module is not (it runs as __main__).
AIM_BACKEND = "tuning.trackers.aim_writer:AimBackend"
MLFLOW_BACKEND = "tuning.trackers.mlflow_writer:MlflowBackend"

# A run's status, the job's outcome, as MLflow names them (Aim records the same word as the run's ``status`` param).
FINISHED, FAILED, KILLED = "FINISHED", "FAILED", "KILLED"


def run_status(error: BaseException | None) -> str:
    """The status of a run whose job ended with ``error`` (None: it succeeded): a stop signal or Ctrl-C is
    ``KILLED``, ``SystemExit(0)`` ``FINISHED``, anything else ``FAILED``."""
    if error is None or (isinstance(error, SystemExit) and error.code in (0, None)):
        return FINISHED
    return KILLED if isinstance(error, KeyboardInterrupt | SignalInterrupt | TrainingInterrupted) else FAILED


def is_main_process() -> bool:
    """True on global rank 0 (or without torchrun): trackers act there only, so a job makes one tracker run."""
    return int(os.environ.get("RANK", "0")) == 0


@functools.cache  # trainers log the same few keys at every step, so each is named once
def _series_name(key: str) -> tuple[str, dict[str, str]]:
    """Log key → (series name, context)."""
    for prefix in _LOG_PREFIXES:
        if key.startswith(prefix):
            return key[len(prefix) :], {"subset": prefix[:-1]}
    return key, {}


def log_series(logs: dict[str, Any]) -> Iterator[tuple[str, dict[str, str], float]]:
    """The numbers of a trainer log as ``(series name, context, value)``, named the way every tracker names them:
    ``train_``/``eval_``/``test_`` prefixes become ``{"subset": ...}``. The contexts are shared between calls: read
    them, never change them. Runs at every logging step, hence the fast path for plain floats and ints."""
    for key, value in logs.items():
        kind = type(value)
        if kind is not float and kind is not int and (kind is bool or not isinstance(value, numbers.Real)):
            continue
        name, context = _series_name(key)
        yield name, context, value


class Tracker:
    """A tracking backend (``name`` as registered, ``config`` its config dataclass): a trainer callback plus a side
    channel for extra data. ``track`` and ``set_params`` may come before training starts (``model_load_time``): a
    backend whose run only exists once training begins must buffer them."""

    name: str = "base"
    callback: "TrainerCallback | None" = None

    def __init__(self, name: str | None = None, tracker_config: Any = None) -> None:
        if name is not None:
            self.name = name
        self.config = tracker_config

    def get_hf_callback(self) -> "TrainerCallback | None":
        """The tracker's trainer callback (the same object at every call); None when the backend needs none."""
        return self.callback

    def track(self, metric: float, name: str, stage: str = "additional_metrics") -> None:
        """Record one scalar that is not part of the trainer's logs."""

    def set_params(self, params: dict, name: str = "experiment_metadata") -> None:
        """Attach a dict of searchable parameters to the run."""

    def close(self, status: str = FINISHED) -> None:
        """End the run with ``status`` (``FINISHED``, ``FAILED`` or ``KILLED``), if the end of training has not; a
        backend whose callback ends its run at train end needs nothing more."""
