"""bench_train for tests: the flags of a short benchmark run, the run as a job, its dump and its rebuilt journal."""

import csv
import itertools
import json
import math
from pathlib import Path

import pytest

from tests.helpers.training import BENCH_TRAIN, RESPONSE_TEMPLATE, TORCHRUN, Job, cli_args, run_python, two_ranks
from tuning.benchmarking.dump import STEP_PART_SERIES, STEP_TIME
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
