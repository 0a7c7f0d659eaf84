"""The run record: what a benchmark measured, in memory for the final dump and mirrored into the journal."""

import math
import threading
import time
from typing import Any

from tuning.benchmarking.dump import RunData, dump_of
from tuning.benchmarking.journal import Journal, Point
from tuning.benchmarking.schema import SCHEMA_VERSION
from tuning.trackers import Tracker

_NO_CONTEXT: dict[str, Any] = {}
Points = list[tuple[str, float, int | None, dict | None]]  # (name, value, step, context)


def _point(name: str, value: float, step: int | None, context: dict | None, now: float) -> Point:
    value = float(value)
    step = None if step is None else int(step)  # numpy integers are no JSON
    return (name, context or _NO_CONTEXT, step, value if math.isfinite(value) else None, now)


class RunRecord(Tracker):
    """Journal records of one run (format in ``tuning.benchmarking.journal``); thread-safe.

    It is also a ``Tracker``, so ``train(trackers=[record])`` delivers ``model_load_time`` straight into it. The
    points are kept in a compact ``RunData`` until the dump is built at ``finish``.
    """

    name = "benchmark_record"

    def __init__(self, journal: Journal, header: dict[str, Any]):
        self.journal = journal
        start = {"type": "start", "time": time.time(), "schema_version": SCHEMA_VERSION, **header}
        self.data = RunData(start)
        self._lock = threading.Lock()
        self._finished = False
        journal.write(start)

    def _append(self, *records: dict[str, Any] | Point, last: bool = False) -> bool:
        """Add records, the ``last`` ones closing the journal; False once finished (nothing added then: e.g. a last
        system-metrics sample racing the end of the run)."""
        with self._lock:
            if self._finished:
                return False
            for record in records:
                self.data.add(record)
            self.journal.write(*records)
            if last:
                self.journal.close()
                self._finished = True
        return True

    def record(self, name: str, value: float, step: int | None = None, context: dict | None = None) -> None:
        """One point of the series ``name``/``context``; NaN and infinities are kept as null (JSON has neither)."""
        self.record_many([(name, value, step, context)])

    def record_many(self, points: Points, at: float | None = None) -> None:
        """Several ``(name, value, step, context)`` points measured together (at ``at``, default now), journaled
        with one write."""
        self.record_batches([(time.time() if at is None else at, points)])

    def record_batches(self, batches: list[tuple[float, Points]]) -> None:
        """Points measured at different times, as ``(time, points)`` pairs in time order, journaled with one write."""
        self._append(
            *[_point(name, value, step, context, at) for at, points in batches for name, value, step, context in points]
        )

    def note(self, **facts: Any) -> None:
        """Facts learnt while running (``run_hash``, ``warmup_steps``, ...): later notes override earlier ones."""
        self._append({"type": "note", "time": time.time(), **facts})

    def track(self, metric: float, name: str, stage: str = "additional_metrics") -> None:
        self.record(name, metric, context={"subset": stage})

    def finish(
        self,
        status: str,
        training_steps: int,
        stop_reason: str | None = None,
        error: dict[str, Any] | None = None,
        peak_rss_bytes: int | None = None,
        cuda: list[dict[str, int]] | None = None,
    ) -> dict[str, Any] | None:
        """Close the journal with an ``end`` record and return the dump; None if the run was already finished
        (a stall report and the main thread can both get here)."""
        end = {
            "type": "end",
            "time": time.time(),
            "status": status,
            "stop_reason": stop_reason,
            "error": error,
            "training_steps": training_steps,
            "peak_rss_bytes": peak_rss_bytes,
            "cuda": cuda,
        }
        return dump_of(self.data) if self._append(end, last=True) else None
