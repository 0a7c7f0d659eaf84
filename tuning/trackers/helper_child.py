"""A tracker helper's child process, ``python -m tuning.trackers.helper_child MODULE:BACKEND ADDRESS``: imports its
backend (a tracking library's writer), connects back to ADDRESS and serves the training process's messages, probing
the tracking server so that a dead one ends the child instead of hanging it. The protocol (what the parent sends,
what this answers) is ``tuning.trackers.helper_transport``'s docstring; the parent side is the transport.

A backend is a class without constructor arguments, importable without the training process's heavy modules, with
``open(options) -> dict`` (facts about the new run, e.g. its id), ``track(points)``, ``set_params(name, params)`` and
``close(status)`` (the job's outcome as MLflow names run statuses; ``KILLED`` too when the training process died).
"""

import os
import pkgutil
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Client, Connection
from typing import Any

from tuning.utils.prologue import collector_paused

PROBE_INTERVAL_S = 5.0
PROBE_TIMEOUT_S = 2.0
# After a failed call, how long the server must keep accepting connections for the call's own error to be the
# reason: a server being killed can cut a call short and still accept a connection a moment later.
SETTLE_S = 1.0
DEFAULT_TIMEOUT_S = 30.0
KILLED = "KILLED"  # tuning.trackers.tracker's, not imported: the child stays light


class ServerGone(Exception):
    """The tracking server stopped accepting connections; its client would only retry or queue writes forever."""


class HelperChild:
    """Serves one backend over one connection (see the module docstring). ``exit`` ends the process (``os._exit``:
    never the library's exit hooks, which with a dead server may wait forever) and ``alarm`` bounds the last close
    (``signal.alarm``); a test serving in a thread of its own passes its own."""

    def __init__(
        self,
        connection: Connection,
        backend: Any,
        exit: Callable[[int], Any] = os._exit,
        alarm: Callable[[int], Any] = signal.alarm,
    ):
        self.connection = connection
        self.backend = backend
        self.exit = exit
        self.alarm = alarm
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

    def probe_after_failure(self) -> None:
        """``probe`` over ``SETTLE_S`` after a call failed: ``ServerGone`` if the server stops accepting meanwhile."""
        if self.server is None:
            return
        deadline = time.monotonic() + SETTLE_S
        while True:
            self.probe()
            if time.monotonic() >= deadline:
                return
            time.sleep(0.2)

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
                    self.exit(0)
                return

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
                        self.probe_after_failure()
                        answer["failed"] = repr(exc)
                    except ServerGone as gone:
                        answer["gone"] = str(gone)
                if "gone" in answer or "failed" in answer or message["op"] == "close":
                    self.reply(**answer)
                    self.exit(0)
                    return
            self.reply(**answer)
        # The training process is gone without closing the run: close it, but never hang around doing so.
        self.alarm(max(1, int(self.timeout)))
        try:
            if self.opened:
                self.probe()
                self.backend.close(KILLED)
        finally:
            self.exit(0)


def main() -> None:
    # Below the training process's priority: where they share a core, training runs and tracking waits (its messages
    # are queued, and its progress is only checked against a timeout of seconds).
    os.nice(10)
    backend_path, address = sys.argv[1:3]
    connection = Client(address, family="AF_UNIX")
    try:
        with collector_paused():  # the tracking library's imports, as a training script's
            backend = pkgutil.resolve_name(backend_path)()
    except Exception as exc:  # reported as the failure of whatever the parent asks first
        connection.send({"ack": 0, "failed": repr(exc)})
        os._exit(0)
    HelperChild(connection, backend).serve()


if __name__ == "__main__":
    main()
