"""The training process's side of a tracker helper (``tuning.trackers.helper_child``): spawn the child (or adopt one
started early), send it messages without ever blocking training, count its acknowledgements, and degrade (kill it,
warn once, go on without it) when it fails, exits or makes no progress for longer than the timeout. What the messages
mean for the run is the callback's (``tuning.trackers.isolated``); the failure rules are docs/trackers.md's "Failure
isolation".

Protocol, over the ``multiprocessing.connection`` the child opens back to the address it is given: the parent sends
lists of messages, ``{"op": "open", "server": [host, port] | None, "timeout": s, **options}`` first, then any of
``{"op": "track", "points": [[value, name, step, epoch, context, time], ...]}`` and ``{"op": "set", "name": ...,
"params": {...}}``, then ``{"op": "close", "status": ...}`` (alone when no run was opened; the status is the job's
outcome, ``FINISHED``, ``FAILED`` or ``KILLED``). The child answers ``{"ack": 0}`` once its backend is imported, then
each list with ``{"ack": n}`` (n messages done so far), adding ``"info"`` (what the backend's ``open`` returned) after
the open, or ``"failed": repr(exception)`` or ``"gone": reason``, after which it exits.
"""

import atexit
import collections
import logging
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection, Listener
from typing import Any

from tuning.trackers.tracker import is_main_process

logger = logging.getLogger("tuning.trackers.isolated")

SEND_INTERVAL_S = 1.0  # tracked points are sent together this often
CHILD_MODULE = "tuning.trackers.helper_child"
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

Helper = tuple[subprocess.Popen, Listener]  # a child process and the listener it connects back to


def spawn_helper(backend: str) -> Helper:
    """The child process of ``backend`` ("module:Class") and its listener; ``OSError`` when it cannot start."""
    # The child imports this very package, wherever this process found it (an uninstalled checkout too).
    path = os.pathsep.join(filter(None, [_PACKAGE_ROOT, os.environ.get("PYTHONPATH")]))
    # No authkey: the socket is in a directory only this user can enter.
    listener = Listener(family="AF_UNIX")
    try:
        # Its own session: a Ctrl-C meant for training must not kill the run before training closes it.
        process = subprocess.Popen(
            [sys.executable, "-m", CHILD_MODULE, backend, listener.address],
            stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONPATH": path},
            start_new_session=True,
        )
    except OSError:
        listener.close()
        raise
    return process, listener


class EarlyHelpers:
    """Helpers started ahead of their trackers, by backend, oldest first: each waits for the next transport of its
    backend to adopt it; one never adopted is stopped at exit (its run was never opened). ``spawn`` starts one
    (``spawn_helper``; the protocol's tests serve the child on a thread instead)."""

    def __init__(self, spawn: Callable[[str], Helper] = spawn_helper) -> None:
        self._helpers: dict[str, list[Helper]] = {}
        self._spawn = spawn

    def start(self, backend: str) -> None:
        """Start the helper of ``backend`` now, on global rank 0; one that cannot start is left to the tracker, which
        starts and reports its own."""
        if not is_main_process():
            return
        try:
            helper = self._spawn(backend)
        except OSError:
            return
        if not self._helpers:  # the first one
            atexit.register(self.stop)
        self._helpers.setdefault(backend, []).append(helper)

    def adopt(self, backend: str) -> Helper | None:
        """The oldest waiting helper of ``backend``, now the caller's; None when there is none."""
        waiting = self._helpers.get(backend)
        return waiting.pop(0) if waiting else None

    def stop(self) -> None:
        for helpers in self._helpers.values():
            while helpers:
                process, listener = helpers.pop()
                process.kill()
                process.wait()
                listener.close()


