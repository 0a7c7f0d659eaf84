"""bench_report.py: many benchmark runs → a table of points (a median and range over each point's repeats), a table of
every run, their failures with the root cause across ranks, CSVs and plots (``tuning.benchmarking.report``).

    python wrappers/bench_report.py RUNS_DIR 'more/*.json' --labels model,batch_size --x batch_size --group model

The files of one run share ``NAME`` (``bench_train.py --metrics_path NAME.json``); a sweep's ``sweep_state.jsonl``
adds its points' outcomes. ``--help`` describes the flags, docs/benchmarking.md ("Reports over many runs") the
report's sections and columns.
"""

from typing import Any

import fire

from tuning.benchmarking import report
from tuning.utils.cli_flags import reject_unknown_flags


def _names(value: Any) -> list[str]:
    """fire hands ``a,b`` over as a tuple and ``a`` as a string."""
    if isinstance(value, list | tuple):
        return [str(item) for item in value]
    return [part for part in str(value).split(",") if part] if value is not None else []


def main(
    *inputs: str,
    labels: str | tuple[str, ...] = (),
    x: str | None = None,
    group: str | None = None,
    output_dir: str = "bench_report",
) -> None:
    """Benchmark runs → report.md (points, runs, failures), report.csv, points.csv, goodput.png and, with --x,
    throughput.png and peak_memory.png; mfu_by_batch_size.png when per_device_train_batch_size is a column (a sweep
    axis or a label) and a run has an MFU. Prints the points table and the failures.

    A point is the runs whose label values are equal (a sweep's repeats): its row has their count and the median and
    range of throughput, step time, peak memory, goodput (and bound_by where the dumps have it); with
    --target_eval_loss runs, the time to train and the MLPerf score (10 or more runs, the fastest and the slowest
    dropped, as bench_compare --mlperf scores them; else invalid or too few runs, said why). The run table has a
    row per run (its files share NAME: NAME.json, NAME.json.rank<N>.error.json, NAME.journal.jsonl), its repeat a
    column; the failures section names each failed run's root cause (the earliest failure across ranks).
    docs/benchmarking.md lists the columns and statuses.

    Args:
        inputs: Dumps, rank error reports, journals and sweep state files: files, directories (searched
            recursively) or globs.
        labels: Metadata keys shown as columns, whose values make a point, comma-separated; dotted keys reach into
            nested metadata; default: the axes of the sweeps among the inputs, else the metadata keys whose values
            differ between runs (never the repeat index, a column of its own).
        x: Metadata key on the x axis of the throughput and memory plots; without it, those are not drawn.
        group: Metadata key whose values get one line each on the plots.
        output_dir: Where the report and the plots are written.
    """
    outputs = report.write_report(
        [str(item) for item in inputs],
        _names(labels),
        str(x) if x else None,
        str(group) if group else None,
        output_dir,
    )
    for path in outputs:
        print(path)


if __name__ == "__main__":
    reject_unknown_flags(main)
    fire.Fire(main)
