"""Trackers: ``train()`` builds one per requested name (the file logger always among them), unless its caller built
them and hands them in with ``trackers=[…]``; either way ``train()`` installs their callbacks (after the caller's
own) and they receive ``model_load_time`` and the experiment metadata, so a wrapper can swap in its own subclass.
"""

from tuning.trackers.tracker import FAILED, FINISHED, KILLED, Tracker, run_status
from tuning.trackers.tracker_factory import (
    AIMSTACK_TRACKER,
    MLFLOW_TRACKER,
    TrackerSpec,
    build_tracker,
    build_trackers,
    closed_on_failure,
    get_tracker,
    hf_callbacks,
    register_tracker,
    start_helpers,
    validate_tracker_names,
)

__all__ = [
    "AIMSTACK_TRACKER",
    "FAILED",
    "FINISHED",
    "KILLED",
    "MLFLOW_TRACKER",
    "Tracker",
    "TrackerSpec",
    "build_tracker",
    "build_trackers",
    "closed_on_failure",
    "get_tracker",
    "hf_callbacks",
    "register_tracker",
    "run_status",
    "start_helpers",
    "validate_tracker_names",
]
