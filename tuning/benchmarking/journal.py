"""The journal: an append-only JSON-lines file holding every point of a run while it trains, since the dump is
written at the end, which a run killed by SIGKILL or the OOM killer never reaches. Its records: docs/benchmarking.md,
"Journal and rebuilding a dump"; ``tuning.benchmarking.rebuild`` turns a journal, complete or cut short, into a dump.
"""

import contextlib
import json
import logging
import os
import threading
import time
from typing import Any

from tuning.benchmarking.paths import RunPaths
from tuning.utils.error_logging import print_own_line
from tuning.utils.file_utils import read_json_lines

logger = logging.getLogger(__name__)
_ENCODER = json.JSONEncoder(allow_nan=False, default=str)

# A ``point`` record as the training process hands it over, without building its dict; value None for NaN/inf.
Point = tuple[str, dict[str, Any], int | None, float | None, float]


def encode(record: dict[str, Any] | Point) -> str:
    if type(record) is tuple:
        name, context, step, value, at = record
        record = {"type": "point", "name": name, "context": context, "step": step, "value": value, "time": at}
    return _ENCODER.encode(record)


def journal_path(metrics_path: str, rank: int = 0) -> str:
    """``RunPaths(metrics_path).journal(rank)`` (kept for older copies of bench_train)."""
    return RunPaths(metrics_path).journal(rank)


class Journal:
    """Thread-safe; ``write`` only queues, a background thread writes and flushes every ``flush_interval`` seconds
    (a SIGKILL loses at most that) and fsyncs every ``sync_interval`` and at ``close``. A new run truncates the file,
    a resumed one (``append``) continues it after its last complete line; a write that fails (disk full) is reported
    once and ends journaling, not training."""

    def __init__(self, path: str, sync_interval: float = 5.0, flush_interval: float = 0.2, append: bool = False):
        self.path = path
        self.sync_interval = sync_interval
        self.flush_interval = flush_interval
        if append:
            _drop_torn_line(path)
        self._file = open(path, "a" if append else "w", encoding="utf-8")  # noqa: SIM115 -- closed by the writer
        self._queued: list[dict[str, Any] | Point] = []
        self._lock = threading.Lock()
        self._closing = threading.Event()  # set by close(): no more writes; the writer finishes
        self._writer = threading.Thread(target=self._write_queued, name="journal-writer", daemon=True)
        self._writer.start()

    def write(self, *records: dict[str, Any] | Point) -> None:
        """Queue records, one line each, in order; dropped once closed."""
        with self._lock:
            if not self._closing.is_set():
                self._queued.extend(records)

    def close(self, timeout: float = 30.0) -> None:
        """Write everything queued, fsync and close. A writer not done within ``timeout`` seconds (a hung
        filesystem) is left behind: the end of a job never waits on it, and the dump gets every point anyway."""
        with self._lock:
            if self._closing.is_set():
                return
            self._closing.set()
        self._writer.join(timeout)
        if self._writer.is_alive():
            logger.warning("journal %s: its writer did not finish within %g s; left behind", self.path, timeout)

    def _write_queued(self) -> None:
        last_sync = time.monotonic()
        closing = False
        while not closing:
            closing = self._closing.wait(self.flush_interval)
            with self._lock:
                batch, self._queued = self._queued, []
            if not (batch or closing):
                continue
            try:
                self._file.write("".join(f"{encode(record)}\n" for record in batch))
                self._file.flush()
                if closing or time.monotonic() - last_sync >= self.sync_interval:
                    os.fsync(self._file.fileno())
                    last_sync = time.monotonic()
            except (OSError, ValueError) as exc:
                print_own_line(f"journal {self.path} stopped: {exc}; the dump at the end still gets every point")
                self._closing.set()  # later writes are dropped
                break
        with contextlib.suppress(OSError):  # after a failed write, which said so already
            self._file.close()


def _drop_torn_line(path: str) -> None:
    """Cut a journal after its last complete line: the torn last record of a process that died while writing it."""
    with open(path, "rb+") as handle:
        content = handle.read()
        handle.truncate(content.rfind(b"\n") + 1)


def read_journal(path: str) -> list[dict[str, Any]]:
    """The records of a journal, a torn last line dropped; ``ValueError`` if the file is not a journal."""
    records = []
    for number, record in read_json_lines(path, "a journal record"):
        if not isinstance(record, dict) or "type" not in record:
            raise ValueError(f"{path}:{number}: not a journal record (no 'type')")
        records.append(record)
    if not records or records[0]["type"] != "start":
        raise ValueError(f"{path}: a journal starts with a 'start' record")
    return records
