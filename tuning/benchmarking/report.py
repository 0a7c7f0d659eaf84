"""Many benchmark runs → rows, a Markdown table, a CSV and plots, with the root cause of every failed run across its
ranks: the report ``wrappers/bench_report.py`` prints, ``bench_sweep`` writes after a sweep and ``bench_compare`` reads
its runs from. A run's files are found by name through ``RunPaths``; docs/benchmarking.md ("Reports over many runs")
describes the columns and statuses. Imports neither torch nor matplotlib (loaded for a plot only).
"""

import contextlib
import csv
import glob
import json
import math
import os
import statistics
import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuning.benchmarking.dump import ALREADY_COMPLETE, SCHEMA_VERSION, build_dump
from tuning.benchmarking.goodput import PARTS as GOODPUT_PARTS
from tuning.benchmarking.journal import read_journal
from tuning.benchmarking.paths import DIRECTORY_PATTERNS as RUN_FILE_PATTERNS
from tuning.benchmarking.paths import JOURNAL, RANK_REPORT, TERMINATION_LOG_SUFFIX, RunPaths, run_of_dump
from tuning.benchmarking.schema import validate_dump
from tuning.utils.error_logging import TERMINATION_LINE, ErrorCategory
from tuning.utils.file_utils import read_json_lines

if TYPE_CHECKING:
    from matplotlib.figure import Figure

SWEEP_STATE = "sweep_state.jsonl"
REPORT_KEYS = ("category", "rank", "timestamp", "message", "global_step")
DIRECTORY_PATTERNS = (*RUN_FILE_PATTERNS, SWEEP_STATE)
TOP_LEVEL_LABELS = ("experiment", "host", "world_size", "run_hash")
DONE_STATUSES = ("ok", "stopped")  # runs that did their work: plotted, compared, and not rerun by --rerun_failed
# A rerun of a job that had trained to its end, which trained nothing: no failure (not rerun), and no measurement (never
# plotted or compared: a measurement it holds is the earlier run's, from the journal it continued).
FINISHED_STATUSES = (*DONE_STATUSES, ALREADY_COMPLETE)
GB = 1e9
BATCH_SIZE_AXIS = "per_device_train_batch_size"  # a sweep with this axis gets a plot of MFU against it
MESSAGE_WIDTH = 80  # of the error message in the Markdown table; the CSV keeps it whole
PLOT_DPI = 120
PLOT_TITLE_WIDTH = 60  # characters per line of a plot's title: what fits across the figure


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass
class Failure:
    """One rank's failure, from its error report (or the dump's ``error`` for rank 0)."""

    rank: int
    category: str
    step: int | None
    time: float  # POSIX timestamp; inf when the report has none readable, so that it counts last
    message: str


@dataclass
class Run:
    """Everything read for one run identity (``NAME``)."""

    name: str
    dump: dict[str, Any] | None = None  # its own, else one rebuilt from its journal
    failures: list[Failure] = field(default_factory=list)
    sweep_point: dict[str, Any] | None = None  # the run's line in a sweep's state file
    termination: Failure | None = None  # the first line of its termination log: the launcher's root cause

    @property
    def status(self) -> str:
        if self.sweep_point is not None:  # judged by the sweep from these files, the exit code and the log
            return self.sweep_point["status"]
        dump = self.dump
        # A journal cut short rebuilds into status error with no category: the run died without a word.
        if dump is None or (dump["rebuilt_from_journal"] and dump["error"] and dump["error"]["category"] is None):
            return "error" if self.failures else "killed"
        if dump["status"] in ("error", "interrupted") and self.failures:
            # The dump holds rank 0's own ending, "interrupted" too when torchrun stopped it for another rank's
            # failure: the run's status follows its root cause.
            return "interrupted" if self.root_cause.category == "interrupted" else "error"
        return dump["status"]

    @property
    def root_cause(self) -> Failure | None:
        """The launcher's root cause when the run has a termination log (it saw a rank killed without a report too:
        a SIGKILL, the kernel's OOM killer), by that rank's own report where it wrote one; else the earliest failure
        across ranks, so that an OOM on one rank is named rather than the communication errors and interruptions it
        causes on the others."""
        if self.termination is not None:
            key = (self.termination.rank, self.termination.category)
            return next((f for f in self.failures if (f.rank, f.category) == key), self.termination)
        return min(self.failures, key=lambda failure: failure.time, default=None)


class Skipped(Exception):
    """A file that cannot be used; the message says why, in one line."""


