"""wrappers/bench_sweep.py for real: grids of bench_train runs of the tiny model through the local executor and a
real local Ray instance (2 CPUs), a real SIGKILL of the driver, faults injected through bench_train's --callbacks
(tests/helpers/bench_callbacks.py), a local Aim repo queried by the points' axis metadata. Where a driver's command
line is not what a test proves, its recipe runs in this process (``sweep_here``); points are processes as always."""

import csv
import fcntl
import hashlib
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from tests.helpers.aim import existing_repo, read_runs
from tests.helpers.bench import markdown_rows, sweep_point_flags
from tests.helpers.training import (
    BENCH_CALLBACKS,
    REPO_ROOT,
    Job,
    load_script,
    run_python,
    subprocess_env,
    wait_until,
)
from tuning.benchmarking.sweep import ray_executor
from tuning.utils.tiny_model import SAMPLE_TRAIN_PATH

pytestmark = pytest.mark.slow  # subprocesses, servers, torchrun ranks: not in make test-fast

BENCH_SWEEP = REPO_ROOT / "wrappers" / "bench_sweep.py"
DATA = "data_config_path"
BATCH = "per_device_train_batch_size"
BATCHES = [1, 2]
POINTS = 2 * len(BATCHES)  # two data configs
TABLE_COLUMNS = ("run", DATA, BATCH, "status", "error_category", "training_steps")


def write_data_config(path: Path, *datasets: dict) -> str:
    path.write_text(yaml.safe_dump({"datasets": list(datasets)}))
    return str(path)


def without_training_data(flags: dict) -> dict:
    """``flags`` for a data config: the data is listed there, not in --training_data_path."""
    return {key: value for key, value in flags.items() if key != "training_data_path"}


def write_spec(path: Path, base: dict, axes: dict, metadata: dict | None = None) -> Path:
    path.write_text(yaml.safe_dump({"base": base, "axes": axes, "metadata": metadata or {"benchmark": "sweep-test"}}))
    return path


def sweep_command(spec: Path, out: Path, *flags: str) -> list[str]:
    """The driver's command line after ``python``."""
    return [str(BENCH_SWEEP), str(spec), "--output_dir", str(out), *flags]


def sweep(
    spec: Path, out: Path, *flags: str, timeout: float = 900, cwd: Path = REPO_ROOT, **env: str
) -> subprocess.CompletedProcess:
    return run_python(*sweep_command(spec, out, *flags), timeout=timeout, cwd=cwd, **env)


@pytest.fixture(scope="module")
def bench_sweep():
    """The script as a module, for sweeps whose driver runs in this process."""
    return load_script(BENCH_SWEEP)


def sweep_here(bench_sweep, monkeypatch, spec: Path, out: Path, env: dict[str, str] | None = None, **flags) -> int:
    """The sweep's recipe (bench_sweep's ``main``, ``flags`` as fire hands them over) in this process, with a child
    job's environment (``env`` added): only its points are processes, so the driver's imports are not paid again. The
    exit code; the sweep gives the stop signals and its lock back when it ends (test_sweep_state). The command line
    around ``main`` (fire, a driver killed or stopped by a signal) is proved by the sweeps run as commands:
    ``local_grid``'s first driver and the Ray sweeps."""
    for name, value in subprocess_env(**(env or {})).items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(REPO_ROOT)
    return bench_sweep.main(str(spec), str(out), **flags)


def state_lines(out: Path) -> list[dict]:
    path = out / "sweep_state.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def state_by_axes(out: Path, *axes: str) -> dict[tuple, dict]:
    return {tuple(line["axes"][axis] for axis in axes): line for line in state_lines(out)}


def report_rows(out: Path) -> list[dict[str, str]]:
    with (out / "report" / "report.csv").open(newline="") as handle:
        return list(csv.DictReader(handle))


def attempts_in_log(out: Path, line: dict) -> int:
    """How many times the sweep started the point: one header line per attempt in its log."""
    log = (out / line["metrics_path"]).with_suffix(".log")
    return log.read_text(errors="replace").count("=== bench_sweep: ")


