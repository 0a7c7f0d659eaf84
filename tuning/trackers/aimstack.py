"""aim tracker: one Aim run per job that can never hang or fail training.

Design
------
``SafeAimCallback`` is a transformers callback whose every Aim call runs on one daemon thread it owns; the training
thread only enqueues closures (``_call(fn)`` runs ``fn(run)`` there, in order). The run is created on that thread by
the first call, so ``track``/``set_params`` calls made before training starts are queued, not lost, and a slow run
creation overlaps with model loading instead of delaying it.

Aim fails in ways that block rather than raise: a locked repo waits minutes for its lock, and once a remote server is
gone the client queues writes forever and ``Run.close()`` never returns (aim issue #3067) — also when Aim's own atexit
hook or a garbage-collected Aim object closes it, which would keep a finished job from exiting or stall the training
thread. So tracking *degrades* instead: the first failure logs one warning, sets ``degraded_reason``, and from then on
the callback never calls Aim again and detaches Aim's atexit hook and finalizers. Failures are

- a single call still running after ``timeout`` seconds (checked at every call and while closing);
- a remote server that no longer accepts TCP connections: probed at most every few seconds and before closing, since
  Aim's client does not report a dead server;
- any exception raised by Aim (unwritable repo, refused connection).

Closing (at the end of training or, when training raised, at exit) waits for the queued calls under the same
bound, so a job never waits for Aim longer than ``timeout`` seconds past its last progress.

Only global rank 0 does anything, so a job makes one run whatever its world size. Aim's own ``pkg_resources``-based
package listing crashes on setuptools >= 81; installed package versions are recorded from ``importlib.metadata``
instead, under the same ``__system_params`` key Aim's UI reads.

Subclassing (the benchmarking wrapper does): override a hook, call ``super()``, and add data with ``track``,
``set_params`` or ``_call`` — failure isolation comes with them. ``AimStackTracker`` only maps ``AimConfig`` and the
``Tracker`` API onto the callback.
"""

import atexit
import importlib.metadata
import json
import logging
import numbers
import os
import queue
import re
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from aim import Run
from aim.ext.cleanup import AutoClean
from transformers import TrainerCallback

from tuning.config.tracker_configs import AimConfig
from tuning.trackers.tracker import Tracker, is_main_process
from tuning.utils.error_reporting import UserInputError

logger = logging.getLogger(__name__)

RUN_HASH_FILENAME = "aimstack_tracker.json"
DEGRADED_WARNING = "Aim tracking stopped, training continues without it"

_AIM_URL = re.compile(r"aim://(?P<host>[^:/\s]+):(?P<port>\d{1,5})/?")
_PROBE_INTERVAL_S = 5.0
_PROBE_TIMEOUT_S = 2.0
_LOG_PREFIXES = ("train_", "eval_", "test_")
# Aim's own bounds for its system-metrics sampler.
_MIN_SYSTEM_INTERVAL_S, _MAX_SYSTEM_INTERVAL_S = 0.1, 24 * 60 * 60.0


class _ServerGone(Exception):
    """The remote Aim server stopped accepting connections: every further Aim call could block forever."""


def _installed_packages() -> dict[str, str]:
    """Installed distributions and versions, as Aim's UI shows them, without ``pkg_resources``."""
    packages = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            packages[name] = dist.version
    return packages


def _server_address(repo: str) -> tuple[str, int] | None:
    match = _AIM_URL.fullmatch(repo)
    return (match["host"], int(match["port"])) if match else None


def _drop_aim_cleanup() -> None:
    """Keep Aim from ever cleaning up after this job: with a dead server its cleanup blocks forever.

    Aim closes its objects from an atexit hook (which would keep a finished job from exiting) and from finalizers
    that run whenever the garbage collector meets them, possibly on the training thread; both go.
    """
    atexit.unregister(AutoClean.cleanup)
    while True:
        try:
            finalizers = [finalizer for _priority, finalizer in AutoClean._finalizers.values()]
            break
        except RuntimeError:  # the Aim thread registered an object meanwhile
            continue
    for finalizer in finalizers:
        finalizer.detach()


