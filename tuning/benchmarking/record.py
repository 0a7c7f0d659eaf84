"""The run record: what a benchmark measured, in memory for the final dump and mirrored into the journal."""

import math
import threading
import time
from typing import Any

from tuning.benchmarking.clocks import RECORD_OPENED
from tuning.benchmarking.dump import DATA_CACHE, LOADED_MODEL, SCHEMA_VERSION, RunData, dump_of
from tuning.benchmarking.journal import Journal, Point
from tuning.trackers import Tracker

_NO_CONTEXT: dict[str, Any] = {}
Points = list[tuple[str, float, int | None, dict | None]]  # (name, value, step, context)


def _point(name: str, value: float, step: int | None, context: dict | None, now: float) -> Point:
    value = float(value)
    step = None if step is None else int(step)  # numpy integers are no JSON
    return (name, context or _NO_CONTEXT, step, value if math.isfinite(value) else None, now)


class RunRecord(Tracker):
    """One run's records, journaled and kept in a compact ``RunData`` for the dump built at ``finish``; thread-safe.
    A ``Tracker`` too, so that ``train(trackers=[record])`` delivers ``model_load_time`` into it. ``previous``: the
    records of the journal a resumed run continues (its earlier segments), which the dump keeps."""

    name = "benchmark_record"

    def __init__(self, journal: Journal, header: dict[str, Any], previous: list[dict[str, Any]] = ()):
        self.journal = journal
        start = {"type": "start", "time": time.time(), "schema_version": SCHEMA_VERSION}
        if "time" not in header:  # no process start given: the run starts now, on the clock of every later record
            start["start_clock"] = {"source": RECORD_OPENED, "precision_seconds": 0.0}
        start.update(header)
        self.data = RunData(previous[0] if previous else start)
        for record in [*previous[1:], start] if previous else []:
            self.data.add(record)
        self._lock = threading.Lock()
        self._finished = False
        journal.write(start)

    def _append(self, *records: dict[str, Any] | Point, last: bool = False) -> bool:
        """Add records, the ``last`` ones closing the journal; False once finished (e.g. a last system sample
        racing the end of the run: dropped)."""
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
        """Points measured together, at ``at`` (default now)."""
        self.record_batches([(time.time() if at is None else at, points)])

    def record_batches(self, batches: list[tuple[float, Points]]) -> None:
        """``(time, points)`` pairs in time order, journaled with one write."""
        self._append(
            *[_point(name, value, step, context, at) for at, points in batches for name, value, step, context in points]
        )

    def note(self, **facts: Any) -> None:
        """Facts learnt while running (``run_hash``, ``warmup_steps``, ...): later notes override earlier ones."""
        self._append({"type": "note", "time": time.time(), **facts})

    def goodput(self) -> dict[str, Any]:
        """The run's ``summary.goodput`` as of now (the running segment ending at its latest record)."""
        with self._lock:
            return dump_of(self.data)["summary"]["goodput"]

    def track(self, metric: float, name: str, stage: str = "additional_metrics") -> None:
        self.record(name, metric, context={"subset": stage})

    def set_params(self, params: dict, name: str = "experiment_metadata") -> None:
        """``train()``'s ``data_cache`` (how the rows were prepared: the dump's ``data.cache``) and ``loaded_model``
        (what the loaded model runs: the dump's ``config.experts_implementation``) are noted."""
        if name in (DATA_CACHE, LOADED_MODEL):
            self.note(**{name: params})

    def finish(
        self,
        status: str,
        training_steps: int,
        stop_reason: str | None = None,
        error: dict[str, Any] | None = None,
        peak_rss_bytes: int | None = None,
        cuda: list[dict[str, int]] | None = None,
    ) -> dict[str, Any] | None:
        """Close the journal with an ``end`` record and return the dump; None if already finished (a stall report and
        the main thread can both get here)."""
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
