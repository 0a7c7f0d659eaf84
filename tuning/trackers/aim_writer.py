"""The Aim writer: a child process of the aim tracker that owns the job's Aim run.

Aim costs ~0.07 ms of CPU per tracked point here, a fifth of what Aim's own ``Run.track`` costs for the same points
(see ``Writer.writes_together``); inside the training process that work would compete with training for the GIL.
Here it runs beside it, and a writer that Aim blocks for good (a locked repo, a dead server: aim#3067) is simply
killed. It runs as a script (``spawn``), imports Aim at once (~2 s of CPU) and waits for its first
message, which says which run to create: so a writer can start before its job knows its configuration.
``tuning.trackers.aimstack_tracker.SafeAimCallback`` starts one when the tracker is created, or adopts the one that
``start_early`` started before the job's own heavy imports (``wrappers/bench_train.py`` does), so that importing Aim
overlaps those instead of the first training steps. Importing this module in the training process stays cheap.

Protocol: the tracker sends messages (dicts, framed by ``tuning.utils.pipe_messages``: a length, then a pickle),
in this order: ``{"op": "open", ...}`` (repo, experiment, ``timeout``, ``server`` as [host, port] or None, ...), any
number of ``{"op": "track", "points": [[value, name, step, epoch, context], ...], "logs": [[step, epoch, {trainer
log}], ...]}`` (logs become points here, named as every tracker names them, by
``tuning.trackers.tracker.log_series``) and ``{"op": "set", "name": ..., "params": {...}}``, then ``{"op":
"close"}``. After each chunk of input it answers one JSON line, ``{"ack": n}``: n messages are done so far (the
first ack after the open also carries ``run_hash``). When a message fails, the answer adds ``"failed": repr of the
exception`` (the message after the n-th failed) or ``"gone": reason`` (the remote server is unreachable) and the
writer exits.
When its input ends without a close (the training process died), it closes the run itself within the open's
``timeout``; a writer whose input ends before any open just exits.
"""

import contextlib
import functools
import importlib.metadata
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any, TextIO

if __name__ == "__main__":  # the writer process: import Aim now, before any message (see the module docstring)
    # Below the training process's priority: where they share a core, training runs and Aim waits (its points are
    # sent ahead, and its progress is only checked against a timeout of seconds).
    os.nice(10)
    import psutil
    from aim import Run

    # Run as a script, this folder heads sys.path; the project root instead makes ``tuning`` importable even from a
    # checkout that is not installed.
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from tuning.trackers.tracker import log_series
    from tuning.utils.pipe_messages import receive

PROBE_INTERVAL_S = 5.0
PROBE_TIMEOUT_S = 2.0
DEFAULT_CLOSE_TIMEOUT_S = 30.0

_early_writer: subprocess.Popen | None = None


def spawn() -> subprocess.Popen:
    """A new writer process, reading messages (``tuning.utils.pipe_messages``) on its stdin and answering JSON lines
    on its stdout. Its own session: a Ctrl-C meant for training must not kill the run before training closes it."""
    command = [sys.executable, os.path.abspath(__file__)]
    return subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)


def asks_for_aim(argv: list[str]) -> bool:
    """Whether a command line names the aim tracker (``--tracker aim``, ``--trackers file_logger aim``,
    ``--trackers=aim``): enough to decide on ``start_early``, which only saves time."""
    in_trackers, values = False, []
    for arg in argv:
        if arg.startswith("--"):
            flag, _, value = arg.partition("=")
            in_trackers = flag in ("--tracker", "--trackers")
            if in_trackers and value:
                values.append(value)
        elif in_trackers:
            values.append(arg)
    return any("aim" in value for value in values)


def start_early() -> None:
    """Start this process's writer now (on global rank 0 only, where the tracker writes), for the aim tracker that
    the job creates later to adopt. Unadopted, it exits when this process does (its input ends)."""
    from tuning.trackers.tracker import is_main_process  # here: the writer process itself never needs it

    global _early_writer
    if _early_writer is None and is_main_process() and importlib.util.find_spec("aim"):
        with contextlib.suppress(OSError):  # the tracker tries again, and reports it, when it is created
            _early_writer = spawn()


def adopt_or_spawn() -> subprocess.Popen:
    """The writer ``start_early`` started, if it is still waiting for its run; else a new one."""
    global _early_writer
    writer, _early_writer = _early_writer, None
    if writer is not None and writer.poll() is None:
        return writer
    return spawn()