@pytest.fixture(scope="module")
def local_grid(bench_sweep, tiny_model, tmp_path_factory) -> dict:
    """The 2x2 grid data_config_path (one dataset alone, a mix of two by sampling ratios) x batch size on the local
    executor (Aim on, --concurrency 2 with one visible device), its driver SIGKILLed once two points have finished,
    then the same flags again (the recipe in this process: the command line is the killed driver's)."""
    tmp = tmp_path_factory.mktemp("sweep-local")
    out, aim_repo = tmp / "sweep", existing_repo(tmp / "aim")
    more = tmp / "more.jsonl"
    more.write_text("".join(Path(SAMPLE_TRAIN_PATH).read_text().splitlines(keepends=True)[:32]))
    alone = write_data_config(tmp / "alone.yaml", {"name": "tweets", "data_paths": [SAMPLE_TRAIN_PATH]})
    mixed = [
        {"name": "tweets", "data_paths": [SAMPLE_TRAIN_PATH], "sampling": 0.7},
        {"name": "more", "data_paths": [str(more)], "sampling": 0.3},
    ]
    mix = write_data_config(tmp / "mix.yaml", *mixed)
    grid = {DATA: [alone, mix], BATCH: BATCHES}
    base = sweep_point_flags(
        tiny_model,
        trackers=["file_logger", "aim"],
        aim_repo=str(aim_repo),
        data_cache_dir=str(tmp / "data-cache"),  # the points of one data config share one processed-data entry
    )
    spec = write_spec(tmp / "sweep.yaml", without_training_data(base), grid)
    # One visible device and --concurrency 2: each point waits for the device instead of starting beside another
    # (this CPU machine's points ignore the device; what they show is when they ran).
    one_device = {"CUDA_VISIBLE_DEVICES": "0"}
    driver = Job(sweep_command(spec, out, "--concurrency", "2"), tmp / "driver-logs", **one_device)
    wait_until(lambda: len(state_lines(out)) >= 2, driver, "two finished points", timeout=600)
    driver.send_signal(signal.SIGKILL)
    driver.finish(timeout=60)
    before = state_lines(out)
    with pytest.MonkeyPatch.context() as patch:
        assert sweep_here(bench_sweep, patch, spec, out, one_device, concurrency=2) == 0
    return {
        "out": out,
        "aim": aim_repo,
        "spec": spec,
        "grid": grid,
        "mixed": mixed,
        "before": before,
        "data_cache": tmp / "data-cache",
    }


