"""A sweep's state and its driver: ``DIR/sweep_state.jsonl`` (a line per point the moment it ends, so that a rerun
runs only what is missing), the points' files under ``DIR/points``, the order points run in (smaller batch sizes
first, an OOM skipping the larger ones), retries of transient failures, the stop signals, the one-driver lock, and
the report at the end. Docs: docs/sweeps.md.
"""

import contextlib
import fcntl
import glob
import importlib.util
import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tqdm import tqdm

from tuning.benchmarking import report
from tuning.benchmarking.dump import utc_iso
from tuning.benchmarking.paths import LOG_SUFFIX, RunPaths
from tuning.benchmarking.sweep.executor import Ended, Executor
from tuning.benchmarking.sweep.local_executor import LocalExecutor
from tuning.benchmarking.sweep.point import ATTEMPT_HEADER, point_outcome
from tuning.benchmarking.sweep.ray_executor import DEFAULT_PLACEMENT_TIMEOUT, RayExecutor
from tuning.benchmarking.sweep.spec import BATCH_SIZE_AXIS, PREDICTED_OOM, Point, smaller_batch_sizes

EXECUTORS = ("local", "ray")
OOM_CATEGORIES = ("gpu_oom", "host_oom", PREDICTED_OOM)
TRANSIENT_CATEGORIES = ("communication", "device_error")


