"""Tracker helper processes: a tracker's library (Aim, MLflow) runs only in a child process, so that it can never hang
or fail training (tracking libraries fail by blocking: a locked repository, a client retrying a dead server, a close
that never returns, aim#3067). Three parts: the child (``tuning.trackers.helper_child``, running a backend), the
transport (``tuning.trackers.helper_transport``: spawn or adopt, send, acknowledge, degrade; it documents the
protocol) and, here, the trainer-callback hooks that turn a job's events into messages (``IsolatedCallback``) and the
``Tracker`` over them. The failure rules are docs/trackers.md's "Failure isolation". A script may start a backend's
child before its own heavy imports (``tuning.trackers.start_helpers``) and hand the ``EarlyHelpers`` it returns to the
tracker built later, which adopts it.
"""

import atexit
import json
import logging
import numbers
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

from tuning.trackers.helper_child import DEFAULT_TIMEOUT_S
from tuning.trackers.helper_child import main as main  # `python -m tuning.trackers.isolated` runs a child too
from tuning.trackers.helper_transport import EarlyHelpers, HelperTransport
from tuning.trackers.tracker import FINISHED, KILLED, Tracker, is_main_process, log_series, run_status
from tuning.utils.error_logging import stop_signal

logger = logging.getLogger(__name__)

_DEFAULT_PORTS = {"http": 80, "https": 443}


def server_address(url: str, *schemes: str) -> tuple[str, int] | None:
    """``(host, port)`` of a ``scheme://host:port`` URL of one of ``schemes`` (http and https have default ports);
    None for another scheme, no host or no valid port."""
    parsed = urlparse(url)
    if parsed.scheme not in schemes:
        return None
    try:
        port = parsed.port
    except ValueError:  # not a number, or out of range
        return None
    port = _DEFAULT_PORTS.get(parsed.scheme) if port is None else port
    return (parsed.hostname, port) if parsed.hostname and port else None


def plain(value: Any) -> Any:
    """``value`` in JSON's types for the child, which cannot import the training process's classes: other numbers
    (numpy's) become ints or floats, anything else its string; a key JSON cannot take is left out."""
    return json.loads(json.dumps(value, skipkeys=True, default=_plain_scalar))


def _plain_scalar(value: Any) -> int | float | str:
    if isinstance(value, numbers.Integral):
        return int(value)
    return float(value) if isinstance(value, numbers.Real) else str(value)


