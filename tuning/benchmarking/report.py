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
from collections import Counter
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
from tuning.benchmarking.statistics import MLPERF_MIN_RUNS, MlperfScore, mlperf_score
from tuning.utils.error_logging import TERMINATION_LINE, ErrorCategory
from tuning.utils.file_utils import read_json_lines

if TYPE_CHECKING:
    from matplotlib.figure import Figure

SWEEP_STATE = "sweep_state.jsonl"
REPORT_KEYS = ("category", "rank", "timestamp", "message", "global_step")
DIRECTORY_PATTERNS = (*RUN_FILE_PATTERNS, SWEEP_STATE)
TOP_LEVEL_LABELS = ("experiment", "host", "world_size", "run_hash")
# Runs that did their work: plotted, compared, and not rerun by --rerun_failed. A --target_eval_loss run ends
# converged or not_converged: both measured (time to train, throughput); only ``converged`` reached the target.
DONE_STATUSES = ("ok", "stopped", "converged", "not_converged")
DONE_WORDS = f"{', '.join(DONE_STATUSES[:-1])} or {DONE_STATUSES[-1]}"  # how messages and legends name them
# A rerun of a job that had trained to its end, which trained nothing: no failure (not rerun), and no measurement (never
# plotted or compared: a measurement it holds is the earlier run's, from the journal it continued).
FINISHED_STATUSES = (*DONE_STATUSES, ALREADY_COMPLETE)
GB = 1e9
BATCH_SIZE_AXIS = "per_device_train_batch_size"  # a sweep with this axis gets a plot of MFU against it
REPEAT = "repeat"  # a sweep's repeat index (metadata): a column of the run table, never a point of its own
FAILURE_COLUMNS = (
    "error_category",
    "error_rank",
    "error_step",
    "failed_ranks",
    "error_message",
)  # "Failures" says them
# Columns of a run across nodes: not named as "not measured" in a report without one.
NODE_COLUMNS = ("slowest_node", "node_tokens_per_second", "node_collective_wait_s")
# Summary keys a dump may or may not have (newer figures): a column each, empty where a dump lacks it.
OPTIONAL_SUMMARY = ("bound_by", "peak_tensor_bytes", "memory_estimate_ratio", "converged", "time_to_train")
# The points table's figures (run-table column → header, meaning), a median and range each, and its words (the most
# common); the meanings are its legend.
POINT_FIGURES = {
    "tokens_per_second": ("tokens/s", "tokens trained per second, warmup excluded"),
    "step_time_p50_s": ("step p50 (s)", "the median step's seconds, warmup excluded"),
    "mfu": ("MFU", "model FLOPs utilisation: achieved over the device's peak FLOP/s"),
    "peak_gpu_memory_bytes": ("GPU memory (GB)", "the most any device reserved"),
    "peak_rss_bytes": ("RSS (GB)", "rank 0's peak resident memory (shown where no GPU memory was measured)"),
    "peak_tensor_bytes": ("tensors (GB)", "the most memory the run's live tensors held at once"),
    "memory_estimate_ratio": (
        "estimate / tensors",
        "the peak predicted before the run over the tensors' peak; the prediction takes every sequence at "
        "--max_seq_length, so data of shorter sequences reads above 1",
    ),
    "goodput": ("goodput", "productive step time over the run's wall time"),
    "time_to_train": (
        "time to train (s)",
        "seconds from run_start to the evaluation that reached --target_eval_loss, over the runs that reached it",
    ),
}
# A point's runs with --target_eval_loss scored as MLPerf scores a result (``mlperf_scored``, bench_compare --mlperf's
# scoring): points.csv's keys, and the points table's column with its meaning.
MLPERF_KEYS = ("mlperf_score", "mlperf_not_converged_runs", "mlperf_verdict", "mlperf_note")
MLPERF_COLUMN = (
    "MLPerf score (s)",
    f"time to train scored as MLPerf scores a result (as bench_compare --mlperf does): of {MLPERF_MIN_RUNS} or more "
    "runs, the fastest and the slowest dropped, the mean of the rest; one run that did not converge counts as the "
    f"slowest, two or more make the point invalid; fewer than {MLPERF_MIN_RUNS} runs: too few runs, never scored; a "
    "resumed run is left out",
)
POINT_WORDS = {"bound_by": ("bound by", "what the steps wait on, as each dump judged it; counts where the runs differ")}
POINTS_LEGEND = (
    "One row per point: the runs whose label values are equal (a sweep's repeats are runs of one point). Each figure "
    f"is the median over the point's runs that ended {DONE_WORDS}, with their range (lowest–highest) in brackets "
    "where they differ; GB are 10^9 bytes."
)
RUNS_MEANING = f"how many runs ended {DONE_WORDS} (N of M where the others did not)"
TEXT_WIDTH = 118  # of the lines written under a table: they fit a 120-column terminal
PLOT_DPI = 120
# One colour per goodput part, the same in every plot (matplotlib's cycle has 10 for 12 parts): the steps in greens,
# what repeats or waits in reds and greys, setting up in blues and purples.
GOODPUT_COLOURS = {
    "startup": "#4e79a7",
    "model_load": "#a0cbe8",
    "data_preparation": "#b07aa1",
    "trackers_start": "#d4a6c8",
    "checkpoint_restore": "#f28e2b",
    "warmup_steps": "#8cd17d",
    "productive_steps": "#2f8a3b",
    "evaluation": "#edc948",
    "checkpoint_save": "#9c755f",
    "repeated_steps": "#e15759",
    "gaps": "#555555",
    "leftover": "#c8c8c8",
}
AXIS_UNITS = {  # training arguments' units, for the plots' axis labels
    "per_device_train_batch_size": "samples per device",
    "batch_size": "samples",
    "gradient_accumulation_steps": "micro-batches",
    "max_seq_length": "tokens",
    "nproc_per_node": "processes",
    "world_size": "processes",
}
PLOT_TITLE_WIDTH = 60  # characters per line of a plot's title: what fits across the figure
MAX_PLOT_TICKS = 12  # up to this many x values, a tick at each
PLOT_CAPTION = "line: each point's median; dots: its runs (ended {done}); bar: their range"


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def bad_value(value: Any) -> str | None:
    """Why ``value`` cannot enter a ratio or a score, or None when it is a positive finite number."""
    if value is None:
        return "missing or null (NaN and infinities are written as null)"
    if not is_number(value):
        return f"not a number ({value!r})"
    if not math.isfinite(value):
        return "NaN" if math.isnan(value) else "infinite"
    return None if value > 0 else "zero" if value == 0 else f"negative ({value:g})"


