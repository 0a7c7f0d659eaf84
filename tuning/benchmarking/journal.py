"""The journal: an append-only JSON-lines file that holds every point of a run while it trains.

It exists because the dump is written once, at the end: a run killed with SIGKILL (or by the OOM killer) never gets
there. ``write`` only queues its records; a writer thread wakes every ``flush_interval`` seconds (0.2) and encodes,
writes and flushes everything queued, so records are in the kernel's page cache, and survive the death of the
process, within that interval. Waking a thread per step would cost the training thread more than the writing itself
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

import json
import logging
import os
import queue
import threading
import time
from typing import Any, TextIO

logger = logging.getLogger(__name__)
# One encoder for every record: json.dumps builds a new one per call whenever an option is given.
_ENCODER = json.JSONEncoder(allow_nan=False, default=str)

# A ``point`` record as writers hand it over: (name, context, step, value, time), value None for NaN/inf. A tuple
# costs the training thread a tenth of a dict, and encodes in a sixth of the time (``_encode``).
Point = tuple[str, dict[str, Any], int | None, float | None, float]
_POINT_HEADS: dict[str, str] = {}  # series name → the encoded start of its point records


def _encode(records: list[dict[str, Any] | Point]) -> str:
    """JSON lines of ``records``, points exactly as the encoder writes the record's dict (keys in the order
    ``type``, ``name``, ``context``, ``step``, ``value``, ``time``) without building it. One loop, no call per
    point, and a time shared by consecutive points (a step's series) is formatted once: the journal's writer thread
    holds the GIL while it encodes, and the training thread waits for it."""
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
    full) is logged once and ends journaling, not training.
    """

    def __init__(self, path: str, sync_interval: float = 5.0, flush_interval: float = 0.2):
        self.path = path
        self.sync_interval = sync_interval
        self.flush_interval = flush_interval
        self._file: TextIO | None = open(path, "w", encoding="utf-8")  # noqa: SIM115 - open until close()
        self._last_sync = time.monotonic()
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._closing = threading.Event()  # set by close(): no more writes; the writer thread finishes
        self._lock = threading.Lock()
        self._writer = threading.Thread(target=self._write_queued, name="journal-writer", daemon=True)
        self._writer.start()

    def write(self, *records: dict[str, Any] | Point) -> None:
        """Queue records (dicts, or ``Point`` tuples) for the writer thread, which appends them one line each, in
        order; dropped once closed."""
        with self._lock:
            if not self._closing.is_set():
                self._queue.put(records)  # nobody waits on the queue: no thread wakes up now

    def close(self) -> None:
        """Write everything queued, fsync and close; later writes are dropped."""
        with self._lock:
            if self._closing.is_set():
                return
            self._closing.set()
        self._writer.join()

    def _write_queued(self) -> None:
        """The writer thread: every ``flush_interval``, everything queued with one write and flush."""
        while True:
            closing = self._closing.wait(self.flush_interval)
            batch = []
            while not self._queue.empty():
                batch.extend(self._queue.get())
            if self._file is not None and (batch or closing):
                self._append(_encode(batch), sync=closing)
            if closing:
                self._close_file()
                return

    def _append(self, text: str, sync: bool) -> None:
        try:
            self._file.write(text)
            self._file.flush()
            if sync or time.monotonic() - self._last_sync >= self.sync_interval:
                os.fsync(self._file.fileno())
                self._last_sync = time.monotonic()
        except (OSError, ValueError) as exc:
            logger.warning("journal %s stopped: %s; the dump at the end still gets every point", self.path, exc)
            self._close_file()

    def _close_file(self) -> None:
        if self._file is None:
            return
        try:
            self._file.close()
        except OSError as exc:
            logger.warning("journal %s could not be closed cleanly: %s", self.path, exc)
        self._file = None


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