class HelperTransport:
    """One helper, seen from the training process. ``send`` only queues; a sender thread writes (blocking on a full
    socket instead of the training thread) and a reader thread takes the acknowledgements. ``pending`` names what
    each sent, unanswered message does, oldest first; ``ready`` is set once the child has imported its library;
    ``degraded_reason`` says why the helper was given up, if it was. ``on_info`` gets the backend's facts about the
    run once it is open (on the reader thread); ``on_idle`` is called by the sender when nothing was queued for a
    while (the callback sends its batched points then)."""

    def __init__(
        self,
        backend: str,
        label: str,
        timeout: float,
        on_info: Callable[[dict[str, Any]], None],
        on_idle: Callable[[], None],
    ):
        self.backend, self.label, self.timeout = backend, label, timeout
        self.degraded_reason: str | None = None
        self.ready = threading.Event()
        self.process: subprocess.Popen | None = None
        self.pending: collections.deque[str] = collections.deque()
        self.closing = False  # the close was queued: the child's exit is expected
        self._on_info, self._on_idle = on_info, on_idle
        self._connection: Connection | None = None
        self._connected = threading.Event()  # the child connected back: _connection is set
        self._exited = threading.Event()  # the child exited and the reader has judged how
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._progress_at = 0.0  # when the oldest pending message could start (monotonic)
        self._lock = threading.RLock()

    @property
    def degraded(self) -> bool:
        return self.degraded_reason is not None

    def start(self, early_helpers: EarlyHelpers | None = None) -> None:
        """Adopt the helper ``early_helpers`` holds for this backend, or spawn one, and start the threads that talk to
        it; degrade if it cannot start."""
        if (helper := early_helpers.adopt(self.backend) if early_helpers else None) is None:
            try:
                helper = spawn_helper(self.backend)
            except OSError as exc:
                self.degrade(f"starting the {self.label} helper process failed: {exc!r}")
                return
        self.process, listener = helper
        threading.Thread(target=self._send_all, args=(listener,), name=f"{self.label}-sender", daemon=True).start()
        threading.Thread(target=self._read_answers, name=f"{self.label}-reader", daemon=True).start()

    def send(self, message: dict[str, Any], what: str) -> None:
        """Queue ``message``; ``what`` names it in a degradation's reason."""
        with self._lock:
            if not self.pending:
                self._progress_at = time.monotonic()
            self.pending.append(what)
            self.closing = self.closing or message["op"] == "close"
            self._outbox.put(message)

    def blocked(self) -> bool:
        """Whether the helper was given up; gives it up when it has made no progress for more than ``timeout``."""
        with self._lock:
            if self.pending and time.monotonic() - self._progress_at > self.timeout:
                self.degrade(f"{self.pending[0]} blocked for more than {self.timeout:g}s")
            return self.degraded

    def wait_exited(self) -> None:
        """Until the child has exited, or the helper is given up."""
        while not self._exited.wait(0.1) and not self.blocked():
            pass

    def degrade(self, reason: str) -> None:
        with self._lock:
            if self.degraded:
                return
            self.degraded_reason = reason
        if self.process is not None:
            self.process.kill()  # stuck or broken: nothing it still holds is worth waiting for
        logger.warning("%s tracking stopped, training continues without it: %s", self.label, reason)

    def _send_all(self, listener: Listener) -> None:
        """The sender thread: accepts the child's connection, then sends what is queued."""
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
                self._on_idle()
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
        while not self._connected.wait(0.1) and self.process.poll() is None:
            pass  # until the child connects back, or exits without doing so
        acked = 0
        while self._connected.is_set():
            try:
                answer = self._connection.recv()
            except (EOFError, OSError):
                break
            self.ready.set()
            with self._lock:
                for _ in range(answer["ack"] - acked):
                    self.pending.popleft()
                acked = answer["ack"]
                self._progress_at = time.monotonic()
                failed = self.pending[0] if self.pending else f"the {self.label} helper process"
            if "info" in answer:
                self._on_info(answer["info"])
            if "gone" in answer:
                self.degrade(answer["gone"])
            elif "failed" in answer:
                self.degrade(f"{failed} failed: {answer['failed']}")
        code = self.process.wait()
        with self._lock:
            if self.pending or not self.closing:
                self.degrade(f"the {self.label} helper process exited unexpectedly (exit status {code})")
        self._exited.set()