def mlperf_scored(runs: list[tuple[str, dict[str, Any]]]) -> tuple[MlperfScore, list[str], list[str]]:
    """Runs of one point (``(NAME, dump summary)`` each) scored MLPerf's way: ``statistics.mlperf_score`` of their
    ``time_to_train``, None for a run that did not converge; the problems found (a run without --target_eval_loss, a
    time that is not a positive number) and the runs left out: converged but resumed, so not one MLPerf run. The
    scoring of bench_compare --mlperf (each side of a point) and of bench_report (each point)."""
    times: list[float | None] = []
    problems, left_out = [], []
    for name, summary in runs:
        seconds = summary.get("time_to_train")
        if summary.get("converged") is None:
            problems.append(f"{name}.json: not a --target_eval_loss run (summary.converged is null)")
        elif not summary["converged"]:
            times.append(None)
        elif seconds is None:
            left_out.append(f"{name}.json left out: {summary.get('time_to_train_note') or 'no time'}")
        elif reason := bad_value(seconds):
            problems.append(f"{name}.json: summary.time_to_train is {reason}")
        else:
            times.append(seconds)
    return mlperf_score(times), problems, left_out


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
        "slowest_node": summary.get("slowest_node"),
        "node_tokens_per_second": _per_node(summary, "tokens_per_second", "{:.1f}"),
        "node_collective_wait_s": _per_node(summary, "collective_wait_p50", "{:.4g}"),
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
        "seed": dump.get("seed") if dump else None,
        "resumed_from_step": summary.get("resumed_from_step"),
        "goodput": (summary.get("goodput") or {}).get("productive_fraction"),
        "data_fetch_share": summary.get("data_fetch_share"),
        **{key: summary.get(key) for key in OPTIONAL_SUMMARY},
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
    """``rank N: data`` or ``rank N: compute`` from the dump's straggler keys (``rank N on node G: ...`` across
    nodes); None when no rank held the rest back."""
    rank, node = summary.get("straggler_rank"), summary.get("straggler_node")
    where = f"rank {rank}" if node is None else f"rank {rank} on node {node}"
    return None if rank is None else f"{where}: {summary.get('straggler_cause')}"