def _failure(report: dict[str, Any]) -> Failure:
    try:  # reports carry UTC ISO-8601 timestamps
        timestamp = datetime.fromisoformat(report.get("timestamp")).timestamp()
    except (TypeError, ValueError):
        timestamp = math.inf
    message = str(report.get("message") or "").splitlines() or [""]
    return Failure(report.get("rank", 0), report["category"], report.get("global_step"), timestamp, message[0])


def read_sweep_state(path: Path) -> dict[str, dict[str, Any]]:
    """A sweep's state file: point id → its latest line. A torn last line (the driver died writing it) is dropped;
    damage anywhere else raises ``ValueError``."""
    return {record["point"]: record for _, record in read_json_lines(path, "a sweep state line")}


def run_files(metrics_path: Path) -> list[tuple[Path, bool]]:
    """The files one run left that exist: its dump, its rank reports, its journal and its termination log, as
    ``find_files`` gives them."""
    paths = RunPaths(str(metrics_path))
    candidates = [paths.dump, *paths.rank_reports(), paths.journal(), paths.termination_log]
    return [(Path(path), True) for path in candidates if os.path.isfile(path)]


def find_files(inputs: list[str]) -> list[tuple[Path, bool]]:
    """``(path, named)`` for every input file, ``named`` when given directly rather than found in a directory."""
    found: dict[Path, bool] = {}
    for item in inputs:
        matches = [item] if os.path.exists(item) else sorted(glob.glob(item, recursive=True))
        if not matches:
            print(f"skipped {item}: no such file, directory or glob match", file=sys.stderr)
        for match in map(Path, matches):
            if not match.is_dir():
                found[match] = True
                continue
            for path in sorted(path for pattern in DIRECTORY_PATTERNS for path in match.rglob(pattern)):
                if path.is_file():
                    found.setdefault(path, False)
    return list(found.items())


@contextlib.contextmanager
def _skipping(path: Path, what: str, skipped: list[str] | None = None) -> Iterator[None]:
    """An unusable file is named on stderr with the reason, in one line, and left out (and ``path: reason`` added to
    ``skipped``)."""
    try:
        yield
        return
    except Skipped as exc:
        reason = str(exc)
    except json.JSONDecodeError as exc:
        reason = f"not valid JSON, cut short or damaged ({exc.msg} at line {exc.lineno})"
    except (OSError, ValueError, KeyError, TypeError) as exc:  # ValueError: also a file that is not UTF-8 text
        reason = f"not a usable {what} ({exc})"
    print(f"skipped {path}: {reason}", file=sys.stderr)
    if skipped is not None:
        skipped.append(f"{path}: {reason}")


def _read_json_file(path: Path, named: bool, run_for: Callable[[str], Run]) -> None:
    """A dump or an error report, filed under its run; anything else is skipped (silently when found in a
    directory and not benchmark-like at all)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    rank_report = RANK_REPORT.match(path.name)
    if not isinstance(data, dict):  # a JSON array or value: neither a dump nor a report
        data = {}
    if rank_report or "category" in data:
        if missing := [key for key in REPORT_KEYS if key not in data]:
            raise Skipped(f"incomplete error report: missing {', '.join(missing)}")
        metrics_name = rank_report["metrics_path"] if rank_report else path.name
        run_for(str(path.parent / os.path.splitext(metrics_name)[0])).failures.append(_failure(data))
    elif "schema_version" in data:
        if data["schema_version"] != SCHEMA_VERSION:
            raise Skipped(f"dump schema_version {data['schema_version']!r}; this report reads {SCHEMA_VERSION}")
        if problems := validate_dump(data):
            raise Skipped(f"incomplete dump: {problems[0]}")
        # The rebuild command's NAME.rebuilt.json stands for NAME.
        name = run_of_dump(str(path)) if data["rebuilt_from_journal"] else os.path.splitext(str(path))[0]
        run = run_for(name)
        if run.dump is None or run.dump["rebuilt_from_journal"]:  # the run's own dump beats a rebuilt one
            run.dump = data
    # What older benchmarking formats look like, so users learn why their file is not read.
    elif {"error", "exception"} <= data.keys():
        raise Skipped("old-schema error file ({error, exception, ...}, no category): not read")
    elif "run_hash" in data and ({"train_time_start", "hostname"} & data.keys()):
        raise Skipped("old-schema dump (Aim-callback format without schema_version): not read")
    elif named:
        raise Skipped("not a benchmark dump or error report (no schema_version or category)")


def _read_termination_log(path: Path) -> Failure:
    """The first line of a run's termination log: the root cause (``tuning.launch`` writes it first)."""
    first = (path.read_text(encoding="utf-8", errors="replace").splitlines() or [""])[0]
    if not (match := TERMINATION_LINE.match(first)) or match["category"] not in set(ErrorCategory):
        raise Skipped("its first line is not '<category>: [rank N: ]<reason>'")
    return Failure(int(match["rank"] or 0), match["category"], None, -math.inf, match["reason"])


