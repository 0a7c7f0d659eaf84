"""Tracker helper processes: a tracker's run lives in a child process, so that the tracker can never hang or fail
training. Every isolated tracker (Aim, MLflow) uses this one mechanism.

Tracking libraries fail in ways that block rather than raise: a locked repository waits minutes for its lock, a client
whose server is gone retries or queues writes forever, and closing such a run never returns (aim#3067). So the
tracker's library runs only in a child, ``python -m tuning.trackers.isolated MODULE:BACKEND ADDRESS``, and the training
process only queues messages for it. A failure *degrades* tracking: one warning line, ``degraded_reason`` set, the
child killed, every later call dropped. Failures are

- a message the child has not finished ``timeout`` seconds after it could start on it (checked at every call and
  while closing);
- a tracking server that no longer accepts TCP connections: the child probes it every few seconds from a thread of
  its own (a call stuck in the client does not delay it), and before closing;
- any exception raised by the backend, or the child exiting early.

Closing waits for the queued messages under the same bound. When the training process dies without closing, the
child sees its connection end and closes the run itself, within the same bound.

Protocol: a ``multiprocessing.connection`` (an AF_UNIX socket; the child connects back with the key it reads on its
stdin). The parent sends lists of messages: ``{"op": "open", "server": [host, port] | None, "timeout": s, **options}``
first, then any of ``{"op": "track", "points": [[value, name, step, epoch, context, time], ...], "logs": [[step,
epoch, time, {key: number}], ...]}`` and ``{"op": "set", "name": ..., "params": {...}}``, then ``{"op": "close"}``
(alone when no run was opened). The child answers ``{"ack": 0}`` once its backend is imported, then each list with
``{"ack": n}`` (n messages done so far), adding ``"info"`` (the backend's ``open`` result) after the open,
``"failed": repr(exception)`` or ``"gone": reason``, after which it exits.

A backend is a class with no constructor arguments, importable without the training process's heavy modules:
``open(options) -> dict`` (facts about the new run, e.g. its id), ``track(points)``, ``track_logs(logs)``,
``set_params(name, params)`` and ``close(finished: bool)`` (False: the training process died). This module imports
only the standard library and the light ``tuning.trackers.tracker``.
"""

import atexit
import collections
import importlib
import json
import logging
import numbers
import os
import queue
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

from tuning.trackers.tracker import Tracker, is_main_process

logger = logging.getLogger(__name__)