def _per_node(summary: dict[str, Any], key: str, form: str) -> str | None:
    """``0: 812.3, 1: 640.1``: a figure of each node of a run across nodes (``summary.nodes``), by node_rank; None
    on one node or when no node has it."""
    nodes = summary.get("nodes") or []
    if all(node.get(key) is None for node in nodes):
        return None
    return ", ".join(
        f"{node['node_rank']}: {'' if node.get(key) is None else form.format(node[key])}" for node in nodes
    )


def _format(key: str, value: Any) -> str:
    if value is None:
        return ""
    if key == "traces":  # a link to each rank's trace, named by its rank's folder
        return " ".join(f"[{os.path.basename(os.path.dirname(path))}]({path})" for path in value.split())
    if key.endswith("_bytes"):
        return f"{value / GB:.2f}"
    if isinstance(value, float):
        return f"{value:.1f}" if key == "tokens_per_second" else f"{value:.4g}"
    text = json.dumps(value) if isinstance(value, dict | list) else str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def _figure(key: str, value: float | None) -> str:
    """A figure of the points table, to three significant digits (the range beside it says how many count)."""
    if value is None or key.endswith("_bytes") or key == "tokens_per_second":
        return _format(key, value)
    return f"{value:.3g}"


def markdown(headers: list[str], cells: list[list[str]]) -> tuple[str, list[str]]:
    """A Markdown table, each column padded to its widest cell (it reads as a table in a terminal too), without the
    columns empty in every row; and the headers of those left out."""
    kept = [index for index in range(len(headers)) if any(line[index] for line in cells)]
    dropped = [header for index, header in enumerate(headers) if index not in kept]
    table = [[headers[index] for index in kept], *([line[index] for index in kept] for line in cells)]
    widths = [max(len(line[column]) for line in table) for column in range(len(kept))]

    def render(line: list[str]) -> str:
        return "| " + " | ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)) + " |"

    rule = "|" + "|".join("-" * (width + 2) for width in widths) + "|"
    return "\n".join([render(table[0]), rule, *map(render, table[1:])]) + "\n", dropped


def _not_measured(dropped: list[str]) -> str:
    return textwrap.fill(f"not measured in these runs: {', '.join(dropped)}", TEXT_WIDTH) if dropped else ""


def runs_table(rows: list[dict[str, Any]]) -> str:
    """The run table (every column but the failure's, which "Failures" says; bytes in GB), and the line naming the
    columns no run measured."""
    columns = [column for column in rows[0] if column not in FAILURE_COLUMNS]
    headers = [column.replace("_bytes", "_gb") for column in columns]
    table, dropped = markdown(headers, [[_format(key, r.get(key)) for key in columns] for r in rows])
    if not any(r.get("slowest_node") is not None or r.get("node_tokens_per_second") for r in rows):
        dropped = [header for header in dropped if header not in NODE_COLUMNS]  # no run across nodes
    return table + ("\n" + _not_measured(dropped) + "\n" if dropped else "")