def load(files: list[tuple[Path, bool]], skipped: list[str] | None = None) -> list[Run]:
    """Group the files by run identity and read them; each unusable file is named on stderr with the reason (and in
    ``skipped``, as ``path: reason``, when given).

    Journals are read last and only for runs without a readable dump: the dump already holds what they hold.
    """
    runs: dict[str, Run] = {}

    def run_for(name: str) -> Run:
        return runs.setdefault(name, Run(name))

    journals = []
    for path, named in files:
        journal = JOURNAL.match(path.name)
        if path.name == SWEEP_STATE:
            with _skipping(path, "sweep state file", skipped):
                for point in read_sweep_state(path).values():  # metrics_path is relative to the state file
                    run_for(str(path.parent / os.path.splitext(point["metrics_path"])[0])).sweep_point = point
        elif path.name.endswith(TERMINATION_LOG_SUFFIX):
            with _skipping(path, "termination log", skipped):
                run_for(
                    str(path.parent / path.name.removesuffix(TERMINATION_LOG_SUFFIX))
                ).termination = _read_termination_log(path)
        elif journal is None:
            with _skipping(path, "benchmark file", skipped):
                _read_json_file(path, named, run_for)
        elif journal["rank"] is None:  # other ranks' journals hold another node's system metrics only
            journals.append((path, str(path.parent / journal["stem"])))
    for path, name in journals:
        if (run := run_for(name)).dump is None:
            with _skipping(path, "journal", skipped):
                run.dump = build_dump(read_journal(str(path)), rebuilt_from_journal=True)
    for run in runs.values():
        if run.dump is not None and run.dump["error"] and run.dump["error"].get("category"):
            run.failures.append(_failure({"rank": run.dump["rank"], **run.dump["error"]}))
        if run.termination is not None and run.root_cause is run.termination:  # a rank that wrote no report
            run.failures.append(run.termination)
    return [run for run in runs.values() if run.dump or run.failures or run.sweep_point]


def label_value(run: Run, key: str) -> Any:
    """A metadata value by dotted key (``model.name``), else one of the dump's top-level identity keys; a sweep
    point's axis values stand in for a run with no dump (a skipped point)."""
    if run.dump is None:
        return (run.sweep_point or {}).get("axes", {}).get(key)
    value: Any = run.dump["metadata"]
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return run.dump.get(key) if key in TOP_LEVEL_LABELS else None
        value = value[part]
    return value


def row(run: Run, labels: list[str]) -> dict[str, Any]:
    """The table row of a run: raw values, formatted only when rendered."""
    dump = run.dump
    summary = dump["summary"] if dump else {}
    cause = run.root_cause
    sweep_point = run.sweep_point or {}  # the sweep's judgement of its point: also skipped and timeout
    return {
        "run": run.name,
        **{label: label_value(run, label) for label in labels},
        "status": run.status,
        "error_category": cause.category if cause else sweep_point.get("category"),
        "error_rank": cause.rank if cause else None,
        "error_step": cause.step if cause else None,
        "failed_ranks": " ".join(str(rank) for rank in sorted({f.rank for f in run.failures})) or None,
        "tokens_per_second": summary.get("tokens_per_second"),
        "step_time_p50_s": summary.get("step_time_p50"),
        "step_time_p90_s": summary.get("step_time_p90"),
        "mfu": summary.get("mfu"),
        "joules_per_token": summary.get("joules_per_token"),
        "rank_skew": summary.get("rank_skew"),
        "straggler": _straggler(summary),
        "peak_rss_bytes": summary.get("peak_rss_bytes"),
        "peak_anon_rss_bytes": summary.get("peak_anon_rss_bytes"),
        "peak_gpu_memory_bytes": max((d["max_memory_reserved_bytes"] for d in summary.get("cuda") or []), default=None),
        "peak_tensor_bytes": summary.get("peak_tensor_bytes"),
        # the estimate before the run; a sweep's predicted_oom point has it in its state line, and no dump
        "memory_estimate_bytes": ((dump or {}).get("estimate") or sweep_point.get("estimate") or {}).get(
            "peak_bytes_per_device"
        ),
        "memory_estimate_ratio": summary.get("memory_estimate_ratio"),
        "model_load_time_s": summary.get("model_load_time"),
        "data_preparation_time_s": summary.get("data_preparation_time"),
        "data_cache": ((dump.get("data") or {}).get("cache") or {}).get("status") if dump else None,
        "training_steps": dump["training_steps"] if dump else None,
        "resumed_from_step": summary.get("resumed_from_step"),
        "goodput": (summary.get("goodput") or {}).get("productive_fraction"),
        "data_fetch_share": summary.get("data_fetch_share"),
        "bound_by": summary.get("bound_by"),
        "step_parts": _step_parts(summary),
        "traces": _traces(run),
        "error_message": sweep_point.get("reason") or (cause.message if cause else None),
    }


