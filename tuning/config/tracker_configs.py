"""Tracker configs. ``TrackerConfigs`` is fms-hf-tuning v3.1.0's one dataclass for every tracker (its fields are CLI
flags and JSON job-config keys); ``FileLoggingTrackerConfig``, ``AimConfig`` and ``MLflowConfig`` are each tracker's
own section, held by ``TrackerConfigFactory`` (the 2.x way to configure trackers) as ``<tracker name>_config``.
``TrackerConfigs.as_factory()`` turns the first into the second; trackers are built from the sections."""

from dataclasses import dataclass, field, fields
from typing import Any

DEFAULT_EXPERIMENT = "fms-hf-tuning"
DEFAULT_AIM_EXPERIMENT = DEFAULT_EXPERIMENT  # the 2.x name
# Tracker names that argument defaults need; the registry of every tracker is tuning.trackers.tracker_factory.
FILE_LOGGING_TRACKER = "file_logger"
NO_TRACKING = "none"
_MLFLOW_URI_HELP = (
    "Where MLflow runs go: a local directory (holding the sqlite store DIR/mlflow.db), sqlite:///path.db, or "
    "http://host:port of an mlflow server; MLFLOW_TRACKING_URI when unset (one of the two is required)."
)


def _flag(help_text: str, default: Any = None) -> Any:
    return field(default=default, metadata={"help": help_text})


def _close_timeout(tracker: str) -> Any:
    return _flag(
        f"Seconds {tracker} may go without progress (run creation, a write, the final close) before it is given up "
        "(training goes on, tracking stops).",
        default=30.0,
    )


def server_url(ip: str | None, port: int | str | None) -> str | None:
    """``aim://ip:port/`` when both parts are given (the port as an int or a string), else None."""
    return f"aim://{ip}:{port}/" if ip and port not in (None, "") else None


@dataclass
class FileLoggingTrackerConfig:
    training_logs_filename: str = _flag(
        "File in output_dir receiving one JSON line per logged loss.", "training_logs.jsonl"
    )


@dataclass
class AimConfig:
    experiment: str | None = _flag(f"Aim experiment name; {DEFAULT_AIM_EXPERIMENT} when unset.")
    aim_repo: str | None = _flag("Local Aim repository directory (created if missing).")
    aim_remote_server_ip: str | None = _flag("Remote Aim server host.")
    aim_remote_server_port: int | None = _flag("Remote Aim server port.")
    aim_url: str | None = _flag("Remote Aim server as aim://host:port; default: from the server ip and port.")
    aim_run_id_export_path: str | None = _flag("Directory for aim_tracker.json (the run hash); default output_dir.")
    aim_system_tracking_interval: int | None = _flag("Seconds between Aim's own system-metric samples; unset: none.")
    aim_close_timeout: float = _close_timeout("Aim")

    def __post_init__(self):
        if self.experiment is None:
            self.experiment = DEFAULT_AIM_EXPERIMENT
        if self.aim_url is None:
            self.aim_url = server_url(self.aim_remote_server_ip, self.aim_remote_server_port)


@dataclass
class MLflowConfig:
    mlflow_experiment: str | None = _flag("MLflow experiment name (created if missing); MLflow's Default when unset.")
    mlflow_tracking_uri: str | None = _flag(_MLFLOW_URI_HELP)
    mlflow_run_uri_export_path: str | None = _flag(
        "Directory for mlflow_tracker.json (run id and URI); default output_dir."
    )
    mlflow_close_timeout: float = _close_timeout("MLflow")


@dataclass
class TrackerConfigFactory:
    file_logger_config: FileLoggingTrackerConfig = field(default_factory=FileLoggingTrackerConfig)
    aim_config: AimConfig = field(default_factory=AimConfig)
    mlflow_config: MLflowConfig = field(default_factory=MLflowConfig)


