"""Tracker helper processes: a tracker's library (Aim, MLflow) runs only in a child process, ``python -m
tuning.trackers.isolated MODULE:BACKEND ADDRESS``, so that it can never hang or fail training (tracking libraries fail
by blocking: a locked repository, a client retrying a dead server, a close that never returns, aim#3067). The training
process only queues messages for it; the failure rules are docs/trackers.md's "Failure isolation". A script may start
a backend's child before its own heavy imports (``start_helper``); the next callback of that backend adopts it.

Protocol, over the ``multiprocessing.connection`` the child opens back to ADDRESS: the parent sends lists of messages,
``{"op": "open", "server": [host, port] | None, "timeout": s, **options}`` first, then any of ``{"op": "track",
"points": [[value, name, step, epoch, context, time], ...]}`` and ``{"op": "set", "name": ..., "params": {...}}``,
then ``{"op": "close", "status": ...}`` (alone when no run was opened; the status is the job's outcome,
``FINISHED``, ``FAILED`` or ``KILLED``). The child answers ``{"ack": 0}`` once its backend is
imported, then each list with ``{"ack": n}`` (n messages done so far), adding ``"info"`` (what the backend's ``open``
returned) after the open, or ``"failed": repr(exception)`` or ``"gone": reason``, after which it exits.

A backend is a class without constructor arguments, importable without the training process's heavy modules, with
``open(options) -> dict`` (facts about the new run, e.g. its id), ``track(points)``, ``set_params(name, params)`` and
``close(status)`` (the job's outcome as MLflow names run statuses; ``KILLED`` too when the training process died).
"""

import atexit
import collections
import json
import logging
import numbers
import os
import pkgutil
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Client, Connection, Listener
from typing import Any
from urllib.parse import urlparse

from tuning.trackers.tracker import FINISHED, KILLED, Tracker, is_main_process, log_series, run_status
from tuning.utils.error_logging import stop_signal

logger = logging.getLogger(__name__)

