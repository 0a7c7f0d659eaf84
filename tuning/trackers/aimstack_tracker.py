"""aim tracker: one Aim run per job, written outside the training process, that can never hang or fail training.

Design
------
The run lives in a child process, ``tuning/trackers/aim_writer.py`` (its docstring has the protocol), started with
the callback (or earlier, by ``aim_writer.start_early``) so that it imports Aim while the job loads data and the
model; the run is created on first use.
``SafeAimCallback`` turns hooks and API calls into messages and queues them; a sender thread writes them to the
child and a reader thread collects its answers, so the training thread never waits for Aim and Aim's CPU work (~0.07
ms per point) runs beside training instead of competing with it for the GIL. Tracked points and trainer logs are
buffered and sent together every ``_TRACK_INTERVAL_S``, so those threads wake about once a second; trainer logs go
as they are, and the writer process turns them into points, not this one. The first message opens the run, so
``track``/``set_params`` calls made before training starts are queued, not lost, and opening the run overlaps with
model loading.

Aim fails in ways that block rather than raise: a locked repo waits minutes for its lock, and once a remote server is
gone the client queues writes forever and ``Run.close()`` never returns (aim issue #3067). So tracking *degrades*
instead: the first failure logs one warning, sets ``degraded_reason``, kills the writer and drops every later call.
Failures are

- a message the writer has not finished ``timeout`` seconds after it could start on it (checked at every call, by
  ``on_log`` at most every second, and while closing);
- a remote server that no longer accepts TCP connections: the writer probes it every few seconds, from a thread
  of its own (a call stuck in Aim's client does not delay it), and before closing, since Aim's client does not
  report a dead server;
- any exception raised by Aim (unwritable repo, refused connection), or the writer dying.

Closing (at the end of training or, when training raised, at exit) waits for the queued messages under the same
bound, so a job never waits for Aim longer than ``timeout`` seconds past its last progress. If the training process
dies without closing, the writer closes the run itself, within the same bound.

Only global rank 0 does anything, so a job makes one run whatever its world size.

Subclassing: override a hook, call ``super()``, and add data with ``track`` and
``set_params`` — failure isolation comes with them. ``AimStackTracker`` only maps ``AimConfig`` and the ``Tracker``
API onto the callback.
"""

import atexit
import collections
import importlib.util
import json
import logging
import os
import queue
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from transformers import TrainerCallback

from tuning.config.tracker_configs import AimConfig, server_url
from tuning.trackers import aim_writer
from tuning.trackers.tracker import Tracker, is_main_process
from tuning.utils.error_logging import UserInputError
from tuning.utils.pipe_messages import encode

if importlib.util.find_spec("aim") is None:  # the writer process needs it; fail while the registry can say so
    raise ImportError("No module named 'aim'")

logger = logging.getLogger(__name__)

RUN_HASH_FILENAME = "aimstack_tracker.json"
DEGRADED_WARNING = "Aim tracking stopped, training continues without it"

_AIM_URL = re.compile(r"aim://(?P<host>[^:/\s]+):(?P<port>\d{1,5})/?")
_CLOSING = "closing the Aim run"
_CLOSE_EXIT_S = 5.0  # how long a writer that acknowledged the close may take to exit before it is killed
_TRACK_INTERVAL_S = 1.0
_RECHECK_S = 1.0
# Aim's own bounds for its system-metrics sampler.
_MIN_SYSTEM_INTERVAL_S, _MAX_SYSTEM_INTERVAL_S = 0.1, 24 * 60 * 60.0


