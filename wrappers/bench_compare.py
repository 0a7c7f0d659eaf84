"""bench_compare.py: is the candidate faster or slower than the baseline, for sure? A verdict per point, as a CI gate.

    python wrappers/bench_compare.py BASELINE CANDIDATE [--metric tokens_per_second] [--threshold 0.02]
                                     [--match key1,key2] [--output_dir bench_compare]

BASELINE and CANDIDATE are sweep directories or directories of dumps. Points are matched by metadata; per point the
candidate/baseline ratio of the metric's mean gets a 95 % interval: over runs when each side has several (a sweep's
``repeats: N``), else over the post-warmup steps (within-run only: no run-to-run noise). Exit 1 when any point is
slower (or worse), 0 otherwise. The formulas: docs/benchmarking.md, "Comparing two sweeps".
"""

import csv
import json
import math
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fire

from tuning.benchmarking import report as bench_report  # the report library bench_report.py prints
from tuning.benchmarking.dump import SCHEMA_VERSION, STEP_TIME, TOKENS_PER_SECOND
from tuning.utils.cli_flags import reject_unknown_flags

PROG = "bench_compare.py"
IGNORED_KEYS = ("repeat",)  # a sweep's repeat index: the runs of one point, never a point of its own
CONFIDENCE = 0.95
SLOWER_VERDICTS = ("slower", "worse")  # exit 1


@dataclass(frozen=True)
class Metric:
    """A summary key compared between runs: where to read it, which way is better, and the per-step series whose
    values it is proportional to within a run (for within-run intervals), if any."""

    read: Callable[[dict[str, Any]], float | None]
    higher_is_better: bool
    step_series: str | None
    verdicts: tuple[str, str]  # (worse, better)


def _summary_key(key: str) -> Callable[[dict[str, Any]], float | None]:
    return lambda summary: summary.get(key)


def _peak_memory(summary: dict[str, Any]) -> float | None:
    """The most any device reserved; without CUDA, rank 0's peak RSS."""
    reserved = [device["max_memory_reserved_bytes"] for device in summary.get("cuda") or []]
    return max(reserved) if reserved else summary.get("peak_rss_bytes")


METRICS = {
    "tokens_per_second": Metric(_summary_key("tokens_per_second"), True, TOKENS_PER_SECOND, ("slower", "faster")),
    "step_time_p50": Metric(_summary_key("step_time_p50"), False, STEP_TIME, ("slower", "faster")),
    "mfu": Metric(_summary_key("mfu"), True, TOKENS_PER_SECOND, ("slower", "faster")),
    "peak_memory": Metric(_peak_memory, False, None, ("worse", "better")),
    "joules_per_token": Metric(_summary_key("joules_per_token"), False, None, ("worse", "better")),
}


def t_quantile(probability: float, degrees_of_freedom: float) -> float:
    """Student's t quantile for ``probability`` > 0.5: the CDF (Simpson's rule over the density from 0) inverted by
    bisection; fractional degrees of freedom allowed (Welch's)."""
    nu = degrees_of_freedom
    log_norm = math.lgamma((nu + 1) / 2) - math.lgamma(nu / 2) - 0.5 * math.log(nu * math.pi)

    def cdf(t: float, intervals: int = 2000) -> float:
        width = t / intervals
        total = 0.0
        for index in range(intervals + 1):
            x = index * width
            weight = 1 if index in (0, intervals) else 4 if index % 2 else 2
            total += weight * math.exp(log_norm - (nu + 1) / 2 * math.log1p(x * x / nu))
        return 0.5 + total * width / 3

    low, high = 0.0, 1.0
    while cdf(high) < probability:
        low, high = high, high * 2
    for _ in range(50):
        middle = (low + high) / 2
        low, high = (middle, high) if cdf(middle) < probability else (low, middle)
    return (low + high) / 2


