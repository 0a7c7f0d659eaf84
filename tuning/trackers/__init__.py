"""Trackers: built from ``train_args.trackers`` and the tracker configs, by ``train()`` or by its caller.

Shape, following the fms-hf-tuning design discussion: ``train()`` builds one tracker per requested name (the file
logger always among them) and installs their callbacks, unless its caller (``main()``, a wrapper) built the trackers
itself and hands them in with ``trackers=[…]``; then the caller places their callbacks. Either way the trackers
receive the metrics that are not trainer logs (``model_load_time``) and the experiment metadata, so a wrapper can
replace any tracker with its own subclass without touching ``train()``.
"""

from tuning.trackers.tracker import Tracker, is_main_process
from tuning.trackers.tracker_factory import (
    AIMSTACK_TRACKER,
    AVAILABLE_TRACKERS,
    FILE_LOGGING_TRACKER,
    MLFLOW_TRACKER,
    NO_TRACKING,
    TrackerSpec,
    build_trackers,
    get_tracker,
    hf_callbacks,
    register_tracker,
    validate_tracker_names,
)

__all__ = [
    "AIMSTACK_TRACKER",
    "AVAILABLE_TRACKERS",
    "FILE_LOGGING_TRACKER",
    "MLFLOW_TRACKER",
    "NO_TRACKING",
    "Tracker",
    "TrackerSpec",
    "build_trackers",
    "get_tracker",
    "hf_callbacks",
    "is_main_process",
    "register_tracker",
    "validate_tracker_names",
]