class SafeAimCallback(TrainerCallback):
    """Tracks a training job into one Aim run; Aim failures cost a warning, never the job (see module docstring).

    ``repo`` is a local directory (created if missing) or ``aim://host:port``. ``run_hash`` is set once the run
    exists and written to ``run_hash_export_dir`` (default: the trainer's ``output_dir``; ``when_run_hash_known``
    tells); ``degraded_reason`` says why tracking stopped, if it did.
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
        self._run_hash_listeners: list[Callable[[str], None]] = []
        self.degraded_reason: str | None = None
        self._enabled = is_main_process()
        self._writer: subprocess.Popen | None = None
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        # What each sent, unanswered message does, oldest first, and when the oldest could start (monotonic).
        self._pending: collections.deque[str] = collections.deque()
        self._progress_at = 0.0
        self._points: list[list] = []  # tracked, not yet queued for the writer
        # Trainer logs not yet turned into points (appended by the training thread without the lock).
        self._logs: collections.deque[tuple[int, float | None, dict[str, Any]]] = collections.deque()
        self._open_until = 0.0  # until then (monotonic), on_log skips checking that the run can take messages
        self._writer_done = threading.Event()  # the writer answered the close, failed or exited
        self._closed = False
        self._run_requested = False
        self._state_lock = threading.RLock()
        if self._enabled:
            # Start the writer now: it imports Aim (~1.5 s of CPU) while this process loads data and the model. The
            # run itself (and so the repo) is created only on first use.
            with self._state_lock:
                self._start_writer()

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
        self._track_points([[float(value), name, step, epoch, dict(context or {})]])

    def track_many(self, points: list[tuple[str, float, int | None, dict | None]]) -> None:
        """Record ``(name, value, step, context)`` points together (one lock, one check of the writer)."""
        self._track_points(
            [
                [float(value), name, step, None, {} if context is None else dict(context)]
                for name, value, step, context in points
            ]
        )

    def set_params(self, params: dict, name: str) -> None:
        """Merge ``params`` into the run param ``name``, so queries like ``run.<name>.<key> == …`` find the run."""
        self._send({"op": "set", "name": name, "params": dict(params)}, f"setting the run param {name}")

    def when_run_hash_known(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(run_hash)`` once the run exists: now if it does, else from the thread that learns it."""
        with self._state_lock:
            known = self.run_hash
            if known is None:
                self._run_hash_listeners.append(listener)
        if known is not None:
            listener(known)

    def close(self) -> None:
        """Flush the queued messages and finish the run; gives up on Aim when one message overruns ``timeout``."""
        with self._state_lock:
            if not self._enabled or self._closed:
                return
            self._closed = True
            self._open_until = 0.0
            if self._writer is None or self.degraded:
                return
            if self._run_requested:
                self._flush_points()
                self._enqueue({"op": "close"}, _CLOSING)
            else:
                self._outbox.put(None)  # no run to close: the writer just ends with its input
        while not self._writer_done.wait(0.1):
            if self._blocked():
                return
        try:
            self._writer.wait(_CLOSE_EXIT_S)
        except subprocess.TimeoutExpired:
            self._writer.kill()

    def _track_points(self, points: list[list]) -> None:
        """Buffer points: the sender thread sends them together every ``_TRACK_INTERVAL_S`` (and before any other
        message), so tracking wakes the training process's helper threads a few times a second, not per point."""
        with self._state_lock:
            if points and self._open():
                self._points.extend(points)

    def _flush_points(self) -> None:
        with self._state_lock:
            logs = [self._logs.popleft() for _ in range(len(self._logs))]
            if self._points or logs:
                self._enqueue({"op": "track", "points": self._points, "logs": logs}, "tracking")
                self._points = []

    def _send(self, message: dict[str, Any], what: str) -> None:
        """Queue ``message`` for the writer, after every point tracked before it; dropped once tracking stopped."""
        with self._state_lock:
            if self._open():
                self._flush_points()
                self._enqueue(message, what)

    def _open(self) -> bool:
        """Open the run unless tracking is off, stopped or closed; whether messages can go to it."""
        with self._state_lock:
            if not self._enabled or self._closed or self._writer is None or self._blocked():
                return False
            if not self._run_requested:
                self._run_requested = True
                open_run = {
                    "op": "open",
                    "repo": self.repo,
                    "timeout": self.timeout,
                    "server": _server_address(self.repo),
                    "experiment": self.experiment,
                    "system_tracking_interval": self.system_tracking_interval,
                    "pid": os.getpid(),
                    "executable": sys.executable,
                    "arguments": sys.argv,
                }
                self._enqueue(open_run, f"creating the Aim run in {self.repo}")
            return True

    def _enqueue(self, message: dict[str, Any], what: str) -> None:
        with self._state_lock:
            if not self._pending:
                self._progress_at = time.monotonic()
            self._pending.append(what)
            self._outbox.put(message)

    def _blocked(self) -> bool:
        """Whether tracking stopped; stops it when the writer has made no progress for more than ``timeout``."""
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
            if self.run_hash_export_dir is None:
                self.run_hash_export_dir = args.output_dir
                if self.run_hash is not None:  # the run was opened before the trainer existed
                    self._export_run_hash()
            self._open()

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if not state.is_world_process_zero:
            return
        self.set_params(args.to_sanitized_dict(), "hparams")
        config = getattr(model, "config", None)
        if config is not None and hasattr(config, "to_dict"):
            self.set_params(config.to_dict(), "model")

    def on_log(self, args, state, control, logs=None, **kwargs):
        # Only noted here (a copy: callbacks edit logs); the sender thread turns logs into points when it sends them.
        # Whether the run still takes messages (and the writer is not stuck) is checked at most every second.
        if not state.is_world_process_zero or not logs:
            return
        if time.monotonic() >= self._open_until:
            with self._state_lock:
                if not self._open():
                    return
                self._open_until = time.monotonic() + _RECHECK_S
        self._logs.append((state.global_step, state.epoch, dict(logs)))

    def on_train_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.close()

    # ---- the writer process ----

    def _start_writer(self) -> None:
        """Start the writer process and its sender and reader threads; tracking degrades if it cannot start."""
        try:
            self._writer = aim_writer.adopt_or_spawn()
        except OSError as exc:
            self._degrade(f"starting the Aim writer failed: {exc!r}")
            return
        threading.Thread(target=self._send_messages, name="aim-sender", daemon=True).start()
        threading.Thread(target=self._read_answers, name="aim-reader", daemon=True).start()
        # A job that fails before on_train_end still flushes and closes its run, bounded, at exit.
        atexit.register(self.close)

    def _send_messages(self) -> None:
        """The sender thread: the writer's input, everything queued at once; blocks (on a full pipe) instead of the
        training thread."""
        stream = self._writer.stdin
        closing = False
        while not closing:
            try:
                messages = [self._outbox.get(timeout=_TRACK_INTERVAL_S)]
            except queue.Empty:
                if self.degraded:
                    return
                self._flush_points()
                continue
            while not self._outbox.empty():
                messages.append(self._outbox.get())
            if messages[-1] is None:  # closed before any run was opened
                break
            closing = any(message["op"] == "close" for message in messages)
            try:
                stream.write(b"".join(encode(message) for message in messages))
                stream.flush()
            except (OSError, ValueError):
                return  # the writer is gone; the reader reports why
        stream.close()

    def _read_answers(self) -> None:
        """The reader thread: acknowledgements advance progress; a failure or an early exit degrades tracking."""
        acked = 0
        for line in self._writer.stdout:
            answer = json.loads(line)
            with self._state_lock:
                done = [self._pending.popleft() for _ in range(answer["ack"] - acked)]
                acked = answer["ack"]
                self._progress_at = time.monotonic()
                failed = self._pending[0] if self._pending else "the Aim writer"
            if "run_hash" in answer:
                with self._state_lock:
                    self.run_hash = answer["run_hash"]
                    listeners, self._run_hash_listeners = self._run_hash_listeners, []
                self._export_run_hash()
                for listener in listeners:
                    try:
                        listener(self.run_hash)
                    except Exception:  # a listener's bug must not stop this thread, which tracking relies on
                        logger.exception("run hash listener failed")
            if "gone" in answer:
                self._degrade(answer["gone"])
            elif "failed" in answer:
                self._degrade(f"{failed} failed: {answer['failed']}")
            elif _CLOSING in done:
                break
        else:
            code = self._writer.wait()
            with self._state_lock:
                unexpected = not self.degraded and (self._pending or not self._closed)
            if unexpected:
                self._degrade(f"the Aim writer exited unexpectedly (exit status {code})")
        self._writer_done.set()

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

    # ---- degradation ----

    def _degrade(self, reason: str) -> None:
        with self._state_lock:
            if self.degraded_reason is not None:
                return
            self.degraded_reason = reason
            self._open_until = 0.0
            writer = self._writer
        if writer is not None:
            writer.kill()  # stuck or broken: nothing it still holds is worth waiting for
        self._writer_done.set()
        logger.warning("%s: %s", DEGRADED_WARNING, reason)