def ratio_interval(baseline: list[float], candidate: list[float]) -> tuple[float, float | None, float | None]:
    """(mean(candidate) / mean(baseline), and its 95 % interval): Welch's t on the log of the ratio with the delta
    method's standard error sqrt(s_c² / (n_c m_c²) + s_b² / (n_b m_b²)); no interval with under 2 values a side."""
    mean_b, mean_c = statistics.fmean(baseline), statistics.fmean(candidate)
    ratio = mean_c / mean_b
    if len(baseline) < 2 or len(candidate) < 2:
        return ratio, None, None
    var_b = statistics.variance(baseline) / (len(baseline) * mean_b**2)
    var_c = statistics.variance(candidate) / (len(candidate) * mean_c**2)
    if var_b + var_c == 0:
        return ratio, ratio, ratio
    df = (var_b + var_c) ** 2 / (var_b**2 / (len(baseline) - 1) + var_c**2 / (len(candidate) - 1))
    spread = t_quantile((1 + CONFIDENCE) / 2, df) * math.sqrt(var_b + var_c)
    return ratio, ratio * math.exp(-spread), ratio * math.exp(spread)


def verdict(metric: Metric, low: float, high: float, threshold: float) -> str:
    """Worse when the whole interval lies beyond 1 ∓ threshold on the bad side, better on the good side, else same."""
    below, above = high < 1 - threshold, low > 1 + threshold
    worse, better = (below, above) if metric.higher_is_better else (above, below)
    return metric.verdicts[0] if worse else metric.verdicts[1] if better else "same"


def step_values(dump: dict[str, Any], metric: Metric) -> list[float]:
    """The metric per post-warmup step of one run: its step series, scaled to the summary value (MFU is tokens/s
    times a constant of the run)."""
    found = next((m for m in dump["metrics"] if m["name"] == metric.step_series and not m["context"]), None)
    if found is None:
        return []
    pairs = zip(found["steps"], found["values"], strict=True)
    values = [value for step, value in pairs if value is not None and step is not None and step > dump["warmup_steps"]]
    summary_value, series_summary = metric.read(dump["summary"]), dump["summary"].get(metric.step_series)
    if metric.step_series == TOKENS_PER_SECOND and summary_value is not None and series_summary:
        values = [value * summary_value / series_summary for value in values]
    return values


def flat_metadata(value: Any, prefix: str = "") -> dict[str, str]:
    """Nested metadata as dotted keys → JSON values."""
    if isinstance(value, dict) and (value or not prefix):
        return {k: v for key, item in value.items() for k, v in flat_metadata(item, f"{prefix}{key}.").items()}
    return {prefix[:-1]: json.dumps(value, sort_keys=True)}


def read_side(location: str) -> tuple[list[dict[str, Any]], set[str]]:
    """The dumps of the runs that did their work in ``location`` and the axes of its sweep (if it is one); a one-line
    ``SystemExit`` when there are none or one has another schema version."""
    if not Path(location).is_dir():
        raise SystemExit(f"{PROG}: {location} is not a directory (give a sweep directory or a directory of dumps)")
    files = bench_report.find_files([location])
    for path, _ in files:
        if path.suffix == ".json":
            try:
                version = json.loads(path.read_text(encoding="utf-8")).get("schema_version", SCHEMA_VERSION)
            except (ValueError, AttributeError, OSError):
                continue  # not a dump: bench_report's loader says why
            if version != SCHEMA_VERSION:
                raise SystemExit(f"{PROG}: {path} has schema_version {version}, this compares {SCHEMA_VERSION} only")
    runs = bench_report.load(files)
    dumps = [run.dump for run in runs if run.dump and run.status in bench_report.DONE_STATUSES]
    if not dumps:
        raise SystemExit(f"{PROG}: no ok or stopped benchmark dumps in {location}")
    return dumps, {axis for run in runs if run.sweep_point for axis in run.sweep_point["axes"]}