def test_a_grid_leaves_a_dump_a_report_row_and_an_aim_run_per_point(local_grid):
    """Each dump names its data config's datasets and ratios and the hash of its file; the points of one data config
    share one processed-data entry; the report tells the points apart by their axes; Aim finds them by metadata."""
    out, grid = local_grid["out"], local_grid["grid"]
    alone, mix = grid[DATA]
    expected = {alone: [("tweets", None)], mix: [("tweets", 0.7), ("more", 0.3)]}
    lines = state_by_axes(out, *grid)
    assert sorted(lines) == sorted((path, batch) for path in grid[DATA] for batch in BATCHES)
    dumps = {}
    for axes, line in lines.items():
        assert (line["status"], line["exit_code"]) == ("ok", 0), line
        dump = json.loads((out / line["metrics_path"]).read_text())
        assert dump["status"] == "ok" and dump["training_steps"] == 2
        assert datetime.fromisoformat(line["time"]) >= datetime.fromisoformat(dump["stop_time"])  # recorded after
        assert dump["metadata"] == {"benchmark": "sweep-test", **dict(zip(grid, axes, strict=True))}
        path = axes[0]
        assert dump["data"]["data_config_path"] == dump["config"]["data_config_path"] == path
        assert [(d["name"], d["sampling"]) for d in dump["data"]["datasets"]] == expected[path]
        digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
        assert dump["data"]["data_config_sha256"] == dump["config"]["data_config_sha256"] == digest
        assert dump["data"]["cache"]["status"] in ("hit", "miss") and dump["summary"]["data_preparation_time"] > 0
        dumps[axes] = dump
    # One entry per data config, built by one point and read by the other (a rerun point reads it too).
    keys = {path: {dumps[path, batch]["data"]["cache"]["key"] for batch in BATCHES} for path in grid[DATA]}
    assert all(len(found) == 1 for found in keys.values()) and len({*keys[alone], *keys[mix]}) == 2
    assert sorted(meta.parent.name for meta in local_grid["data_cache"].glob("*/meta.json")) == sorted(
        {*keys[alone], *keys[mix]}
    )
    for path in grid[DATA]:
        statuses = [dumps[path, batch]["data"]["cache"]["status"] for batch in BATCHES]
        assert statuses.count("hit") >= len(statuses) - 1, statuses
    # One visible device: each point started once the one before had stopped.
    spans = sorted(
        (datetime.fromisoformat(d["start_time"]), datetime.fromisoformat(d["stop_time"])) for d in dumps.values()
    )
    assert all(later[0] >= earlier[1] for earlier, later in itertools.pairwise(spans))

    rows = report_rows(out)
    assert list(rows[0])[:4] == ["run", *grid, "status"]  # the axes are the report's label columns
    assert sorted((r[DATA], int(r[BATCH])) for r in rows) == sorted(lines)
    for r in rows:
        assert r["status"] == "ok" and float(r["tokens_per_second"]) > 0 and float(r["data_preparation_time_s"]) > 0
        assert r["run"] == lines[r[DATA], int(r[BATCH])]["point"]
    shown = markdown_rows((out / "report" / "report.md").read_text(), "Runs")
    assert [row["status"] for row in shown] == ["ok"] * POINTS

    for index, batch in enumerate(BATCHES):
        query = f"run.experiment_metadata.per_device_train_batch_size == {batch}"
        found = read_runs(local_grid["aim"], query, reindex=index == 0)  # the points have ended: one reindex will do
        by_hash = {run["hash"]: run for run in found}
        for path in grid[DATA]:
            run = by_hash[dumps[path, batch]["run_hash"]]
            assert run["params"]["data"]["data_config_path"] == path  # the data is searchable
        for run in found:
            assert run["params"]["experiment_metadata"]["per_device_train_batch_size"] == batch


def test_a_rerun_after_a_sigkilled_driver_runs_only_the_missing_points(local_grid):
    """The points finished before the kill stay as they were, the rest run once by the rerun; then nothing is left to
    run, until a data config is edited (the same path, other work): its points are ones to run again."""
    out, before = local_grid["out"], local_grid["before"]
    lines = state_lines(out)
    assert 2 <= len(before) < POINTS  # the kill came mid-sweep
    assert lines[: len(before)] == before  # what was finished stays as it was
    assert len(lines) == POINTS and len({line["point"] for line in lines}) == POINTS  # the others once, by the rerun
    for line in before:
        assert attempts_in_log(out, line) == 1, line["point"]
    for line in lines:  # a point the kill interrupted ran again: its attempts are numbered on across the drivers
        log = (out / line["metrics_path"]).with_suffix(".log").read_text(errors="replace")
        numbers = [int(number) for number in re.findall(r"=== bench_sweep: .*, attempt (\d+) ===", log)]
        assert numbers == list(range(1, len(numbers) + 1)), (line["point"], numbers)
    again = sweep(local_grid["spec"], out, "--dry_run")
    assert again.returncode == 0 and again.stdout.strip().endswith(f"{POINTS} points, 0 to run"), again.stdout

    mix = Path(local_grid["grid"][DATA][1])
    original = mix.read_text()
    edited = [{**dataset, "sampling": 0.5} for dataset in local_grid["mixed"]]
    write_data_config(mix, *edited)
    try:
        again = sweep(local_grid["spec"], out, "--dry_run", timeout=60)
    finally:
        mix.write_text(original)  # the other tests read the dumps of the file as it was
    assert again.returncode == 0 and again.stdout.strip().endswith(f"{POINTS} points, 2 to run"), again.stdout


