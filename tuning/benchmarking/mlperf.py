"""Time to train as MLPerf Training counts it (the llama2_70b_lora rules of mlcommons/training_policies): evaluations
on the validation data every ``eval_interval`` training samples, the first ``skipped_evaluations`` left out, the run
stopped at the first evaluation whose loss is at or below the target; and the run's result log, ``:::MLLOG {json}``
lines in the format mlcommons' compliance checker (``mlperf_logging.compliance_checker``) reads, written line by line
as the run goes so that a killed run's log ends where it died. docs/benchmarking.md, "Time to train".

``TimeToTrain`` is the trainer callback; ``MlperfLog`` the log (a ``Tracker`` too: ``train()`` tells it how the
processed data was prepared, its ``cache_clear``). Scoring many runs is ``statistics.mlperf_score``; over their dumps,
``report.mlperf_scored`` (bench_compare --mlperf, bench_report).
"""

import json
import math
import os
import time
from typing import Any, TextIO

from transformers import TrainerCallback

from tuning.benchmarking.dump import EVALUATIONS_NOTE, RUN_START_NOTE, TARGET_NOTE
from tuning.trackers import Tracker

CONVERGED, NOT_CONVERGED = "converged", "not_converged"  # the dump's statuses of a run with a target
EVAL_EVERY_SEQUENCES = 384  # llama2_70b_lora: an evaluation every 384 training sequences
SKIP_PER_SEQUENCE, SKIP_BASE = 0.125, 2  # ... the first FLOOR(0.125 * global batch + 2) evaluations skipped
BENCHMARK, DIVISION = "llama2_70b_lora", "open"
DIVISIONS = ("open", "closed")
UNSPECIFIED_ORG = "unspecified"
# The log's run_stop statuses (mllog's constants): reached the target, or not.
SUCCESS, ABORTED = "success", "aborted"
RESUMED = "run_resumed"  # our own key (the checker skips unknown keys): a segment resumed from a checkpoint
# Notes in the run's journal, read by the dump (summary.time_to_train, converged, evaluations, init_seconds).
RUN_START, EVALUATIONS, TARGET = RUN_START_NOTE, EVALUATIONS_NOTE, TARGET_NOTE


def eval_interval(global_batch: int, every_samples: int | None = None) -> int:
    """Training samples between evaluations: ``every_samples`` (default 384) rounded up to a whole number of global
    batches, as MLPerf rounds 384 for a global batch that does not divide it."""
    return math.ceil((every_samples or EVAL_EVERY_SEQUENCES) / global_batch) * global_batch


def skipped_evaluations(global_batch: int, skip: int | None = None) -> int:
    """How many of the first evaluations are not run: ``skip``, default MLPerf's FLOOR(0.125 * global batch + 2)."""
    return skip if skip is not None else math.floor(SKIP_PER_SEQUENCE * global_batch + SKIP_BASE)


def platform_name(world_size: int) -> str:
    """``<devices>x<device>``: the CUDA device's name, else the CPU's architecture."""
    import platform

    import torch

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"CPU {platform.machine()}"
    return f"{world_size}x{device}"


