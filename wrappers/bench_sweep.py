"""bench_sweep.py: benchmark a whole grid of bench_train.py runs, on this machine or across a Ray cluster.

    python wrappers/bench_sweep.py SWEEP.yaml --output_dir DIR [--executor local|ray] ...   # --help: every flag

Each point (one combination of axis values) runs as its own process tree; its outcome is appended to
``DIR/sweep_state.jsonl`` the moment it ends, so that a rerun runs only what is missing. Docs: docs/sweeps.md.
"""

import contextlib
import ctypes
import fcntl
import functools
import glob
import hashlib
import importlib.util
import itertools
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fire
import psutil
import yaml
from tqdm import tqdm

from tuning.benchmarking import report
from tuning.benchmarking.configuration import file_sha256
from tuning.benchmarking.paths import LOG_SUFFIX, RunPaths
from tuning.utils.cli_flags import reject_unknown_flags
from tuning.utils.error_logging import TERMINATION_LOG_ENV

BENCH_TRAIN = Path(__file__).resolve().with_name("bench_train.py")
SPEC_KEYS = ("base", "axes", "metadata")
REPEATS_KEY = "repeats"  # optional: every point runs this many times, metadata "repeat" 0, 1, ... telling them apart
SWEEP_OWNED_FLAGS = ("output_dir", "metrics_path", "metadata")  # set per point by the sweep
BATCH_SIZE_AXIS = "per_device_train_batch_size"
PREDICTED_OOM = "predicted_oom"  # a point whose memory estimate exceeds the device budget: never started
OOM_CATEGORIES = ("gpu_oom", "host_oom", PREDICTED_OOM)
TRANSIENT_CATEGORIES = ("communication", "device_error")
STOP_GRACE_SECONDS = 30.0  # after a SIGTERM (timeout, Ctrl-C) a point gets this long to write its dump
POLL_SECONDS = 0.5
# tuning.utils.error_logging's marker line: its category, and its type= part (exception type and message).
ERROR_MARKER = re.compile(r"^TUNING_ERROR category=(?P<category>\w+) .*?type=(?P<message>.*)$", re.M)
ATTEMPT_HEADER = "\n=== bench_sweep: "  # starts each attempt's part of a point's log
SLUG_MAX = 120  # of a point id's readable part; file names may have 255 bytes
PR_SET_PDEATHSIG = 1
SCRATCH_PREFIX = "bench-sweep-"  # a Ray point's directory in its node's temp dir


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

    @property
    def label(self) -> str:
        return " ".join(f"{axis}={_short(value)}" for axis, value in self.axes.items())


def _short(value: Any) -> str:
    """A value as a label: paths by their last part."""
    text = json.dumps(value) if isinstance(value, dict | list) else str(value)
    return os.path.basename(text.rstrip("/")) or text


