"""A sweep's grid: the sweep file (``base``, ``axes``, ``metadata``, ``repeats``) read and checked, its points (one
combination of axis values each, with the hash of everything it runs with), and their flags as bench_train's command
line. Docs: docs/sweeps.md.
"""

import functools
import hashlib
import importlib.util
import itertools
import json
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tuning.benchmarking import report
from tuning.benchmarking.configuration import file_sha256
from tuning.utils.prologue import collector_paused

SPEC_KEYS = ("base", "axes", "metadata")
REPEATS_KEY = "repeats"  # optional: every point runs this many times, metadata "repeat" 0, 1, ... telling them apart
SEED = "seed"  # each repeat its own (MLPerf's runs of one point differ by seed): the base's (default) + repeat
DEFAULT_SEED = 42  # transformers' TrainingArguments.seed
SWEEP_OWNED_FLAGS = ("output_dir", "metrics_path", "metadata")  # set per point by the sweep
BATCH_SIZE_AXIS = "per_device_train_batch_size"
PREDICTED_OOM = "predicted_oom"  # a point whose memory estimate exceeds the device budget: never started
LAUNCH_COUNTS = ("nproc_per_node", "nnodes")  # the launcher's, not bench_train's: processes per node, nodes
SLUG_MAX = 120  # of a point id's readable part; file names may have 255 bytes