def matching_keys(dumps: list[dict[str, Any]], axes: set[str], match: list[str]) -> list[str]:
    """``match``, else every metadata key but the repeat index and those whose value differs on every run (sweep
    ``axes`` always count)."""
    if match:
        return match
    values: dict[str, list[str]] = {}
    for dump in dumps:
        for key, value in flat_metadata(dump["metadata"]).items():
            values.setdefault(key, []).append(value)
    unique_per_run = {
        key for key, seen in values.items() if len(dumps) > 1 and len(set(seen)) == len(dumps) and key not in axes
    }
    return sorted(key for key in values if key not in IGNORED_KEYS and key not in unique_per_run)


def point_of(dump: dict[str, Any], keys: list[str]) -> str:
    metadata = flat_metadata(dump["metadata"])
    return ", ".join(f"{key}={metadata.get(key, 'null')}" for key in keys) or "(all runs)"


def compare(
    baseline: list[dict[str, Any]], candidate: list[dict[str, Any]], metric: Metric, keys: list[str], threshold: float
) -> list[dict[str, Any]]:
    """One row per point: the means, the ratio, its interval and how it was formed, the verdict."""
    sides: dict[str, tuple[list, list]] = {}
    for index, dumps in enumerate((baseline, candidate)):
        for dump in dumps:
            sides.setdefault(point_of(dump, keys), ([], []))[index].append(dump)
    rows = []
    for point, (base_runs, cand_runs) in sorted(sides.items()):
        row: dict[str, Any] = {"point": point, "baseline_runs": len(base_runs), "candidate_runs": len(cand_runs)}
        base_values = [value for dump in base_runs if (value := metric.read(dump["summary"])) is not None]
        cand_values = [value for dump in cand_runs if (value := metric.read(dump["summary"])) is not None]
        row["baseline"] = statistics.fmean(base_values) if base_values else None
        row["candidate"] = statistics.fmean(cand_values) if cand_values else None
        if not base_values or not cand_values:
            side = "baseline" if base_values else "candidate" if cand_values else "neither side"
            rows.append(
                {**row, "ratio": None, "ci_low": None, "ci_high": None, "interval": "", "verdict": side + " only"}
            )
            continue
        if len(base_values) > 1 and len(cand_values) > 1:
            ratio, low, high = ratio_interval(base_values, cand_values)
            interval = "over runs"
        else:
            base_steps = [value for dump in base_runs for value in step_values(dump, metric)]
            cand_steps = [value for dump in cand_runs for value in step_values(dump, metric)]
            ratio = row["candidate"] / row["baseline"]
            low = high = None
            if len(base_steps) > 1 and len(cand_steps) > 1:
                step_ratio, low, high = ratio_interval(base_steps, cand_steps)
                low, high = low * ratio / step_ratio, high * ratio / step_ratio  # around the summaries' ratio
            interval = "within run (steps)" if low is not None else "none (one value a side)"
        judged_low, judged_high = (low, high) if low is not None else (ratio, ratio)
        rows.append(
            {
                **row,
                "ratio": ratio,
                "ci_low": low,
                "ci_high": high,
                "interval": interval,
                "verdict": verdict(metric, judged_low, judged_high, threshold),
            }
        )
    return rows


def _number(value: float | None, digits: str = ".4g") -> str:
    return "" if value is None else format(value, digits)