@dataclass
class PointRuns:
    """The runs of one point: the rows whose label values (all but the repeat index) are equal."""

    labels: dict[str, Any]
    rows: list[dict[str, Any]] = field(default_factory=list)
    configs: list[dict[str, Any]] = field(default_factory=list)  # the dumps' config blocks, where recorded
    summaries: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (run, summary) of the done runs
    across_nodes: list[dict[str, Any]] = field(default_factory=list)  # the summaries of its done runs across nodes

    @property
    def done(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if r["status"] in DONE_STATUSES]


def group_points(pairs: list[tuple[dict[str, Any], Run]], labels: list[str]) -> list[PointRuns]:
    """The runs grouped by their ``labels``' values (``repeat`` never counts), in the rows' order."""
    points: dict[str, PointRuns] = {}
    shown = [label for label in labels if label != REPEAT]
    for r, run in pairs:
        values = {label: r[label] for label in shown}
        point = points.setdefault(json.dumps(values, sort_keys=True, default=str), PointRuns(values))
        point.rows.append(r)
        if run.dump is not None and isinstance(run.dump.get("config"), dict):
            point.configs.append(run.dump["config"])
        if run.dump is not None and r["status"] in DONE_STATUSES:
            point.summaries.append((r["run"], run.dump["summary"]))
        if run.dump is not None and r["status"] in DONE_STATUSES and run.dump["summary"].get("nodes"):
            point.across_nodes.append(run.dump["summary"])
    return list(points.values())


def has_time_to_train(points: list[PointRuns]) -> bool:
    """Whether a run that did its work had --target_eval_loss: the report then scores the points as MLPerf does."""
    return any(summary.get("converged") is not None for point in points for _, summary in point.summaries)


def mlperf_figures(point: PointRuns) -> dict[str, Any]:
    """A point's ``MLPERF_KEYS``: its runs scored MLPerf's way (``mlperf_scored``), how many did not converge, and,
    when not scored, why (``invalid``, ``too few runs``, as bench_compare --mlperf says) with a note that also names
    the runs left out; all empty for a point without --target_eval_loss runs."""
    if not has_time_to_train([point]):
        return dict.fromkeys(MLPERF_KEYS)
    score, problems, left_out = mlperf_scored(point.summaries)
    verdict, notes = ("invalid", problems) if problems else (score.verdict, [score.note] if score.note else [])
    return {
        "mlperf_score": None if problems else score.score,
        "mlperf_not_converged_runs": score.not_converged,
        "mlperf_verdict": verdict,
        "mlperf_note": "; ".join([*notes, *left_out]),
    }


def _mlperf_cell(figures: dict[str, Any]) -> str:
    """The points table's MLPerf cell: the score (and the non-converged run it dropped as the slowest), else the
    verdict; then the note."""
    score, short, verdict, note = (figures[key] for key in MLPERF_KEYS)
    if verdict:
        return _format("mlperf_note", f"{verdict}: {note}")
    if score is None:  # a point without --target_eval_loss runs
        return ""
    text = _format("mlperf_score", score) + (f" ({short} not converged: the slowest)" if short else "")
    return _format("mlperf_note", f"{text}; {note}" if note else text)


def point_row(point: PointRuns, mlperf: bool = False) -> dict[str, Any]:
    """A point's figures over its runs that did their work (``DONE_STATUSES``): the median, lowest and highest of
    each, and the most common word (``bound_by``), with the count of each where they differ; with ``mlperf`` (the
    report has --target_eval_loss runs) the point's MLPerf score (``mlperf_figures``) too."""
    done = point.done
    figures: dict[str, Any] = {**point.labels, "runs": len(point.rows), "done_runs": len(done)}
    for key in POINT_FIGURES:
        values = [r[key] for r in done if is_number(r.get(key))]
        low, middle, high = (min(values), statistics.median(values), max(values)) if values else (None,) * 3
        figures.update({f"{key}_median": middle, f"{key}_min": low, f"{key}_max": high})
    for key in POINT_WORDS:
        counts = Counter(str(r[key]) for r in done if r.get(key) is not None)
        ranked = counts.most_common()
        figures[key] = ranked[0][0] if len(ranked) == 1 else ", ".join(f"{word} ({n})" for word, n in ranked) or None
    if mlperf:
        figures.update(mlperf_figures(point))
    return figures


