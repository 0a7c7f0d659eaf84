"""mlflow tracker: one MLflow run per job, written by a helper process (``tuning.trackers.isolated``) running
``tuning.trackers.mlflow_writer.MlflowBackend``."""

import importlib.util
import logging
import numbers
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from tuning.config.tracker_configs import MLflowConfig
from tuning.trackers.helper_transport import EarlyHelpers
from tuning.trackers.isolated import IsolatedCallback, IsolatedTracker, server_address
from tuning.trackers.tracker import MLFLOW_BACKEND
from tuning.utils.error_logging import UserInputError

if importlib.util.find_spec("mlflow") is None:  # the helper process needs it; fail while the registry can say so
    raise ImportError("No module named 'mlflow'")

logger = logging.getLogger(__name__)

RUN_URI_FILENAME = "mlflow_tracker.json"
STORE_FILENAME = "mlflow.db"  # the sqlite store in a --mlflow_tracking_uri directory
DEGRADED_WARNING = "MLflow tracking stopped, training continues without it"
HTTP_SCHEMES = ("http", "https")  # a tracking server, which the helper probes


class SafeMlflowCallback(IsolatedCallback, TrainerCallback):
    """Tracks a training job into one MLflow run; ``run_id`` is set once the run exists (and ``mlflow_tracker.json``
    written to ``run_uri_export_dir``, by default the trainer's ``output_dir``)."""

    tracker, label, export_filename = "mlflow", "MLflow", RUN_URI_FILENAME
    default_backend = MLFLOW_BACKEND

    def __init__(
        self,
        tracking_uri: str | None,
        experiment: str | None = None,
        timeout: float = 30.0,
        run_uri_export_dir: str | None = None,
        backend: str | None = None,
        early_helpers: EarlyHelpers | None = None,
    ):
        self.tracking_uri = tracking_uri
        options = {"tracking_uri": tracking_uri, "experiment": experiment, "source": sys.argv[0] if sys.argv else ""}
        server = server_address(tracking_uri or "", *HTTP_SCHEMES)
        super().__init__(options, server, timeout, run_uri_export_dir, backend, early_helpers)

    @property
    def run_id(self) -> str | None:
        return self.run_info["run_id"] if self.run_info else None

    def log_series(self, logs: dict[str, Any]) -> Iterator[tuple[str, dict[str, str], float]]:
        """Trainer logs keep their keys (``train_loss``), as transformers' own MLflow callback logs them."""
        for key, value in logs.items():
            if isinstance(value, numbers.Real) and not isinstance(value, bool):
                yield key, {}, value


def resolve_tracking_uri(config: MLflowConfig) -> str | None:
    """Validate ``config`` (cheaply, no network) and return the tracking URI. A local directory holds a sqlite store,
    ``DIR/mlflow.db`` (MLflow 3 refuses to create file stores unless told to); a ``file:`` URI keeps the file store
    it names, as in v3.1.0 (the helper opts in to it), with one warning that MLflow deprecates file stores;
    ``http(s)://host:port`` must name a host and a valid port; other URIs go to MLflow as given. Without a URI (the
    flag or ``MLFLOW_TRACKING_URI``) it is fms-hf-tuning's ValueError."""
    if (timeout := config.mlflow_close_timeout) is None or timeout <= 0:
        raise UserInputError(f"--mlflow_close_timeout must be a positive number of seconds, got {timeout}")
    uri = (config.mlflow_tracking_uri or "").strip()
    if not uri:
        if not os.environ.get("MLFLOW_TRACKING_URI"):  # MLflow would write ./mlruns wherever the job happens to run
            raise UserInputError(
                "mlflow tracker requested but mlflow_uri is not specified: give --mlflow_tracking_uri "
                "(or set MLFLOW_TRACKING_URI)"
            )
        return None
    if uri.startswith(("http://", "https://")):
        if server_address(uri, *HTTP_SCHEMES) is None:
            raise UserInputError(f"--mlflow_tracking_uri must look like http://host:port (port 1-65535), got {uri!r}")
        return uri.rstrip("/")
    if uri.startswith("file:"):
        logger.warning(
            "--mlflow_tracking_uri %s is an MLflow file store, which MLflow deprecates (in maintenance mode; MLflow 3 "
            "opens it only with MLFLOW_ALLOW_FILE_STORE=true, which the tracker sets for itself): move to a database "
            "store with `mlflow migrate-filestore`, or give a directory (its mlflow.db is a sqlite store) or a "
            "sqlite:/// URI",
            uri,
        )
        return uri
    if "://" in uri:
        return uri
    return f"sqlite:///{Path(os.path.expanduser(uri)).absolute() / STORE_FILENAME}"


class MLflowTracker(IsolatedTracker):
    """The ``mlflow`` tracker: validates ``MLflowConfig`` and exposes a ``SafeMlflowCallback`` running ``helper`` (the
    registry's backend) or adopting its helper from ``early_helpers``."""

    def __init__(
        self, tracker_config: MLflowConfig, helper: str | None = None, early_helpers: EarlyHelpers | None = None
    ):
        callback = SafeMlflowCallback(
            resolve_tracking_uri(tracker_config),
            experiment=tracker_config.mlflow_experiment,
            timeout=tracker_config.mlflow_close_timeout,
            run_uri_export_dir=tracker_config.mlflow_run_uri_export_path,
            backend=helper,
            early_helpers=early_helpers,
        )
        super().__init__("mlflow", tracker_config, callback)

    @property
    def run_id(self) -> str | None:
        return self.callback.run_id

    def track(self, metric: float, name: str, stage: str = "additional_metrics") -> None:
        """MLflow has no contexts: the metric goes under its own name."""
        self.callback.track(metric, name)
