"""Tracker registry: name → config dataclass + a ``module:Class`` path, imported only when its tracker is requested
(so that optional packages such as aim are too)."""

import contextlib
import pkgutil
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tuning.config.tracker_configs import (
    FILE_LOGGING_TRACKER,
    NO_TRACKING,
    AimConfig,
    FileLoggingTrackerConfig,
    MLflowConfig,
    TrackerConfigFactory,
    TrackerConfigs,
)
from tuning.trackers.tracker import (  # what each tracker's helper process runs
    AIM_BACKEND,
    MLFLOW_BACKEND,
    Tracker,
    run_status,
)
from tuning.utils.error_logging import UserInputError

if TYPE_CHECKING:  # importing transformers takes seconds; the registry stays light without it
    from transformers import TrainerCallback

    from tuning.trackers.helper_transport import EarlyHelpers

TRACKER_FLAGS = ("--trackers", "--tracker")
AIMSTACK_TRACKER = "aim"
MLFLOW_TRACKER = "mlflow"

AVAILABLE_TRACKERS: list[str] = []  # every registered name, in registration order


@dataclass(frozen=True)
class TrackerSpec:
    config_class: type
    implementation: str  # "module:Class", constructed with the tracker's config
    extra: str | None = None  # pip extra providing the optional backend
    helper: str | None = None  # "module:Class" its helper process runs (tuning.trackers.isolated), if it has one


_REGISTRY: dict[str, TrackerSpec] = {}


def register_tracker(name: str, spec: TrackerSpec) -> None:
    """Add a tracker: its flags are parsed from ``spec.config_class`` (``TrackerConfigs`` holds those of this
    package's trackers) and its parsed config is the ``<name>_config`` attribute of the parsed ``TrackerConfigs``
    and of ``TrackerConfigFactory`` (a field for this package's trackers)."""
    if name not in _REGISTRY:
        AVAILABLE_TRACKERS.append(name)
    _REGISTRY[name] = spec


register_tracker(
    FILE_LOGGING_TRACKER,
    TrackerSpec(FileLoggingTrackerConfig, "tuning.trackers.filelogging_tracker:FileLoggingTracker"),
)
register_tracker(
    AIMSTACK_TRACKER,
    TrackerSpec(
        AimConfig,
        "tuning.trackers.aimstack_tracker:AimStackTracker",
        extra="aim",
        helper=AIM_BACKEND,
    ),
)
register_tracker(
    MLFLOW_TRACKER,
    TrackerSpec(
        MLflowConfig,
        "tuning.trackers.mlflow_tracker:MLflowTracker",
        extra="mlflow",
        helper=MLFLOW_BACKEND,
    ),
)


def tracker_config_classes() -> dict[str, type]:
    """Each registered tracker's config dataclass, by tracker name."""
    return {name: spec.config_class for name, spec in _REGISTRY.items()}


def external_tracker_config_classes() -> dict[str, type]:
    """The config dataclasses of trackers registered from outside this package, by tracker name: the parser's
    sections beside ``TrackerConfigs``, which has the flags of this package's own."""
    return {name: config for name, config in tracker_config_classes().items() if config not in _OWN_CONFIG_CLASSES}


_OWN_CONFIG_CLASSES = (FileLoggingTrackerConfig, AimConfig, MLflowConfig)


def validate_tracker_names(names: list[str] | None) -> list[str]:
    """The trackers a job runs: the requested names, deduplicated, always with the file logger first; ``["none"]``
    alone means no tracking at all. An unknown name is a user error (a ``ValueError``)."""
    requested = list(dict.fromkeys(name.strip().lower() for name in names or []))
    if NO_TRACKING in requested:
        if len(requested) > 1:
            raise UserInputError(f"--trackers {NO_TRACKING} cannot be combined with other trackers: {names}")
        return []
    for name in names or []:
        _spec(name)  # an unknown name is reported as typed
    return list(dict.fromkeys([FILE_LOGGING_TRACKER, *requested]))


def _spec(name: str) -> TrackerSpec:
    if (spec := _REGISTRY.get(name.strip().lower())) is None:
        hint = f" (separate tracker names with spaces: --trackers {' '.join(name.split(','))})" if "," in name else ""
        raise UserInputError(
            f"Requested Tracker {name} not found. Available trackers: "
            f"{', '.join(AVAILABLE_TRACKERS + [NO_TRACKING])}{hint}"
        )
    return spec


