"""bench_compare's library: two sides' runs paired by point (a configuration: the run's metadata and the dump's
``config``), a verdict per point (the statistics of ``tuning.benchmarking.statistics`` for speed, those of
``tuning.benchmarking.quality`` for the loss), the table, the CSV and the plot, and the exit code the worst news
gives. wrappers/bench_compare.py is the recipe over these; docs/benchmarking.md, "Comparing two sweeps".
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

from tuning.benchmarking import quality
from tuning.benchmarking import report as bench_report
from tuning.benchmarking import statistics as stats
from tuning.benchmarking.dump import SCHEMA_VERSION, STEP_PART_SERIES, STEP_TIME, TOKENS_PER_SECOND, measured_step
from tuning.benchmarking.report import bad_value

PROG = "bench_compare.py"
IGNORED_KEYS = ("repeat",)  # a sweep's repeat index: the runs of one point, never a point of its own
SLOWER_VERDICTS = ("slower", "worse")  # exit 1
TOO_FEW_FOR_OLYMPIC = "too few runs"
NO_DATA_VERDICTS = ("invalid", "baseline only", "candidate only", TOO_FEW_FOR_OLYMPIC)  # exit 2
NO_QUALITY_VERDICTS = (quality.NO_LOSS, quality.NO_MATCHED_STEPS)  # exit 2: never passes as equal
NOT_CONVERGED = "not converged"  # more than one run of a side short of --target_loss: exit 2
UNDECIDED_VERDICTS = (stats.INCONCLUSIVE, stats.IDENTICAL)  # exit 3 with --strict
EXIT_SLOWER, EXIT_NO_DATA, EXIT_UNDECIDED, EXIT_DIVERGED = 1, 2, 3, 4
NOT_RECORDED = "configuration not recorded (old schema): matched on metadata and world_size only"
WITHIN_RUN = "within run (steps): ignores run-to-run noise"
OLYMPIC = "over runs, olympic (each side's fastest and slowest dropped)"
MLPERF = "over runs, MLPerf-scored (fastest and slowest dropped, a non-converged run the slowest)"
MISSING = "—"  # a value not measured or not computed: the note says why
SPEED_VERDICTS = {  # what each speed verdict means, for the legend under the table
    "faster": "p (Holm) below 0.05 and the ratio beyond the band, on the better side",
    "slower": "p (Holm) below 0.05 and the ratio beyond the band, on the worse side (exit 1)",
    "better": "as faster, for a figure where lower is better (memory, energy)",
    "worse": "as slower, for a figure where lower is better (exit 1)",
    stats.SAME: "the whole interval inside the band: no change beyond the threshold, shown",
    stats.INCONCLUSIVE: "neither shown; the note says how many runs a side could decide it",
    stats.IDENTICAL: "every value on both sides the same: nothing to estimate",
    "invalid": "a value is not a positive number; the note names the file and key (exit 2)",
    "baseline only": "the point has runs on the baseline side only (exit 2)",
    "candidate only": "the point has runs on the candidate side only (exit 2)",
    TOO_FEW_FOR_OLYMPIC: (
        f"--olympic needs {stats.OLYMPIC_MIN_RUNS} runs a side, --mlperf {stats.MLPERF_MIN_RUNS}, never scored (exit 2)"
    ),
}
LOSS_VERDICTS = {
    quality.MATCHED: "the candidate's smoothed end loss within the tolerance of the baseline's",
    quality.BETTER: "the candidate's loss lower by more than the tolerance",
    quality.DIVERGED: "the candidate's loss higher by more than the tolerance: it learns worse (exit 4)",
    quality.NO_LOSS: "a run logged no training loss (exit 2)",
    quality.NO_MATCHED_STEPS: f"fewer than {quality.MIN_MATCHED_STEPS} steps where every run logged its loss (exit 2)",
    NOT_CONVERGED: "more than one run a side never reached --target_loss (exit 2)",
}


@dataclass(frozen=True)
class Metric:
    """A summary key compared between runs: where to read it, which way is better, and the per-step series whose
    values it is proportional to within a run (for within-run intervals), if any."""

    read: Callable[[dict[str, Any]], float | None]
    higher_is_better: bool
    step_series: str | None
    verdicts: tuple[str, str]  # (worse, better)


@dataclass
class Sample:
    """One run: where its dump is, and the dump."""

    name: str
    dump: dict[str, Any]


@dataclass
class Point:
    """A configuration and the runs of each side in it."""

    identity: dict[str, str]  # dotted key → JSON value: metadata labels, config.<argument> or world_size
    recorded: bool  # the dumps hold the configuration (a ``config`` block)
    sides: tuple[list[Sample], list[Sample]]


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
    "time_to_train": Metric(_summary_key("time_to_train"), False, None, ("slower", "faster")),
}
MLPERF_METRIC = "time_to_train"  # what --mlperf compares


def step_values(dump: dict[str, Any], metric: Metric) -> list[float]:
    """The metric per post-warmup step of one run: its step series, scaled to the summary value (MFU is tokens/s
    times a constant of the run)."""
    found = next((m for m in dump["metrics"] if m["name"] == metric.step_series and not m["context"]), None)
    if found is None:
        return []
    pairs = zip(found["steps"], found["values"], strict=True)
    values = [value for step, value in pairs if value is not None and measured_step(dump, step)]
    summary_value, series_summary = metric.read(dump["summary"]), dump["summary"].get(metric.step_series)
    if metric.step_series == TOKENS_PER_SECOND and summary_value is not None and series_summary:
        values = [value * summary_value / series_summary for value in values]
    return values


def flat_metadata(value: Any, prefix: str = "") -> dict[str, str]:
    """Nested metadata as dotted keys → JSON values."""
    if isinstance(value, dict) and (value or not prefix):
        return {k: v for key, item in value.items() for k, v in flat_metadata(item, f"{prefix}{key}.").items()}
    return {prefix[:-1]: json.dumps(value, sort_keys=True)}


def read_side(location: str) -> tuple[list[Sample], list[str], list[str]]:
    """The runs that did their work in ``location``, a line for each run that did not (a sweep's failed or skipped
    points, a run that died) and one for each run file that could not be read (a dump cut short or not JSON); a
    one-line ``SystemExit`` when there is no finished run or a dump has another schema version."""
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
    damaged: list[str] = []
    runs = bench_report.load(files, skipped=damaged)
    done = [Sample(run.name, run.dump) for run in runs if run.dump and run.status in bench_report.DONE_STATUSES]
    failed = [failure_line(run) for run in runs if run.status not in bench_report.FINISHED_STATUSES]
    for run in runs:
        if run.status == bench_report.ALREADY_COMPLETE:  # neither a failure nor a measurement
            print(f"not compared: {run.name}: {run.status} (a rerun of a finished job: it measured nothing)")
    if not done:
        also = f" ({len(failed)} runs that did not finish)" if failed else ""
        raise SystemExit(f"{PROG}: no benchmark dumps that ended {bench_report.DONE_WORDS} in {location}{also}")
    return done, failed, damaged


def failure_line(run: bench_report.Run) -> str:
    """``NAME: status (category: message)``, or the sweep's reason for a point that left no report (skipped)."""
    cause = run.root_cause
    reason = f"{cause.category}: {cause.message}" if cause else (run.sweep_point or {}).get("reason")
    return f"{run.name}: {run.status}" + (f" ({reason})" if reason else "")


