"""bench_train for tests: the flags of a short benchmark run, the run as a job, its dump and its rebuilt journal; a
directory of real runs with every ending a report reads (``BenchRuns``)."""

import csv
import itertools
import json
import math
import signal
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers.training import (
    BENCH_CALLBACKS,
    BENCH_TRAIN,
    RESPONSE_TEMPLATE,
    TORCHRUN,
    Job,
    cli_args,
    run_python,
    start_launch,
    two_ranks,
    wait_for_steps,
)
from tuning.benchmarking.dump import STEP_PART_SERIES, STEP_TIME
from tuning.benchmarking.journal import journal_path
from tuning.benchmarking.schema import validate_dump
from tuning.utils.tiny_model import SAMPLE_TRAIN_PATH


def bench_args(model: str, output_dir: Path, **extra) -> list[str]:
    """A short bench_train run on the tiny model: dump in ``output_dir/bench.json``, one warmup step, quick system
    samples, no memory estimate; ``extra`` adds or overrides flags."""
    extra.setdefault("metrics_path", output_dir / "bench.json")
    extra.setdefault("skip_warmup_steps", 1)
    extra.setdefault("system_metrics_interval", 0.2)
    extra.setdefault("memory_estimate", False)  # its cost is paid by the tests of the memory estimate only
    return cli_args(model, str(output_dir), **extra)


def sweep_point_flags(model: str, **extra) -> dict:
    """A sweep point's flags (its spec's base): two logged steps of the tiny model; ``extra`` adds or overrides."""
    return {
        "model_name_or_path": model,
        "training_data_path": SAMPLE_TRAIN_PATH,
        "dataset_text_field": "output",
        "response_template": RESPONSE_TEMPLATE,
        "max_steps": 2,
        "logging_strategy": "steps",
        "logging_steps": 1,
        "save_strategy": "no",
        "torch_dtype": "float32",
        "use_flash_attn": False,
        "skip_warmup_steps": 0,
        "system_metrics_interval": 0.5,
        "memory_estimate": False,
        **extra,
    }


def start_bench(args: list[str], torchrun: bool = False, log_dir: Path | None = None, **env: str) -> Job:
    """``python wrappers/bench_train.py ARGS``, or under torchrun on two ranks."""
    argv = [*TORCHRUN, *two_ranks(BENCH_TRAIN, args)] if torchrun else [BENCH_TRAIN, *args]
    return Job(argv, log_dir, **env)


def run_bench(args: list[str], torchrun: bool = False, timeout: float = 300, **env: str) -> tuple[int, str, str]:
    """bench_train run to its end: its exit code, stdout and stderr."""
    process = start_bench(args, torchrun, **env)
    stdout, stderr = process.communicate(timeout=timeout)
    return process.returncode, stdout, stderr


def read_dump(path: Path) -> dict:
    """A dump, checked against the schema."""
    dump = json.loads(path.read_text())
    assert validate_dump(dump) == []
    return dump


def series(dump: dict, name: str, context: dict | None = None) -> dict:
    """A dump's series by name and context."""
    return next(m for m in dump["metrics"] if m["name"] == name and m["context"] == (context or {}))


def rebuild(journal: Path) -> dict:
    """``python -m tuning.benchmarking.rebuild`` as users run it; the dump it wrote beside the journal."""
    rebuilt = run_python("-m", "tuning.benchmarking.rebuild", str(journal), timeout=60)
    assert rebuilt.returncode == 0, rebuilt.stderr
    return read_dump(journal.with_name(journal.name.replace(".journal.jsonl", ".rebuilt.json")))


def csv_by(path: Path, column: str) -> dict[str, dict[str, str]]:
    """The rows of a CSV file (a report's, a comparison's) by their value in ``column``."""
    with path.open(newline="") as handle:
        return {row[column]: row for row in csv.DictReader(handle)}


def step_parts(dump: dict) -> dict[int, dict[str, float]]:
    """Each step's parts from the dump's series."""
    parts: dict[int, dict[str, float]] = {}
    for part, name in STEP_PART_SERIES.items():
        found = [m for m in dump["metrics"] if m["name"] == name]
        for metric in found:
            for step, value in zip(metric["steps"], metric["values"], strict=True):
                parts.setdefault(step, {})[part] = value
    return parts


def assert_parts_sum_to_step_times(dump: dict) -> None:
    """Each step's parts (step anatomy) add up to its step time, within 5 %."""
    times = dict(zip(*(series(dump, STEP_TIME)[key] for key in ("steps", "values")), strict=True))
    parts = step_parts(dump)
    assert sorted(parts) == sorted(times)
    for step, seconds in times.items():
        assert math.fsum(parts[step].values()) == pytest.approx(seconds, rel=0.05), (step, parts[step], seconds)