def is_count(value: Any, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


@dataclass(frozen=True)
class Point:
    """One combination of axis values."""

    id: str
    axes: dict[str, Any]
    flags: dict[str, Any]  # base + axes without nproc_per_node, and metadata (the file's + axes) as JSON
    nproc: int
    config: str  # hash of all the point runs with (its data config's bytes too): a state line of another does not count
    repeat: int = 0  # which of the sweep's repeats of these axis values
    nnodes: int = 1  # nodes the point spans, nproc processes on each (the Ray executor's placement group)

    @property
    def label(self) -> str:
        return " ".join(f"{axis}={_short(value)}" for axis, value in self.axes.items())


def _short(value: Any) -> str:
    """A value as a label: paths by their last part."""
    text = json.dumps(value) if isinstance(value, dict | list) else str(value)
    return os.path.basename(text.rstrip("/")) or text


def _canonical(value: Any) -> str:
    """One text per value, whatever its keys' order: what tells flags and axis values apart."""
    return json.dumps(value, sort_keys=True, default=str)


def _hash(value: Any) -> str:
    return hashlib.sha256(_canonical(value).encode()).hexdigest()[:8]


def point_id(axes: dict[str, Any]) -> str:
    """Readable and unique: ``<axis>-<value>_...`` (letters, digits, ``_`` and ``-`` only) and a hash of the values."""
    slug = "_".join(f"{axis}-{_short(value)}" for axis, value in axes.items())
    return f"{re.sub(r'[^A-Za-z0-9_-]+', '-', slug)[:SLUG_MAX]}-{_hash(axes)}"


class SweepLoader(yaml.SafeLoader):
    """YAML as a sweep file needs it: a repeated key is an error (PyYAML keeps the last one silently), and
    ``1e-4`` is a number, as in YAML 1.2 (YAML 1.1 wants a dot in a float)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode):
                if (key := self.construct_object(key_node)) in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"found repeated key {key!r}", key_node.start_mark
                    )
                seen.add(key)
        return super().construct_mapping(node, deep)


SweepLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def load_spec(path: str) -> dict[str, Any]:
    """The sweep file, checked: every problem is a one-line ``SystemExit`` naming the culprit."""
    try:
        with open(path, encoding="utf-8") as handle:
            spec = yaml.load(handle, Loader=SweepLoader)
    except OSError as exc:
        raise SystemExit(f"cannot read sweep file {path}: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise SystemExit(f"sweep file {path} is not valid YAML: {' '.join(str(exc).split())}") from exc
    if problem := next(spec_problems(spec), None):
        raise SystemExit(f"sweep file {path}: {problem}")
    # YAML dates and the like become strings: metadata and flags travel as JSON.
    checked = {key: spec.get(key) or {} for key in SPEC_KEYS}
    return json.loads(json.dumps({**checked, REPEATS_KEY: spec.get(REPEATS_KEY, 1)}, default=str))


def spec_problems(spec: Any) -> Iterator[str]:
    """What is wrong with a sweep file's content, first problem first. The caller takes the first only, so each check
    runs once the ones before it passed and may rely on what they checked."""
    if not isinstance(spec, dict):
        yield f"must hold a mapping with keys {', '.join(SPEC_KEYS)}"
    if unknown := sorted(set(spec) - {*SPEC_KEYS, REPEATS_KEY}):
        yield f"unknown key {unknown[0]!r} (allowed: {', '.join(SPEC_KEYS)}, {REPEATS_KEY})"
    if not is_count(spec.get(REPEATS_KEY, 1), 1):
        yield f"{REPEATS_KEY} must be a positive integer, got {spec[REPEATS_KEY]!r}"
    for key in SPEC_KEYS:
        if not isinstance(spec.get(key) or {}, dict):
            yield f"{key} must be a mapping, got {type(spec[key]).__name__}"
    base, axes = spec.get("base") or {}, spec.get("axes") or {}
    if not is_count(base.get(SEED, DEFAULT_SEED), 0):
        yield f"base {SEED} must be a non-negative integer (each repeat adds its index), got {base[SEED]!r}"
    if not axes:
        yield "axes is empty; give at least one flag with a list of values"
    for axis, values in axes.items():
        if not isinstance(values, list) or not values:
            yield f"axis {axis} must be a non-empty list of values"
        if len({_canonical(value) for value in values}) != len(values):
            yield f"axis {axis} repeats a value"
    for key in SWEEP_OWNED_FLAGS:
        if key in base or key in axes:
            yield f"{key} is set by the sweep for each point; remove it"
    for count in LAUNCH_COUNTS:
        for value in [base.get(count, 1), *axes.get(count, [])]:
            if not is_count(value, 1):
                yield f"{count} must be a positive integer, got {value!r}"


def smaller_batch_sizes(point: Point, points: list[Point]) -> list[Point]:
    """The points of the same repeat that differ from ``point`` by a smaller batch size only: they run first, and an
    OOM in one skips it. Every point has the same axes, so a numeric batch size axis gives every point one."""
    if not report.is_number(size := point.axes.get(BATCH_SIZE_AXIS)):
        return []
    return [
        other
        for other in points
        if report.is_number(smaller := other.axes[BATCH_SIZE_AXIS])
        and smaller < size
        and other.axes == {**point.axes, BATCH_SIZE_AXIS: smaller}
        and other.repeat == point.repeat  # an interleaved sweep's first round runs before its second
    ]


def grid(spec: dict[str, Any], interleave: bool = False) -> list[Point]:
    """Every combination of the axes, in the order the file lists them (the last axis varies fastest); with
    ``repeats`` N > 1, each N times, its metadata's ``repeat`` (0 to N-1) in its id too and its own ``seed`` (the
    base's, default 42, plus the repeat; unless ``seed`` is an axis): in a row, or with ``interleave`` in rounds
    (every combination once, then every one again), so that a drift of the machine's speed falls on all of them
    alike."""
    points = []
    repeats = spec[REPEATS_KEY]
    for values in itertools.product(*spec["axes"].values()):
        axes = dict(zip(spec["axes"], values, strict=True))
        flags = {**spec["base"], **axes}
        nproc, nnodes = flags.pop("nproc_per_node", 1), flags.pop("nnodes", 1)
        for repeat in range(repeats):
            tells_apart = {"repeat": repeat} if repeats > 1 else {}
            if repeats > 1 and SEED not in spec["axes"]:
                flags = {**flags, SEED: spec["base"].get(SEED, DEFAULT_SEED) + repeat}
            metadata = {**spec["metadata"], **axes, **tells_apart}
            runs_with = {"flags": flags, "nproc": nproc, "metadata": metadata}
            if nnodes > 1:  # one node's points keep the hash they always had: their state lines still count
                runs_with["nnodes"] = nnodes
            if data_config := flags.get("data_config_path"):  # an edited data config is other work: run it again
                runs_with["data_config_sha256"] = file_sha256(str(data_config))
            config = _hash(runs_with)
            flags_of_point = {**flags, "metadata": json.dumps(metadata)}
            point = Point(point_id({**axes, **tells_apart}), axes, flags_of_point, nproc, config, repeat, nnodes)
            points.append(point)
    return sorted(points, key=lambda point: point.repeat) if interleave else points  # sorted() keeps ties' order


def flag_tokens(flags: dict[str, Any]) -> list[str]:
    """A mapping of flags as command-line tokens: ``null`` → a bare flag, a list → its items, a mapping → JSON."""
    tokens = []
    for key, value in flags.items():
        values = value if isinstance(value, list) else [] if value is None else [value]
        tokens += [f"--{key}", *(json.dumps(item) if isinstance(item, dict) else str(item) for item in values)]
    return tokens


@functools.cache
def load_bench_train(bench_train: Path) -> Any:
    """bench_train's module, for its parser: run once per sweep, for the flags' check and the memory estimates. Its
    imports (torch, transformers) run with the garbage collector paused, as a training script's do."""
    module_spec = importlib.util.spec_from_file_location("bench_sweep_point_flags", bench_train)
    module = importlib.util.module_from_spec(module_spec)
    with collector_paused():
        module_spec.loader.exec_module(module)
    return module


def parser_flags(point: Point) -> dict[str, Any]:
    """A point's flags as bench_train's parser is handed them, its own files' names stood in."""
    flags = {**point.flags, "output_dir": "point", "metrics_path": "point.json"}
    flags.pop("metadata")  # a point's labels, read by bench_train as a JSON string: the same for the parser
    return flags


def check_point_flags(points: list[Point], bench_train: Path) -> None:
    """Every point's flags as ``bench_train``'s own parser reads them (unknown flags, values of the wrong type, what
    the trainer refuses), before the first point runs: one bad axis value ends the sweep in seconds, naming the point
    and the flag, not after the points before it ran. Parsing only: files are checked by each point where it runs (a
    Ray node's paths need not be the driver's)."""
    module = load_bench_train(bench_train)
    checked = set()
    for point in points:
        flags = parser_flags(point)
        if (key := _canonical(flags)) in checked:
            continue
        checked.add(key)
        try:
            module.benchmarking.parse_command_line(module.BenchmarkFlags, flag_tokens(flags))
        except ValueError as exc:  # the trainer's UserInputError
            raise SystemExit(f"point {point.label}: {exc}") from None


def predicted_ooms(points: list[Point], device_memory_gb: float | None, bench_train: Path) -> dict[str, dict[str, Any]]:
    """Each point's predicted peak memory per device (``tuning.benchmarking.memory``, config only, on its
    nproc_per_node devices on each of its nnodes), before any point starts; those above ``device_memory_gb``
    (default: the visible GPU's memory; without a budget, on a CPU, nothing is estimated) get ``predicted_oom`` and
    are never started. Points that differ only by seed (a sweep's repeats) share one estimate: a seed draws other
    numbers into tensors of the same sizes. Returns point id → its state line's outcome, for the points predicted not
    to fit."""
    from tuning.benchmarking import memory

    budget = memory.gib_to_bytes(device_memory_gb) if device_memory_gb else memory.visible_device_memory()
    if budget is None:
        return {}
    module, outcomes, estimates = load_bench_train(bench_train), {}, {}
    for point in points:
        flags = parser_flags(point)
        devices = point.nproc * point.nnodes
        key = _canonical([{k: v for k, v in flags.items() if k != SEED}, devices])
        if key not in estimates:
            _, args = module.benchmarking.parse_command_line(module.BenchmarkFlags, flag_tokens(flags))
            estimates[key] = memory.estimate_memory(args, devices=devices)
        estimate = estimates[key]
        print(f"{point.label}: {memory.format_estimate(estimate).splitlines()[0]}", file=sys.stderr)
        if memory.fits(estimate, budget) is False:
            reason = f"predicted {estimate['peak_bytes_per_device'] / 2**30:.2f} GiB per device > {budget / 2**30:.2f}"
            outcomes[point.id] = {"status": PREDICTED_OOM, "category": PREDICTED_OOM, "reason": reason}
            outcomes[point.id]["estimate"] = estimate
    return outcomes