def installed_packages() -> dict[str, str]:
    """Installed distributions and versions, as Aim's UI shows them, without Aim's ``pkg_resources`` listing (which
    crashes on setuptools >= 81)."""
    packages = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            packages[name] = dist.version
    return packages


def run_containers(run: Any) -> list:
    """The local RocksDB containers that a run's series and their metadata are written to (for
    ``Writer.writes_together``); none for a remote repo, or where Aim's internals differ from the 3.29 these names
    come from: then every write commits on its own, as in Aim itself."""
    from aim.storage.rockscontainer import RocksContainer

    if run.repo.is_remote_repo:
        return []
    containers = []
    try:
        tracker = run._tracker
        for tree in (tracker.meta_run_tree, *tracker.series_run_trees.values()):
            container = tree.container
            while not isinstance(container, RocksContainer):
                container = container.parent
            if all(container is not known for known in containers):
                containers.append(container)
    except AttributeError:
        return []
    return containers


def _commit_unless(gathering: Any, container: Any, batch: Any) -> None:
    """A container's commit while it gathers writes: the gathering batch waits; a batch begun before (by Aim's own
    system-metrics thread) is written now."""
    if batch is not gathering:
        type(container).commit(container, batch)


def _skip_delete(*args: Any, **kwargs: Any) -> None:
    """A container's delete while it gathers tracked values: they clear nothing (see ``Writer.writes_together``)."""


class _LatestWrites:
    """Stands in for a run's metadata tree while one thread tracks a message: Aim rewrites a series' last value and
    step (and minimum or maximum) at every point, so that thread's writes are kept, the last per key, for ``apply``
    to write once. Other threads write through; everything else is the tree's."""

    def __init__(self, tree: Any):
        self.tree = tree
        self.owner = threading.get_ident()
        self.latest: dict[Any, Any] = {}

    def __setitem__(self, path: Any, value: Any) -> None:
        if threading.get_ident() == self.owner:
            self.latest[path] = value
        else:
            self.tree[path] = value

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tree, name)

    def apply(self) -> None:
        for path, value in self.latest.items():  # tracking's keys are leaves: none holds another, order is free
            self.tree[path] = value


class ServerGone(Exception):
    """The remote Aim server stopped accepting connections; Aim's client would only queue writes forever."""