def identity_of(dump: dict[str, Any], match: list[str]) -> tuple[dict[str, str], bool]:
    """What a run's point is: its metadata labels (``match`` only, when given; never the repeat index) and its
    ``config`` block, else (an older dump without one) its world size; and whether the configuration was recorded."""
    metadata = flat_metadata(dump["metadata"])
    labels = {key: metadata.get(key, "null") for key in match} if match else metadata
    identity = {key: value for key, value in labels.items() if key not in IGNORED_KEYS}
    config = dump.get("config")
    if not isinstance(config, dict):
        return {**identity, "world_size": json.dumps(dump["world_size"])}, False
    config_values = {f"config.{key}": json.dumps(value, sort_keys=True) for key, value in config.items()}
    return {**identity, **config_values}, True


def group_points(sides: tuple[list[Sample], list[Sample]], match: list[str]) -> list[Point]:
    """The runs of both sides grouped by point: equal identities, nothing else, make one point."""
    points: dict[str, Point] = {}
    for index, samples in enumerate(sides):
        for sample in samples:
            identity, recorded = identity_of(sample.dump, match)
            key = json.dumps([identity, recorded], sort_keys=True)
            points.setdefault(key, Point(identity, recorded, ([], []))).sides[index].append(sample)
    return [points[key] for key in sorted(points)]


