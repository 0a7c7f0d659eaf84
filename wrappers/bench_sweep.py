"""bench_sweep.py: benchmark a whole grid of bench_train.py runs, on this machine or across a Ray cluster.

    python wrappers/bench_sweep.py SWEEP.yaml --output_dir DIR [--executor local|ray] ...   # --help: every flag

Each point (one combination of axis values) runs as its own process tree; its outcome is appended to
``DIR/sweep_state.jsonl`` the moment it ends, so that a rerun runs only what is missing. Docs: docs/sweeps.md.
This file is the recipe: its flags are the dataclass below, and ``main`` reads top to bottom, each step one call into
``tuning.benchmarking.sweep`` (the grid, the points, the executors, the sweep's state).
"""

import dataclasses
import sys
from pathlib import Path
from typing import Any

from tuning.benchmarking import sweep
from tuning.benchmarking.report import is_number
from tuning.utils.cli_flags import fire_flags

BENCH_TRAIN = Path(__file__).resolve().with_name("bench_train.py")  # what every point runs


@dataclasses.dataclass
class SweepFlags:
    """Run every point of SPEC (a sweep YAML) into OUTPUT_DIR, resumably, then write OUTPUT_DIR/report.

    Args:
        spec: The sweep file: base (flags of every point), axes (flag → values), metadata (of every point),
            optionally repeats (runs of every point, for bench_compare's intervals over runs).
        output_dir: The sweep directory: state file, the points' files, the report. Rerun to finish a sweep.
        executor: local (this machine's processes) or ray (tasks on a Ray cluster; pip install 'tuning-bench[ray]').
        concurrency: Points running at once; default: local, one per nproc_per_node GPUs, one on CPU; ray, all
            that the nodes' GPUs fit, one per node (spread over them) on a cluster without GPUs.
        retries: Reruns of a point that failed with a transient category (communication, device_error).
        rerun_failed: Also rerun the points that finished with a failure (and the ones their OOM skipped).
        point_timeout: Seconds after which a point is stopped (SIGTERM, then SIGKILL 30 s later): status timeout.
        dry_run: Print the points, their files and their state, and run nothing.
        report_only: Write OUTPUT_DIR/report from what the sweep directory holds now, and run nothing.
        interleave: Run the repeats in rounds (every point once, then each again) rather than each point's in a row,
            so that the machine's drift falls on every point alike.
        ray_address: An existing Ray cluster (ray://host:10001 or host:6379); default: start a local instance.
        ray_num_cpus: CPUs of the local Ray instance (default: all of this machine's).
        ray_runtime_env: JSON Ray runtime_env, e.g. '{"working_dir": "."}' to ship this checkout to the nodes.
        placement_timeout: Seconds a point across nodes (nnodes > 1, --executor ray) waits for its nodes before it
            ends unschedulable.
        predict_memory: Estimate every point's peak memory per device first (from its model's config) and end
            the points above --device_memory_gb as predicted_oom without starting them; False: start every point.
        device_memory_gb: The memory budget per device for that; default: the visible GPU's (none on a CPU).
    """

    spec: str
    output_dir: str
    executor: str = "local"
    concurrency: int | None = None
    retries: int = 1
    rerun_failed: bool = False
    point_timeout: float | None = None
    dry_run: bool = False
    report_only: bool = False
    interleave: bool = False
    ray_address: str | None = None
    ray_num_cpus: int | None = None
    ray_runtime_env: str | dict | None = None
    placement_timeout: float = 300.0
    predict_memory: bool = True
    device_memory_gb: float | None = None

    def __post_init__(self) -> None:
        """Every flag checked: a one-line error (exit 1) before anything is read or run."""
        if self.executor not in sweep.EXECUTORS:
            raise SystemExit(f"--executor {self.executor!r}: choose {' or '.join(sweep.EXECUTORS)}")
        for name, value, low in (("concurrency", self.concurrency, 1), ("retries", self.retries, 0)):
            if value is not None and not sweep.is_count(value, low):
                raise SystemExit(f"--{name} must be an integer >= {low}, got {value!r}")
        if self.point_timeout is not None and (not is_number(self.point_timeout) or self.point_timeout <= 0):
            raise SystemExit(f"--point_timeout must be a positive number of seconds, got {self.point_timeout!r}")
        if not is_number(self.placement_timeout) or self.placement_timeout <= 0:
            raise SystemExit(
                f"--placement_timeout must be a positive number of seconds, got {self.placement_timeout!r}"
            )
        if self.device_memory_gb is not None and (not is_number(self.device_memory_gb) or self.device_memory_gb <= 0):
            raise SystemExit(f"--device_memory_gb must be a positive number, got {self.device_memory_gb!r}")


def main(*args: Any, **kwargs: Any) -> int:
    """The recipe: a sweep from its command line to its report and exit status (0; 128 + the signal that stopped
    it). Takes ``SweepFlags``' fields, by position or name, as fire hands them over."""
    # 1. Read the flags, each checked.
    flags = SweepFlags(*args, **kwargs)
    # 2. The grid: every point of the sweep file (each with the hash of all it runs with), and the sweep directory.
    points = sweep.grid(sweep.load_spec(str(flags.spec)), bool(flags.interleave))
    run = sweep.Sweep(points, Path(str(flags.output_dir)).absolute(), flags.retries, flags.point_timeout, BENCH_TRAIN)
    # 3. Runs nothing: --dry_run lists the points and their state, --report_only writes the report of what is there.
    if flags.dry_run:
        print("\n".join(run.plan(flags.rerun_failed)))
        return 0
    if flags.report_only:
        run.write_report()
        return 0
    # 4. Every point's flags parsed as bench_train parses them: a bad axis value fails now, naming the point.
    sweep.check_point_flags(points, BENCH_TRAIN)
    # 5. Every point's peak memory per device estimated: those above the budget end as predicted_oom, unstarted.
    predicted = sweep.predicted_ooms(points, flags.device_memory_gb, BENCH_TRAIN) if flags.predict_memory else {}
    # 6. Claim the sweep directory (one driver at a time; SIGINT and SIGTERM stop the sweep; both given back at the
    #    end of the block), start the executor, and run every point not finished yet; the bar's last line holds the
    #    counts of done, failed and skipped points.
    ray_options = (flags.ray_address, flags.ray_num_cpus, flags.ray_runtime_env, flags.placement_timeout)
    with run.claimed(str(flags.spec)):
        executor = run.start_executor(flags.executor, flags.concurrency, *ray_options)
        run.run(executor, flags.rerun_failed, predicted)
        # 7. The report over every point (DIR/report), unless a signal stopped the sweep.
        if run.interrupted_by is None:
            run.write_report()
            return 0
    print(f"bench_sweep: stopped by signal {run.interrupted_by}; rerun the same command to finish", file=sys.stderr)
    return 128 + run.interrupted_by


if __name__ == "__main__":
    sys.exit(fire_flags(main, SweepFlags, "bench_sweep.py"))