def _step_parts(summary: dict[str, Any]) -> str | None:
    """``data 0.62, forward 0.15, ...``: each step part's median share of the step time (``summary.step_parts``)."""
    shares = summary.get("step_parts") or {}
    return ", ".join(f"{part} {share:.2f}" for part, share in shares.items() if share is not None) or None


def _traces(run: Run) -> str | None:
    """The profile's trace of each rank that wrote one (``profile.traces``), space-separated, as paths from where the
    report is read (the run's folder until ``write_report`` makes them relative to its own)."""
    profile = (run.dump or {}).get("profile") or {}
    folder = os.path.dirname(run.name)
    paths = [os.path.join(folder, entry["trace"]) for entry in profile.get("traces") or [] if entry.get("trace")]
    return " ".join(paths) or None


def _straggler(summary: dict[str, Any]) -> str | None:
    """``rank N: data`` or ``rank N: compute`` from the dump's straggler keys; None when no rank held the rest back."""
    rank = summary.get("straggler_rank")
    return None if rank is None else f"rank {rank}: {summary.get('straggler_cause')}"


def _format(key: str, value: Any) -> str:
    if value is None:
        return ""
    if key == "error_message" and len(value) > MESSAGE_WIDTH:
        value = value[: MESSAGE_WIDTH - 1] + "…"
    if key == "traces":  # a link to each rank's trace, named by its rank's folder
        return " ".join(f"[{os.path.basename(os.path.dirname(path))}]({path})" for path in value.split())
    if key.endswith("_bytes"):
        return f"{value / GB:.2f}"
    if isinstance(value, float):
        return f"{value:.1f}" if key == "tokens_per_second" else f"{value:.4g}"
    text = json.dumps(value) if isinstance(value, dict | list) else str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(rows: list[dict[str, Any]]) -> str:
    """The rows as a Markdown table; byte columns shown in GB."""
    columns = list(rows[0])
    headers = [column.replace("_bytes", "_gb") for column in columns]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_format(key, r[key]) for key in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], x: str, group: str | None, metric: str, ylabel: str, path: Path) -> bool:
    """One PNG of ``metric`` against ``x``, a line per group through the median at each x; False when there is
    nothing to draw."""
    figure = draw(rows, x, group, metric, ylabel)
    if figure is None:
        print(f"no plot {path.name}: no ok or stopped run has both {x} and {metric}", file=sys.stderr)
        return False
    figure.savefig(path, dpi=PLOT_DPI)
    return True


def draw(rows: list[dict[str, Any]], x: str, group: str | None, metric: str, ylabel: str) -> "Figure | None":
    """The figure ``plot`` saves; None when no ok or stopped run has both ``x`` and ``metric``."""
    points = [r for r in rows if r["status"] in DONE_STATUSES and r[metric] is not None and r[x] is not None]
    if not points:
        return None
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global figure state
    from matplotlib.ticker import MaxNLocator

    numeric = all(is_number(r[x]) for r in points)  # else matplotlib's categorical axis, one tick per value
    scale = GB if metric.endswith("_bytes") else 1
    groups: dict[str, dict[float, list[float]]] = {}  # group → x → values
    for r in points:
        at = r[x] if numeric else str(r[x])
        groups.setdefault(str(r[group]) if group else "", {}).setdefault(at, []).append(r[metric] / scale)
    figure = Figure(figsize=(7, 4.5))
    axes = figure.subplots()
    for name, by_x in sorted(groups.items()):
        xs = sorted(by_x)
        medians = [statistics.median(by_x[at]) for at in xs]
        line = axes.plot(xs, medians, marker="o", label=f"{group}={name}" if group else None)[0]
        for at in xs:  # every run, around its median
            axes.scatter([at] * len(by_x[at]), by_x[at], color=line.get_color())
    title = f"{ylabel} by {x} ({' and '.join(DONE_STATUSES)} runs)"
    axes.set(xlabel=x, ylabel=ylabel, title=textwrap.fill(title, PLOT_TITLE_WIDTH))  # a long one would be clipped
    if numeric and all(isinstance(r[x], int) for r in points):  # batch sizes: no tick at 1.5
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.grid(alpha=0.3)
    if group:
        axes.legend()
    figure.tight_layout()
    return figure