def _mixed_configurations(point: PointRuns) -> str | None:
    """A line for a point whose runs differ in configuration (the dumps' ``config``): labels do not tell them apart."""
    configs = point.configs
    differ = sorted({key for config in configs for key in config if len({json.dumps(c.get(key)) for c in configs}) > 1})
    if not differ:
        return None
    where = ", ".join(f"{key}={value}" for key, value in point.labels.items()) or "the one point"
    return f"{where}: its runs differ in {', '.join(differ)} (configuration); --labels can tell them apart"


def _node_line(point: PointRuns) -> str | None:
    """A line for a point whose runs ran across nodes: per node, the median over its done runs of its throughput and
    of its collective wait per step; and the slowest node, in how many of those runs."""
    if not point.across_nodes:
        return None
    every = [node for summary in point.across_nodes for node in summary["nodes"]]
    parts = []
    for node_rank in sorted({node["node_rank"] for node in every}):
        figures = []
        for key, form in (("tokens_per_second", "{:.1f} tokens/s"), ("collective_wait_p50", "{:.3g} s")):
            values = [node[key] for node in every if node["node_rank"] == node_rank and is_number(node[key])]
            figures.append(form.format(statistics.median(values)) if values else "not measured")
        parts.append(f"node {node_rank} {figures[0]}, waited {figures[1]} a step in collectives")
    slowest = Counter(
        summary["slowest_node"] for summary in point.across_nodes if summary.get("slowest_node") is not None
    )
    if slowest:
        runs = len(point.across_nodes)
        parts.append("slowest " + ", ".join(f"node {node} ({n} of {runs} runs)" for node, n in slowest.most_common()))
    where = ", ".join(f"{key}={value}" for key, value in point.labels.items()) or "the one point"
    return f"{where}, per node: {'; '.join(parts)}"


def points_table(points: list[PointRuns], rows: list[dict[str, Any]]) -> str:
    """The points table: the labels, the runs that did their work, and per figure the median with the range
    (lowest–highest) in brackets where the runs differ; the peak RSS only where no run measured GPU memory; the
    MLPerf score where runs had --target_eval_loss. Then the legend, and the figures no run measured."""
    mlperf = has_time_to_train(points)
    point_rows = [point_row(point, mlperf) for point in points]
    figures = dict(POINT_FIGURES)
    if any(r["peak_gpu_memory_bytes_median"] is not None for r in point_rows):
        del figures["peak_rss_bytes"]  # the device's memory is the figure that decides a fit
    labels = list(points[0].labels) if points else []
    mlperf_header = [MLPERF_COLUMN[0]] if mlperf else []
    headers = [*labels, "runs", *(header for header, _ in figures.values()), *mlperf_header]
    headers += [header for header, _ in POINT_WORDS.values()]
    cells = []
    for r in point_rows:
        runs = str(r["runs"]) if r["done_runs"] == r["runs"] else f"{r['done_runs']} of {r['runs']}"
        line = [_format(label, r[label]) for label in labels] + [runs]
        for key in figures:
            middle, low, high = (_figure(key, r[f"{key}_{end}"]) for end in ("median", "min", "max"))
            line.append(middle if low == high else f"{middle} ({low}–{high})")
        line += [_mlperf_cell(r)] if mlperf else []
        cells.append(line + [_format(key, r[key]) for key in POINT_WORDS])
    table, dropped = markdown(headers, cells)
    meanings = dict([("runs", RUNS_MEANING), *figures.values(), *([MLPERF_COLUMN] if mlperf else [])])
    meanings.update(POINT_WORDS.values())
    legend = [textwrap.fill(POINTS_LEGEND, TEXT_WIDTH)]
    legend += [
        textwrap.fill(f"- {header}: {meaning}", TEXT_WIDTH, subsequent_indent="  ")  # a Markdown list item's lines
        for header, meaning in meanings.items()
        if header not in dropped
    ]
    notes = [textwrap.fill(note, TEXT_WIDTH) for point in points if (note := _mixed_configurations(point))]
    notes += [textwrap.fill(line, TEXT_WIDTH) for point in points if (line := _node_line(point))]
    return "\n\n".join(
        part for part in (table.rstrip(), "\n".join(legend), _not_measured(dropped), "\n".join(notes)) if part
    )


