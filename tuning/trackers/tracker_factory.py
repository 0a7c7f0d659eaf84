"""Tracker registry: name → config dataclass + lazily imported implementation.

Backends register a dotted ``module:Class`` path rather than a class so that optional packages (aim) are imported
only when their tracker is requested.
"""

import importlib
from dataclasses import dataclass

from tuning.config.tracker_configs import AimConfig, FileLoggingTrackerConfig, MLflowConfig, TrackerConfigFactory
from tuning.trackers.tracker import Tracker
from tuning.utils.error_logging import UserInputError

NO_TRACKING = "none"


@dataclass(frozen=True)
class TrackerSpec:
    config_class: type
    implementation: str  # "module:Class"
    extra: str | None = None  # pip extra providing the optional backend


_REGISTRY: dict[str, TrackerSpec] = {}


def register_tracker(name: str, spec: TrackerSpec) -> None:
    _REGISTRY[name] = spec


register_tracker(
    "file_logger", TrackerSpec(FileLoggingTrackerConfig, "tuning.trackers.filelogging_tracker:FileLoggingTracker")
)
register_tracker("aim", TrackerSpec(AimConfig, "tuning.trackers.aimstack_tracker:AimStackTracker", extra="aim"))
register_tracker("mlflow", TrackerSpec(MLflowConfig, "tuning.trackers.mlflow_tracker:MLflowTracker", extra="mlflow"))


def tracker_config_classes() -> list[type]:
    """Every registered tracker's config dataclass, in registration order: the parser reads their flags."""
    return [spec.config_class for spec in _REGISTRY.values()]


def tracker_configs_from(configs: list) -> TrackerConfigFactory:
    """The parsed configs (in ``tracker_config_classes`` order) as one ``TrackerConfigFactory``; a tracker registered
    from outside this package gets its ``<name>_config`` attribute too."""
    factory = TrackerConfigFactory()
    for name, config in zip(_REGISTRY, configs, strict=True):
        setattr(factory, f"{name}_config", config)
    return factory


def available_trackers() -> list[str]:
    return sorted(_REGISTRY)


def validate_tracker_names(names: list[str]) -> list[str]:
    """Return the requested tracker names, deduplicated; ``none`` means no tracking at all."""
    requested = list(dict.fromkeys(name.strip().lower() for name in names))
    if NO_TRACKING in requested:
        if len(requested) > 1:
            raise UserInputError(f"--trackers {NO_TRACKING} cannot be combined with other trackers: {names}")
        return []
    unknown = [name for name in requested if name not in _REGISTRY]
    if unknown:
        raise UserInputError(f"unknown tracker(s) {unknown}; available: {available_trackers() + [NO_TRACKING]}")
    return requested


def _implementation(name: str) -> type:
    spec = _REGISTRY[name]
    module_name, class_name = spec.implementation.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        hint = f"pip install 'tuning-bench[{spec.extra}]'" if spec.extra else "reinstall tuning-bench"
        raise UserInputError(f"tracker '{name}' needs a package that is not installed ({exc}); run: {hint}") from exc
    return getattr(module, class_name)


def get_tracker(name: str, tracker_configs: TrackerConfigFactory, output_dir: str) -> Tracker:
    """Instantiate one tracker from its section of ``tracker_configs``."""
    config = getattr(tracker_configs, f"{name}_config", None) or _REGISTRY[name].config_class()
    return _implementation(name)(config, output_dir)


def build_trackers(names: list[str], tracker_configs: TrackerConfigFactory, output_dir: str) -> list[Tracker]:
    """Create every requested tracker; raises before any model work when a name or package is wrong."""
    return [get_tracker(name, tracker_configs, output_dir) for name in validate_tracker_names(names)]