PROBE_INTERVAL_S = 5.0
PROBE_TIMEOUT_S = 2.0
DEFAULT_TIMEOUT_S = 30.0
SEND_INTERVAL_S = 1.0  # tracked points are sent together this often
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
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
    """Hooks and API of a tracker whose run lives in a child process (see the module docstring). Mixed in before
    ``transformers.TrainerCallback`` by each backend's callback, which names its backend and passes what opens its run.

    ``run_info`` is the backend's facts about the run once it exists (also written as JSON to
    ``export_dir/export_filename``); ``degraded_reason`` says why tracking stopped, if it did; ``ready`` is set once
    the helper has imported its library. Only global rank 0 does anything: one run per job.
    """

    backend: str  # "module:Class" of the backend the child runs
    label: str  # the library's name, in messages
    export_filename: str  # the file in export_dir receiving run_info
    log_series = staticmethod(log_series)  # a trainer log's numbers as (name, context, value); a backend may rename

    def __init__(
        self,
        open_options: dict[str, Any],
        server: tuple[str, int] | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        export_dir: str | None = None,
    ):
        self.timeout = timeout
        self.export_dir = export_dir
        self.run_info: dict[str, Any] | None = None
        self.degraded_reason: str | None = None
        self.ready = threading.Event()
        self._info_listeners: list[Callable[[dict[str, Any]], None]] = []
        self._open_message: dict[str, Any] | None = {"op": "open", "server": server, "timeout": timeout, **open_options}
        self._closed = False
        self._process: subprocess.Popen | None = None
        self._connection: Connection | None = None
        self._connected = threading.Event()  # the child connected back: _connection is set
        self._exited = threading.Event()  # the child exited and the reader has judged how
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        # What each sent, unanswered message does, oldest first, and when the oldest could start (monotonic).
        self._pending: collections.deque[str] = collections.deque()
        self._progress_at = 0.0
        self._points: list[list] = []  # tracked, not yet queued for the child
        self._state_lock = threading.RLock()
        if is_main_process():  # the child imports its library while the job loads; the run is created on first use
            self._start()

    @property
    def degraded(self) -> bool:
        return self.degraded_reason is not None

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
                self._enqueue({"op": "set", "name": name, "params": plain(params)}, f"setting the run params {name}")

    def close(self, status: str = FINISHED) -> None:
        """Flush the queued messages and end the run with ``status`` (the job's outcome: ``FINISHED``, ``FAILED`` or
        ``KILLED``); gives up when one message overruns ``timeout``. Only the first call counts."""
        with self._state_lock:
            if self._closed or self._process is None or self.degraded:
                return
            self._closed = True
            self._flush_points()
            self._enqueue({"op": "close", "status": status}, "closing the run")  # without a run, the child just exits
        while not self._exited.wait(0.1) and not self._blocked():
            pass

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
                self._enqueue({"op": "track", "points": self._points}, "tracking")
                self._points = []

    def _open(self) -> bool:
        """Open the run unless tracking is off, stopped or closed; whether messages can go to it."""
        with self._state_lock:
            if self._closed or self._process is None or self._blocked():
                return False
            if self._open_message is not None:  # sent once, with the first message
                self._enqueue(self._open_message, f"creating the {self.label} run")
                self._open_message = None
            return True

    def _enqueue(self, message: dict[str, Any], what: str) -> None:
        with self._state_lock:
            if not self._pending:
                self._progress_at = time.monotonic()
            self._pending.append(what)
            self._outbox.put(message)

    def _blocked(self) -> bool:
        """Whether tracking stopped; stops it when the child has made no progress for more than ``timeout``."""
        with self._state_lock:
            if self._pending and time.monotonic() - self._progress_at > self.timeout:
                self._degrade(f"{self._pending[0]} blocked for more than {self.timeout:g}s")
            return self.degraded

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

    # ---- the child process ----

    def _start(self) -> None:
        """Start the child (or adopt one ``start_helper`` started early) and the threads that talk to it; tracking
        degrades if it cannot start."""
        if early := _early_helpers.get(self.backend):
            self._process, listener = early.pop(0)
        else:
            try:
                self._process, listener = _spawn_helper(self.backend)
            except OSError as exc:
                self._degrade(f"starting the {self.label} helper process failed: {exc!r}")
                return
        threading.Thread(target=self._send_all, args=(listener,), name=f"{self.label}-sender", daemon=True).start()
        threading.Thread(target=self._read_answers, name=f"{self.label}-reader", daemon=True).start()
        # A job that fails before on_train_end, and whose owner did not close the run, still flushes and closes it,
        # bounded, at exit.
        atexit.register(self._close_at_exit)

    def _close_at_exit(self) -> None:
        """Close the run with the outcome of the exception that ended the interpreter, if one did."""
        self.close(run_status(getattr(sys, "last_value", None)))

    def _send_all(self, listener: Listener) -> None:
        """The sender thread: accepts the child's connection, then sends what is queued, blocking (on a full socket)
        instead of the training thread."""
        try:
            with listener:
                self._connection = listener.accept()
        except OSError:
            return  # the child is gone; the reader reports it
        self._connected.set()
        while not self.degraded:
            try:
                messages = [self._outbox.get(timeout=SEND_INTERVAL_S)]
            except queue.Empty:
                self._flush_points()
                continue
            while not self._outbox.empty():
                messages.append(self._outbox.get())
            try:
                self._connection.send(messages)
            except (OSError, ValueError):
                return  # the child is gone; the reader reports it
            if messages[-1]["op"] == "close":
                return

    def _read_answers(self) -> None:
        """The reader thread: acknowledgements are progress; a failure, or the child's exit (also before it connected
        back) while messages wait or before the close, degrades tracking."""
        while not self._connected.wait(0.1) and self._process.poll() is None:
            pass  # until the child connects back, or exits without doing so
        acked = 0
        while self._connected.is_set():
            try:
                answer = self._connection.recv()
            except (EOFError, OSError):
                break
            self.ready.set()
            with self._state_lock:
                for _ in range(answer["ack"] - acked):
                    self._pending.popleft()
                acked = answer["ack"]
                self._progress_at = time.monotonic()
                failed = self._pending[0] if self._pending else f"the {self.label} helper process"
            if "info" in answer:
                self._run_opened(answer["info"])
            if "gone" in answer:
                self._degrade(answer["gone"])
            elif "failed" in answer:
                self._degrade(f"{failed} failed: {answer['failed']}")
        code = self._process.wait()
        with self._state_lock:
            if self._pending or not self._closed:
                self._degrade(f"the {self.label} helper process exited unexpectedly (exit status {code})")
        self._exited.set()

    def _degrade(self, reason: str) -> None:
        with self._state_lock:
            if self.degraded:
                return
            self.degraded_reason = reason
        if self._process is not None:
            self._process.kill()  # stuck or broken: nothing it still holds is worth waiting for
        logger.warning("%s tracking stopped, training continues without it: %s", self.label, reason)


# Helpers started ahead of their trackers, by backend, oldest first: each waits to be adopted by the next
# IsolatedCallback of its backend.
_early_helpers: dict[str, list[tuple[subprocess.Popen, Listener]]] = {}


def _spawn_helper(backend: str) -> tuple[subprocess.Popen, Listener]:
    """The child process of ``backend`` and the listener it connects back to; ``OSError`` when it cannot start."""
    # The child imports this very package, wherever this process found it (an uninstalled checkout too).
    path = os.pathsep.join(filter(None, [_PACKAGE_ROOT, os.environ.get("PYTHONPATH")]))
    # No authkey: the socket is in a directory only this user can enter.
    listener = Listener(family="AF_UNIX")
    try:
        # Its own session: a Ctrl-C meant for training must not kill the run before training closes it.
        process = subprocess.Popen(
            [sys.executable, "-m", __name__, backend, listener.address],
            stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONPATH": path},
            start_new_session=True,
        )
    except OSError:
        listener.close()
        raise
    return process, listener


