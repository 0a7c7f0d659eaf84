"""The Ray executor: a sweep's points as Ray tasks, each running its point in a scratch directory of the node that
runs it and handing back the point's files (no filesystem shared with the driver). ``ray`` is imported lazily.
"""

import contextlib
import fcntl
import glob
import json
import os
import shutil
import signal
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

from tuning.benchmarking.paths import JOURNAL_SUFFIX, RunPaths
from tuning.benchmarking.placement import RAY_NODE_ID_ENV
from tuning.benchmarking.sweep.executor import Ended, check_gpus
from tuning.benchmarking.sweep.point import (
    POINT_MARKER_ENV,
    POLL_SECONDS,
    STOP_GRACE_SECONDS,
    PointProcess,
    end_leftovers,
)
from tuning.benchmarking.sweep.ray_spread import SpreadPoint
from tuning.benchmarking.sweep.spec import Point

SCRATCH_PREFIX = "bench-sweep-"  # a Ray point's directory in its node's temp dir
DEFAULT_PLACEMENT_TIMEOUT = 300.0  # seconds a point across nodes waits for its placement group


def remove_abandoned_scratch() -> None:
    """The scratch directories on this node that nothing holds any more: a SIGKILLed driver takes its local Ray
    instance and the task's worker with it, and the point then stops and ends, leaving its directory. Each directory
    is locked (flock on the directory itself) by its task and, inherited, its point: a free lock means both ended."""
    for path in glob.glob(os.path.join(glob.escape(tempfile.gettempdir()), SCRATCH_PREFIX + "*")):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:  # removed meanwhile, or not a directory
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            shutil.rmtree(path, ignore_errors=True)
        except BlockingIOError:  # its task or point still runs
            pass
        finally:
            os.close(fd)