class MlperfLog(Tracker):
    """The MLPerf result log at ``path``: one ``:::MLLOG`` line per event, flushed as written. A resumed run appends
    to the log its interrupted process left (a ``run_resumed`` line, then its own events: two runs in one file, which
    the checker refuses, as it must); a new run starts it afresh."""

    name = "mlperf_log"

    def __init__(self, path: str, append: bool = False):
        super().__init__()
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self.path = path
        self._file: TextIO | None = open(path, "a" if append else "w", encoding="utf-8")  # noqa: SIM115 - kept open
        self.stopped = False  # run_stop written

    def _write(self, event_type: str, key: str, value: Any, metadata: dict[str, Any] | None, at: float | None) -> None:
        if self._file is None:
            return
        line = {
            "namespace": "",
            "time_ms": round((time.time() if at is None else at) * 1000),
            "event_type": event_type,
            "key": key,
            "value": value,
            "metadata": metadata or {},
        }
        self._file.write(":::MLLOG " + json.dumps(line) + "\n")
        self._file.flush()

    def event(self, key: str, value: Any = None, at: float | None = None, **metadata: Any) -> None:
        self._write("POINT_IN_TIME", key, value, metadata, at)

    def start(self, key: str, at: float | None = None, **metadata: Any) -> None:
        self._write("INTERVAL_START", key, None, metadata, at)

    def end(self, key: str, at: float | None = None, **metadata: Any) -> None:
        self._write("INTERVAL_END", key, None, metadata, at)

    def run_stop(self, status: str, at: float | None = None, **metadata: Any) -> None:
        """``run_stop`` once: ``success`` at the target, else ``aborted`` with the reason in its metadata."""
        if not self.stopped:
            self.stopped = True
            self.end("run_stop", at, status=status, **metadata)

    def set_params(self, params: dict, name: str = "experiment_metadata") -> None:
        """``train()``'s ``data_cache``: ``cache_clear`` true unless the processed rows came from the cache (the
        operating system's page cache is not dropped by the run, and the line says so)."""
        if name == "data_cache":
            hit = params.get("status") == "hit"
            self.event("cache_clear", not hit, data_cache=params.get("status"), os_page_cache="not dropped")

    def close(self, status: str = "") -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class TimeToTrain(TrainerCallback):
    """Evaluates at MLPerf's cadence and stops training at the target. Per evaluation, on rank 0: the journal's
    ``evaluations`` note (samples seen, eval loss, seconds from ``run_start``) and the log's
    ``block_stop``/``eval_start``/``eval_stop``/``eval_accuracy``. ``on_target(at)`` is called when the target is
    reached. Every rank decides alike: the eval loss is the same on each."""

    def __init__(
        self,
        target: float,
        run_start: float,
        every_samples: int | None = None,
        skip: int | None = None,
        note: Any = None,
        log: MlperfLog | None = None,
    ):
        self.target, self.run_start = target, run_start
        self.every_samples, self.skip = every_samples, skip
        self.note, self.log = note, log  # note(**facts) journals on rank 0; None elsewhere
        self.global_batch = self.interval = 0
        self.skipped = 0
        self.evaluations: list[dict[str, Any]] = []
        self.converged_at: float | None = None
        self._pending: int | None = None  # samples of the evaluation asked for

    def samples(self, step: int) -> int:
        return step * self.global_batch

    def on_train_begin(self, args, state, control, **kwargs):
        self.global_batch = args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size
        self.interval = eval_interval(self.global_batch, self.every_samples)
        self.skipped = skipped_evaluations(self.global_batch, self.skip)
        if self.note is not None:
            self.note(mlperf_cadence={"eval_every_samples": self.interval, "eval_skip": self.skipped})
        if self.log is not None:
            dataset = getattr(kwargs.get("train_dataloader"), "dataset", None)
            rows = len(dataset) if hasattr(dataset, "__len__") else "unknown (a streamed dataset)"
            self.log.event("train_samples", rows)
            self.log.event("opt_learning_rate_training_steps", state.max_steps)
            self.log.event("opt_learning_rate_warmup_steps", args.get_warmup_steps(state.max_steps))
            self.log.start("block_start", samples_count=self.samples(state.global_step))

    def on_step_end(self, args, state, control, **kwargs):
        samples = self.samples(state.global_step)
        if samples % self.interval or samples // self.interval <= self.skipped:
            return
        control.should_evaluate = True
        self._pending = samples
        if self.log is not None:
            self.log.end("block_stop", samples_count=samples)
            self.log.start("eval_start", samples_count=samples)

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if self._pending is None:  # an evaluation this callback did not ask for (the trainer's own)
            return
        now, samples, self._pending = time.time(), self._pending, None
        loss = (metrics or {}).get("eval_loss")
        reached = loss is not None and loss <= self.target
        self.evaluations.append({"samples": samples, "eval_loss": loss, "seconds": now - self.run_start})
        if self.note is not None:
            self.note(**{EVALUATIONS: list(self.evaluations)})
        if self.log is not None:
            self.log.end("eval_stop", at=now, samples_count=samples)
            if len(self.evaluations) == 1:
                dataset = getattr(kwargs.get("eval_dataloader"), "dataset", None)
                self.log.event("eval_samples", len(dataset) if hasattr(dataset, "__len__") else "unknown", at=now)
            self.log.event("eval_accuracy", loss, at=now, samples_count=samples)
        if reached:
            self.converged_at = now
            control.should_training_stop = True
            if self.log is not None:
                self.log.run_stop(SUCCESS, at=now, samples_count=samples)
        elif self.log is not None:
            self.log.start("block_start", at=now, samples_count=samples)
