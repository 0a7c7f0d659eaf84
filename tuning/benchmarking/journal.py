"""The journal: an append-only JSON-lines file that holds every point of a run while it trains.

It exists because the dump is written once, at the end: a run killed with SIGKILL (or by the OOM killer) never gets
there. ``write`` only queues its records; a sender thread wakes every ``flush_interval`` seconds (0.2) and hands
everything queued, pickled (``tuning.utils.pipe_messages``), to the journal's writer process, which encodes the
JSON, writes and flushes it: records are in the kernel's page cache within that interval, and the writer, which
outlives the training process, writes what it received even when training dies. Encoding and writing the JSON took a
thread of the training process ~4 µs of CPU per point (holding the GIL, which the training thread then waits for);
pickling the batch takes ~1. Waking a thread per step would cost the training thread more than the writing itself
(~0.2 ms per wake-up on a CPU, through the GIL). ``fsync`` (which survives a node crash too) costs milliseconds, so
it runs at most every ``sync_interval`` seconds and at ``close``, never once per record.

Records are JSON objects with a ``type``:

- ``start``: the run's header (schema version, experiment, host, rank, world size, start time, environment)
- ``point``: one tracked value: ``name``, ``context``, ``step`` (or null), ``value`` (null for NaN/inf), ``time``
- ``note``: facts learnt while running (``metadata`` once read and checked, ``train_start``, ``warmup_steps``,
  ``run_hash``, ``train_end``, ...); a later note of the same key wins
- ``end``: how the run ended (``status``, ``stop_reason``, ``error``, ``training_steps``) and what only the end can
  measure (``peak_rss_bytes``, ``cuda`` peak memory)

``tuning.benchmarking.rebuild`` turns a journal, complete or cut short, into a dump.
"""

import contextlib
import json
import logging
import os
import queue
import subprocess
import sys
import threading
import time
from typing import Any

if __name__ == "__main__":  # the writer process: ``tuning`` importable from a checkout too (this folder heads sys.path)
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tuning.utils.error_logging import print_own_line
from tuning.utils.pipe_messages import encode, receive

logger = logging.getLogger(__name__)
# One encoder for every record: json.dumps builds a new one per call whenever an option is given.
_ENCODER = json.JSONEncoder(allow_nan=False, default=str)

CLOSE_TIMEOUT_S = 30.0

# A ``point`` record as writers hand it over: (name, context, step, value, time), value None for NaN/inf. A tuple
# costs the training thread a tenth of a dict, and pickles and encodes faster.
Point = tuple[str, dict[str, Any], int | None, float | None, float]
_POINT_HEADS: dict[str, str] = {}  # series name → the encoded start of its point records


def _encode(records: list[dict[str, Any] | Point]) -> str:
    """JSON lines of ``records``, points exactly as the encoder writes the record's dict (keys in the order
    ``type``, ``name``, ``context``, ``step``, ``value``, ``time``) without building it. One loop, no call per
    point, and a time shared by consecutive points (a step's series) is formatted once."""
    lines = []
    last_time, time_json = None, ""
    for record in records:
        if type(record) is not tuple:
            lines.append(_ENCODER.encode(record))
            continue
        name, context, step, value, at = record
        head = _POINT_HEADS.get(name)
        if head is None:
            head = _POINT_HEADS[name] = f'{{"type": "point", "name": {_ENCODER.encode(name)}, "context": '
        if at != last_time:
            last_time, time_json = at, float.__repr__(at)
        context_json = _ENCODER.encode(context) if context else "{}"
        step_json = "null" if step is None else int(step)
        value_json = "null" if value is None else float.__repr__(value)
        lines.append(f'{head}{context_json}, "step": {step_json}, "value": {value_json}, "time": {time_json}}}')
    lines.append("")
    return "\n".join(lines)


def journal_path(metrics_path: str, rank: int = 0) -> str:
    """Where the journal of ``metrics_path`` lives: ``run.json`` → ``run.journal.jsonl`` (``run.rank3.journal.jsonl``
    for the system metrics of another node's local rank 0)."""
    stem = os.path.splitext(metrics_path)[0]
    return f"{stem}.journal.jsonl" if rank == 0 else f"{stem}.rank{rank}.journal.jsonl"