def start_helpers(argv: list[str]) -> "EarlyHelpers":
    """Start now the helper processes of the trackers that the command line ``argv`` asks for (``--trackers aim
    mlflow``, ``--tracker=aim``), for those trackers to adopt when built: a script calls it first thing, so that Aim
    or MLflow loads in its helper while the script imports torch, instead of beside the first training steps.
    Returns them, for ``build_trackers``/``build_tracker`` (``early_helpers=``) to hand to the trackers they build.
    Names it does not know, and trackers asked for elsewhere (a job config), start their helper when built."""
    from tuning.trackers.helper_transport import EarlyHelpers  # light, but it imports this package: not at its top

    early_helpers = EarlyHelpers()
    for name in dict.fromkeys(_named_trackers(argv)):
        if (spec := _REGISTRY.get(name.strip().lower())) is not None and spec.helper:
            early_helpers.start(spec.helper)
    return early_helpers


def _named_trackers(argv: list[str]) -> Iterator[str]:
    """The values of every ``--trackers``/``--tracker`` flag in ``argv``, as the trainer's parser reads them."""
    values = False
    for token in argv:
        flag, equals, value = token.partition("=")
        if flag in TRACKER_FLAGS:
            values = not equals
            if equals:
                yield value
        elif token.startswith("-"):
            values = False
        elif values:
            yield token


def tracker_sections(tracker_configs: TrackerConfigs | TrackerConfigFactory | None) -> TrackerConfigFactory | None:
    """Each tracker's config section: ``TrackerConfigs`` (v3.1.0) split up, a ``TrackerConfigFactory`` as it is."""
    return tracker_configs.as_factory() if isinstance(tracker_configs, TrackerConfigs) else tracker_configs


def get_tracker(name: str, tracker_configs: TrackerConfigs | TrackerConfigFactory | None) -> Tracker:
    """One tracker, configured from ``tracker_configs`` (its ``<name>_config`` section; its defaults when that is
    unset). Raises a ``ValueError`` (a user error) for an unknown name, a missing package or a bad config."""
    return build_tracker(name, tracker_configs)


def build_tracker(
    name: str,
    tracker_configs: TrackerConfigs | TrackerConfigFactory | None,
    early_helpers: "EarlyHelpers | None" = None,
) -> Tracker:
    """``get_tracker``; a tracker with a helper process gets its backend from here and adopts its helper from
    ``early_helpers`` (``start_helpers``'s) when one waits there."""
    spec, name = _spec(name), name.strip().lower()
    try:
        implementation = pkgutil.resolve_name(spec.implementation)
    except ImportError as exc:
        hint = f"pip install 'tuning-bench[{spec.extra}]'" if spec.extra else "reinstall tuning-bench"
        raise UserInputError(f"tracker '{name}' needs a package that is not installed ({exc}); run: {hint}") from exc
    section = getattr(tracker_sections(tracker_configs), f"{name}_config", None)
    helper: dict[str, Any] = {"helper": spec.helper, "early_helpers": early_helpers} if spec.helper else {}
    return implementation(section or spec.config_class(), **helper)


@contextlib.contextmanager
def closed_on_failure(trackers: list[Tracker]) -> Iterator[None]:
    """Whatever the block raises ends each tracker's run with that outcome (``FAILED``, or ``KILLED`` for a stop
    signal) and its helper process with it, instead of leaving them to the interpreter's exit."""
    try:
        yield
    except BaseException as error:
        for tracker in trackers:
            tracker.close(run_status(error))
        raise


def build_trackers(
    names: list[str] | None,
    tracker_configs: TrackerConfigs | TrackerConfigFactory | None,
    early_helpers: "EarlyHelpers | None" = None,
) -> list[Tracker]:
    """The trackers of ``validate_tracker_names(names)``, built before any model work (bad input fails early); when
    one cannot be built, those built before it are closed. ``early_helpers``: the helpers ``start_helpers`` started,
    for the trackers to adopt."""
    sections = tracker_sections(tracker_configs)
    trackers: list[Tracker] = []
    with closed_on_failure(trackers):
        for name in validate_tracker_names(names):
            trackers.append(build_tracker(name, sections, early_helpers))
    return trackers


def hf_callbacks(trackers: list[Tracker]) -> list["TrainerCallback"]:
    return [callback for tracker in trackers if (callback := tracker.get_hf_callback()) is not None]