def failures_section(rows: list[dict[str, Any]]) -> str:
    """A line per run that failed to do its work (not in ``FINISHED_STATUSES``: a rerun of a finished job measured
    nothing, but failed nothing): its status and root cause (category, rank, step, message), the ranks that reported
    a failure; empty when no run failed."""
    lines = []
    for r in rows:
        if r["status"] in FINISHED_STATUSES:
            continue
        where = "".join(
            f" {word} {r[key]}"
            for word, key in (("on rank", "error_rank"), ("at step", "error_step"))
            if r[key] is not None
        )
        cause = f", {r['error_category']}{where}" if r["error_category"] else ""
        if not cause and r["status"] == "killed":
            cause = ", no error report on any rank" + (
                f" (trained to step {r['training_steps']})" * bool(r["training_steps"])
            )
        ranks = f" (ranks that reported a failure: {r['failed_ranks']})" if r["failed_ranks"] else ""
        message = f": {r['error_message']}" if r["error_message"] else ""
        lines.append(f"- `{r['run']}`: {r['status']}{cause}{message}{ranks}\n")
    return "".join(lines)


def plot(rows: list[dict[str, Any]], x: str, group: str | None, metric: str, ylabel: str, path: Path) -> bool:
    """One PNG of ``metric`` against ``x``, a line per group through the median at each x; False when there is
    nothing to draw."""
    figure = draw(rows, x, group, metric, ylabel)
    if figure is None:
        print(f"no plot {path.name}: no run that ended {DONE_WORDS} has both {x} and {metric}", file=sys.stderr)
        return False
    figure.savefig(path, dpi=PLOT_DPI)
    return True


def draw(rows: list[dict[str, Any]], x: str, group: str | None, metric: str, ylabel: str) -> "Figure | None":
    """The figure ``plot`` saves; None when no run that did its work (``DONE_STATUSES``) has both ``x`` and
    ``metric``."""
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
        for at in xs:  # every run, and the range of the point's runs
            axes.scatter([at] * len(by_x[at]), by_x[at], color=line.get_color(), s=12, alpha=0.6)
            axes.vlines(at, min(by_x[at]), max(by_x[at]), color=line.get_color(), linewidth=3, alpha=0.35)
    axes.set(xlabel=axis_label(x), ylabel=ylabel, title=textwrap.fill(f"{ylabel} by {x}", PLOT_TITLE_WIDTH))
    # Every figure drawn is a size: from zero, a 1 % difference does not look like a doubling (and room above the top).
    top = max(value for by_x in groups.values() for values in by_x.values() for value in values)
    axes.set_ylim(0, top * 1.08 or None)
    values = sorted({at for by_x in groups.values() for at in by_x})
    if numeric and len(values) <= MAX_PLOT_TICKS:  # a tick at each point's value, none between (no batch size 3)
        axes.set_xticks(values)
    elif numeric and all(isinstance(r[x], int) for r in points):
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.grid(alpha=0.3)
    if group:
        axes.legend()
    done = f"{', '.join(DONE_STATUSES[:-1])} or {DONE_STATUSES[-1]}"
    figure.text(0.5, 0.01, PLOT_CAPTION.format(done=done), ha="center", va="bottom", fontsize=8, color="#444444")
    figure.tight_layout(rect=(0, 0.04, 1, 1))  # the caption's line stays clear of the x axis' label
    return figure