def _server_address(repo: str) -> tuple[str, int] | None:
    match = _AIM_URL.fullmatch(repo)
    return (match["host"], int(match["port"])) if match else None


def resolve_repo(config: AimConfig) -> str:
    """Validate ``config`` (cheaply, no network) and return where the run goes: a configured server wins."""
    ip = config.aim_remote_server_ip or None
    port = None if config.aim_remote_server_port in (None, "") else config.aim_remote_server_port
    if (ip is None) != (port is None):
        raise UserInputError("--aim_remote_server_ip and --aim_remote_server_port must be given together")
    if config.aim_close_timeout is None or config.aim_close_timeout <= 0:
        raise UserInputError(
            f"--aim_close_timeout must be a positive number of seconds, got {config.aim_close_timeout}"
        )
    interval = config.aim_system_tracking_interval
    if interval is not None and not _MIN_SYSTEM_INTERVAL_S <= interval <= _MAX_SYSTEM_INTERVAL_S:
        raise UserInputError(f"--aim_system_tracking_interval must be between 0.1 s and one day, got {interval}")
    servers = {_server_address(url.strip()) or url for url in (config.aim_url, server_url(ip, port)) if url}
    for server in servers:
        if isinstance(server, str) or not 0 < server[1] < 65536:
            raise UserInputError(f"Aim server must look like aim://host:port (port 1-65535), got {server!r}")
    if len(servers) > 1:
        raise UserInputError(
            "give the Aim server as --aim_url or as --aim_remote_server_ip/_port, not both: "
            f"they name different servers ({config.aim_url} and {server_url(ip, port)})"
        )
    if servers:
        server = servers.pop()
        if config.aim_repo:
            logger.warning(
                "ignoring --aim_repo %s: the run goes to the Aim server aim://%s:%d", config.aim_repo, *server
            )
        return "aim://{}:{}".format(*server)
    if config.aim_repo:
        return os.path.abspath(os.path.expanduser(config.aim_repo))
    raise UserInputError(
        "Aim tracker requested but repo or server is not specified: give --aim_repo DIR or an Aim server "
        "(--aim_url aim://host:port, or --aim_remote_server_ip with --aim_remote_server_port)"
    )


class AimStackTracker(Tracker):
    """The ``aim`` tracker: validates ``AimConfig`` and exposes a ``SafeAimCallback``. The run hash goes to
    ``aim_run_id_export_path``, else to the trainer's ``output_dir``, which the callback learns when the trainer
    is created."""

    def __init__(self, tracker_config: AimConfig):
        super().__init__(name="aim", tracker_config=tracker_config)
        self.callback = SafeAimCallback(
            resolve_repo(tracker_config),
            experiment=tracker_config.experiment,
            system_tracking_interval=tracker_config.aim_system_tracking_interval,
            timeout=tracker_config.aim_close_timeout,
            run_hash_export_dir=tracker_config.aim_run_id_export_path,
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