PROBE_INTERVAL_S = 5.0
PROBE_TIMEOUT_S = 2.0
DEFAULT_TIMEOUT_S = 30.0
SEND_INTERVAL_S = 1.0  # tracked points and logs are sent together this often
_CLOSE_EXIT_S = 5.0  # how long a child that acknowledged the close may take to exit before it is killed
_CLOSING = "closing the run"
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def plain(value: Any) -> Any:
    """``value`` as plain Python for the child, which cannot import the training process's classes: numbers of other
    types (numpy's) become ints or floats, other mappings dicts, tuples lists, anything else its string."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, Mapping):
        return {str(key): plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [plain(item) for item in value]
    return str(value)


def _numbers(logs: dict[str, Any]) -> dict[str, float]:
    """The numeric entries of a trainer log, as floats."""
    return {
        key: float(value)
        for key, value in logs.items()
        if isinstance(value, numbers.Real) and not isinstance(value, bool)
    }


class IsolatedCallback:
    """Hooks and API of a tracker whose run lives in a child process (see the module docstring). Mixed in before
    ``transformers.TrainerCallback`` by each backend's callback, which passes what opens its run.

    ``run_info`` is the backend's facts about the run once it exists (also written as JSON to
    ``export_dir/export_filename``); ``degraded_reason`` says why tracking stopped, if it did; ``ready`` is set once
    the helper has imported its library. Only global rank 0 does anything, so a job makes one run whatever its world
    size.
    """

    def __init__(
        self,
        backend: str,
        label: str,
        open_options: dict[str, Any],
        server: tuple[str, int] | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        export_filename: str | None = None,
        export_dir: str | None = None,
    ):
        self.backend = backend
        self.label = label
        self.timeout = timeout
        self.export_filename = export_filename
        self.export_dir = export_dir
        self.run_info: dict[str, Any] | None = None
        self._info_listeners: list[Callable[[dict[str, Any]], None]] = []
        self.degraded_reason: str | None = None
        self._open_message = {"op": "open", "server": server, "timeout": timeout, **open_options}
        self._enabled = is_main_process()
        self._process: subprocess.Popen | None = None
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        # What each sent, unanswered message does, oldest first, and when the oldest could start (monotonic).
        self._pending: collections.deque[str] = collections.deque()
        self._progress_at = 0.0
        self._points: list[list] = []  # tracked, not yet queued for the child
        # Trainer logs not yet queued (appended by the training thread without the lock).
        self._logs: collections.deque[tuple[int, float | None, float, dict[str, Any]]] = collections.deque()
        self._child_done = threading.Event()  # the child answered the close, failed or exited
        self._connection: Connection | None = None
        self._connected = threading.Event()  # the child connected back: _connection is set
        self.ready = threading.Event()
        self._closed = False
        self._run_requested = False
        self._state_lock = threading.RLock()
        if self._enabled:
            # Started now, the child imports its library while this process loads data and the model; the run
            # itself is created on first use.
            with self._state_lock:
                self._start()

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
        self._track_points([[float(value), name, step, epoch, dict(context or {}), time.time()]])

    def track_many(self, points: list[tuple[str, float, int | None, dict | None]]) -> None:
        """Record ``(name, value, step, context)`` points together (one lock, one check of the child)."""
        now = time.time()
        self._track_points(
            [[float(value), name, step, None, dict(context or {}), now] for name, value, step, context in points]
        )

    def set_params(self, params: dict, name: str) -> None:
        """Merge ``params`` into the run's parameters under ``name``."""
        self._send({"op": "set", "name": name, "params": plain(params)}, f"setting the run params {name}")

    def close(self) -> None:
        """Flush the queued messages and finish the run; gives up when one message overruns ``timeout``."""
        with self._state_lock:
            if not self._enabled or self._closed:
                return
            self._closed = True
            if self._process is None or self.degraded:
                return
            self._flush_points()
            self._enqueue({"op": "close"}, _CLOSING)  # without a run, the child just exits
        while not self._child_done.wait(0.1):
            if self._blocked():
                return
        try:
            self._process.wait(_CLOSE_EXIT_S)
        except subprocess.TimeoutExpired:
            self._process.kill()

    def when_run_info_known(self, listener: Callable[[dict[str, Any]], None]) -> None:
        """Call ``listener(run_info)`` once the run exists: now if it does, else from the thread that learns it."""
        with self._state_lock:
            info = self.run_info
            if info is None:
                self._info_listeners.append(listener)
        if info is not None:
            listener(info)

    def on_run_info(self, info: dict[str, Any]) -> None:
        """Called (on a helper thread) once the run exists: writes ``info`` as JSON to ``export_dir`` (the trainer's
        ``output_dir`` unless set), then tells the listeners."""
        self._export_run_info()
        with self._state_lock:
            listeners, self._info_listeners = self._info_listeners, []
        for listener in listeners:
            try:
                listener(info)
            except Exception:  # a listener's bug must not stop the reader thread, which tracking relies on
                logger.exception("%s run info listener failed", self.label)

    def _export_run_info(self) -> None:
        if not (self.export_dir and self.export_filename and self.run_info):
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
            logs = [self._logs.popleft() for _ in range(len(self._logs))]
            if self._points or logs:
                logs = [[step, epoch, at, _numbers(entry)] for step, epoch, at, entry in logs]
                self._enqueue({"op": "track", "points": self._points, "logs": logs}, "tracking")
                self._points = []

    def _send(self, message: dict[str, Any], what: str) -> None:
        """Queue ``message`` after every point tracked before it; dropped once tracking stopped."""
        with self._state_lock:
            if self._open():
                self._flush_points()
                self._enqueue(message, what)

    def _open(self) -> bool:
        """Open the run unless tracking is off, stopped or closed; whether messages can go to it."""
        with self._state_lock:
            if not self._enabled or self._closed or self._process is None or self._blocked():
                return False
            if not self._run_requested:
                self._run_requested = True
                self._enqueue(self._open_message, f"creating the {self.label} run")
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
            stuck = self._pending[0] if self._pending else None
            since = self._progress_at
        if stuck is not None and time.monotonic() - since > self.timeout:
            self._degrade(f"{stuck} blocked for more than {self.timeout:g}s")
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
        config = getattr(model, "config", None)
        if config is not None and hasattr(config, "to_dict"):
            self.set_params(config.to_dict(), "model")

    def on_log(self, args, state, control, logs=None, **kwargs):
        # Only noted here (a copy: callbacks edit logs); the sender thread sends them.
        if state.is_world_process_zero and logs and self._open():
            self._logs.append((state.global_step, state.epoch, time.time(), dict(logs)))

    def on_train_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.close()

    # ---- the child process ----

    def _start(self) -> None:
        """Start the child and the threads that talk to it; tracking degrades if it cannot start."""
        authkey = secrets.token_bytes(32)
        try:
            listener = Listener(family="AF_UNIX", authkey=authkey)
            command = [sys.executable, "-m", __name__, self.backend, listener.address]
            # The child imports this very package, wherever this process found it (an uninstalled checkout too).
            env = dict(os.environ)
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [_PACKAGE_ROOT, env.get("PYTHONPATH")]))
            # Its own session: a Ctrl-C meant for training must not kill the run before training closes it.
            self._process = subprocess.Popen(command, stdin=subprocess.PIPE, env=env, start_new_session=True)
            self._process.stdin.write(authkey)
            self._process.stdin.close()
        except OSError as exc:
            self._degrade(f"starting the {self.label} helper process failed: {exc!r}")
            return
        threading.Thread(target=self._talk, args=(listener,), name=f"{self.label}-sender", daemon=True).start()
        threading.Thread(target=self._read_answers, name=f"{self.label}-reader", daemon=True).start()
        # A job that fails before on_train_end still flushes and closes its run, bounded, at exit.
        atexit.register(self.close)

    def _talk(self, listener: Listener) -> None:
        """The sender thread: accepts the child's connection, then sends everything queued at once, blocking (on a
        full socket) instead of the training thread."""
        try:
            with listener:
                self._connection = listener.accept()
        except OSError:
            return  # the child is gone; the reader reports it
        self._connected.set()
        closing = False
        while not closing:
            try:
                messages = [self._outbox.get(timeout=SEND_INTERVAL_S)]
            except queue.Empty:
                if self.degraded:
                    return
                self._flush_points()
                continue
            while not self._outbox.empty():
                messages.append(self._outbox.get())
            closing = any(message["op"] == "close" for message in messages)
            try:
                self._connection.send(messages)
            except (OSError, ValueError):
                return  # the child is gone; the reader reports it

    def _read_answers(self) -> None:
        """The reader thread: acknowledgements advance progress; a failure, or the child's exit (also before it
        connected back), degrades tracking."""
        while not self._connected.wait(0.1):
            if self._process.poll() is not None and not self._connected.is_set():
                break  # it exited before connecting back
        acked = 0
        while self._connected.is_set():
            try:
                answer = self._connection.recv()
            except (EOFError, OSError):
                break
            self.ready.set()
            with self._state_lock:
                done = [self._pending.popleft() for _ in range(answer["ack"] - acked)]
                acked = answer["ack"]
                self._progress_at = time.monotonic()
                failed = self._pending[0] if self._pending else f"the {self.label} helper process"
            if "info" in answer:
                self.run_info = answer["info"]
                self.on_run_info(self.run_info)
            if "gone" in answer:
                self._degrade(answer["gone"])
            elif "failed" in answer:
                self._degrade(f"{failed} failed: {answer['failed']}")
            elif _CLOSING in done:
                self._child_done.set()
                return
        code = self._process.wait()
        with self._state_lock:
            unexpected = self._pending or not self._closed
        if unexpected:
            self._degrade(f"the {self.label} helper process exited unexpectedly (exit status {code})")
        self._child_done.set()

    def _degrade(self, reason: str) -> None:
        with self._state_lock:
            if self.degraded_reason is not None:
                return
            self.degraded_reason = reason
            process = self._process
        if process is not None:
            process.kill()  # stuck or broken: nothing it still holds is worth waiting for
        self._child_done.set()
        logger.warning("%s tracking stopped, training continues without it: %s", self.label, reason)