@dataclass
class TrackerConfigs:
    """fms-hf-tuning v3.1.0's tracker flags, v3.1.0's defaults and post-init, plus this package's own (timeouts,
    Aim's system tracking, per-tracker export paths). ClearML and the resource scanner are not implemented here;
    their fields are kept so that v3.1.0 job configs parse."""

    experiment: str | None = _flag("Experiment name of every tracker unless its own is set.", DEFAULT_EXPERIMENT)
    run_uri_export_path: str | None = _flag(
        "Directory for each tracker's <name>_tracker.json (its run id or URI); default output_dir."
    )
    aim_experiment: str | None = _flag("Aim experiment name; --experiment when unset.")
    aim_repo: str | None = _flag("Local Aim repository directory (created if missing).")
    aim_remote_server_ip: str | None = _flag("Remote Aim server host.")
    aim_remote_server_port: int | None = _flag("Remote Aim server port.")
    aim_url: str | None = _flag("Remote Aim server as aim://host:port; default: from the server ip and port.")
    mlflow_experiment: str | None = _flag("MLflow experiment name (created if missing); --experiment when unset.")
    mlflow_tracking_uri: str | None = _flag(_MLFLOW_URI_HELP)
    clearml_project: str | None = _flag("ClearML project (no ClearML tracker in tuning-bench).", DEFAULT_EXPERIMENT)
    clearml_task: str | None = _flag("ClearML task (no ClearML tracker in tuning-bench).", "SFTTrainer")
    scanner_output_filename: str | None = _flag(
        "Resource scanner output (no such tracker in tuning-bench).", "scanner_output.json"
    )
    training_logs_filename: str = _flag(
        "File in output_dir receiving one JSON line per logged loss.", "training_logs.jsonl"
    )
    aim_run_id_export_path: str | None = _flag("Directory for aim_tracker.json; --run_uri_export_path when unset.")
    mlflow_run_uri_export_path: str | None = _flag(
        "Directory for mlflow_tracker.json; --run_uri_export_path when unset."
    )
    aim_system_tracking_interval: int | None = _flag("Seconds between Aim's own system-metric samples; unset: none.")
    aim_close_timeout: float = _close_timeout("Aim")
    mlflow_close_timeout: float = _close_timeout("MLflow")

    def __post_init__(self):
        if self.experiment is not None:
            self.aim_experiment = self.aim_experiment or self.experiment
            self.mlflow_experiment = self.mlflow_experiment or self.experiment
            self.clearml_task = self.clearml_task or self.experiment
        if self.aim_remote_server_ip is not None and self.aim_remote_server_port is not None:
            self.aim_url = server_url(self.aim_remote_server_ip, self.aim_remote_server_port)

    @property
    def file_logger_config(self) -> FileLoggingTrackerConfig:
        """The 2.x section, built from these flags (a copy: set the flags, not its fields)."""
        return self.as_factory().file_logger_config

    @property
    def aim_config(self) -> AimConfig:
        """The 2.x section, built from these flags (a copy: set the flags, not its fields)."""
        return self.as_factory().aim_config

    @property
    def mlflow_config(self) -> MLflowConfig:
        """The 2.x section, built from these flags (a copy: set the flags, not its fields)."""
        return self.as_factory().mlflow_config

    def as_factory(self) -> TrackerConfigFactory:
        """Each tracker's section, filled from these flags; sections of trackers registered from outside the package
        (set here as ``<name>_config`` attributes) come along."""
        factory = TrackerConfigFactory(
            FileLoggingTrackerConfig(self.training_logs_filename),
            AimConfig(
                experiment=self.aim_experiment,
                aim_repo=self.aim_repo,
                aim_remote_server_ip=self.aim_remote_server_ip,
                aim_remote_server_port=self.aim_remote_server_port,
                aim_url=self.aim_url,
                aim_run_id_export_path=self.aim_run_id_export_path or self.run_uri_export_path,
                aim_system_tracking_interval=self.aim_system_tracking_interval,
                aim_close_timeout=self.aim_close_timeout,
            ),
            MLflowConfig(
                mlflow_experiment=self.mlflow_experiment,
                mlflow_tracking_uri=self.mlflow_tracking_uri,
                mlflow_run_uri_export_path=self.mlflow_run_uri_export_path or self.run_uri_export_path,
                mlflow_close_timeout=self.mlflow_close_timeout,
            ),
        )
        own = {spec.name for spec in fields(self)}
        for name, value in vars(self).items():
            if name not in own and name.endswith("_config"):
                setattr(factory, name, value)
        return factory