class Journal:
    """Thread-safe JSON-lines writer; a new run truncates what an earlier run left at the same path.

    Opening fails loudly (the caller checks its output location before training); a write that fails later (disk
    full) is logged once by the writer process and ends journaling, not training.
    """

    def __init__(self, path: str, sync_interval: float = 5.0, flush_interval: float = 0.2):
        self.path = path
        self.flush_interval = flush_interval
        with open(path, "w", encoding="utf-8") as file:  # the writer process gets its own copy of the descriptor
            self._writer = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), str(file.fileno()), repr(sync_interval), path],
                stdin=subprocess.PIPE,
                pass_fds=(file.fileno(),),
                start_new_session=True,  # a Ctrl-C meant for training must not cut the journal short
            )
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._closing = threading.Event()  # set by close(): no more writes; the sender thread finishes
        self._lock = threading.Lock()
        self._sender = threading.Thread(target=self._send_queued, name="journal-sender", daemon=True)
        self._sender.start()

    def write(self, *records: dict[str, Any] | Point) -> None:
        """Queue records (dicts, or ``Point`` tuples) for the writer process, which appends them one line each, in
        order; dropped once closed."""
        with self._lock:
            if not self._closing.is_set():
                self._queue.put(records)  # nobody waits on the queue: no thread wakes up now

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
        """Write everything queued, fsync and close (the writer process exits); later writes are dropped. A writer
        not done within ``timeout`` seconds (stuck on a hung filesystem, stopped) is killed, so that the end of a
        job never waits on it: the journal keeps what was written, the dump gets every point anyway."""
        with self._lock:
            if self._closing.is_set():
                return
            self._closing.set()
        self._sender.join(timeout)
        if self._sender.is_alive():
            logger.warning(
                "journal %s: its writer did not finish within %g s; killed it (the dump still gets every point)",
                self.path,
                timeout,
            )
            self._writer.kill()  # a send blocked on the full pipe now fails, and the sender thread ends
            self._sender.join()

    def _send_queued(self) -> None:
        """The sender thread: every ``flush_interval``, everything queued to the writer process at once."""
        stream = self._writer.stdin
        closing = False
        while not closing:
            closing = self._closing.wait(self.flush_interval)
            batch = []
            while not self._queue.empty():
                batch.extend(self._queue.get())
            if batch and not stream.closed:
                try:
                    stream.write(encode(batch))
                    stream.flush()
                except OSError as exc:
                    logger.warning("journal %s stopped: %s; the dump at the end still gets every point", self.path, exc)
                    with contextlib.suppress(OSError):
                        stream.close()
        with contextlib.suppress(OSError):
            stream.close()  # the writer writes what is left, syncs and exits
        self._writer.wait()


def _write_journal(fd: int, sync_interval: float, path: str) -> None:
    """The writer process: appends the batches that arrive on stdin to the journal open as ``fd``, until its input
    ends (the journal was closed, or the training process died). After a failed write it only drains its input."""
    journal = os.fdopen(fd, "w", encoding="utf-8")
    last_sync = time.monotonic()
    for batches in receive(sys.stdin.fileno()):
        if journal.closed:
            continue
        try:
            journal.write("".join(map(_encode, batches)))
            journal.flush()
            if time.monotonic() - last_sync >= sync_interval:
                os.fsync(fd)
                last_sync = time.monotonic()
        except (OSError, ValueError) as exc:
            print_own_line(f"journal {path} stopped: {exc}; the dump at the end still gets every point")
            with contextlib.suppress(OSError):
                journal.close()
    if not journal.closed:
        try:
            journal.flush()
            os.fsync(fd)
            journal.close()
        except OSError as exc:
            print_own_line(f"journal {path} could not be closed cleanly: {exc}")


def read_journal(path: str) -> list[dict[str, Any]]:
    """The records of a journal. A torn last line (the process died while writing it) is dropped; damage anywhere
    else means the file is not a journal and raises ``ValueError``."""
    with open(path, encoding="utf-8") as handle:
        lines = handle.read().split("\n")
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            if number >= len(lines) - 1:  # the last line, with or without its newline
                break
            raise ValueError(f"{path}:{number}: not a journal record ({exc})") from exc
        if not isinstance(record, dict) or "type" not in record:
            raise ValueError(f"{path}:{number}: not a journal record (no 'type')")
        records.append(record)
    if not records or records[0]["type"] != "start":
        raise ValueError(f"{path}: a journal starts with a 'start' record")
    return records


if __name__ == "__main__":
    _write_journal(int(sys.argv[1]), float(sys.argv[2]), sys.argv[3])