def start_helper(backend: str) -> None:
    """Start the helper process of ``backend`` ("module:Class") now, on global rank 0, for the next tracker of that
    backend built in this process to adopt: started before the script's own heavy imports, the helper imports its
    library on a core those leave idle, instead of beside the first training steps. One never adopted is stopped at
    exit (its run was never opened); one that cannot start is left to the tracker, which starts and reports its own.
    """
    if not is_main_process():
        return
    try:
        helper = _spawn_helper(backend)
    except OSError:
        return
    if not _early_helpers:  # the first one
        atexit.register(_stop_early_helpers)
    _early_helpers.setdefault(backend, []).append(helper)


def _stop_early_helpers() -> None:
    for helpers in _early_helpers.values():
        while helpers:
            process, listener = helpers.pop()
            process.kill()
            process.wait()
            listener.close()


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


# ---- the child process ----


class ServerGone(Exception):
    """The tracking server stopped accepting connections; its client would only retry or queue writes forever."""


class _Child:
    """Serves one backend over one connection (see the module docstring)."""

    def __init__(self, connection: Connection, backend: Any):
        self.connection = connection
        self.backend = backend
        self.server: tuple[str, int] | None = None
        self.timeout = DEFAULT_TIMEOUT_S
        self.opened = False
        self.done = 0
        self._send_lock = threading.Lock()  # answers come from the main loop and from the server watch

    def reply(self, **answer: Any) -> None:
        with self._send_lock:
            self.connection.send({"ack": self.done, **answer})

    def probe(self) -> None:
        """Raise ``ServerGone`` when the server no longer accepts connections."""
        if self.server is None:
            return
        try:
            socket.create_connection(self.server, timeout=PROBE_TIMEOUT_S).close()
        except OSError as exc:
            raise ServerGone("the tracking server {}:{} is unreachable ({})".format(*self.server, exc)) from exc

    def watch_server(self) -> None:
        """A thread: probe the server every few seconds (also while the client is stuck inside a call); answer
        ``gone`` and exit once it is unreachable."""
        while True:
            time.sleep(PROBE_INTERVAL_S)
            try:
                self.probe()
            except ServerGone as exc:
                try:
                    self.reply(gone=str(exc))
                finally:
                    os._exit(0)

    def handle(self, message: dict[str, Any], answer: dict[str, Any]) -> None:
        match message:
            case {"op": "open", "server": server, "timeout": timeout, **options}:
                self.server, self.timeout = (tuple(server) if server else None), timeout
                self.probe()
                if self.server is not None:
                    threading.Thread(target=self.watch_server, name="server-watch", daemon=True).start()
                answer["info"] = self.backend.open(options)
                self.opened = True
            case {"op": "track", "points": points}:
                self.backend.track(points)
            case {"op": "set", "name": name, "params": params}:
                self.backend.set_params(name, params)
            case {"op": "close", "status": status} if self.opened:
                self.probe()  # closing against a dead server would never return
                self.backend.close(status)
        self.done += 1

    def serve(self) -> None:
        self.reply()  # ready, the library imported: progress, as far as the parent's timeout goes
        while True:
            try:
                messages = self.connection.recv()
            except (EOFError, OSError):
                break
            answer: dict[str, Any] = {}
            for message in messages:
                try:
                    self.handle(message, answer)
                except ServerGone as exc:
                    answer["gone"] = str(exc)
                except Exception as exc:
                    try:  # a call cut short by the server's death: the dead server is the reason
                        self.probe()
                        answer["failed"] = repr(exc)
                    except ServerGone as gone:
                        answer["gone"] = str(gone)
                if "gone" in answer or "failed" in answer or message["op"] == "close":
                    self.reply(**answer)
                    os._exit(0)  # never the library's exit hooks: with a dead server they may wait forever
            self.reply(**answer)
        # The training process is gone without closing the run: close it, but never hang around doing so.
        signal.alarm(max(1, int(self.timeout)))
        try:
            if self.opened:
                self.probe()
                self.backend.close(KILLED)
        finally:
            os._exit(0)


def main() -> None:
    # Below the training process's priority: where they share a core, training runs and tracking waits (its messages
    # are queued, and its progress is only checked against a timeout of seconds).
    os.nice(10)
    backend_path, address = sys.argv[1:3]
    connection = Client(address, family="AF_UNIX")
    try:
        backend = pkgutil.resolve_name(backend_path)()
    except Exception as exc:  # reported as the failure of whatever the parent asks first
        connection.send({"ack": 0, "failed": repr(exc)})
        os._exit(0)
    _Child(connection, backend).serve()


if __name__ == "__main__":
    main()