def markdown(rows: list[dict[str, Any]], metric_name: str) -> str:
    header = ["point", "runs (baseline/candidate)", f"baseline {metric_name}", "candidate", "ratio", "95 % interval"]
    lines = ["| " + " | ".join([*header, "over", "verdict"]) + " |", "|---" * (len(header) + 2) + "|"]
    for row in rows:
        interval = f"{row['ci_low']:.3f}–{row['ci_high']:.3f}" if row["ci_low"] is not None else ""
        cells = [
            row["point"].replace("|", "\\|"),
            f"{row['baseline_runs']}/{row['candidate_runs']}",
            _number(row["baseline"]),
            _number(row["candidate"]),
            _number(row["ratio"], ".3f"),
            interval,
            row["interval"],
            row["verdict"],
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], metric_name: str, threshold: float, path: Path) -> bool:
    """The ratios with their intervals, one line per point, and the band of ``same``; False without matplotlib."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        print(f"no plot {path.name}: matplotlib is not installed (pip install 'tuning-bench[plots]')", file=sys.stderr)
        return False
    shown = [row for row in rows if row["ratio"] is not None]
    figure = Figure(figsize=(7, 1.5 + 0.4 * len(shown)))
    axes = figure.subplots()
    for index, row in enumerate(shown):
        low, high = (row["ci_low"], row["ci_high"]) if row["ci_low"] is not None else (row["ratio"], row["ratio"])
        axes.errorbar([row["ratio"]], [index], xerr=[[row["ratio"] - low], [high - row["ratio"]]], fmt="o", capsize=4)
    axes.axvspan(1 - threshold, 1 + threshold, color="grey", alpha=0.2, label=f"same (±{threshold:g})")
    axes.axvline(1.0, color="grey", linewidth=1)
    axes.set_yticks(range(len(shown)), [row["point"] for row in shown])
    axes.set(xlabel=f"candidate / baseline {metric_name} (95 % interval)", title="bench_compare")
    axes.legend(loc="best")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    return True


def main(
    baseline: str,
    candidate: str,
    metric: str = "tokens_per_second",
    threshold: float = 0.02,
    match: str | tuple[str, ...] = (),
    output_dir: str = "bench_compare",
) -> int:
    """Compare CANDIDATE with BASELINE point by point; write comparison.md, comparison.csv and comparison.png.

    Args:
        baseline: A sweep directory or a directory of dumps: the reference.
        candidate: The same for the change under test.
        metric: tokens_per_second, step_time_p50, mfu, peak_memory or joules_per_token.
        threshold: Relative change the whole 95 % interval must pass for a verdict other than same.
        match: Metadata keys that identify a point, comma-separated (dotted for nested keys); default: every key
            but the repeat index and keys whose value differs on every run (timestamps, hosts) unless a sweep axis.
        output_dir: Where comparison.md, comparison.csv and comparison.png are written.
    """
    if metric not in METRICS:
        raise SystemExit(f"{PROG}: --metric {metric!r}: choose one of {', '.join(METRICS)}")
    if not bench_report.is_number(threshold) or not 0 <= threshold < 1:
        raise SystemExit(f"{PROG}: --threshold must be a number from 0 to below 1, got {threshold!r}")
    (base_dumps, base_axes), (cand_dumps, cand_axes) = read_side(str(baseline)), read_side(str(candidate))
    keys = matching_keys(base_dumps + cand_dumps, base_axes | cand_axes, names(match))
    rows = compare(base_dumps, cand_dumps, METRICS[metric], keys, float(threshold))
    if not any(row["ratio"] is not None for row in rows):
        raise SystemExit(
            f"{PROG}: no point is on both sides with a {metric} (matched on: {', '.join(keys) or 'nothing'})"
        )
    out = Path(str(output_dir))
    out.mkdir(parents=True, exist_ok=True)
    table = markdown(rows, metric)
    print(table)
    (out / "comparison.md").write_text(table, encoding="utf-8")
    with (out / "comparison.csv").open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    plot(rows, metric, float(threshold), out / "comparison.png")
    if any(row["interval"] == "within run (steps)" for row in rows):
        print("within run (steps): one run a side; the interval covers step-to-step noise, not run-to-run noise")
    return 1 if any(row["verdict"] in SLOWER_VERDICTS for row in rows) else 0


def names(value: str | tuple[str, ...]) -> list[str]:
    """fire hands ``a,b`` over as a tuple and ``a`` as a string."""
    parts = value if isinstance(value, tuple | list) else str(value).split(",")
    return [str(part) for part in parts if part]


if __name__ == "__main__":
    reject_unknown_flags(main)
    sys.exit(fire.Fire(main, name=PROG, serialize=lambda _: None))