def run_point_on_node(
    flags: dict[str, Any],
    nproc: int,
    name: str,
    bench_train: str,
    cwd: str,
    timeout: float | None,
    rendezvous: list[str] | None = None,
) -> dict[str, Any]:
    """A Ray task's body: the point (with ``rendezvous``, one node of it: ``PointProcess``) in a scratch directory of
    the node that runs it; returns how it ended (as ``LocalExecutor.wait`` does, with the Ray node's id, when it
    ended, and the ranks of workers that outlived their launcher and were killed) and the files the driver keeps
    (dump, rank reports, other nodes' journals, rank 0's journal when there is no dump, the termination log, the log)
    as bytes by their names in the sweep directory. Plain arguments, not a ``Point``: the node needs only what
    bench_train needs (this package). Every process of the point carries its Ray node's id (``RAY_NODE_ID_ENV``),
    which the dump records per rank."""
    import ray

    bench_train = os.path.abspath(bench_train)  # a shipped working_dir's copy: the task starts in it
    remove_abandoned_scratch()
    scratch = tempfile.mkdtemp(prefix=SCRATCH_PREFIX)
    lock_fd = os.open(scratch, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(lock_fd, fcntl.LOCK_EX)
    node_id = ray.get_runtime_context().get_node_id()
    try:
        stem = os.path.join(scratch, name)
        env = {**os.environ, POINT_MARKER_ENV: scratch, RAY_NODE_ID_ENV: node_id}
        popen = {"cwd": cwd if os.path.isdir(cwd) else scratch, "pass_fds": (lock_fd,), "env": env}
        process = PointProcess(flags, nproc, stem, bench_train, timeout, rendezvous, **popen)
        try:
            exit_code = process.wait()
        except BaseException:  # cancelled (the driver stopped or died): the point goes with the task
            process.stop()
            process.wait()
            raise
        finally:
            leftovers = end_leftovers(scratch)
        ended_at = time.time()
        paths = RunPaths.from_stem(stem)
        names = [paths.dump, *paths.rank_reports(), *glob.glob(glob.escape(stem) + ".rank*" + JOURNAL_SUFFIX)]
        names += [paths.termination_log, paths.log]
        if not os.path.exists(paths.dump):
            names.append(paths.journal())
        files = {os.path.basename(name): Path(name).read_bytes() for name in names if os.path.isfile(name)}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        os.close(lock_fd)
    ending = {"exit_code": exit_code, "timed_out": process.timed_out, "host": socket.gethostname(), "files": files}
    return {**ending, "node_id": node_id, "ended_at": ended_at, "leftovers": leftovers}


class RayExecutor:
    """Points as Ray tasks, each requesting ``nproc_per_node`` GPUs and as many CPUs (on a cluster without GPUs,
    one point per node unless ``concurrency`` says otherwise); the task runs the point on its node and hands back
    its files, which the sweep writes under its directory, so no filesystem is shared. ``ray`` is imported
    only here; a local instance stops when the driver exits."""

    def __init__(
        self,
        points: list[Point],
        bench_train: Path,
        point_timeout: float | None,
        concurrency: int | None,
        address: str | None,
        num_cpus: int | None,
        runtime_env: str | dict | None,
        placement_timeout: float = DEFAULT_PLACEMENT_TIMEOUT,
    ):
        try:
            import ray
        except ImportError as exc:
            raise SystemExit("--executor ray needs Ray: pip install 'tuning-bench[ray]'") from exc
        self.ray, self.concurrency, self.point_timeout = ray, concurrency, point_timeout
        self.placement_timeout = placement_timeout
        try:  # fire hands a JSON object over already parsed, unless it holds true, false or null
            runtime_env = json.loads(runtime_env) if isinstance(runtime_env, str) else runtime_env or {}
        except json.JSONDecodeError as exc:
            raise SystemExit(f"--ray_runtime_env is not valid JSON: {exc}") from exc
        options = {"runtime_env": runtime_env or None, "log_to_driver": False, "include_dashboard": False}
        ray.init(address, num_cpus=num_cpus if address is None else None, **options)
        # A runtime_env working_dir ships this checkout to every node: bench_train is then found relative to it.
        shipped = "working_dir" in runtime_env
        self.bench_train = str(bench_train.relative_to(bench_train.parents[1])) if shipped else str(bench_train)
        nodes = [node for node in ray.nodes() if node["Alive"]]
        self.gpus = max((node["Resources"].get("GPU", 0) for node in nodes), default=0)
        if self.concurrency is None and not self.gpus:  # benchmarks sharing a node's CPUs would measure each other
            self.concurrency = len(nodes)
        self.remote = ray.remote(max_retries=0)(run_point_on_node)
        self.running: dict[Any, Point] = {}  # by its task, or its SpreadPoint when it spans nodes
        check_gpus(points, self.gpus, f"the largest node has {self.gpus}")

    def can_start(self, point: Point) -> bool:
        """Room for the point's nodes within ``concurrency``; a point alone always starts (one that cannot be
        placed then ends unschedulable)."""
        busy = sum(running.nnodes for running in self.running.values())
        return self.concurrency is None or not self.running or busy + point.nnodes <= self.concurrency

    def start(self, point: Point) -> None:
        task_args = (self.bench_train, os.getcwd(), self.point_timeout)
        if point.nnodes > 1:
            spread = SpreadPoint(self.ray, point, self.remote, task_args, self.gpus, self.placement_timeout)
            self.running[spread] = point
            return
        placement = {"num_gpus": point.nproc} if self.gpus else {"num_gpus": 0, "scheduling_strategy": "SPREAD"}
        task = self.remote.options(num_cpus=point.nproc, name=f"bench_sweep {point.id}", **placement)
        self.running[task.remote(point.flags, point.nproc, point.id, *task_args)] = point

    def wait(self) -> list[tuple[Point, Ended]]:
        """Every point that ended within the poll interval (all of them: one stop signal later, none is lost)."""
        ended = []
        for spread in [key for key in self.running if isinstance(key, SpreadPoint)]:
            if (result := spread.poll()) is not None:
                ended.append((self.running.pop(spread), result))
        refs = [key for key in self.running if not isinstance(key, SpreadPoint)]
        wait = POLL_SECONDS if refs and not ended else 0
        done, _ = self.ray.wait(refs, num_returns=len(refs), timeout=wait) if refs else ([], [])
        if not refs and not ended:
            time.sleep(POLL_SECONDS)
        for ref in done:
            point = self.running.pop(ref)
            try:
                result = self.ray.get(ref)
            except self.ray.exceptions.RayError as exc:  # the task's worker or node died
                failure = f"Ray task failed: {' '.join(str(exc).split())[:2000]}\n".encode()
                files = {RunPaths.from_stem(point.id).log: failure}
                result = dict(exit_code=-signal.SIGKILL, timed_out=False, host="?", files=files)
            ended.append((point, result))
        return ended

    def stop(self) -> list[tuple[Point, Ended]]:
        """Every running task cancelled (its point stopped, its scratch directory removed) and waited for; the points
        that finished before the cancel reached them, to be recorded. A point across nodes is stopped as a whole
        (its tasks cancelled, its placement group removed) and left for the next run."""
        spreads = [key for key in self.running if isinstance(key, SpreadPoint)]
        for spread in spreads:
            spread.cancel()
            del self.running[spread]
        for ref in self.running:
            self.ray.cancel(ref)
        tasks = [*self.running, *(task for spread in spreads for task in spread.tasks)]
        with contextlib.suppress(Exception):
            self.ray.wait(tasks, num_returns=len(tasks), timeout=STOP_GRACE_SECONDS + 5)
        for spread in spreads:
            spread.remove()
        ended = []
        for ref, point in self.running.items():
            with contextlib.suppress(self.ray.exceptions.RayError):  # cancelled, or still stopping: left for a rerun
                ended.append((point, self.ray.get(ref, timeout=0)))
        self.running.clear()
        return ended
