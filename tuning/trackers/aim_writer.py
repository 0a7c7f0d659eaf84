"""The Aim writer: a child process of the aim tracker that owns the job's Aim run.

Aim costs ~0.4 ms of CPU per tracked point; inside the training process that work competes with the training loop
for the GIL. Here it runs beside it, and a writer that Aim blocks for good (a locked repo, a dead server: aim#3067)
is simply killed. ``tuning.trackers.aimstack.SafeAimCallback`` starts it by path (``python aim_writer.py``) when
the tracker is created, so it imports only the standard library, psutil and aim, while the job prepares; the run
is created by the first message.

Protocol: one JSON object per line. The tracker sends, in this order, ``{"op": "open", ...}``, any number of
``{"op": "track", "points": [[value, name, step, epoch, context], ...]}`` and ``{"op": "set", "name": ...,
"params": {...}}``, then ``{"op": "close"}``. After each chunk of input it answers ``{"ack": n}``: n messages are
done so far (the first ack after the open also carries ``run_hash``). When a message fails, the answer adds
``"failed": repr of the exception`` (the message after the n-th failed) or ``"gone": reason`` (the remote server
is unreachable) and the writer exits.
When its input ends without a close (the training process died), it closes the run itself within ``--timeout``.
"""

import argparse
import importlib.metadata
import json
import os
import signal
import socket
import sys
import time
from typing import Any

# Imported at start, before any message: the tracker starts the writer early so that this overlaps its job's setup.
import psutil
from aim import Run

PROBE_INTERVAL_S = 5.0
PROBE_TIMEOUT_S = 2.0


def installed_packages() -> dict[str, str]:
    """Installed distributions and versions, as Aim's UI shows them, without Aim's ``pkg_resources`` listing (which
    crashes on setuptools >= 81)."""
    packages = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            packages[name] = dist.version
    return packages


class ServerGone(Exception):
    """The remote Aim server stopped accepting connections; Aim's client would only queue writes forever."""


class Writer:
    def __init__(self, server: tuple[str, int] | None):
        self.server = server
        self.run: Any = None
        self.done = 0
        self.new_run_hash: str | None = None
        self._last_probe = 0.0

    def probe(self, force: bool = False) -> None:
        """Raise ``ServerGone`` when the server no longer accepts connections (checked every few seconds)."""
        now = time.monotonic()
        if self.server is None or (not force and now - self._last_probe < PROBE_INTERVAL_S):
            return
        self._last_probe = now
        try:
            socket.create_connection(self.server, timeout=PROBE_TIMEOUT_S).close()
        except OSError as exc:
            raise ServerGone(f"the Aim server aim://{self.server[0]}:{self.server[1]} is unreachable ({exc})") from exc

    def open(self, message: dict[str, Any]) -> str:
        self.probe(force=True)
        self.run = Run(
            repo=message["repo"],
            experiment=message["experiment"],
            system_tracking_interval=message["system_tracking_interval"],
            log_system_params=False,
            capture_terminal_logs=False,
        )
        sampler = getattr(self.run, "_system_resource_tracker", None)
        if sampler is not None:  # Aim's process CPU and memory series describe the training process, not this one
            sampler._process = psutil.Process(message["pid"])
        self.run["__system_params"] = {
            "packages": installed_packages(),
            "executable": message["executable"],
            "arguments": message["arguments"],
        }
        return self.run.hash

    def handle(self, message: dict[str, Any]) -> None:
        op = message["op"]
        self.probe(force=op == "close")
        if op == "open":
            self.new_run_hash = self.open(message)
        elif op == "track":
            for value, name, step, epoch, context in message["points"]:
                self.run.track(value, name=name, step=step, epoch=epoch, context=context)
        elif op == "set":
            for key, value in message["params"].items():
                self.run.set((message["name"], key), value, strict=False)
        elif op == "close":
            self.run.close()
        else:
            raise ValueError(f"unknown message {op!r}")
        self.done += 1

    def handle_chunk(self, lines: list[bytes]) -> tuple[dict[str, Any], bool]:
        """Handle complete input lines; the answer, and whether the writer is done (closed or failed)."""
        answer: dict[str, Any] = {}
        finished = False
        for line in lines:
            message = json.loads(line)
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
        if self.new_run_hash is not None:
            answer["run_hash"], self.new_run_hash = self.new_run_hash, None
        return answer, finished


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", default=None, help="host:port of a remote Aim server to probe")
    parser.add_argument("--timeout", type=float, default=30.0, help="bound on closing the run when input ends")
    args = parser.parse_args()
    host, _, port = (args.server or "").rpartition(":")
    writer = Writer((host, int(port)) if args.server else None)
    # The protocol keeps the real stdout; anything Aim prints goes to stderr instead.
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)

    # Whatever arrived together is handled together and answered once: one wake-up of the tracker per chunk.
    pending = b""
    while chunk := os.read(sys.stdin.fileno(), 1 << 16):
        *lines, pending = (pending + chunk).split(b"\n")
        if not lines:
            continue
        answer, finished = writer.handle_chunk(lines)
        replies.write(json.dumps(answer) + "\n")
        if finished:
            os._exit(0)  # never Aim's exit hooks: with a dead server they wait forever
    # The training process is gone without closing the run: close it, but never hang around doing so.
    signal.alarm(max(1, int(args.timeout)))
    if writer.run is not None:
        try:
            writer.probe(force=True)
            writer.run.close()
        except Exception as exc:
            print(f"aim writer: could not close the run after the training process ended: {exc!r}", file=sys.stderr)
    os._exit(0)


if __name__ == "__main__":
    main()