def plot_goodput(bars: list[tuple[str, dict[str, Any]]], path: Path) -> bool:
    """One horizontal bar per run, its wall time stacked by goodput part (``summary.goodput``); False without
    matplotlib (said on stderr) or without a run that has the figures."""
    bars = [(name, goodput) for name, goodput in bars if goodput]
    if not bars:
        return False
    try:
        from matplotlib.figure import Figure
    except ImportError:
        print(f"no plot {path.name}: matplotlib is not installed (pip install 'tuning-bench[plots]')", file=sys.stderr)
        return False
    figure = Figure(figsize=(9, 1.8 + 0.45 * len(bars)))
    axes = figure.subplots()
    names = [name for name, _ in bars]
    left = [0.0] * len(bars)
    for part in GOODPUT_PARTS:
        widths = [max(goodput["parts"].get(part) or 0.0, 0.0) for _, goodput in bars]
        if any(widths):
            axes.barh(names, widths, left=left, label=part.replace("_", " "))
            left = [start + width for start, width in zip(left, widths, strict=True)]
    axes.set(xlabel="seconds of wall time", title="where the time went (goodput: productive steps over wall time)")
    axes.invert_yaxis()  # the first run on top, as in the table
    axes.legend(loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=4, fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=PLOT_DPI)
    return True


def _sort_key(value: Any) -> tuple[int, float, str]:
    """Numbers in numeric order, then text, then missing values."""
    if is_number(value):
        return (0, value, "")
    return (1, 0.0, str(value)) if value is not None else (2, 0.0, "")


def write_report(
    inputs: list[str],
    labels: list[str] | None = None,
    x: str | None = None,
    group: str | None = None,
    output_dir: str = "bench_report",
) -> list[Path]:
    """The runs of ``inputs`` (dumps, rank error reports, journals, sweep state files: files, directories searched
    recursively, or globs) → report.md, report.csv and, with ``x``, throughput.png and peak_memory.png in
    ``output_dir``; mfu_by_batch_size.png when per_device_train_batch_size is a column and a run has an MFU. The
    table is printed too; returns the files written. ``labels``: metadata keys shown as columns (default: the sweeps'
    axes). Raises ``SystemExit`` with the reason when there is nothing to report."""
    if not inputs:
        raise SystemExit("give dumps, error reports or journals: files, directories or globs")
    runs = load(find_files([str(item) for item in inputs]))
    if not runs:
        raise SystemExit("no readable runs in the inputs")
    sweep_axes = [axis for run in runs if run.sweep_point for axis in run.sweep_point["axes"]]
    columns = list(dict.fromkeys([*(labels or sweep_axes), *([x] if x else []), *([group] if group else [])]))
    pairs = sorted(
        ((row(run, columns), run) for run in runs),
        key=lambda pair: [*map(_sort_key, (pair[0][c] for c in columns)), pair[0]["run"]],
    )
    rows = [r for r, _ in pairs]
    common = os.path.commonpath([os.path.abspath(os.path.dirname(r["run"])) for r in rows])
    out = Path(output_dir)
    for r in rows:
        r["run"] = os.path.relpath(r["run"], common)
        if r["traces"]:  # from where the report is, so that its links open
            r["traces"] = " ".join(os.path.relpath(path, out.resolve()) for path in r["traces"].split())

    out.mkdir(parents=True, exist_ok=True)
    table = markdown(rows)
    print(table)
    outputs = [out / "report.md", out / "report.csv"]
    outputs[0].write_text(table, encoding="utf-8")
    with outputs[1].open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    if x:
        memory = ("peak_rss_bytes", "peak process RSS (GB)")
        if any(r["peak_gpu_memory_bytes"] is not None for r in rows):
            memory = ("peak_gpu_memory_bytes", "peak GPU memory reserved (GB)")
        for metric, ylabel, name in (("tokens_per_second", "tokens/s", "throughput.png"), (*memory, "peak_memory.png")):
            if plot(rows, x, group, metric, ylabel, out / name):
                outputs.append(out / name)
    bars = [(r["run"], run.dump["summary"].get("goodput") if run.dump else None) for r, run in pairs]
    if plot_goodput(bars, out / "goodput.png"):
        outputs.append(out / "goodput.png")
    if BATCH_SIZE_AXIS in columns and any(r["mfu"] is not None for r in rows):
        mfu_plot = out / "mfu_by_batch_size.png"
        if plot(rows, BATCH_SIZE_AXIS, group, "mfu", "MFU", mfu_plot):
            outputs.append(mfu_plot)
    return outputs