def _hash(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:8]


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
    if not axes:
        yield "axes is empty; give at least one flag with a list of values"
    for axis, values in axes.items():
        if not isinstance(values, list) or not values:
            yield f"axis {axis} must be a non-empty list of values"
        if len({json.dumps(value, sort_keys=True, default=str) for value in values}) != len(values):
            yield f"axis {axis} repeats a value"
    for key in SWEEP_OWNED_FLAGS:
        if key in base or key in axes:
            yield f"{key} is set by the sweep for each point; remove it"
    for nproc in [base.get("nproc_per_node", 1), *axes.get("nproc_per_node", [])]:
        if not is_count(nproc, 1):
            yield f"nproc_per_node must be a positive integer, got {nproc!r}"


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
    ``repeats`` N > 1, each N times, its metadata's ``repeat`` (0 to N-1) in its id too: in a row, or with
    ``interleave`` in rounds (every combination once, then every one again), so that a drift of the machine's speed
    falls on all of them alike."""
    points = []
    repeats = spec[REPEATS_KEY]
    for values in itertools.product(*spec["axes"].values()):
        axes = dict(zip(spec["axes"], values, strict=True))
        flags = {**spec["base"], **axes}
        nproc = flags.pop("nproc_per_node", 1)
        for repeat in range(repeats):
            tells_apart = {"repeat": repeat} if repeats > 1 else {}
            metadata = {**spec["metadata"], **axes, **tells_apart}
            runs_with = {"flags": flags, "nproc": nproc, "metadata": metadata}
            if data_config := flags.get("data_config_path"):  # an edited data config is other work: run it again
                runs_with["data_config_sha256"] = file_sha256(str(data_config))
            config = _hash(runs_with)
            flags_of_point = {**flags, "metadata": json.dumps(metadata)}
            points.append(Point(point_id({**axes, **tells_apart}), axes, flags_of_point, nproc, config, repeat))
    return sorted(points, key=lambda point: point.repeat) if interleave else points  # sorted() keeps ties' order


def flag_tokens(flags: dict[str, Any]) -> list[str]:
    """A mapping of flags as command-line tokens: ``null`` → a bare flag, a list → its items, a mapping → JSON."""
    tokens = []
    for key, value in flags.items():
        values = value if isinstance(value, list) else [] if value is None else [value]
        tokens += [f"--{key}", *(json.dumps(item) if isinstance(item, dict) else str(item) for item in values)]
    return tokens


def load_bench_train(bench_train: Path = BENCH_TRAIN) -> Any:
    """bench_train's module, for its parser."""
    module_spec = importlib.util.spec_from_file_location("bench_sweep_point_flags", bench_train)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def predicted_ooms(points: list[Point], device_memory_gb: float | None) -> dict[str, dict[str, Any]]:
    """Each point's predicted peak memory per device (``tuning.benchmarking.memory``, config only, on its
    nproc_per_node devices), before any point starts; those above ``device_memory_gb`` (default: the visible GPU's
    memory; without a budget, on a CPU, nothing is estimated) get ``predicted_oom`` and are never started. Returns
    point id → its state line's outcome, for the points predicted not to fit."""
    from tuning.benchmarking import memory

    budget = memory.gib_to_bytes(device_memory_gb) if device_memory_gb else memory.visible_device_memory()
    if budget is None:
        return {}
    module, outcomes = load_bench_train(), {}
    for point in points:
        flags = {**point.flags, "output_dir": "point", "metrics_path": "point.json"}
        flags.pop("metadata")
        _, args = module.benchmarking.parse_command_line(module.BenchmarkFlags, flag_tokens(flags))
        estimate = memory.estimate_memory(args, devices=point.nproc)
        print(f"{point.label}: {memory.format_estimate(estimate).splitlines()[0]}", file=sys.stderr)
        if memory.fits(estimate, budget) is False:
            reason = f"predicted {estimate['peak_bytes_per_device'] / 2**30:.2f} GiB per device > {budget / 2**30:.2f}"
            outcomes[point.id] = {"status": PREDICTED_OOM, "category": PREDICTED_OOM, "reason": reason}
            outcomes[point.id]["estimate"] = estimate
    return outcomes


def check_point_flags(points: list[Point], bench_train: Path = BENCH_TRAIN) -> None:
    """Every point's flags as ``bench_train``'s own parser reads them (unknown flags, values of the wrong type, what
    the trainer refuses), before the first point runs: one bad axis value ends the sweep in seconds, naming the point
    and the flag, not after the points before it ran. Parsing only: files are checked by each point where it runs (a
    Ray node's paths need not be the driver's)."""
    module = load_bench_train(bench_train)
    checked = set()
    for point in points:
        flags = {**point.flags, "output_dir": "point", "metrics_path": "point.json"}
        flags.pop("metadata")  # a point's labels, read by bench_train as a JSON string: the same for the parser
        if (key := json.dumps(flags, sort_keys=True, default=str)) in checked:
            continue
        checked.add(key)
        try:
            module.benchmarking.parse_command_line(module.BenchmarkFlags, flag_tokens(flags))
        except ValueError as exc:  # the trainer's UserInputError
            raise SystemExit(f"point {point.label}: {exc}") from None