def axis_label(key: str) -> str:
    """A metadata key as an axis label, with its unit where the key is a training argument that has one."""
    unit = AXIS_UNITS.get(key.rsplit(".", 1)[-1])
    return f"{key} ({unit})" if unit else key


def plot_goodput(bars: list[tuple[str, dict[str, Any] | None]], path: Path) -> bool:
    """``draw_goodput`` saved at ``path``; False without matplotlib (said on stderr) or without a run that has the
    figures."""
    try:
        figure = draw_goodput(bars)
    except ImportError:
        print(f"no plot {path.name}: matplotlib is not installed (pip install 'tuning-bench[plots]')", file=sys.stderr)
        return False
    if figure is not None:
        figure.savefig(path, dpi=PLOT_DPI)
    return figure is not None


def draw_goodput(bars: list[tuple[str, dict[str, Any] | None]]) -> "Figure | None":
    """One horizontal bar per run (``(name, summary.goodput)``), its wall time stacked by goodput part, each part in
    its own colour (``GOODPUT_COLOURS``, the same in every plot) and named in the legend; None when no run has the
    figures."""
    bars = [(name, goodput) for name, goodput in bars if goodput]
    if not bars:
        return None
    from matplotlib.figure import Figure

    figure = Figure(figsize=(9, 2.6 + 0.45 * len(bars)), layout="constrained")  # room for the legend below
    axes = figure.subplots()
    names = [name for name, _ in bars]
    left = [0.0] * len(bars)
    for part in GOODPUT_PARTS:
        widths = [max(goodput["parts"].get(part) or 0.0, 0.0) for _, goodput in bars]
        if any(widths):
            axes.barh(names, widths, left=left, label=part.replace("_", " "), color=GOODPUT_COLOURS[part])
            left = [start + width for start, width in zip(left, widths, strict=True)]
    axes.set(
        xlabel="wall time (s)", ylabel="run", title="where the time went (goodput: productive steps over wall time)"
    )
    axes.invert_yaxis()  # the first run on top, as in the table
    figure.legend(loc="outside lower center", ncol=4, fontsize="small", title="goodput parts")
    return figure


def _sort_key(value: Any) -> tuple[int, float, str]:
    """Numbers in numeric order, then text, then missing values."""
    if is_number(value):
        return (0, value, "")
    return (1, 0.0, str(value)) if value is not None else (2, 0.0, "")


def varying_metadata(runs: list[Run]) -> list[str]:
    """The metadata keys (dotted where nested) whose values are not the same in every dump, but the repeat index:
    what tells the runs' points apart when neither ``--labels`` nor a sweep names them."""
    flat = [_flat(run.dump["metadata"]) for run in runs if run.dump is not None]
    keys = dict.fromkeys(key for metadata in flat for key in metadata if key != REPEAT)
    return [key for key in keys if len({json.dumps(metadata.get(key), sort_keys=True) for metadata in flat}) > 1]


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    """Nested metadata as dotted keys → values (an empty object is a value)."""
    if not isinstance(value, dict) or not value and prefix:
        return {prefix[:-1]: value}
    return {key: item for name, inner in value.items() for key, item in _flat(inner, f"{prefix}{name}.").items()}