class SafeAimCallback(TrainerCallback):
    """Tracks a training job into one Aim run; Aim failures cost a warning, never the job (see module docstring).

    ``repo`` is a local directory (created if missing) or ``aim://host:port``. ``run_hash`` is set once the run
    exists; ``degraded_reason`` says why tracking stopped, if it did.
    """

    def __init__(
        self,
        repo: str,
        experiment: str | None = None,
        system_tracking_interval: float | None = None,
        timeout: float = 30.0,
        run_hash_export_dir: str | None = None,
    ):
        self.repo = repo
        self.experiment = experiment
        self.system_tracking_interval = system_tracking_interval
        self.timeout = timeout
        self.run_hash_export_dir = run_hash_export_dir
        self.run_hash: str | None = None
        self.degraded_reason: str | None = None
        self._enabled = is_main_process()
        self._server = _server_address(repo)
        self._run: Run | None = None
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._worker: threading.Thread | None = None
        self._busy: tuple[str, float] | None = None  # what the Aim thread is doing, since when (monotonic)
        self._closed = False
        self._last_probe = 0.0
        self._state_lock = threading.Lock()

    @property
    def degraded(self) -> bool:
        return self.degraded_reason is not None

    # ---- API for hooks and subclasses: never blocks, never raises ----

    def track(
        self,
        value: float,
        name: str,
        step: int | None = None,
        epoch: float | None = None,
        context: dict | None = None,
    ) -> None:
        """Record one point of the series ``name``/``context``."""
        context = dict(context or {})
        self._call(lambda run: run.track(value, name=name, step=step, epoch=epoch, context=context), f"tracking {name}")

    def set_params(self, params: dict, name: str) -> None:
        """Merge ``params`` into the run param ``name``, so queries like ``run.<name>.<key> == …`` find the run."""
        params = dict(params)

        def record(run: Run) -> None:
            for key, value in params.items():
                run.set((name, key), value, strict=False)

        self._call(record, f"setting the run param {name}")

    def close(self) -> None:
        """Flush the queued calls and finish the run; gives up on Aim when one call runs over ``timeout``."""
        with self._state_lock:
            if not self._enabled or self._closed:
                return
            self._closed = True
        if self._worker is None or self.degraded:
            return
        done = threading.Event()
        self._tasks.put(("closing the Aim run", self._finish, done))
        # Calls still queued may legitimately take a while (a new repo is initialised on first use): give up only
        # when a single call overruns its bound.
        while not done.wait(0.1):
            if self._blocked():
                return

    def _call(self, fn: Callable[[Run], Any], what: str = "an Aim call") -> None:
        """Run ``fn(run)`` on the Aim thread, after every earlier call; dropped once tracking stopped."""
        if not self._enabled or self._closed or self._blocked():
            return
        with self._state_lock:
            if self._worker is None:
                self._worker = threading.Thread(target=self._work, name="aim-tracker", daemon=True)
                self._worker.start()
                # A job that fails before on_train_end still flushes and closes its run, bounded, at exit.
                atexit.register(self.close)
        self._tasks.put((what, lambda: fn(self._ensure_run()), None))

    def _blocked(self) -> bool:
        """Whether tracking stopped; stops it when the current Aim call has run for more than ``timeout``."""
        busy = self._busy
        if busy is not None and time.monotonic() - busy[1] > self.timeout:
            self._degrade(f"{busy[0]} blocked for more than {self.timeout:g}s")
        return self.degraded

    # ---- trainer hooks ----

    def on_init_end(self, args, state, control, **kwargs):
        # Open the run while the trainer prepares, so it is ready (or known broken) before the first step.
        if state.is_world_process_zero:
            self._call(lambda run: None, "opening the Aim run")

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if not state.is_world_process_zero:
            return
        self.set_params(args.to_sanitized_dict(), "hparams")
        config = getattr(model, "config", None)
        if config is not None and hasattr(config, "to_dict"):
            self.set_params(config.to_dict(), "model")

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        points = []
        for key, value in logs.items():
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                continue
            name, context = key, {}
            for prefix in _LOG_PREFIXES:
                if key.startswith(prefix):
                    name, context = key[len(prefix) :], {"subset": prefix[:-1]}
                    break
            points.append((name, float(value), context))
        step, epoch = state.global_step, state.epoch

        def record(run: Run) -> None:
            for name, value, context in points:
                run.track(value, name=name, step=step, epoch=epoch, context=context)

        self._call(record, "tracking the trainer logs")

    def on_train_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.close()

    # ---- the Aim thread ----

    def _work(self) -> None:
        while True:
            what, task, done = self._tasks.get()
            try:
                if not self.degraded:
                    self._run_task(what, task)
            finally:
                if done is not None:
                    done.set()

    def _run_task(self, what: str, task: Callable[[], Any]) -> None:
        self._busy = (what, time.monotonic())
        try:
            self._probe_server()
            task()
        except _ServerGone as exc:
            self._degrade(str(exc))
        except Exception as exc:
            self._degrade(f"{self._busy[0]} failed: {exc!r}")
        finally:
            self._busy = None
            if self.degraded:
                # Also when the call unblocked only after Aim was given up: it may have created Aim objects since.
                _drop_aim_cleanup()

    def _finish(self) -> None:
        if self._run is not None:
            self._probe_server(force=True)
            self._run.close()

    def _ensure_run(self) -> Run:
        if self._run is None:
            self._busy = (f"creating the Aim run in {self.repo}", time.monotonic())
            self._probe_server(force=True)
            self._run = Run(
                repo=self.repo,
                experiment=self.experiment,
                system_tracking_interval=self.system_tracking_interval,
                log_system_params=False,
                capture_terminal_logs=False,
            )
            self.run_hash = self._run.hash
            # Aim registered its own exit hook while creating the run; ours must run before it (atexit runs in
            # reverse order), so that it bounds what Aim would wait for and can drop Aim's hook in time.
            atexit.unregister(self.close)
            atexit.register(self.close)
            self._run["__system_params"] = {
                "packages": _installed_packages(),
                "executable": sys.executable,
                "arguments": sys.argv,
            }
            self._export_run_hash()
        return self._run

    def _export_run_hash(self) -> None:
        if not self.run_hash_export_dir:
            return
        path = os.path.join(self.run_hash_export_dir, RUN_HASH_FILENAME)
        try:
            os.makedirs(self.run_hash_export_dir, exist_ok=True)
            with open(path, "w", encoding="utf-8") as handle:
                json.dump({"run_hash": self.run_hash}, handle)
        except OSError as exc:
            logger.warning("could not write the Aim run hash to %s: %s", path, exc)

    def _probe_server(self, force: bool = False) -> None:
        if self._server is None:
            return
        now = time.monotonic()
        if not force and now - self._last_probe < _PROBE_INTERVAL_S:
            return
        self._last_probe = now
        try:
            socket.create_connection(self._server, timeout=_PROBE_TIMEOUT_S).close()
        except OSError as exc:
            raise _ServerGone(f"the Aim server {self.repo} is unreachable ({exc})") from exc

    # ---- degradation ----

    def _degrade(self, reason: str) -> None:
        with self._state_lock:
            if self.degraded_reason is not None:
                return
            self.degraded_reason = reason
        _drop_aim_cleanup()
        sampler = getattr(self._run, "_system_resource_tracker", None)
        if sampler is not None:
            sampler._shutdown = True  # Aim's own sampler thread would keep queueing writes nobody sends
        logger.warning("%s: %s", DEGRADED_WARNING, reason)