def distinguishing_keys(points: list[Point]) -> list[str]:
    """The identity keys whose value is not the same on every point: what tells the points apart."""
    keys = sorted({key for point in points for key in point.identity})
    return [key for key in keys if len({point.identity.get(key, "null") for point in points}) > 1]


def label(point: Point, shown: list[str]) -> str:
    """The point's metadata labels, and the configuration keys that tell it from the other points (unless a metadata
    label of the same name and value says it already, as a sweep's axes do)."""
    identity = point.identity

    def said(key: str) -> bool:
        if not key.startswith(("config.", "world_size")):
            return True
        return key in shown and identity.get(key.removeprefix("config.")) != identity[key]

    return ", ".join(f"{key}={identity[key]}" for key in sorted(identity) if said(key)) or "(all runs)"


def samples_of(
    point: Point, metric: Metric, metric_name: str, within_run: bool, olympic: bool = False
) -> tuple[list, list, list[str], str]:
    """Each side's values of the metric (a value per run; per post-warmup step when ``within_run`` and a side has one
    run; with ``olympic`` each side's lowest and highest run dropped), the problems found (file and key) and what the
    values are."""
    over_steps = within_run and min(len(runs) for runs in point.sides) == 1 and metric.step_series is not None
    values: tuple[list[float], list[float]] = ([], [])
    problems = []
    for side, runs in zip(values, point.sides, strict=True):
        for sample in runs:
            run_values = [metric.read(sample.dump["summary"])]
            where = f"{sample.name}.json: summary.{metric_name}"
            if over_steps:
                run_values, where = step_values(sample.dump, metric), f"{sample.name}.json: {metric.step_series}"
                run_values = run_values or [None]
            if reason := next((bad for value in run_values if (bad := bad_value(value))), None):
                problems.append(f"{where} is {reason}")
            side.extend(run_values)
    if olympic and not over_steps and not problems and min(map(len, values)) >= stats.OLYMPIC_MIN_RUNS:
        return stats.olympic(values[0]), stats.olympic(values[1]), problems, OLYMPIC
    return values[0], values[1], problems, WITHIN_RUN if over_steps else "over runs"


def mlperf_samples(point: Point) -> tuple[list[stats.MlperfScore], list[str], list[str]]:
    """Each side's runs scored MLPerf's way (``report.mlperf_scored``), the problems found on either side (a run
    without --target_eval_loss, a time that is not a positive number) and the runs left out (resumed)."""
    scores, problems, left_out = [], [], []
    for runs in point.sides:
        score, side_problems, side_left_out = bench_report.mlperf_scored([(s.name, s.dump["summary"]) for s in runs])
        scores.append(score)
        problems += side_problems
        left_out += side_left_out
    return scores, problems, left_out


def mlperf_columns(scores: list[stats.MlperfScore]) -> dict[str, Any]:
    """The row's MLPerf columns: each side's score (the mean of the times kept) and its non-converged runs."""
    columns: dict[str, Any] = {}
    for side, score in zip(("baseline", "candidate"), scores, strict=True):
        columns[f"{side}_mlperf_score"] = score.score
        columns[f"{side}_not_converged_runs"] = score.not_converged
    return columns