def write_report(
    inputs: list[str],
    labels: list[str] | None = None,
    x: str | None = None,
    group: str | None = None,
    output_dir: str = "bench_report",
) -> list[Path]:
    """The runs of ``inputs`` (dumps, rank error reports, journals, sweep state files: files, directories searched
    recursively, or globs) → report.md (points, runs, failures), report.csv (every run, every column), points.csv
    (every point's figures), goodput.png and, with ``x``, throughput.png and peak_memory.png in ``output_dir``;
    mfu_by_batch_size.png when per_device_train_batch_size is a column and a run has an MFU. The points table and the
    failures are printed too; returns the files written. ``labels``: metadata keys shown as columns, whose values make
    a point (default: the sweeps' axes, else the metadata keys whose values differ between runs; a run's ``repeat``
    is a column of its own). Raises ``SystemExit`` with the reason when there is nothing to report."""
    if not inputs:
        raise SystemExit("give dumps, error reports or journals: files, directories or globs")
    runs = load(find_files([str(item) for item in inputs]))
    if not runs:
        raise SystemExit("no readable runs in the inputs")
    sweep_axes = [axis for run in runs if run.sweep_point for axis in run.sweep_point["axes"]]
    named = labels or sweep_axes or varying_metadata(runs)
    repeats = [REPEAT] if any(label_value(run, REPEAT) is not None for run in runs) else []
    columns = list(dict.fromkeys([*named, *([x] if x else []), *([group] if group else []), *repeats]))
    pairs = sorted(
        ((row(run, columns), run) for run in runs),
        key=lambda pair: [*map(_sort_key, (pair[0][c] for c in columns)), pair[0]["run"]],
    )
    fields = list(dict.fromkeys(key for r, _ in pairs for key in r))  # a figure some dumps lack: empty in their rows
    rows = [{key: r.get(key) for key in fields} for r, _ in pairs]
    common = os.path.commonpath([os.path.abspath(os.path.dirname(r["run"])) for r in rows])
    out = Path(output_dir)
    for r in rows:
        r["run"] = os.path.relpath(r["run"], common)
        if r["traces"]:  # from where the report is, so that its links open
            r["traces"] = " ".join(os.path.relpath(path, out.resolve()) for path in r["traces"].split())
    points = group_points(list(zip(rows, (run for _, run in pairs), strict=True)), columns)

    out.mkdir(parents=True, exist_ok=True)
    points_text = "## Points\n\n" + points_table(points, rows) + "\n"
    runs_text = "## Runs\n\nEvery run; report.csv holds every column, the failures' too.\n\n" + runs_table(rows)
    failures = failures_section(rows)
    failures_text = f"## Failures\n\nThe runs that did not end {DONE_WORDS}, and their root causes.\n\n{failures}"
    print(
        points_text
        + ("\n" + failures_text if failures else "")
        + "\nEvery run: report.md; every column: report.csv and points.csv\n"
    )
    outputs = [out / "report.md", out / "report.csv", out / "points.csv"]
    sections = [points_text, runs_text, *([failures_text] if failures else [])]
    outputs[0].write_text("\n".join(sections), encoding="utf-8")
    _write_csv(outputs[1], rows)
    _write_csv(outputs[2], [point_row(point, has_time_to_train(points)) for point in points])
    if x:
        memory = ("peak_rss_bytes", "peak process RSS (GB)")
        if any(r["peak_gpu_memory_bytes"] is not None for r in rows):
            memory = ("peak_gpu_memory_bytes", "peak GPU memory reserved (GB)")
        throughput = ("tokens_per_second", "throughput (tokens/s)", "throughput.png")
        for metric, ylabel, name in (throughput, (*memory, "peak_memory.png")):
            if plot(rows, x, group, metric, ylabel, out / name):
                outputs.append(out / name)
    bars = [
        (r["run"], run.dump["summary"].get("goodput") if run.dump else None)
        for r, (_, run) in zip(rows, pairs, strict=True)
    ]
    if plot_goodput(bars, out / "goodput.png"):
        outputs.append(out / "goodput.png")
    if BATCH_SIZE_AXIS in columns and any(r["mfu"] is not None for r in rows):
        mfu_plot = out / "mfu_by_batch_size.png"
        if plot(rows, BATCH_SIZE_AXIS, group, "mfu", "MFU (achieved / peak FLOP/s)", mfu_plot):
            outputs.append(mfu_plot)
    return outputs


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