def markdown_rows(text: str, section: str) -> list[dict[str, str]]:
    """The rows of the first Markdown table under ``## section`` in ``text``, by header (cells stripped of padding)."""
    lines = text.split(f"## {section}\n", 1)[1].splitlines()
    after = itertools.dropwhile(lambda line: not line.startswith("|"), lines)
    table = itertools.takewhile(lambda line: line.startswith("|"), after)
    headers, *rows = ([cell.strip() for cell in line.strip("|").split(" | ")] for line in table)
    return [dict(zip(headers, cells, strict=True)) for cells in rows[1:]]


# The runs of ``BenchRuns``: name → (metadata, extra bench_train flags, on 2 ranks under tuning.launch). Output dirs
# land beside the dumps on purpose: the report must ignore the model files it finds there.
BENCH_RUNS = {
    "ok-a2": ({"model": "a", "batch_size": 2}, {"per_device_train_batch_size": 2}, False),
    "ok-a4": ({"model": "a", "batch_size": 4}, {}, False),
    "stopped-b4": (
        {"model": "b", "batch_size": 4},
        {"max_steps": 500, "stop_after_seconds": 2, "callbacks": f"{BENCH_CALLBACKS}:SlowSteps"},
        False,
    ),
    "oom-a8": (
        {"model": "a", "batch_size": 8},
        {"per_device_train_batch_size": 8, "callbacks": f"{BENCH_CALLBACKS}:OutOfMemoryOnLastRank"},
        False,
    ),
    "killed-b8": (
        {"model": "b", "batch_size": 8},
        {"per_device_train_batch_size": 8, "max_steps": 500, "callbacks": f"{BENCH_CALLBACKS}:SlowSteps"},
        False,
    ),
    # Started as a pod starts it (tuning.launch, a termination log): tests/test_launch.py reads its exit code, pod
    # log and stderr, the report tests its files.
    "ranks-b2": (
        {"model": "b", "batch_size": 2},
        {"per_device_train_batch_size": 2, "max_steps": 6, "callbacks": f"{BENCH_CALLBACKS}:OutOfMemoryOnLastRank"},
        True,
    ),
}
BENCH_RUNS_EXPECTED = {  # name → (status, root-cause category, root-cause rank), as the report reads them
    "ok-a2": ("ok", "", ""),
    "ok-a4": ("ok", "", ""),
    "stopped-b4": ("stopped", "", ""),
    "oom-a8": ("error", "gpu_oom", "0"),
    "killed-b8": ("killed", "", ""),
    "ranks-b2": ("error", "gpu_oom", "1"),
}


@dataclass(frozen=True)
class BenchRuns:
    """The finished runs of ``BENCH_RUNS``: dumps, journals and rank reports in ``dir`` (``NAME.json``...); each
    run's exit code, stderr, and its logs' directory (stdout, stderr, and the launched run's ``termination-log``)."""

    dir: Path
    returncodes: dict[str, int]
    stderr: dict[str, str]
    logs: dict[str, Path]


def make_bench_runs(model: str, runs_dir: Path) -> BenchRuns:
    """Every run of ``BENCH_RUNS`` at the same time; killed-b8 SIGKILLed after 2 steps. Each run that should end
    well did, and each that should fail did."""
    jobs = {}
    for name, (metadata, extra, launched) in BENCH_RUNS.items():
        flags = {"max_steps": 3, "skip_warmup_steps": 1, "system_metrics_interval": 0.2, "memory_estimate": False}
        args = cli_args(
            model,
            str(runs_dir / name),
            metrics_path=runs_dir / f"{name}.json",
            metadata=json.dumps(metadata),
            **{**flags, **extra},
        )
        log_dir = runs_dir.with_name(f"{runs_dir.name}-logs") / name
        if launched:
            jobs[name] = start_launch(two_ranks(BENCH_TRAIN, args), log_dir)
        else:
            jobs[name] = start_bench(args, log_dir=log_dir)
    wait_for_steps(Path(journal_path(str(runs_dir / "killed-b8.json"))), 2, jobs["killed-b8"], signal.SIGKILL, 300)
    stderr = {name: job.finish(timeout=300) for name, job in jobs.items()}
    for name, job in jobs.items():
        ends_well = BENCH_RUNS_EXPECTED[name][0] in ("ok", "stopped")
        assert (job.returncode == 0) == ends_well, f"{name}: {stderr[name][-3000:]}"
    returncodes = {name: job.returncode for name, job in jobs.items()}
    return BenchRuns(runs_dir, returncodes, stderr, {name: job.log_dir for name, job in jobs.items()})