def compare_points(
    points: list[Point],
    metric: Metric,
    metric_name: str,
    threshold: float,
    within_run: bool,
    olympic: bool = False,
    loss_tolerance: float | None = None,
    target_loss: float | None = None,
    mlperf: bool = False,
) -> list[dict[str, Any]]:
    """One row per point: the runs, the sides' medians, the ratio, its interval, the p-values and the verdict, then
    the loss comparison (and with ``target_loss`` each side's steps and time to it). With ``mlperf`` the samples are
    each side's times to train that MLPerf's scoring keeps, and the row has each side's score."""
    shown = distinguishing_keys(points)
    rows, tested = [], []
    for point in points:
        if mlperf:
            scores, problems, left_out = mlperf_samples(point)
            base, cand, interval = scores[0].kept, scores[1].kept, MLPERF
            sides = zip(("baseline", "candidate"), scores, strict=True)
            unscored = [f"{side}: {score.note}" for side, score in sides if score.verdict]
        else:
            base, cand, problems, interval = samples_of(point, metric, metric_name, within_run, olympic)
        row: dict[str, Any] = {
            "point": label(point, shown),
            "baseline_runs": len(point.sides[0]),
            "candidate_runs": len(point.sides[1]),
            "baseline": statistics.median(base) if base and not problems else None,
            "candidate": statistics.median(cand) if cand and not problems else None,
            **dict.fromkeys(("ratio", "ci_low", "ci_high", "p_value", "p_adjusted", "min_runs", "runs_needed")),
            "interval": "",
            "verdict": "",
            "slower_part": "",
            "note": "" if point.recorded else NOT_RECORDED,
        }
        too_few = olympic and not within_run and min(len(runs) for runs in point.sides) < stats.OLYMPIC_MIN_RUNS
        if mlperf:
            row.update(mlperf_columns(scores))
            row["note"] = "; ".join(note for note in (row["note"], *left_out) if note)
        if not all(point.sides):
            row["verdict"] = "baseline only" if point.sides[0] else "candidate only"
        elif mlperf and not problems and unscored:
            verdict = "invalid" if any(score.verdict == "invalid" for score in scores) else TOO_FEW_FOR_OLYMPIC
            row.update(verdict=verdict, note="; ".join(note for note in (*unscored, row["note"]) if note))
        elif too_few:
            row.update(verdict=TOO_FEW_FOR_OLYMPIC, note=f"--olympic needs {stats.OLYMPIC_MIN_RUNS} runs a side")
        elif problems:
            row.update(verdict="invalid", note="; ".join(note for note in (*problems, row["note"]) if note))
        else:
            row["interval"] = interval
            tested.append((row, (base, cand), point))
        row.update(quality_columns(point, loss_tolerance, target_loss))
        rows.append(row)
    results = stats.compare_points([values for _, values, _ in tested], threshold, metric.higher_is_better)
    better = {stats.FASTER: metric.verdicts[1], stats.SLOWER: metric.verdicts[0]}
    for (row, _, point), result in zip(tested, results, strict=True):
        row.update(
            ratio=result.ratio,
            ci_low=result.ci_low,
            ci_high=result.ci_high,
            p_value=result.p_value,
            p_adjusted=result.p_adjusted,
            min_runs=result.min_runs,
            runs_needed=result.runs_needed,
            verdict=better.get(result.verdict, result.verdict),
            note="; ".join(note for note in (result.note, row["note"]) if note),
        )
        if row["verdict"] in SLOWER_VERDICTS:
            row["slower_part"] = slowdown_cause(point)
        if result.ci_low is None:
            row["interval"] = "none"
        if result.p_value is None and not within_run:
            row["note"] += "; repeat the runs, or --within_run for an interval over steps (ignores run-to-run noise)"
    return rows