def die_with_parent() -> Callable[[], Any] | None:
    """What the child runs before exec (Linux): SIGTERM when the process that started it dies (a SIGKILLed driver
    or Ray worker), so that no point outlives its sweep. prctl is looked up in the parent: the child only calls it."""
    if sys.platform != "linux":
        return None
    return functools.partial(ctypes.CDLL(None, use_errno=True).prctl, PR_SET_PDEATHSIG, signal.SIGTERM)


class PointProcess:
    """A point's process tree in a session of its own: output_dir ``stem``, dump ``stem.json``, output appended to
    ``stem.log``. bench_train.py, under ``tuning.launch`` (torchrun with the root cause's exit code; ``--standalone``
    picks a free port on the machine that runs it) when it has several processes. Stopped with SIGTERM to its root
    (which bench_train and tuning.launch handle gracefully), then SIGKILL to every process of its tree."""

    def __init__(
        self, flags: dict[str, Any], nproc: int, stem: str, bench_train: str, timeout: float | None, **popen: Any
    ):
        launcher = [sys.executable]
        if nproc > 1:
            launcher += ["-m", "tuning.launch", "--standalone", "--nproc_per_node", str(nproc)]
        paths = RunPaths.from_stem(stem)
        # A stopped point starts again from scratch (docs/sweeps.md): a checkpoint at its stop would only cost time.
        flags = {"save_on_preemption": False, **flags, "output_dir": stem, "metrics_path": paths.dump}
        # The termination log names the root cause as the launcher saw it: a rank SIGKILLed leaves no report.
        env = {**(popen.pop("env", None) or os.environ), TERMINATION_LOG_ENV: paths.termination_log}
        with open(paths.log, "ab") as log:
            self.process = subprocess.Popen(
                [*launcher, bench_train, *flag_tokens(flags)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent(),
                env=env,
                **popen,
            )
        self.deadline = time.monotonic() + timeout if timeout else math.inf
        self.kill_at = math.inf  # once stopped: the end of its grace
        self.timed_out = False

    def poll(self) -> int | None:
        """The exit status once the point has ended; also enforces the timeout and the grace after a stop."""
        if (code := self.process.poll()) is not None:
            return code
        if time.monotonic() > self.deadline and self.kill_at == math.inf:
            self.timed_out = True
            self.stop()
        if time.monotonic() > self.kill_at:
            with contextlib.suppress(psutil.NoSuchProcess):  # every process of its tree, the root last
                root = psutil.Process(self.process.pid)
                for process in [*root.children(recursive=True), root]:
                    with contextlib.suppress(psutil.NoSuchProcess):
                        process.kill()
        return None

    def stop(self) -> None:
        if self.kill_at == math.inf:
            self.kill_at = time.monotonic() + STOP_GRACE_SECONDS
            self.process.send_signal(signal.SIGTERM)  # a no-op once it has ended

    def wait(self) -> int:
        while (code := self.poll()) is None:
            time.sleep(POLL_SECONDS)
        return code


def remove_abandoned_scratch() -> None:
    """The scratch directories on this node that nothing holds any more: a SIGKILLed driver takes its local Ray
    instance and the task's worker with it, and the point then stops and ends, leaving its directory. Each directory
    is locked (flock on the directory itself) by its task and, inherited, its point: a free lock means both ended."""
    for path in glob.glob(os.path.join(glob.escape(tempfile.gettempdir()), SCRATCH_PREFIX + "*")):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:  # removed meanwhile, or not a directory
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            shutil.rmtree(path, ignore_errors=True)
        except BlockingIOError:  # its task or point still runs
            pass
        finally:
            os.close(fd)


def run_point_on_node(
    flags: dict[str, Any], nproc: int, name: str, bench_train: str, cwd: str, timeout: float | None
) -> dict[str, Any]:
    """A Ray task's body: the point in a scratch directory of the node that runs it; returns how it ended (as
    ``LocalExecutor.wait`` does) and the files the driver keeps (dump, rank reports, the journal when there is no
    dump, the log) as bytes by their names in the sweep directory. Plain arguments, not a ``Point``: nothing of
    this script has to be importable on the node."""
    bench_train = os.path.abspath(bench_train)  # a shipped working_dir's copy: the task starts in it
    remove_abandoned_scratch()
    scratch = tempfile.mkdtemp(prefix=SCRATCH_PREFIX)
    lock_fd = os.open(scratch, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(lock_fd, fcntl.LOCK_EX)
    try:
        stem = os.path.join(scratch, name)
        popen = {"cwd": cwd if os.path.isdir(cwd) else scratch, "pass_fds": (lock_fd,)}
        process = PointProcess(flags, nproc, stem, bench_train, timeout, **popen)
        try:
            exit_code = process.wait()
        except BaseException:  # cancelled (the driver stopped or died): the point goes with the task
            process.stop()
            process.wait()
            raise
        paths = RunPaths.from_stem(stem)
        names = [paths.dump, *paths.rank_reports(), paths.termination_log, paths.log]
        if not os.path.exists(paths.dump):
            names.append(paths.journal())
        files = {os.path.basename(name): Path(name).read_bytes() for name in names if os.path.isfile(name)}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        os.close(lock_fd)
    return {"exit_code": exit_code, "timed_out": process.timed_out, "host": socket.gethostname(), "files": files}


def check_gpus(points: list[Point], gpus: int, where: str) -> None:
    """With GPUs, a point that needs more than ``gpus`` (the most one machine has) is an error before anything runs."""
    if too_big := next((point for point in points if gpus and point.nproc > gpus), None):
        raise SystemExit(f"point {too_big.label} needs {too_big.nproc} GPUs; {where}")


class LocalExecutor:
    """Points as process trees of this machine. With GPUs (``CUDA_VISIBLE_DEVICES``, else ``nvidia-smi``) each point
    gets ``nproc_per_node`` devices of its own; on CPU one point runs at a time unless ``concurrency`` says more."""

    def __init__(self, sweep: "Sweep", concurrency: int | None):
        self.sweep = sweep
        self.devices = visible_gpus()
        self.free_devices = list(self.devices)
        self.concurrency = concurrency or len(self.devices) or 1
        self.running: list[tuple[Point, PointProcess, list[str]]] = []  # and the devices it was given
        check_gpus(sweep.points, len(self.devices), f"this machine has {len(self.devices)} ({','.join(self.devices)})")

    def can_start(self, point: Point) -> bool:
        return len(self.running) < self.concurrency and (not self.devices or point.nproc <= len(self.free_devices))

    def start(self, point: Point) -> None:
        devices = self.free_devices[: point.nproc]
        del self.free_devices[: point.nproc]
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(devices)} if devices else None
        stem, timeout = str(self.sweep.path(point, "")), self.sweep.point_timeout
        popen = {"env": env, "pass_fds": (self.sweep.lock_fd,)}
        process = PointProcess(point.flags, point.nproc, stem, str(BENCH_TRAIN), timeout, **popen)
        self.running.append((point, process, devices))

    def wait(self) -> list[tuple[Point, dict[str, Any]]]:
        """The points that ended since the last call, each with its ``exit_code``, ``timed_out`` and ``host``."""
        ended = []
        for point, process, devices in list(self.running):
            if (code := process.poll()) is not None:
                self.running.remove((point, process, devices))
                self.free_devices += devices
                ended.append((point, {"exit_code": code, "timed_out": process.timed_out, "host": socket.gethostname()}))
        if not ended:
            time.sleep(POLL_SECONDS)
        return ended

    def stop(self) -> list[tuple[Point, dict[str, Any]]]:
        """Every running point stopped and waited for (each writes its dump); none is recorded as finished."""
        for _, process, _ in self.running:
            process.stop()
        for _, process, _ in self.running:
            process.wait()
        self.running.clear()
        return []


def visible_gpus() -> list[str]:
    """This machine's GPUs as ``CUDA_VISIBLE_DEVICES`` entries (no torch import: the driver stays light)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [device for device in visible.split(",") if device.strip() not in ("", "-1")]
    try:
        query = ["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"]
        listing = subprocess.run(query, capture_output=True, text=True, timeout=60, check=True)
    except (OSError, subprocess.SubprocessError):  # no nvidia-smi, or no driver behind it
        return []
    return [line.strip() for line in listing.stdout.splitlines() if line.strip()]


class RayExecutor:
    """Points as Ray tasks, each requesting ``nproc_per_node`` GPUs and as many CPUs (on a cluster without GPUs,
    one point per node unless ``concurrency`` says otherwise); the task runs the point on its node and hands back
    its files, which the driver writes under the sweep directory, so no filesystem is shared. ``ray`` is imported
    only here; a local instance stops when the driver exits."""

    def __init__(
        self,
        sweep: "Sweep",
        concurrency: int | None,
        address: str | None,
        num_cpus: int | None,
        runtime_env: str | dict | None,
    ):
        try:
            import ray
        except ImportError as exc:
            raise SystemExit("--executor ray needs Ray: pip install 'tuning-bench[ray]'") from exc
        self.ray, self.sweep, self.concurrency = ray, sweep, concurrency
        try:  # fire hands a JSON object over already parsed, unless it holds true, false or null
            runtime_env = json.loads(runtime_env) if isinstance(runtime_env, str) else runtime_env or {}
        except json.JSONDecodeError as exc:
            raise SystemExit(f"--ray_runtime_env is not valid JSON: {exc}") from exc
        options = {"runtime_env": runtime_env or None, "log_to_driver": False, "include_dashboard": False}
        ray.init(address, num_cpus=num_cpus if address is None else None, **options)
        # A runtime_env working_dir ships this checkout to every node: bench_train is then found relative to it.
        shipped = "working_dir" in runtime_env
        self.bench_train = str(BENCH_TRAIN.relative_to(BENCH_TRAIN.parents[1])) if shipped else str(BENCH_TRAIN)
        nodes = [node for node in ray.nodes() if node["Alive"]]
        self.gpus = max((node["Resources"].get("GPU", 0) for node in nodes), default=0)
        if self.concurrency is None and not self.gpus:  # benchmarks sharing a node's CPUs would measure each other
            self.concurrency = len(nodes)
        self.remote = ray.remote(max_retries=0)(run_point_on_node)
        self.running: dict[Any, Point] = {}
        check_gpus(sweep.points, self.gpus, f"the largest node has {self.gpus}")

    def can_start(self, point: Point) -> bool:
        return self.concurrency is None or len(self.running) < self.concurrency

    def start(self, point: Point) -> None:
        placement = {"num_gpus": point.nproc} if self.gpus else {"num_gpus": 0, "scheduling_strategy": "SPREAD"}
        task = self.remote.options(num_cpus=point.nproc, name=f"bench_sweep {point.id}", **placement)
        ref = task.remote(point.flags, point.nproc, point.id, self.bench_train, os.getcwd(), self.sweep.point_timeout)
        self.running[ref] = point

    def wait(self) -> list[tuple[Point, dict[str, Any]]]:
        """Every point that ended within the poll interval (all of them: one stop signal later, none is lost)."""
        done, _ = self.ray.wait(list(self.running), num_returns=len(self.running), timeout=POLL_SECONDS)
        ended = []
        for ref in done:
            point = self.running.pop(ref)
            try:
                result = self.ray.get(ref)
            except self.ray.exceptions.RayError as exc:  # the task's worker or node died
                failure = f"Ray task failed: {' '.join(str(exc).split())[:2000]}\n".encode()
                files = {RunPaths.from_stem(point.id).log: failure}
                result = dict(exit_code=-signal.SIGKILL, timed_out=False, host="?", files=files)
            self.sweep.store_files(result["files"])
            ended.append((point, result))
        return ended

    def stop(self) -> list[tuple[Point, dict[str, Any]]]:
        """Every running task cancelled (its point stopped, its scratch directory removed) and waited for; the points
        that finished before the cancel reached them, to be recorded."""
        for ref in self.running:
            self.ray.cancel(ref)
        with contextlib.suppress(Exception):
            self.ray.wait(list(self.running), num_returns=len(self.running), timeout=STOP_GRACE_SECONDS + 5)
        ended = []
        for ref, point in self.running.items():
            with contextlib.suppress(self.ray.exceptions.RayError):  # cancelled, or still stopping: left for a rerun
                result = self.ray.get(ref, timeout=0)
                self.sweep.store_files(result["files"])
                ended.append((point, result))
        self.running.clear()
        return ended


class Sweep:
    def __init__(self, points: list[Point], output_dir: Path, retries: int, point_timeout: float | None):
        self.points, self.dir, self.retries, self.point_timeout = points, output_dir, retries, point_timeout
        self.state_path = output_dir / report.SWEEP_STATE
        self.lock_fd = -1
        self.interrupted_by: int | None = None

    def run_paths(self, point: Point) -> RunPaths:
        """The files of the point's run (its dump, log, journal, reports...)."""
        return RunPaths.from_stem(str(self.path(point, "")))

    def path(self, point: Point, suffix: str = ".json") -> Path:
        """A file of the point: its dump, ``.log`` its output, ``""`` its output_dir."""
        return self.dir / "points" / f"{point.id}{suffix}"

    def finished(self, rerun_failed: bool) -> dict[str, dict[str, Any]]:
        """The state lines that count for the current grid: same config; with ``rerun_failed`` only successes."""
        state = report.read_sweep_state(self.state_path) if self.state_path.exists() else {}
        return {
            point.id: line
            for point in self.points
            if (line := state.get(point.id)) is not None
            and line.get("config") == point.config
            and (not rerun_failed or line["status"] in report.DONE_STATUSES)
        }

    def record(self, point: Point, **outcome: Any) -> dict[str, Any]:
        """One line per finished point, flushed to disk before anything else happens."""
        line = {
            "point": point.id,
            "axes": point.axes,
            "metrics_path": f"points/{point.id}.json",
            "config": point.config,
            **outcome,
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        with self.state_path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(line) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        return line

    def clear(self, point: Point) -> None:
        """An earlier attempt's files gone (the log stays, appended to), so that what is read next is this one's."""
        for name in glob.glob(glob.escape(str(self.path(point, ""))) + ".*"):
            if not name.endswith(LOG_SUFFIX):
                os.remove(name)
        shutil.rmtree(self.path(point, ""), ignore_errors=True)

    def store_files(self, files: dict[str, bytes]) -> None:
        """Files of the points by name, a log appended to; a torn one is cleared before a rerun."""
        for name, data in files.items():
            with (self.dir / "points" / name).open("ab" if name.endswith(LOG_SUFFIX) else "wb") as handle:
                handle.write(data)

    def outcome(self, point: Point, ended: dict[str, Any]) -> dict[str, Any]:
        """Status and category from the point's files (the root cause across ranks: they name the category and
        rank), else from the TUNING_ERROR line of this attempt's part of its log (category, and its message as the
        reason), else from its exit code (and the log's last line as the reason)."""
        runs, exit_code = report.load(report.run_files(Path(self.run_paths(point).dump))), ended["exit_code"]
        status = runs[0].status if runs else "killed" if exit_code < 0 else "error"
        cause = runs[0].root_cause if runs else None
        category, reason = (cause.category, cause.message) if cause else (None, None)
        if category is None and exit_code != 0:
            attempt_log = Path(self.run_paths(point).log).read_text(errors="replace").rpartition(ATTEMPT_HEADER)[2]
            if markers := list(ERROR_MARKER.finditer(attempt_log)):
                status, category = "error", markers[-1]["category"]
                reason = markers[-1]["message"].strip()
            elif reason is None and exit_code > 0:  # it ended before it could report: its last words are all there is
                last_line = attempt_log.strip().rsplit("\n", 1)[-1].rsplit("\r", 1)[-1]
                reason = f"exited {exit_code} without an error report; its log ends: {last_line}"
        if ended["timed_out"]:
            status, reason = "timeout", f"ran past --point_timeout {self.point_timeout:g}s"
        elif status in report.DONE_STATUSES and exit_code != 0:
            status, reason = "error", f"exited {exit_code} after its dump said {status}"
        return {"status": status, "category": category, "exit_code": exit_code, "reason": reason}

    def run(
        self, executor: "LocalExecutor | RayExecutor", rerun_failed: bool, predicted: dict[str, dict] | None = None
    ) -> None:
        """Every point not finished yet, each once its smaller batch sizes have finished; a point in ``predicted``
        (``predicted_ooms``) ends with its outcome there, unstarted. Progress: a bar on stderr of points done /
        failed / skipped, labelled with the latest start."""
        predicted = predicted or {}
        finished = self.finished(rerun_failed)
        pending = [point for point in self.points if point.id not in finished]
        smaller = {point.id: smaller_batch_sizes(point, self.points) for point in pending}
        attempts = dict.fromkeys(smaller, 0)
        counts = dict.fromkeys(("done", "failed", "skipped"), 0)

        def finish(line: dict[str, Any]) -> None:
            finished[line["point"]] = line
            status = line["status"]
            done = status in report.DONE_STATUSES
            counts["done" if done else "skipped" if status in ("skipped", PREDICTED_OOM) else "failed"] += 1
            bar.set_postfix(counts, refresh=False)
            bar.update(1)

        with tqdm(total=len(self.points), unit="point", dynamic_ncols=True, file=sys.stderr) as bar:
            for line in list(finished.values()):
                finish(line)
            while pending or executor.running:
                if self.interrupted_by is not None:
                    bar.set_description_str("stopping: waiting for the running points")
                    for point, ended in executor.stop():
                        finish(
                            self.record(
                                point, **self.outcome(point, ended), attempts=attempts[point.id], host=ended["host"]
                            )
                        )
                    break
                for point in list(pending):
                    if None in (below := [finished.get(other.id) for other in smaller[point.id]]):
                        continue
                    ooms = [line for line in below if line.get("category") in OOM_CATEGORIES]
                    if not ooms and not executor.can_start(point):
                        continue
                    pending.remove(point)
                    self.clear(point)
                    if ooms:
                        oom = min(ooms, key=lambda line: line["axes"][BATCH_SIZE_AXIS])
                        reason = f"oom at {BATCH_SIZE_AXIS}={oom['axes'][BATCH_SIZE_AXIS]} ({oom['category']})"
                        finish(self.record(point, status="skipped", category=None, reason=reason, attempts=0))
                        continue
                    if point.id in predicted:
                        finish(self.record(point, **predicted[point.id], attempts=0))
                        continue
                    attempts[point.id] += 1
                    header = f"{ATTEMPT_HEADER}{point.label}, attempt {attempts[point.id]} ===\n"
                    self.store_files({RunPaths.from_stem(point.id).log: header.encode()})
                    executor.start(point)
                    bar.set_description_str(point.label[:60])
                for point, ended in executor.wait():
                    outcome = self.outcome(point, ended)
                    transient = outcome["status"] == "error" and outcome["category"] in TRANSIENT_CATEGORIES
                    if transient and attempts[point.id] <= self.retries:
                        pending.insert(0, point)
                    else:
                        finish(self.record(point, **outcome, attempts=attempts[point.id], host=ended["host"]))

    def on_signal(self, signum: int, _frame: Any) -> None:
        self.interrupted_by = signum

    def handle_stop_signals(self) -> None:
        """SIGINT and SIGTERM stop the sweep: running points stopped, finished ones recorded, exit 128+signal."""
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self.on_signal)

    def lock(self) -> None:
        """One driver per sweep directory. The points inherit the lock, so a rerun after a SIGKILLed driver waits
        until the points it left (stopping since their parent died) are gone before it touches their files."""
        self.lock_fd = os.open(self.dir / "sweep.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            waiting = "another driver of this sweep, or points of one that was killed, still running"
            print(f"waiting for {self.dir / 'sweep.lock'}: {waiting}", file=sys.stderr)
            fcntl.flock(self.lock_fd, fcntl.LOCK_EX)


def write_report(output_dir: Path, points: list[Point]) -> None:
    """bench_report over the sweep directory into DIR/report, the axes as columns; plots against the batch size
    (else the first numeric axis) when matplotlib is installed, a line per value of the next axis."""
    numeric = [axis for axis in points[0].axes if all(report.is_number(p.axes[axis]) for p in points)]
    x = BATCH_SIZE_AXIS if BATCH_SIZE_AXIS in numeric else next(iter(numeric), None)
    x = x if importlib.util.find_spec("matplotlib") else None
    group = next((axis for axis in points[0].axes if axis != x), None) if x else None
    for path in report.write_report([str(output_dir)], x=x, group=group, output_dir=str(output_dir / "report")):
        print(path)


def main(
    spec: str,
    output_dir: str,
    executor: str = "local",
    concurrency: int | None = None,
    retries: int = 1,
    rerun_failed: bool = False,
    point_timeout: float | None = None,
    dry_run: bool = False,
    report_only: bool = False,
    interleave: bool = False,
    ray_address: str | None = None,
    ray_num_cpus: int | None = None,
    ray_runtime_env: str | dict | None = None,
    predict_memory: bool = True,
    device_memory_gb: float | None = None,
) -> int:
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
        predict_memory: Estimate every point's peak memory per device first (from its model's config) and end
            the points above --device_memory_gb as predicted_oom without starting them; False: start every point.
        device_memory_gb: The memory budget per device for that; default: the visible GPU's (none on a CPU).
    """
    if executor not in ("local", "ray"):
        raise SystemExit(f"--executor {executor!r}: choose local or ray")
    for name, value, low in (("concurrency", concurrency, 1), ("retries", retries, 0)):
        if value is not None and not is_count(value, low):
            raise SystemExit(f"--{name} must be an integer >= {low}, got {value!r}")
    if point_timeout is not None and (not report.is_number(point_timeout) or point_timeout <= 0):
        raise SystemExit(f"--point_timeout must be a positive number of seconds, got {point_timeout!r}")
    points = grid(load_spec(str(spec)), bool(interleave))
    sweep_dir = Path(str(output_dir)).absolute()
    sweep = Sweep(points, sweep_dir, retries, point_timeout)
    if dry_run:
        finished = sweep.finished(rerun_failed)
        for point in points:
            state = finished.get(point.id, {}).get("status", "to run")
            processes = "" if "nproc_per_node" in point.axes else f"  nproc_per_node={point.nproc}"
            print(f"{point.label}{processes}  {sweep.path(point)}  [{state}]")
        print(f"{len(points)} points, {len(points) - len(finished)} to run")
        return 0
    if report_only:
        write_report(sweep_dir, points)
        return 0
    check_point_flags(points)
    (sweep_dir / "points").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(spec, sweep_dir / "sweep.yaml")
    sweep.lock()
    predicted = predicted_ooms(points, device_memory_gb) if predict_memory else {}  # every point estimated first
    sweep.handle_stop_signals()
    ray_options = (ray_address, ray_num_cpus, ray_runtime_env)
    runner = RayExecutor(sweep, concurrency, *ray_options) if executor == "ray" else LocalExecutor(sweep, concurrency)
    sweep.handle_stop_signals()  # again: ray.init() installs its own SIGTERM handler, which aborts the process
    # The bar's last line holds the counts of done, failed and skipped points.
    sweep.run(runner, rerun_failed, predicted)
    if (signum := sweep.interrupted_by) is not None:
        print(f"bench_sweep: stopped by signal {signum}; rerun the same command to finish", file=sys.stderr)
        return 128 + signum
    write_report(sweep_dir, points)
    return 0


if __name__ == "__main__":
    reject_unknown_flags(main)
    sys.exit(fire.Fire(main, name="bench_sweep.py", serialize=lambda _: None))