def resolve_repo(config: AimConfig) -> str:
    """Validate ``config`` (cheaply, no network) and return where the run goes: a configured server wins."""
    ip = config.aim_remote_server_ip or None
    port = None if config.aim_remote_server_port in (None, "") else config.aim_remote_server_port
    url = config.aim_url or None
    if url and (ip or port is not None):
        raise UserInputError("give the Aim server as --aim_url or as --aim_remote_server_ip/_port, not both")
    if (ip is None) != (port is None):
        raise UserInputError("--aim_remote_server_ip and --aim_remote_server_port must be given together")
    if ip is not None:
        url = f"aim://{ip}:{port}"
    if config.aim_close_timeout is None or config.aim_close_timeout <= 0:
        raise UserInputError(
            f"--aim_close_timeout must be a positive number of seconds, got {config.aim_close_timeout}"
        )
    interval = config.aim_system_tracking_interval
    if interval is not None and not _MIN_SYSTEM_INTERVAL_S <= interval <= _MAX_SYSTEM_INTERVAL_S:
        raise UserInputError(f"--aim_system_tracking_interval must be between 0.1 s and one day, got {interval}")
    if url:
        match = _AIM_URL.fullmatch(url.strip())
        if not match or not 0 < int(match["port"]) < 65536:
            raise UserInputError(f"Aim server must look like aim://host:port (port 1-65535), got {url!r}")
        if config.aim_repo:
            logger.warning("ignoring --aim_repo %s: the run goes to the Aim server %s", config.aim_repo, url)
        return f"aim://{match['host']}:{match['port']}"
    if config.aim_repo:
        return os.path.abspath(os.path.expanduser(config.aim_repo))
    raise UserInputError(
        "--tracker aim needs --aim_repo DIR or an Aim server "
        "(--aim_url aim://host:port, or --aim_remote_server_ip with --aim_remote_server_port)"
    )


class AimStackTracker(Tracker):
    """The ``aim`` tracker: validates ``AimConfig`` and exposes a ``SafeAimCallback``."""

    name = "aim"

    def __init__(self, config: AimConfig, output_dir: str):
        self.callback = SafeAimCallback(
            resolve_repo(config),
            experiment=config.experiment,
            system_tracking_interval=config.aim_system_tracking_interval,
            timeout=config.aim_close_timeout,
            run_hash_export_dir=config.aim_run_id_export_path or output_dir,
        )

    @property
    def run_hash(self) -> str | None:
        return self.callback.run_hash

    @property
    def degraded_reason(self) -> str | None:
        return self.callback.degraded_reason

    @property
    def degraded(self) -> bool:
        return self.callback.degraded

    def get_hf_callback(self) -> TrainerCallback:
        return self.callback

    def track(self, metric: float, name: str, stage: str = "additional_metrics") -> None:
        self.callback.track(metric, name, context={"subset": stage})

    def set_params(self, params: dict, name: str = "experiment_metadata") -> None:
        self.callback.set_params(params, name)