def slowdown_cause(point: Point, top: int = 3) -> str:
    """For a point judged slower: the step part (step anatomy) whose median seconds per measured step grew most
    from baseline to candidate, and, when every run of both sides was profiled, the operators whose self time per
    profiled step grew most (CUDA's where both sides have them); empty without the parts' series."""
    parts: list[dict[str, float]] = []  # per side: part → median over runs of the run's median seconds per step
    for runs in point.sides:
        per_run: dict[str, list[float]] = {}
        for sample in runs:
            for part, name in STEP_PART_SERIES.items():
                found = next((m for m in sample.dump["metrics"] if m["name"] == name and not m["context"]), None)
                pairs = zip(found["steps"], found["values"], strict=True) if found else ()
                values = [value for step, value in pairs if value is not None and measured_step(sample.dump, step)]
                if values:
                    per_run.setdefault(part, []).append(statistics.median(values))
        parts.append({part: statistics.median(values) for part, values in per_run.items()})
    common = parts[0].keys() & parts[1].keys()
    if not common:
        return ""
    grown = max(common, key=lambda part: parts[1][part] - parts[0][part])
    before, after = parts[0][grown], parts[1][grown]
    cause = f"{grown} +{1000 * (after - before):.3g} ms/step ({1000 * before:.3g} → {1000 * after:.3g} ms)"
    profiles = [[(sample.dump.get("profile") or {}) for sample in runs] for runs in point.sides]
    if not all(profile.get("top_ops") and profile.get("profiled_steps") for side in profiles for profile in side):
        return cause
    kind = "cuda" if all(profile["top_ops"].get("cuda") for side in profiles for profile in side) else "cpu"
    key = "self_device_us" if kind == "cuda" else "self_cpu_us"
    per_step: list[dict[str, float]] = []  # per side: operator → mean self microseconds per profiled step
    for side in profiles:
        totals: dict[str, float] = {}
        steps = sum(profile["profiled_steps"][1] - profile["profiled_steps"][0] + 1 for profile in side)
        for profile in side:
            for op in profile["top_ops"][kind]:
                totals[op["name"]] = totals.get(op["name"], 0.0) + op[key]
        per_step.append({name: total / steps for name, total in totals.items()})
    growth = {name: per_step[1].get(name, 0.0) - per_step[0].get(name, 0.0) for name in per_step[0] | per_step[1]}
    ops = sorted((name for name in growth if growth[name] > 0), key=growth.__getitem__, reverse=True)[:top]
    named = ", ".join(f"{name} +{growth[name] / 1000:.3g} ms" for name in ops)
    return f"{cause}; {kind} operators grown most per step: {named}" if ops else cause


def quality_columns(point: Point, tolerance: float | None, target: float | None) -> dict[str, Any]:
    """The row's loss columns: the sides' smoothed end losses, the gap, the tolerance, the steps compared and the loss
    verdict; with ``target`` each side's median steps and step time to it over the runs that reached it, and how many
    did not (more than one on a side: ``not converged``, unless the point diverged, the worse news)."""
    sides = [[quality.losses(sample.dump) for sample in runs] for runs in point.sides]
    result = quality.compare_losses(*sides, tolerance=tolerance) if all(point.sides) else quality.Quality("")
    columns = {
        "loss_baseline": result.baseline,
        "loss_candidate": result.candidate,
        "loss_gap": result.gap,
        "loss_tolerance": result.tolerance,
        "loss_steps": f"{result.steps[0]}-{result.steps[1]}" if result.steps else "",
        "loss_verdict": result.verdict,
        "loss_note": result.note,
    }
    if target is None:
        return columns
    short = []
    for name, runs, losses in zip(("baseline", "candidate"), point.sides, sides, strict=True):
        reached = [(quality.steps_to_target(run, target), sample) for run, sample in zip(losses, runs, strict=True)]
        steps = [step for step, _ in reached if step is not None]
        times = [quality.time_to_step(sample.dump, step) for step, sample in reached if step is not None]
        times = [seconds for seconds in times if seconds is not None]
        columns[f"{name}_steps_to_target"] = statistics.median(steps) if steps else None
        columns[f"{name}_time_to_target"] = statistics.median(times) if times else None
        columns[f"{name}_not_converged"] = len(reached) - len(steps)
        if len(reached) - len(steps) > 1:
            short.append(f"{len(reached) - len(steps)} {name} runs never reached loss {target:g}")
    if short:  # worse news than not converging (diverged) keeps its verdict, and the note says both
        verdict = columns["loss_verdict"] if columns["loss_verdict"] == quality.DIVERGED else NOT_CONVERGED
        note = "; ".join(part for part in [*short, columns["loss_note"]] if part)
        columns.update(loss_verdict=verdict, loss_note=note)
    return columns