class IsolatedCallback:
    """Hooks and API of a tracker whose run lives in a helper process (see the module docstring). Mixed in before
    ``transformers.TrainerCallback`` by each backend's callback, which names its backend and passes what opens its run.

    ``run_info`` is the backend's facts about the run once it exists (also written as JSON to
    ``export_dir/export_filename``); ``degraded_reason`` says why tracking stopped, if it did; ``ready`` is set once
    the helper has imported its library. Only global rank 0 does anything: one run per job. ``backend``: the
    "module:Class" the helper runs, as the registry names it for the tracker (``get_tracker`` hands it over; the
    class's ``default_backend`` when not given). ``early_helpers``: where a helper started ahead of this callback may
    wait.
    """

    tracker: str  # the tracker's registered name
    default_backend: str  # the backend its helper runs when none is handed in (a callback built directly)
    label: str  # the library's name, in messages
    export_filename: str  # the file in export_dir receiving run_info
    log_series = staticmethod(log_series)  # a trainer log's numbers as (name, context, value); a backend may rename

    def __init__(
        self,
        open_options: dict[str, Any],
        server: tuple[str, int] | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        export_dir: str | None = None,
        backend: str | None = None,
        early_helpers: EarlyHelpers | None = None,
    ):
        self.backend = backend or self.default_backend
        self.timeout = timeout
        self.export_dir = export_dir
        self.run_info: dict[str, Any] | None = None
        self.transport = HelperTransport(self.backend, self.label, timeout, self._run_opened, self._flush_points)
        self._info_listeners: list[Callable[[dict[str, Any]], None]] = []
        self._open_message: dict[str, Any] | None = {"op": "open", "server": server, "timeout": timeout, **open_options}
        self._closed = False
        self._points: list[list] = []  # tracked, not yet queued for the child
        self._state_lock = threading.RLock()
        if is_main_process():  # the child imports its library while the job loads; the run is created on first use
            self.transport.start(early_helpers)
            if self.transport.process is not None:
                # A job that fails before on_train_end, and whose owner did not close the run, still flushes and
                # closes it, bounded, at exit.
                atexit.register(self._close_at_exit)

    @property
    def degraded_reason(self) -> str | None:
        return self.transport.degraded_reason

    @property
    def degraded(self) -> bool:
        return self.transport.degraded

    @property
    def ready(self) -> threading.Event:
        return self.transport.ready

    # ---- API for hooks and subclasses: never blocks, never raises ----

    def track(self, value: float, name: str, step: int | None = None, context: dict | None = None) -> None:
        """Record one point of the series ``name``/``context``."""
        self.track_many([(name, value, step, context)])

    def track_many(self, points: list[tuple[str, float, int | None, dict | None]]) -> None:
        """Record ``(name, value, step, context)`` points."""
        now = time.time()
        self._track_points(
            [[float(value), name, step, None, dict(context or {}), now] for name, value, step, context in points]
        )

    def set_params(self, params: dict, name: str) -> None:
        """Merge ``params`` into the run's parameters under ``name``, after every point tracked before."""
        with self._state_lock:
            if self._open():
                self._flush_points()
                message = {"op": "set", "name": name, "params": plain(params)}
                self.transport.send(message, f"setting the run params {name}")

    def close(self, status: str = FINISHED) -> None:
        """Flush the queued messages and end the run with ``status`` (the job's outcome: ``FINISHED``, ``FAILED`` or
        ``KILLED``); gives up when one message overruns ``timeout``. Only the first call counts."""
        with self._state_lock:
            if self._closed or self.transport.process is None or self.degraded:
                return
            self._closed = True
            self._flush_points()
            self.transport.send({"op": "close", "status": status}, "closing the run")  # no run: the child just exits
        self.transport.wait_exited()

    def when_run_info_known(self, listener: Callable[[dict[str, Any]], None]) -> None:
        """Call ``listener(run_info)`` once the run exists: now if it does, else from the thread that learns it."""
        with self._state_lock:
            if self.run_info is None:
                self._info_listeners.append(listener)
                return
        listener(self.run_info)

    def _run_opened(self, info: dict[str, Any]) -> None:
        """On the reader thread, once the run exists: export ``info``, then tell the listeners."""
        with self._state_lock:
            self.run_info = info
            listeners, self._info_listeners = self._info_listeners, []
        self._export_run_info()
        for listener in listeners:
            listener(info)

    def _export_run_info(self) -> None:
        """The run's facts as JSON in ``export_dir`` (the trainer's ``output_dir`` unless set), once both are known."""
        if not (self.export_dir and self.run_info):
            return
        path = os.path.join(self.export_dir, self.export_filename)
        try:
            os.makedirs(self.export_dir, exist_ok=True)
            with open(path, "w", encoding="utf-8") as handle:
                json.dump(self.run_info, handle)
        except OSError as exc:
            logger.warning("could not write the %s run's id to %s: %s", self.label, path, exc)

    def _track_points(self, points: list[list]) -> None:
        with self._state_lock:
            if points and self._open():
                self._points.extend(points)

    def _flush_points(self) -> None:
        with self._state_lock:
            if self._points:
                self.transport.send({"op": "track", "points": self._points}, "tracking")
                self._points = []

    def _open(self) -> bool:
        """Open the run unless tracking is off, stopped or closed; whether messages can go to it."""
        with self._state_lock:
            if self._closed or self.transport.process is None or self.transport.blocked():
                return False
            if self._open_message is not None:  # sent once, with the first message
                self.transport.send(self._open_message, f"creating the {self.label} run")
                self._open_message = None
            return True

    def _close_at_exit(self) -> None:
        """Close the run with the outcome of the exception that ended the interpreter, if one did."""
        self.close(run_status(getattr(sys, "last_value", None)))

    # ---- trainer hooks ----

    def on_init_end(self, args, state, control, **kwargs):
        # Open the run while the trainer prepares, so it is ready (or known broken) before the first step.
        if state.is_world_process_zero:
            if self.export_dir is None:
                self.export_dir = args.output_dir
                self._export_run_info()  # the run may have opened before the trainer existed
            self._open()

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if not state.is_world_process_zero:
            return
        self.set_params(args.to_sanitized_dict(), "hparams")
        if hasattr(config := getattr(model, "config", None), "to_dict"):
            self.set_params(config.to_dict(), "model")

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and logs:
            step, epoch, now = state.global_step, state.epoch, time.time()
            self._track_points(
                [[float(value), name, step, epoch, context, now] for name, context, value in self.log_series(logs)]
            )

    def on_train_end(self, args, state, control, **kwargs):
        # Training stopped early on a signal ends as the job does: interrupted.
        if state.is_world_process_zero:
            self.close(FINISHED if stop_signal() is None else KILLED)


class IsolatedTracker(Tracker):
    """The ``Tracker`` of an isolated backend: its ``callback`` (built from the backend's config) does the work."""

    def __init__(self, name: str, tracker_config: Any, callback: IsolatedCallback):
        super().__init__(name=name, tracker_config=tracker_config)
        self.callback = callback

    @property
    def degraded_reason(self) -> str | None:
        return self.callback.degraded_reason

    @property
    def degraded(self) -> bool:
        return self.callback.degraded

    def set_params(self, params: dict, name: str = "experiment_metadata") -> None:
        self.callback.set_params(params, name)

    def close(self, status: str = FINISHED) -> None:
        self.callback.close(status)


if __name__ == "__main__":
    main()