class Sweep:
    """The points of one sweep directory, run by ``bench_train`` (the script's path) and recorded there."""

    def __init__(
        self, points: list[Point], output_dir: Path, retries: int, point_timeout: float | None, bench_train: Path
    ):
        self.points, self.dir, self.retries, self.point_timeout = points, output_dir, retries, point_timeout
        self.bench_train = bench_train
        self.state_path = output_dir / report.SWEEP_STATE
        self.lock_fd = -1
        self.interrupted_by: int | None = None
        self.previous_handlers: dict[int, Any] = {}  # the stop signals' handlers before the sweep took them

    def run_paths(self, point: Point) -> RunPaths:
        """The files of the point's run (its dump, log, journal, reports...)."""
        return RunPaths.from_stem(str(self.path(point, "")))

    def path(self, point: Point, suffix: str = ".json") -> Path:
        """A file of the point: its dump, ``.log`` its output, ``""`` its output_dir."""
        return self.dir / "points" / f"{point.id}{suffix}"

    def finished(self, rerun_failed: bool) -> dict[str, dict[str, Any]]:
        """The state lines that count for the current grid: same config; with ``rerun_failed`` only successes."""
        state = report.read_sweep_state(self.state_path) if self.state_path.exists() else {}
        return {
            point.id: line
            for point in self.points
            if (line := state.get(point.id)) is not None
            and line.get("config") == point.config
            and (not rerun_failed or line["status"] in report.FINISHED_STATUSES)
        }

    def record(self, point: Point, **outcome: Any) -> dict[str, Any]:
        """One line per finished point, flushed to disk before anything else happens."""
        line = {
            "point": point.id,
            "axes": point.axes,
            "metrics_path": f"points/{point.id}.json",
            "config": point.config,
            **outcome,
            "time": utc_iso(time.time()),  # as the dumps' times: after the point's stop_time, never before it
        }
        with self.state_path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(line) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        return line

    def clear(self, point: Point) -> None:
        """An earlier attempt's files gone (the log stays, appended to), so that what is read next is this one's."""
        for name in glob.glob(glob.escape(str(self.path(point, ""))) + ".*"):
            if not name.endswith(LOG_SUFFIX):
                os.remove(name)
        shutil.rmtree(self.path(point, ""), ignore_errors=True)

    def begin_attempt(self, point: Point) -> None:
        """The point's log gets the header of its next attempt, numbered after every attempt the log already holds:
        those of earlier drivers of this sweep too (a point resumed after a stop, or rerun with --rerun_failed)."""
        log = Path(self.run_paths(point).log)
        earlier = log.read_bytes().count(ATTEMPT_HEADER.encode()) if log.exists() else 0
        header = f"{ATTEMPT_HEADER}{point.label}, attempt {earlier + 1} ===\n"
        self.store_files({RunPaths.from_stem(point.id).log: header.encode()})

    def store_files(self, files: dict[str, bytes]) -> None:
        """Files of the points by name, a log appended to; a torn one is cleared before a rerun."""
        for name, data in files.items():
            with (self.dir / "points" / name).open("ab" if name.endswith(LOG_SUFFIX) else "wb") as handle:
                handle.write(data)

    def outcome(self, point: Point, ended: Ended) -> dict[str, Any]:
        """How the point ended (``point.point_outcome``), from its files: the ones an executor handed back written
        first."""
        self.store_files(ended.get("files") or {})
        outcome = point_outcome(self.run_paths(point), ended, self.point_timeout)
        return {**outcome, "nodes": ended["nodes"]} if "nodes" in ended else outcome

    def run(self, executor: Executor, rerun_failed: bool, predicted: dict[str, dict] | None = None) -> None:
        """Every point not finished yet, each once its smaller batch sizes have finished; a point in ``predicted``
        (``spec.predicted_ooms``) ends with its outcome there, unstarted. Progress: a bar on stderr of points done /
        failed / skipped, labelled with the latest start."""
        predicted = predicted or {}
        finished = self.finished(rerun_failed)
        pending = [point for point in self.points if point.id not in finished]
        smaller = {point.id: smaller_batch_sizes(point, self.points) for point in pending}
        attempts = dict.fromkeys(smaller, 0)
        counts = dict.fromkeys(("done", "failed", "skipped"), 0)

        def finish(line: dict[str, Any]) -> None:
            finished[line["point"]] = line
            status = line["status"]
            done = status in report.FINISHED_STATUSES
            counts["done" if done else "skipped" if status in ("skipped", PREDICTED_OOM) else "failed"] += 1
            bar.set_postfix(counts, refresh=False)
            bar.update(1)

        with tqdm(total=len(self.points), unit="point", dynamic_ncols=True, file=sys.stderr) as bar:
            for line in list(finished.values()):
                finish(line)
            while pending or executor.running:
                if self.interrupted_by is not None:
                    bar.set_description_str("stopping: waiting for the running points")
                    for point, ended in executor.stop():
                        finish(
                            self.record(
                                point, **self.outcome(point, ended), attempts=attempts[point.id], host=ended["host"]
                            )
                        )
                    break
                for point in list(pending):
                    if None in (below := [finished.get(other.id) for other in smaller[point.id]]):
                        continue
                    ooms = [line for line in below if line.get("category") in OOM_CATEGORIES]
                    if not ooms and point.id not in predicted and not executor.can_start(point):
                        continue
                    pending.remove(point)
                    self.clear(point)
                    if ooms:
                        oom = min(ooms, key=lambda line: line["axes"][BATCH_SIZE_AXIS])
                        reason = f"oom at {BATCH_SIZE_AXIS}={oom['axes'][BATCH_SIZE_AXIS]} ({oom['category']})"
                        finish(self.record(point, status="skipped", category=None, reason=reason, attempts=0))
                        continue
                    if point.id in predicted:
                        finish(self.record(point, **predicted[point.id], attempts=0))
                        continue
                    attempts[point.id] += 1
                    self.begin_attempt(point)
                    executor.start(point)
                    bar.set_description_str(point.label[:60])
                for point, ended in executor.wait():
                    outcome = self.outcome(point, ended)
                    transient = outcome["status"] == "error" and outcome["category"] in TRANSIENT_CATEGORIES
                    if transient and attempts[point.id] <= self.retries:
                        pending.insert(0, point)
                    else:
                        finish(self.record(point, **outcome, attempts=attempts[point.id], host=ended["host"]))

    def on_signal(self, signum: int, _frame: Any) -> None:
        self.interrupted_by = signum

    def handle_stop_signals(self) -> None:
        """SIGINT and SIGTERM stop the sweep: running points stopped, finished ones recorded, exit 128+signal."""
        for signum in (signal.SIGINT, signal.SIGTERM):
            self.previous_handlers.setdefault(signum, signal.signal(signum, self.on_signal))

    def lock(self) -> None:
        """One driver per sweep directory. The points inherit the lock, so a rerun after a SIGKILLed driver waits
        until the points it left (stopping since their parent died) are gone before it touches their files."""
        self.lock_fd = os.open(self.dir / "sweep.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            waiting = "another driver of this sweep, or points of one that was killed, still running"
            print(f"waiting for {self.dir / 'sweep.lock'}: {waiting}", file=sys.stderr)
            fcntl.flock(self.lock_fd, fcntl.LOCK_EX)

    def plan(self, rerun_failed: bool) -> list[str]:
        """What ``--dry_run`` prints: a line per point (its label, processes, dump and state), then the counts."""
        finished = self.finished(rerun_failed)
        lines = []
        for point in self.points:
            state = finished.get(point.id, {}).get("status", "to run")
            processes = "" if "nproc_per_node" in point.axes else f"  nproc_per_node={point.nproc}"
            processes += f"  nnodes={point.nnodes}" if point.nnodes > 1 and "nnodes" not in point.axes else ""
            lines.append(f"{point.label}{processes}  {self.path(point)}  [{state}]")
        return [*lines, f"{len(self.points)} points, {len(self.points) - len(finished)} to run"]

    def claim(self, spec: str) -> None:
        """The sweep directory made and taken: its points folder, a copy of the sweep file, the one-driver lock, and
        the stop signals handled."""
        (self.dir / "points").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(spec, self.dir / "sweep.yaml")
        self.lock()
        self.handle_stop_signals()

    def release(self) -> None:
        """The sweep directory given back: the one-driver lock released and the stop signals' earlier handlers back,
        so that a program running sweeps in its own process can run the next one (the same directory again
        included) and be interrupted as before."""
        for signum, handler in self.previous_handlers.items():
            signal.signal(signum, handler)
        self.previous_handlers = {}
        if self.lock_fd >= 0:
            os.close(self.lock_fd)
            self.lock_fd = -1

    @contextlib.contextmanager
    def claimed(self, spec: str) -> Iterator[None]:
        """``claim`` for the block, ``release`` after it, however it ends."""
        self.claim(spec)
        try:
            yield
        finally:
            self.release()

    def start_executor(
        self,
        kind: str,
        concurrency: int | None,
        ray_address: str | None = None,
        ray_num_cpus: int | None = None,
        ray_runtime_env: str | dict | None = None,
        placement_timeout: float = DEFAULT_PLACEMENT_TIMEOUT,
    ) -> Executor:
        """The executor ``kind`` (one of ``EXECUTORS``) for this sweep's points; the stop signals handled again after
        it started (``ray.init()`` installs its own SIGTERM handler, which aborts the process)."""
        if kind == "ray":
            ray_options = (ray_address, ray_num_cpus, ray_runtime_env, placement_timeout)
            executor = RayExecutor(self.points, self.bench_train, self.point_timeout, concurrency, *ray_options)
        else:
            points_dir = self.dir / "points"
            bench_train, fds = str(self.bench_train), (self.lock_fd,)
            executor = LocalExecutor(self.points, points_dir, bench_train, self.point_timeout, concurrency, fds)
        self.handle_stop_signals()
        return executor

    def write_report(self) -> None:
        """bench_report over the sweep directory into DIR/report, the axes as columns; plots against the batch size
        (else the first numeric axis) when matplotlib is installed, a line per value of the next axis."""
        points, output_dir = self.points, self.dir
        numeric = [axis for axis in points[0].axes if all(report.is_number(p.axes[axis]) for p in points)]
        x = BATCH_SIZE_AXIS if BATCH_SIZE_AXIS in numeric else next(iter(numeric), None)
        x = x if importlib.util.find_spec("matplotlib") else None
        group = next((axis for axis in points[0].axes if axis != x), None) if x else None
        for path in report.write_report([str(output_dir)], x=x, group=group, output_dir=str(output_dir / "report")):
            print(path)