def exit_code(rows: list[dict[str, Any]], failed: list[str], strict: bool) -> tuple[int, str]:
    """4 when a point diverged (the candidate learns worse), else 1 when a point is slower (worse), else 2 when the
    data cannot be compared everywhere (a value that is not a positive number, a point on one side only, a run that
    did not finish or could not be read, runs without a loss series, runs short of the target loss, a configuration
    not recorded), else 3 with ``strict`` when a point is inconclusive or identical, else 0; and why, in one line."""
    verdicts = [row["verdict"] for row in rows]
    if diverged := [row for row in rows if row["loss_verdict"] == quality.DIVERGED]:
        gaps = "; ".join(f"{row['point']}: {row['loss_note']}" for row in diverged)
        return EXIT_DIVERGED, f"{len(diverged)} of {len(rows)} points diverged, whatever their speed ({gaps})"
    if slower := sum(verdict in SLOWER_VERDICTS for verdict in verdicts):
        return EXIT_SLOWER, f"{slower} of {len(rows)} points slower (worse)"
    no_data = sum(verdict in NO_DATA_VERDICTS for verdict in verdicts)
    no_quality = sum(row["loss_verdict"] in (*NO_QUALITY_VERDICTS, NOT_CONVERGED) for row in rows)
    not_recorded = sum(NOT_RECORDED in row["note"] for row in rows)
    if no_data or no_quality or failed or not_recorded:
        reasons = [
            f"{no_data} of {len(rows)} points not compared" if no_data else "",
            f"{no_quality} of {len(rows)} points without a loss comparison" if no_quality else "",
            f"{len(failed)} runs did not finish or could not be read" if failed else "",
            f"{not_recorded} points without a recorded configuration" if not_recorded else "",
        ]
        return EXIT_NO_DATA, "; ".join(reason for reason in reasons if reason)
    undecided = sum(verdict in UNDECIDED_VERDICTS for verdict in verdicts)
    if undecided and strict:
        return EXIT_UNDECIDED, f"{undecided} of {len(rows)} points inconclusive or identical (--strict)"
    if undecided:
        return 0, f"{undecided} of {len(rows)} points inconclusive or identical: nothing shown slower, nor the same"
    return 0, f"all {len(rows)} points decided, none slower"


def _number(value: float | None, digits: str = ".4g") -> str:
    return MISSING if value is None else format(value, digits)


