"""Trackers: created by ``main()`` (or a wrapper) and handed to ``train()``.

Shape, following the fms-hf-tuning design discussion: ``main()`` owns configuration and builds trackers from the
registry; ``train()`` receives their callbacks in ``callbacks=[…]`` (it never creates one) and the tracker objects in
``trackers=[…]`` so that it can report metrics that are not trainer logs (``model_load_time``) and the experiment
metadata. A wrapper can therefore replace any tracker with its own subclass without touching ``train()``.
"""

from tuning.trackers.tracker import Tracker, is_main_process
from tuning.trackers.tracker_factory import (
    TrackerSpec,
    available_trackers,
    build_trackers,
    get_tracker,
    register_tracker,
    validate_tracker_names,
)

__all__ = [
    "Tracker",
    "TrackerSpec",
    "available_trackers",
    "build_trackers",
    "get_tracker",
    "is_main_process",
    "register_tracker",
    "validate_tracker_names",
]
