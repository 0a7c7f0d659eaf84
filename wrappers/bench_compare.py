"""bench_compare.py: is the candidate faster or slower than the baseline, for sure? A verdict per point, as a CI gate.

    python wrappers/bench_compare.py BASELINE CANDIDATE [--metric tokens_per_second] [--threshold 0.02]
                                     [--match key1,key2] [--within_run] [--strict] [--output_dir bench_compare]
                                     [--loss_tolerance X] [--target_loss X] [--olympic] [--drop_damaged] [--mlperf]

BASELINE and CANDIDATE are sweep directories or directories of dumps. A point is a configuration: the run's metadata
and the dump's ``config`` (the arguments that define the work). Each whole run is one sample; per point the
statistics of ``tuning.benchmarking.statistics`` (Hodges–Lehmann ratio, bootstrap interval, Mann–Whitney U, Holm)
give faster / slower / same / inconclusive; beside it ``tuning.benchmarking.quality`` compares the runs' losses at
matched steps: matched / better / diverged. Exit 4 when a point diverged (the candidate learns worse, whatever its
speed), 1 when a point is slower (or worse), 2 when the data cannot be compared everywhere (values that are not
positive numbers, failed or damaged runs, runs without a loss series, points on one side only, configurations not
recorded, more than one run a side short of --target_loss), 3 with --strict when a point is inconclusive, else 0.
docs/benchmarking.md, "Comparing two sweeps" and "Quality beside speed".
This file is the recipe: its flags are the dataclass below, and ``main`` reads top to bottom, each step one call into
``tuning.benchmarking.compare`` (pairing, verdicts, table, plot).
"""

import dataclasses
import sys
from pathlib import Path
from typing import Any

from tuning.benchmarking import compare
from tuning.utils.cli_flags import fire_flags


@dataclasses.dataclass
class CompareFlags:
    """Compare CANDIDATE with BASELINE point by point; write comparison.md, comparison.csv and comparison.png.

    Exit 4: a point diverged (the candidate's loss is worse beyond the tolerance, whatever its speed); 1: a point is
    slower (worse); 2: the data cannot be compared everywhere (a value that is not a positive number, a point on one
    side only, a run that did not finish, a damaged dump, runs without a loss series, more than one run a side short
    of --target_loss, a configuration not recorded); 3: with --strict, a point is inconclusive or identical; 0: none
    of these. Bad input: a one-line error and exit 1, before any work.

    Args:
        baseline: A sweep directory or a directory of dumps: the reference.
        candidate: The same for the change under test.
        metric: tokens_per_second, step_time_p50, mfu, peak_memory or joules_per_token.
        threshold: The noise band: relative changes within it do not count (same needs the whole interval inside,
            faster or slower a significant change estimated beyond it).
        match: Metadata keys that identify a point with the dump's config, comma-separated (dotted for nested keys);
            default: every metadata key but the repeat index.
        within_run: With one run on a side, compare the runs' post-warmup steps instead (the interval then ignores
            run-to-run noise, and the row says so); default: such a point is inconclusive.
        strict: Exit 3 when a point is inconclusive or identical (a gate that must show the change is harmless).
        output_dir: Where comparison.md, comparison.csv and comparison.png are written.
        loss_tolerance: How much higher (in loss units) the candidate's smoothed loss may end than the baseline's
            before the point is diverged; default: 3 standard deviations of the baseline's own noise.
        target_loss: Add each side's steps and step time to this smoothed training loss; a run that never reaches
            it has not converged, and more than one such run on a side fails the comparison (exit 2).
        olympic: Drop each side's fastest and slowest run before the statistics (MLPerf's olympic scoring); needs 5
            runs a side.
        drop_damaged: Compare without the run files that cannot be read (cut short, not JSON), naming them; by
            default they make the comparison exit 2.
        mlperf: Compare time_to_train (bench_train --target_eval_loss runs) scored MLPerf's way: 10 runs a side or
            more, each side's fastest and slowest dropped, one non-converged run the slowest, two invalid.
    """

    baseline: str
    candidate: str
    metric: str = "tokens_per_second"
    threshold: float = 0.02
    match: str | tuple[str, ...] = ()
    within_run: bool = False
    strict: bool = False
    output_dir: str = "bench_compare"
    loss_tolerance: float | None = None
    target_loss: float | None = None
    olympic: bool = False
    drop_damaged: bool = False
    mlperf: bool = False

    def __post_init__(self) -> None:
        """Every flag checked: a one-line error (exit 1) before any file is read."""
        others = [f"--{name}" for name in ("olympic", "within_run") if getattr(self, name)]
        compare.check_options(self.metric, self.threshold, self.loss_tolerance, self.target_loss, self.mlperf, *others)
        if self.mlperf:
            self.metric = compare.MLPERF_METRIC


def main(*args: Any, **kwargs: Any) -> int:
    """The recipe: two sides' runs to a table, a plot and the exit code of the worst news. Takes ``CompareFlags``'
    fields, by position or name, as fire hands them over."""
    # 1. Read the flags, each checked.
    flags = CompareFlags(*args, **kwargs)
    # 2. Read each side: the runs that did their work, those that did not, and the files that could not be read.
    base_runs, *base_unread = compare.read_side(str(flags.baseline))
    cand_runs, *cand_unread = compare.read_side(str(flags.candidate))
    # 3. Pair the runs by point: the metadata labels (--match's, or all but the repeat) and the dump's config.
    points = compare.pair(base_runs, cand_runs, compare.names(flags.match))
    # 4. A verdict per point: the speed statistics over runs (or steps), the losses at matched steps.
    rows = compare.compare_points(
        points,
        compare.METRICS[flags.metric],
        flags.metric,
        float(flags.threshold),
        bool(flags.within_run),
        bool(flags.olympic),
        flags.loss_tolerance,
        flags.target_loss,
        bool(flags.mlperf),
    )
    # 5. The table (printed too), the CSV and the plot.
    compare.write_comparison(rows, flags.metric, float(flags.threshold), Path(str(flags.output_dir)))
    # 6. Name every run not compared; the exit code the worst news gives, and why.
    failed = compare.not_compared(tuple(base_unread), tuple(cand_unread), bool(flags.drop_damaged))
    code, why = compare.exit_code(rows, failed, bool(flags.strict))
    print(f"exit {code}: {why}")
    return code


if __name__ == "__main__":
    sys.exit(fire_flags(main, CompareFlags, compare.PROG))