def legend(rows: list[dict[str, Any]], metric_name: str, threshold: float) -> str:
    """The lines under the table: what its columns mean, which way is better, and the verdicts it shows."""
    higher = METRICS[metric_name].higher_is_better
    band = f"{1 / (1 + threshold):.3g} to {1 + threshold:g}"
    lines = [
        f"- ratio (HL): the candidate's {metric_name} over the baseline's, the Hodges–Lehmann estimate (the median of "
        f"the ratios of every baseline–candidate pair of samples); {'higher' if higher else 'lower'} is better, so "
        f"a ratio {'above' if higher else 'below'} 1 favours the candidate",
        "- 95 % interval: where the ratio lies with 95 % confidence (percentile bootstrap over the samples)",
        "- over: what one sample is: a whole run (over runs), a step after the warmup (within run), or the runs "
        "without each side's fastest and slowest (olympic; MLPerf-scored: a non-converged run the slowest)",
        "- p (Holm): the two-sided Mann–Whitney U test's p-value, the chance of a difference at least this large "
        "between sides that do not differ",
        "- correction: Holm's, over the points tested together, so that testing many points does not make a chance "
        "difference count; p (Holm) below 0.05 counts",
        f"- band: ratios from {band} (--threshold {threshold:g}) are no change",
    ]
    speed = list(dict.fromkeys(row["verdict"] for row in rows if row["verdict"] in SPEED_VERDICTS))
    loss = list(dict.fromkeys(row["loss_verdict"] for row in rows if row["loss_verdict"] in LOSS_VERDICTS))
    lines += [f"- verdict {word}: {SPEED_VERDICTS[word]}" for word in speed]
    lines += [f"- loss verdict {word}: {LOSS_VERDICTS[word]}" for word in loss]
    lines.append(f"- {MISSING}: not measured or not computed; the note says why")
    return "\n".join(lines) + "\n"


def to_target(row: dict[str, Any], side: str) -> str:
    """A side's way to --target_loss for the table's note: the median step and step time over the runs that reached
    it (a time only where the runs recorded their step times), and how many runs did not; or that none did."""
    steps, seconds, short = (row[f"{side}_{key}"] for key in ("steps_to_target", "time_to_target", "not_converged"))
    if steps is None:
        return f"never reached ({short} runs short)" if short else "no runs"
    reached = f"step {_number(steps)}" + (f", {_number(seconds, '.3g')} s of steps" if seconds is not None else "")
    return reached + (f" ({short} runs short)" if short else "")


def markdown(rows: list[dict[str, Any]], metric_name: str, threshold: float) -> str:
    """The rows as a Markdown table, a missing value as ``MISSING``, and the legend under it."""
    header = ["point", "runs (baseline/candidate)", f"baseline {metric_name} (median)", "candidate", "ratio (HL)"]
    header += ["95 % interval", "over", "p (Holm)", "verdict", "loss verdict", "note"]
    lines = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    for row in rows:
        interval = f"{row['ci_low']:.3f}–{row['ci_high']:.3f}" if row["ci_low"] is not None else MISSING
        note = row["note"]
        if row["runs_needed"] is not None:
            needed = row["runs_needed"]
            samples = "steps" if row["interval"] == WITHIN_RUN else "runs"
            count = needed if needed <= stats.MAX_RUNS_NEEDED else f"> {stats.MAX_RUNS_NEEDED}"
            if row["p_value"] is None:  # one sample on a side: no spread to estimate from, only the test's floor
                note += f"; at least {count} {samples} a side: the minimum the test needs (no spread to size it)"
            else:
                note += f"; about {count} {samples} a side would likely decide"
        for name in ("baseline", "candidate"):
            if f"{name}_steps_to_target" in row:
                note += f"; {name} to target: {to_target(row, name)}"
        if "baseline_mlperf_score" in row:
            scores = " vs ".join(_number(row[f"{name}_mlperf_score"]) for name in ("baseline", "candidate"))
            short = "/".join(str(row[f"{name}_not_converged_runs"]) for name in ("baseline", "candidate"))
            note += f"; MLPerf score (s) {scores}, not converged {short}"
        note += f"; {row['loss_note']}" if row["loss_note"] else ""
        note += f"; grew most: {row['slower_part']}" if row["slower_part"] else ""
        cells = [
            row["point"],
            f"{row['baseline_runs']}/{row['candidate_runs']}",
            _number(row["baseline"]),
            _number(row["candidate"]),
            _number(row["ratio"], ".3f"),
            interval,
            row["interval"] or MISSING,
            _number(row["p_adjusted"], ".3g"),
            row["verdict"],
            row["loss_verdict"] or MISSING,
            note.removeprefix("; "),
        ]
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines) + "\n\n" + legend(rows, metric_name, threshold)


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
    band = f"same (1/{1 + threshold:g} to {1 + threshold:g})"
    axes.axvspan(1 / (1 + threshold), 1 + threshold, color="grey", alpha=0.2, label=band)
    axes.axvline(1.0, color="grey", linewidth=1)
    axes.set_yticks(range(len(shown)), [row["point"] for row in shown])
    axes.set(xlabel=f"candidate / baseline {metric_name} (95 % interval)", title="bench_compare")
    axes.legend(loc="best")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    return True