def test_the_ray_executor_gives_the_same_table_one_point_at_a_time_from_a_shipped_working_dir(
    local_grid, tiny_model, tmp_path
):
    """The grid's first row (its first data config, every batch size) on a real local Ray instance, its driver
    outside the checkout it ships (the task finds bench_train.py in the shipped copy): the same rows as the local
    executor's for those points; on a 2-CPU node without GPUs and without --concurrency, one point at a time (each
    starts once the one before has stopped)."""
    first = local_grid["grid"][DATA][0]
    row = {DATA: [first], BATCH: BATCHES}
    spec = write_spec(tmp_path / "sweep.yaml", without_training_data(sweep_point_flags(tiny_model)), row)
    runtime_env = json.dumps({"working_dir": str(REPO_ROOT), "excludes": [".git"]})
    flags = ("--executor", "ray", "--ray_num_cpus", "2", "--ray_runtime_env", runtime_env)
    result = sweep(spec, tmp_path / "sweep", *flags, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    local_rows = [r for r in report_rows(local_grid["out"]) if r[DATA] == first]
    local = [tuple(r[c] for c in TABLE_COLUMNS) for r in local_rows]
    remote = [tuple(r[c] for c in TABLE_COLUMNS) for r in report_rows(tmp_path / "sweep")]
    assert len(remote) == len(BATCHES) >= 2 and remote == local
    points = tmp_path / "sweep" / "points"
    assert len(list(points.glob("*.json"))) == len(remote)  # the dumps, written by the driver from the tasks' returns
    assert not list(points.glob("*/"))  # the points' output dirs stayed on the node (scratch, removed)
    dumps = [json.loads((tmp_path / "sweep" / line["metrics_path"]).read_text()) for line in state_lines(points.parent)]
    spans = sorted((datetime.fromisoformat(d["start_time"]), datetime.fromisoformat(d["stop_time"])) for d in dumps)
    assert all(later[0] >= earlier[1] for earlier, later in itertools.pairwise(spans))


def processes_with_env(entry: str) -> list[int]:
    """The pids of the processes whose environment holds ``entry`` (``NAME=value``)."""
    pids = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if entry.encode() in environ.read_bytes().split(b"\0"):
                pids.append(int(environ.parent.name))
        except (OSError, ValueError):
            continue  # ended while we looked, or not ours to read
    return pids


def test_a_ray_sweep_stopped_by_sigterm_records_finished_points_and_leaves_nothing_behind(tiny_model, tmp_path):
    """A driver SIGTERMed mid-point, on a real local Ray instance with its own temp dir (short: Ray's sockets live
    there): exit 143, the finished point recorded once, and neither the Ray processes nor the point's scratch
    directory outlive it. (What a SIGKILLed driver leaves, its point's scratch directory, the next point on the node
    removes: test_scratch_directories_nothing_holds_are_removed_by_the_next_point.)"""
    temp = Path(tempfile.mkdtemp(prefix="bs", dir="/tmp"))
    try:
        base = sweep_point_flags(tiny_model, callbacks=f"{BENCH_CALLBACKS}:SlowSteps")
        spec = write_spec(tmp_path / "sweep.yaml", base, {"max_steps": [2, 1000]})
        out, tmpdir = tmp_path / "sweep", f"TMPDIR={temp}"
        command = sweep_command(spec, out, "--executor", "ray", "--ray_num_cpus", "2")

        def slow_point_running() -> bool:  # past a step
            journals = temp.glob("bench-sweep-*/max_steps-1000-*.journal.jsonl")
            return any(path.stat().st_size for path in journals)

        driver = Job(command, log_dir=tmp_path / "driver", TMPDIR=str(temp))
        wait_until(lambda: len(state_lines(out)) == 1 and slow_point_running(), driver, "a finished point", 300)
        driver.send_signal(signal.SIGTERM)
        stderr = driver.finish(timeout=120)
        # A stopped driver shuts its Ray instance down.
        wait_until(lambda: not processes_with_env(tmpdir), None, "no process left after SIGTERM", 30)
        assert driver.returncode == 128 + signal.SIGTERM, stderr[-3000:]
        assert "stopped by signal 15" in stderr
        assert [(line["axes"], line["status"]) for line in state_lines(out)] == [({"max_steps": 2}, "ok")]
        assert not list(temp.glob("bench-sweep-*"))
    finally:
        shutil.rmtree(temp, ignore_errors=True)


def test_scratch_directories_nothing_holds_are_removed_by_the_next_point(tmp_path, monkeypatch):
    """A SIGKILLed driver takes its Ray task with it and its point ends, leaving the point's scratch directory; the
    next point on the node removes every one whose lock nothing holds, and keeps those of points still running."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    abandoned, running = (tmp_path / f"{ray_executor.SCRATCH_PREFIX}{name}" for name in ("abandoned", "running"))
    for directory in (abandoned, running):
        directory.mkdir()
        (directory / "point.journal.jsonl").write_text("{}\n")
    held = os.open(running, os.O_RDONLY | os.O_DIRECTORY)  # as its task and point hold it
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
        ray_executor.remove_abandoned_scratch()
        assert not abandoned.exists() and (running / "point.journal.jsonl").exists()
    finally:
        os.close(held)


def test_a_point_that_dies_without_a_report_is_an_error_with_its_last_log_line(
    bench_sweep, monkeypatch, tiny_model, tmp_path
):
    spec = write_spec(
        tmp_path / "sweep.yaml", sweep_point_flags(tiny_model), {"callbacks": [f"{BENCH_CALLBACKS}:ExitsWithoutReport"]}
    )
    assert sweep_here(bench_sweep, monkeypatch, spec, tmp_path / "sweep") == 0
    (line,) = state_lines(tmp_path / "sweep")
    reason = "exited 3 without an error report; its log ends: fatal: the device went away (injected)"
    assert (line["status"], line["category"], line["reason"]) == ("error", None, reason)
    (row,) = report_rows(tmp_path / "sweep")
    assert (row["status"], row["error_message"]) == ("error", reason)


def test_oom_and_predicted_oom_skip_larger_batch_sizes_and_only_transient_failures_are_retried(
    bench_sweep, monkeypatch, tiny_model, tmp_path
):
    """One grid, each row its own story. With SweepFaults (stall_timeout 0: off): batch size 1 fails with a
    communication error, then passes on its retry; 2 runs out of memory; 64 and 128 are skipped after it, never
    started (their estimates, made before the sweep, unused). With stall_timeout -1, which bench_train's own check
    rejects before its dump exists (values the parser rejects are refused before any point runs): a user error at 1
    and 2, its TUNING_ERROR line's message as the reason, never retried, skipping nothing; so 64, estimated against
    --device_memory_gb 0.1 (predicted far above it), ends predicted_oom with its estimate, no process started (no
    log, no dump), and 128 is skipped as after an OOM. The points estimated below the budget (1, 2) started."""
    markers = tmp_path / "markers"
    markers.mkdir()
    axes = {"stall_timeout": [0, -1], "per_device_train_batch_size": [1, 2, 64, 128]}
    base = sweep_point_flags(
        tiny_model, max_seq_length=128, peft_method="lora", callbacks=f"{BENCH_CALLBACKS}:SweepFaults"
    )
    spec = write_spec(tmp_path / "sweep.yaml", base, axes)
    out = tmp_path / "sweep"
    flags = {"concurrency": 2, "retries": 1, "device_memory_gb": 0.1}
    assert sweep_here(bench_sweep, monkeypatch, spec, out, {"FAULT_MARKER_DIR": str(markers)}, **flags) == 0
    lines = state_by_axes(out, *axes)
    faults, refused = axes["stall_timeout"]
    outcome = {key: (line["status"], line["category"], line["attempts"]) for key, line in lines.items()}
    assert outcome == {
        (faults, 1): ("ok", None, 2),  # a communication error, then a clean second attempt
        (faults, 2): ("error", "gpu_oom", 1),
        (faults, 64): ("skipped", None, 0),
        (faults, 128): ("skipped", None, 0),
        (refused, 1): ("error", "user_error", 1),  # never retried
        (refused, 2): ("error", "user_error", 1),  # a user error skips nothing
        (refused, 64): ("predicted_oom", "predicted_oom", 0),
        (refused, 128): ("skipped", None, 0),
    }
    for batch in (64, 128):
        assert lines[faults, batch]["reason"] == "oom at per_device_train_batch_size=2 (gpu_oom)"
        assert not list((out / "points").glob(lines[faults, batch]["point"] + "*"))  # never started: a state line only
    assert attempts_in_log(out, lines[faults, 1]) == 2 and attempts_in_log(out, lines[refused, 1]) == 1
    for batch in (1, 2):
        assert lines[refused, batch]["reason"] == "UserInputError: --stall_timeout must not be negative, got -1.0"
        assert not (out / lines[refused, batch]["metrics_path"]).exists()  # failed before its dump
    predicted = lines[refused, 64]
    assert predicted["estimate"]["peak_bytes_per_device"] > 0.1 * 2**30
    assert predicted["reason"].startswith("predicted ") and predicted["reason"].endswith("GiB per device > 0.10")
    assert not (out / "points" / f"{predicted['point']}.log").exists()
    assert not (out / "points" / f"{predicted['point']}.json").exists()
    assert lines[refused, 128]["reason"] == "oom at per_device_train_batch_size=64 (predicted_oom)"

    rows = {(int(r["stall_timeout"]), int(r["per_device_train_batch_size"])): r for r in report_rows(out)}
    assert set(rows) == set(lines)
    skipped = rows[faults, 64]
    assert (skipped["status"], skipped["error_message"]) == ("skipped", lines[faults, 64]["reason"])
    assert (rows[faults, 2]["status"], rows[faults, 2]["error_category"]) == ("error", "gpu_oom")
    assert rows[refused, 1]["error_message"] == lines[refused, 1]["reason"]


def test_points_of_two_processes_are_judged_by_their_ranks_reports_and_an_oom_of_either_kind_skips_larger_batches(
    bench_sweep, monkeypatch, tiny_model, tmp_path
):
    """Run under tuning.launch, with every level of available memory counting as low (100 %). Rank 1 out of GPU
    memory: the point exits with its root cause's code, and the category (gpu_oom, not host_oom: its report says
    what happened) and rank come from rank 1's report. Rank 1 SIGKILLed: without a report of its own, the launcher
    names the kill host_oom, the root cause over rank 0's lost peer (a communication error, which the sweep would
    retry as transient: the point ran once). Either skips the larger batch size."""
    oom, kill = f"{BENCH_CALLBACKS}:OutOfMemoryOnLastRank", f"{BENCH_CALLBACKS}:SigkillOnLastRankInStep3"
    axes = {"callbacks": [oom, kill], "per_device_train_batch_size": [1, 2]}
    base = sweep_point_flags(tiny_model, max_steps=3, nproc_per_node=2)
    out = tmp_path / "sweep"
    spec, low_memory = write_spec(tmp_path / "sweep.yaml", base, axes), {"TUNING_HOST_OOM_AVAILABLE_PERCENT": "100"}
    assert sweep_here(bench_sweep, monkeypatch, spec, out, low_memory) == 0
    lines = state_by_axes(out, *axes)
    assert (lines[oom, 1]["status"], lines[oom, 1]["category"], lines[oom, 1]["exit_code"]) == ("error", "gpu_oom", 204)
    assert (lines[oom, 2]["status"], lines[oom, 2]["reason"]) == (
        "skipped",
        "oom at per_device_train_batch_size=1 (gpu_oom)",
    )
    assert (lines[kill, 1]["status"], lines[kill, 1]["category"], lines[kill, 1]["exit_code"]) == (
        "error",
        "host_oom",
        205,
    )
    assert "killed by SIGKILL while memory ran out (the host's available memory fell to" in lines[kill, 1]["reason"]
    assert (lines[kill, 1]["attempts"], attempts_in_log(out, lines[kill, 1])) == (1, 1)  # --retries 1 by default
    assert (lines[kill, 2]["status"], lines[kill, 2]["reason"]) == (
        "skipped",
        "oom at per_device_train_batch_size=1 (host_oom)",
    )
    rows = {(r["callbacks"], r["per_device_train_batch_size"]): r for r in report_rows(out)}
    assert (rows[oom, "1"]["error_category"], rows[oom, "1"]["error_rank"]) == ("gpu_oom", "1")
    assert (rows[kill, "1"]["error_category"], rows[kill, "1"]["error_rank"], rows[kill, "1"]["failed_ranks"]) == (
        "host_oom",
        "1",
        "0 1",
    )


def test_a_point_past_its_timeout_is_stopped_and_recorded_as_timeout(bench_sweep, monkeypatch, tiny_model, tmp_path):
    base = sweep_point_flags(
        tiny_model, max_steps=1000, callbacks=f"{BENCH_CALLBACKS}:SlowSteps"
    )  # 300 s of steps at least
    out = tmp_path / "sweep"
    # Whether the point is still importing or already training when its time is up, it is stopped the same way.
    spec = write_spec(tmp_path / "sweep.yaml", base, {"max_seq_length": [64]})
    assert sweep_here(bench_sweep, monkeypatch, spec, out, point_timeout=3) == 0
    (line,) = state_lines(out)
    assert (line["status"], line["reason"], line["attempts"]) == ("timeout", "ran past --point_timeout 3s", 1)
    assert line["exit_code"] != 0
    (row,) = report_rows(out)
    assert (row["status"], row["error_message"]) == ("timeout", line["reason"])


@pytest.mark.parametrize(
    ("spec", "flags", "reason"),
    [
        ({"base": {"output_dir": "x"}, "axes": {"max_steps": [1]}}, [], "output_dir is set by the sweep"),
        ({"axes": {"max_steps": 3}}, [], "axis max_steps must be a non-empty list"),
        ({"axes": {"max_steps": [1, 1]}}, [], "axis max_steps repeats a value"),
        ({"axes": {}}, [], "axes is empty"),
        ({"axis": {"max_steps": [1]}}, [], "unknown key 'axis'"),
        ({"axes": {"nproc_per_node": [0]}}, [], "nproc_per_node must be a positive integer"),
        ({"axes": {"max_steps": [1]}, "repeats": 0}, [], "repeats must be a positive integer, got 0"),
        ({"axes": {"max_steps": [1]}}, ["--executor", "slurm"], "--executor 'slurm': choose local or ray"),
        ({"axes": {"max_steps": [1]}}, ["--retries=-1"], "--retries must be an integer >= 0"),
        (
            {"axes": {"max_steps": [1]}},
            ["--point_timout", "5"],
            "unknown flag --point_timout; did you mean --point_timeout?",
        ),
        ({"axes": {"max_steps": [1]}}, ["--dryrun"], "unknown flag --dryrun; did you mean --dry_run?"),
    ],
)
def test_bad_input_is_one_line_and_exit_1_before_anything_runs(tmp_path, spec, flags, reason):
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec))
    result = sweep(path, tmp_path / "sweep", *flags, timeout=60)
    assert result.returncode == 1
    assert reason in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "sweep").exists()


def test_repeats_run_every_point_that_many_times_told_apart_by_metadata(tmp_path):
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"axes": {"learning_rate": [0.1, 0.2]}, "metadata": {"b": 1}, "repeats": 3}))
    result = sweep(path, tmp_path / "sweep", "--dry_run", timeout=60)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[-1] == "6 points, 6 to run"
    assert [line.split("  ")[0] for line in lines[:3]] == ["learning_rate=0.1"] * 3
    assert len({line.split("  ")[2] for line in lines[:-1]}) == 6  # a dump path of its own each
    assert "learning_rate-0-1_repeat-2-" in lines[2]


def test_a_repeated_key_is_an_error_naming_it(tmp_path):
    path = tmp_path / "sweep.yaml"
    path.write_text("base:\n  callbacks: a:B\n  max_steps: 1\n  callbacks: c:D\naxes:\n  learning_rate: [0.1]\n")
    result = sweep(path, tmp_path / "sweep", timeout=60)
    assert result.returncode == 1
    assert result.stderr.strip().endswith(f"found repeated key 'callbacks' in \"{path}\", line 4, column 3")
    assert not (tmp_path / "sweep").exists()


def test_numbers_in_scientific_notation_are_numbers(tmp_path):
    path = tmp_path / "sweep.yaml"
    path.write_text("axes:\n  learning_rate: [1e-4, 2.5E+3, '1e-5']\n")
    result = sweep(path, tmp_path / "sweep", "--dry_run", timeout=60)
    assert result.returncode == 0, result.stderr
    labels = [line.split("  ")[0] for line in result.stdout.splitlines()[:-1]]
    assert labels == ["learning_rate=0.0001", "learning_rate=2500.0", "learning_rate=1e-5"]  # quoted: a string


def test_dry_run_lists_the_points_and_their_files(tmp_path):
    path = write_spec(tmp_path / "sweep.yaml", {"max_steps": 1}, {"learning_rate": [0.1, 0.2], "max_seq_length": [8]})
    result = sweep(path, tmp_path / "sweep", "--dry_run", timeout=60)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[-1] == "2 points, 2 to run"
    assert lines[0].startswith("learning_rate=0.1 max_seq_length=8  nproc_per_node=1  ")
    assert str(tmp_path / "sweep" / "points" / "learning_rate-0-1_max_seq_length-8-") in lines[0]
    assert not (tmp_path / "sweep").exists()


def test_interleave_runs_the_repeats_in_rounds(tmp_path):
    """Every point once, then each again: a drift of the machine's speed falls on both learning rates alike."""
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"axes": {"learning_rate": [0.1, 0.2]}, "repeats": 3}))
    result = sweep(path, tmp_path / "sweep", "--dry_run", "--interleave", timeout=60)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()[:-1]
    order = [(line.split("  ")[0], line.split("_repeat-")[1][0]) for line in lines]
    assert order == [(f"learning_rate={rate}", repeat) for repeat in "012" for rate in ("0.1", "0.2")]


@pytest.mark.parametrize(
    ("axes", "reason"),
    [
        (
            {"learning_rate": [0.1], "per_device_train_batch_size": [2, "two"]},
            "point learning_rate=0.1 per_device_train_batch_size=two: argument --per_device_train_batch_size"
            "/--per-device-train-batch-size: invalid int value: 'two'",
        ),
        ({"max_step": [1, 2]}, "point max_step=1: unknown flag --max_step; did you mean --max_steps?"),
        ({"multipack": [16]}, "point multipack=16: --multipack 16: multipack sampling is not supported"),
    ],
)
def test_a_bad_point_fails_the_sweep_before_any_point_runs_naming_it(bench_sweep, tmp_path, axes, reason):
    """Every point's flags are parsed as bench_train parses them before the first one runs (in-process: the parse is
    the driver's own; nothing is started, nothing written)."""
    spec = write_spec(tmp_path / "sweep.yaml", {"max_steps": 1}, axes)
    with pytest.raises(SystemExit) as refused:
        bench_sweep.main(str(spec), str(tmp_path / "sweep"))
    assert str(refused.value) == reason or str(refused.value).startswith(reason), refused.value
    assert not (tmp_path / "sweep").exists()
