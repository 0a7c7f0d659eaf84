"""aim tracker: one Aim run per job, written by a helper process (``tuning.trackers.isolated``) running
``tuning.trackers.aim_writer.AimBackend``. Subclassing ``SafeAimCallback``: override a hook, call ``super()``, and add
data with ``track`` and ``set_params``; failure isolation comes with them."""

import importlib.util
import logging
import os
import sys

from transformers import TrainerCallback

from tuning.config.tracker_configs import AimConfig, server_url
from tuning.trackers.helper_transport import EarlyHelpers
from tuning.trackers.isolated import IsolatedCallback, IsolatedTracker, server_address
from tuning.trackers.tracker import AIM_BACKEND
from tuning.utils.error_logging import UserInputError

if importlib.util.find_spec("aim") is None:  # the helper process needs it; fail while the registry can say so
    raise ImportError("No module named 'aim'")

logger = logging.getLogger(__name__)

RUN_HASH_FILENAME = "aim_tracker.json"
DEGRADED_WARNING = "Aim tracking stopped, training continues without it"


class SafeAimCallback(IsolatedCallback, TrainerCallback):
    """Tracks a training job into one Aim run, in ``repo`` (a local directory, created if missing, or
    ``aim://host:port``); ``run_hash`` is set once the run exists (and written to ``aim_tracker.json`` in
    ``run_hash_export_dir``, by default the trainer's ``output_dir``)."""

    tracker, label, export_filename = "aim", "Aim", RUN_HASH_FILENAME
    default_backend = AIM_BACKEND

    def __init__(
        self,
        repo: str,
        experiment: str | None = None,
        system_tracking_interval: float | None = None,
        timeout: float = 30.0,
        run_hash_export_dir: str | None = None,
        backend: str | None = None,
        early_helpers: EarlyHelpers | None = None,
    ):
        self.repo = repo
        options = {"repo": repo, "experiment": experiment, "system_tracking_interval": system_tracking_interval}
        options.update(executable=sys.executable, arguments=sys.argv)
        super().__init__(options, server_address(repo, "aim"), timeout, run_hash_export_dir, backend, early_helpers)

    @property
    def run_hash(self) -> str | None:
        return self.run_info["run_hash"] if self.run_info else None


def resolve_repo(config: AimConfig) -> str:
    """Validate ``config`` (cheaply, no network) and return where the run goes: a configured server wins."""
    ip, port = config.aim_remote_server_ip, config.aim_remote_server_port
    if bool(ip) != (port not in (None, "")):
        raise UserInputError("--aim_remote_server_ip and --aim_remote_server_port must be given together")
    if (timeout := config.aim_close_timeout) is None or timeout <= 0:
        raise UserInputError(f"--aim_close_timeout must be a positive number of seconds, got {timeout}")
    interval = config.aim_system_tracking_interval
    if interval is not None and not 0.1 <= interval <= 24 * 60 * 60:  # Aim's own bounds for its sampler
        raise UserInputError(f"--aim_system_tracking_interval must be between 0.1 s and one day, got {interval}")
    servers = set()
    for url in filter(None, (config.aim_url, server_url(ip, port))):
        server = server_address(url.strip(), "aim")
        if server is None:
            raise UserInputError(f"Aim server must look like aim://host:port (port 1-65535), got {url!r}")
        servers.add(server)
    if len(servers) > 1:
        raise UserInputError(
            "give the Aim server as --aim_url or as --aim_remote_server_ip/_port, not both: "
            f"they name different servers ({config.aim_url} and {server_url(ip, port)})"
        )
    if servers:
        url = "aim://{}:{}".format(*servers.pop())
        if config.aim_repo:
            logger.warning("ignoring --aim_repo %s: the run goes to the Aim server %s", config.aim_repo, url)
        return url
    if config.aim_repo:
        return os.path.abspath(os.path.expanduser(config.aim_repo))
    raise UserInputError(
        "Aim tracker requested but repo or server is not specified: give --aim_repo DIR or an Aim server "
        "(--aim_url aim://host:port, or --aim_remote_server_ip with --aim_remote_server_port)"
    )


class AimStackTracker(IsolatedTracker):
    """The ``aim`` tracker: validates ``AimConfig`` and exposes a ``SafeAimCallback`` running ``helper`` (the
    registry's backend) or adopting its helper from ``early_helpers``."""

    def __init__(self, tracker_config: AimConfig, helper: str | None = None, early_helpers: EarlyHelpers | None = None):
        callback = SafeAimCallback(
            resolve_repo(tracker_config),
            experiment=tracker_config.experiment,
            system_tracking_interval=tracker_config.aim_system_tracking_interval,
            timeout=tracker_config.aim_close_timeout,
            run_hash_export_dir=tracker_config.aim_run_id_export_path,
            backend=helper,
            early_helpers=early_helpers,
        )
        super().__init__("aim", tracker_config, callback)

    @property
    def run_hash(self) -> str | None:
        return self.callback.run_hash

    def track(self, metric: float, name: str, stage: str = "additional_metrics") -> None:
        self.callback.track(metric, name, context={"subset": stage})