def check_options(
    metric: str, threshold: Any, loss_tolerance: Any, target_loss: Any, mlperf: bool = False, *other_samples: str
) -> None:
    """The comparison's options checked: a one-line ``SystemExit`` naming the flag. ``other_samples``: the flags
    given that choose other samples than --mlperf's (``--olympic``, ``--within_run``)."""
    if mlperf and metric not in ("tokens_per_second", MLPERF_METRIC):  # the default, or what --mlperf compares
        raise SystemExit(f"{PROG}: --mlperf compares {MLPERF_METRIC}: leave out --metric {metric}")
    if mlperf and other_samples:
        raise SystemExit(f"{PROG}: --mlperf scores whole runs its own way: leave out {other_samples[0]}")
    if metric not in METRICS:
        raise SystemExit(f"{PROG}: --metric {metric!r}: choose one of {', '.join(METRICS)}")
    if not bench_report.is_number(threshold) or not 0 <= threshold < 1:
        raise SystemExit(f"{PROG}: --threshold must be a number from 0 to below 1, got {threshold!r}")
    for name, value in (("loss_tolerance", loss_tolerance), ("target_loss", target_loss)):
        if value is not None and (not bench_report.is_number(value) or not math.isfinite(value) or value < 0):
            raise SystemExit(f"{PROG}: --{name} must be a number of at least 0, got {value!r}")


def pair(baseline: list[Sample], candidate: list[Sample], match: list[str]) -> list[Point]:
    """The two sides' runs grouped by point; a one-line ``SystemExit`` when no point has runs on both sides."""
    points = group_points((baseline, candidate), match)
    if not any(all(point.sides) for point in points):
        differ = ", ".join(distinguishing_keys(points)) or "nothing"
        raise SystemExit(
            f"{PROG}: no point is on both sides: the {len(points)} points differ in {differ} "
            "(--match names the metadata keys that identify a point; the config block always counts)"
        )
    return points


def write_comparison(rows: list[dict[str, Any]], metric_name: str, threshold: float, output_dir: Path) -> None:
    """The table printed and written as comparison.md, the rows as comparison.csv, the plot as comparison.png."""
    output_dir.mkdir(parents=True, exist_ok=True)
    table = markdown(rows, metric_name, threshold)
    print(table)
    (output_dir / "comparison.md").write_text(table, encoding="utf-8")
    with (output_dir / "comparison.csv").open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    plot(rows, metric_name, threshold, output_dir / "comparison.png")


def not_compared(
    baseline: tuple[list[str], list[str]], candidate: tuple[list[str], list[str]], drop_damaged: bool
) -> list[str]:
    """Each side's runs that did not finish and files that could not be read (``read_side``'s second and third
    parts), printed a line each; the ones that count against the comparison (damaged files too, unless
    ``drop_damaged``)."""
    sides = (("baseline", baseline), ("candidate", candidate))
    failed = [f"{side} run {line}" for side, (lines, _) in sides for line in lines]
    damaged = [f"{side} file {line}" for side, (_, lines) in sides for line in lines]
    for line in failed:
        print(f"not compared: {line}")
    for line in damaged:
        print(f"{'dropped (--drop_damaged)' if drop_damaged else 'not compared'}: {line}")
    return failed + ([] if drop_damaged else damaged)


def names(value: str | tuple[str, ...]) -> list[str]:
    """fire hands ``a,b`` over as a tuple and ``a`` as a string."""
    parts = value if isinstance(value, tuple | list) else str(value).split(",")
    return [str(part) for part in parts if part]