class Writer:
    def __init__(self, replies: TextIO, packages: dict[str, str]):
        self.packages = packages
        self.server: tuple[str, int] | None = None
        self.close_timeout = DEFAULT_CLOSE_TIMEOUT_S
        self.run: Any = None
        self.containers: list = []  # the run's local RocksDB containers, written in batches
        self.done = 0
        self.new_run_hash: str | None = None
        self._replies = replies
        self._reply_lock = threading.Lock()  # answers come from the main loop and from the server watch

    def reply(self, answer: dict[str, Any]) -> None:
        with self._reply_lock:
            self._replies.write(json.dumps(answer) + "\n")

    def probe(self) -> None:
        """Raise ``ServerGone`` when the server no longer accepts connections."""
        if self.server is None:
            return
        try:
            socket.create_connection(self.server, timeout=PROBE_TIMEOUT_S).close()
        except OSError as exc:
            raise ServerGone(f"the Aim server aim://{self.server[0]}:{self.server[1]} is unreachable ({exc})") from exc

    def watch_server(self) -> None:
        """A thread: probe the server every few seconds, also while Aim's client is stuck inside a call on a dead
        server, and answer ``gone`` and exit once it is."""
        while True:
            time.sleep(PROBE_INTERVAL_S)
            try:
                self.probe()
            except ServerGone as exc:
                with contextlib.suppress(OSError, ValueError):  # the tracker may be gone too
                    self.reply({"ack": self.done, "gone": str(exc)})
                os._exit(0)

    def open(self, message: dict[str, Any]) -> str:
        if message.get("server"):
            host, port = message["server"]
            self.server = host, port
        self.close_timeout = message.get("timeout", DEFAULT_CLOSE_TIMEOUT_S)
        self.probe()
        if self.server is not None:
            threading.Thread(target=self.watch_server, name="aim-server-watch", daemon=True).start()
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
        self.containers = run_containers(self.run)
        self.run["__system_params"] = {
            "packages": self.packages,
            "executable": message["executable"],
            "arguments": message["arguments"],
        }
        return self.run.hash

    @contextlib.contextmanager
    def writes_together(self):
        """Track at a fraction of Aim's own storage work, leaving the same data. Aim commits each write of a point to
        RocksDB on its own (about seven per point: value, step, epoch and time, and the series' last value, last
        step, minimum or maximum), and precedes each with deletes of what the key held (a range delete for a
        subtree, a delete for a blob). Within this block, for each of the run's local containers:

        - the writes gather in one batch, committed when the block ends (tracking reads nothing back);
        - the deletes are skipped: tracking writes numbers to keys that hold a number or nothing (a new context's
          dict goes to a new key), so they clear nothing, yet their range tombstones cost RocksDB's background
          threads more CPU than the writes;
        - the series metadata is written once, its last value per key (``_LatestWrites``).

        CPU per point (the writer's, background threads included) falls to a fifth. Only tracking writes meanwhile:
        this thread, and Aim's own system-metrics sampler, whose writes join the batch."""
        if not self.containers:  # a remote repo, or an Aim whose internals differ: Aim's own way
            yield
            return
        tracker = self.run._tracker
        metadata = tracker.meta_run_tree = _LatestWrites(tracker.meta_run_tree)
        batches = []
        for container in self.containers:
            batch = container.batch()
            # Instance attributes shadow the methods, on these containers only, for the block.
            container.batch = lambda batch=batch: batch
            container.commit = functools.partial(_commit_unless, batch, container)
            container.delete_range = container._delete_blob = _skip_delete
            batches.append((container, batch))
        try:
            yield
            metadata.apply()
        finally:
            tracker.meta_run_tree = metadata.tree
            for container, batch in batches:
                del container.batch, container.commit, container.delete_range, container._delete_blob
                container.commit(batch)

    def track(self, points: list[list]) -> None:
        """Track ``[value, name, step, epoch, context]`` points in order. A row of points that share step, epoch and
        context (a trainer log, a step's measurements) is one call to Aim, which costs a third less per point than
        a call each."""
        together: dict[str, float] = {}
        shared: tuple | None = None
        for value, name, step, epoch, context in points:
            if (step, epoch, context) != shared or name in together:
                if together:
                    self.run.track(together, step=shared[0], epoch=shared[1], context=shared[2])
                together, shared = {}, (step, epoch, context)
            together[name] = value
        if together:
            self.run.track(together, step=shared[0], epoch=shared[1], context=shared[2])

    def handle(self, message: dict[str, Any]) -> None:
        op = message["op"]
        if op == "open":
            self.new_run_hash = self.open(message)
        elif op == "track":
            with self.writes_together():
                self.track(message["points"])
                for step, epoch, logs in message.get("logs", ()):
                    points = [[float(value), name, step, epoch, context] for name, context, value in log_series(logs)]
                    self.track(points)
        elif op == "set":
            for key, value in message["params"].items():
                self.run.set((message["name"], key), value, strict=False)
        elif op == "close":
            self.probe()  # Run.close() on a dead server would never return
            self.run.close()
        else:
            raise ValueError(f"unknown message {op!r}")
        self.done += 1

    def handle_chunk(self, messages: list[dict[str, Any]]) -> tuple[dict[str, Any], bool]:
        """Handle messages that arrived together; the answer, and whether the writer is done (closed or failed)."""
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
        if self.new_run_hash is not None:
            answer["run_hash"], self.new_run_hash = self.new_run_hash, None
        return answer, finished


def main() -> None:
    # Listing the installed packages (for the run's __system_params) takes ~0.25 s of CPU: now, while the job is still
    # loading, not once its run is opened, when training may have begun.
    packages = installed_packages()
    # The protocol keeps the real stdout; anything Aim prints goes to stderr instead.
    writer = Writer(os.fdopen(os.dup(1), "w", buffering=1), packages)
    os.dup2(2, 1)

    # Whatever arrived together is handled together and answered once: one wake-up of the tracker per chunk.
    for messages in receive(sys.stdin.fileno()):
        answer, finished = writer.handle_chunk(messages)
        writer.reply(answer)
        if finished:
            os._exit(0)  # never Aim's exit hooks: with a dead server they wait forever
    # The training process is gone without closing the run: close it, but never hang around doing so.
    signal.alarm(max(1, int(writer.close_timeout)))
    if writer.run is not None:
        try:
            writer.probe()
            writer.run.close()
        except Exception as exc:
            print(f"aim writer: could not close the run after the training process ended: {exc!r}", file=sys.stderr)
    os._exit(0)


if __name__ == "__main__":
    main()
