"""Tracker config dataclasses, one per tracker registered in ``tuning.trackers.tracker_factory``: each field is a CLI
flag and a JSON job-config key, and ``TrackerConfigFactory`` holds each as ``<tracker name>_config``."""

from dataclasses import dataclass, field
from typing import Any

DEFAULT_AIM_EXPERIMENT = "fms-hf-tuning"


def _flag(help_text: str, default: Any = None) -> Any:
    return field(default=default, metadata={"help": help_text})


def _close_timeout(tracker: str) -> Any:
    return _flag(
        f"Seconds {tracker} may go without progress (run creation, a write, the final close) before it is given up "
        "(training goes on, tracking stops).",
        default=30.0,
    )


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
    aim_run_id_export_path: str | None = _flag(
        "Directory for aimstack_tracker.json (the run hash); default output_dir."
    )
    aim_system_tracking_interval: int | None = _flag("Seconds between Aim's own system-metric samples; unset: none.")
    aim_close_timeout: float = _close_timeout("Aim")

    def __post_init__(self):
        if self.experiment is None:
            self.experiment = DEFAULT_AIM_EXPERIMENT
        if self.aim_url is None:
            self.aim_url = server_url(self.aim_remote_server_ip, self.aim_remote_server_port)


def server_url(ip: str | None, port: int | str | None) -> str | None:
    """``aim://ip:port/`` when both parts are given (the port as an int or a string), else None."""
    return f"aim://{ip}:{port}/" if ip and port not in (None, "") else None


@dataclass
class MLflowConfig:
    mlflow_experiment: str | None = _flag("MLflow experiment name (created if missing); MLflow's Default when unset.")
    mlflow_tracking_uri: str | None = _flag(
        "Where runs go: a local directory (holding the sqlite store DIR/mlflow.db), sqlite:///path.db, or "
        "http://host:port of an mlflow server; MLflow's own default (MLFLOW_TRACKING_URI) when unset."
    )
    mlflow_run_uri_export_path: str | None = _flag(
        "Directory for mlflow_tracker.json (run id and URI); default output_dir."
    )
    mlflow_close_timeout: float = _close_timeout("MLflow")


@dataclass
class TrackerConfigFactory:
    file_logger_config: FileLoggingTrackerConfig = field(default_factory=FileLoggingTrackerConfig)
    aim_config: AimConfig = field(default_factory=AimConfig)
    mlflow_config: MLflowConfig = field(default_factory=MLflowConfig)