class IsolatedTracker(Tracker):
    """The ``Tracker`` side of a tracker whose run lives in a helper process: its ``callback``, an
    ``IsolatedCallback`` that each backend builds from its config, does the work."""

    callback: IsolatedCallback

    @property
    def degraded_reason(self) -> str | None:
        return self.callback.degraded_reason

    @property
    def degraded(self) -> bool:
        return self.callback.degraded

    def get_hf_callback(self) -> IsolatedCallback:
        return self.callback

    def set_params(self, params: dict, name: str = "experiment_metadata") -> None:
        self.callback.set_params(params, name)


# ---- the child process ----


class ServerGone(Exception):
    """The tracking server stopped accepting connections; its client would only retry or queue writes forever."""


class _Child:
    """Serves one backend over one connection (see the module docstring)."""

    def __init__(self, connection: Connection, backend: Any, backend_error: Exception | None = None):
        self.connection = connection
        self.backend = backend
        self.backend_error = backend_error  # importing or creating the backend failed: the open reports it
        self.server: tuple[str, int] | None = None
        self.timeout = DEFAULT_TIMEOUT_S
        self.opened = False
        self.done = 0
        self.info: dict[str, Any] | None = None
        self._send_lock = threading.Lock()  # answers come from the main loop and from the server watch

    def reply(self, answer: dict[str, Any]) -> None:
        with self._send_lock:
            self.connection.send(answer)

    def probe(self) -> None:
        """Raise ``ServerGone`` when the server no longer accepts connections."""
        if self.server is None:
            return
        host, port = self.server
        try:
            socket.create_connection(self.server, timeout=PROBE_TIMEOUT_S).close()
        except OSError as exc:
            raise ServerGone(f"the tracking server {host}:{port} is unreachable ({exc})") from exc

    def watch_server(self) -> None:
        """A thread: probe the server every few seconds, also while the client is stuck inside a call, and answer
        ``gone`` and exit once it is unreachable."""
        while True:
            time.sleep(PROBE_INTERVAL_S)
            try:
                self.probe()
            except ServerGone as exc:
                try:
                    self.reply({"ack": self.done, "gone": str(exc)})
                finally:
                    os._exit(0)

    def handle(self, message: dict[str, Any]) -> None:
        match message:
            case {"op": "open", "server": server, "timeout": timeout, **options}:
                self.server, self.timeout = (tuple(server) if server else None), timeout
                self.probe()
                if self.backend_error is not None:
                    raise self.backend_error
                if self.server is not None:
                    threading.Thread(target=self.watch_server, name="server-watch", daemon=True).start()
                self.info = self.backend.open(options)
                self.opened = True
            case {"op": "track", "points": points, "logs": logs}:
                if points:
                    self.backend.track(points)
                if logs:
                    self.backend.track_logs(logs)
            case {"op": "set", "name": name, "params": params}:
                self.backend.set_params(name, params)
            case {"op": "close"}:
                if self.opened:
                    self.probe()  # closing against a dead server would never return
                    self.backend.close(finished=True)
            case _:
                raise ValueError(f"unknown message {message.get('op')!r}")
        self.done += 1

    def handle_batch(self, messages: list[dict[str, Any]]) -> tuple[dict[str, Any], bool]:
        """Handle messages that arrived together; the answer, and whether the child is done (closed or failed)."""
        answer: dict[str, Any] = {}
        finished = False
        for message in messages:
            try:
                self.handle(message)
            except ServerGone as exc:
                answer["gone"] = str(exc)
            except Exception as exc:
                answer["failed"] = repr(exc)
            if answer or message["op"] == "close":
                finished = True
                break
        answer["ack"] = self.done
        if self.info is not None:
            answer["info"], self.info = self.info, None
        return answer, finished

    def serve(self) -> None:
        self.reply({"ack": 0})  # ready, the library imported: progress, as far as the parent's timeout goes
        while True:
            try:
                messages = self.connection.recv()
            except (EOFError, OSError):
                break
            answer, finished = self.handle_batch(messages)
            self.reply(answer)
            if finished:
                os._exit(0)  # never the library's exit hooks: with a dead server they may wait forever
        # The training process is gone without closing the run: close it, but never hang around doing so.
        signal.alarm(max(1, int(self.timeout)))
        if self.opened:
            try:
                self.probe()
                self.backend.close(finished=False)
            except Exception as exc:
                print(f"tracker helper: could not close the run after training ended: {exc!r}", file=sys.stderr)
        os._exit(0)


def main() -> None:
    # Below the training process's priority: where they share a core, training runs and tracking waits (its messages
    # are queued, and its progress is only checked against a timeout of seconds).
    os.nice(10)
    backend_path, address = sys.argv[1:3]
    connection = Client(address, family="AF_UNIX", authkey=sys.stdin.buffer.read())
    module_name, class_name = backend_path.split(":")
    try:
        backend, error = getattr(importlib.import_module(module_name), class_name)(), None
    except Exception as exc:
        backend, error = None, exc
    _Child(connection, backend, error).serve()


if __name__ == "__main__":
    main()
