"""wrappers/bench_train.py end to end: real training of the tiny model in child processes (python and torchrun), real
Aim (local repo and a real server), real signals. Faults come in through the wrapper's public ``--callbacks`` flag
(tests/helpers/bench_callbacks.py); nothing is mocked."""

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, cli_args, free_port, load_script, subprocess_env
from tests.helpers.aim import AimServer, read_runs
from tuning.benchmarking.dump import STEP_SAMPLES, STEP_TIME, TOKENS_PER_SECOND, build_dump
from tuning.benchmarking.journal import read_journal
from tuning.benchmarking.schema import validate_dump
from tuning.sft_trainer import get_parser

BENCH_TRAIN = REPO_ROOT / "wrappers" / "bench_train.py"
HELPERS = "tests.helpers.bench_callbacks"


@pytest.fixture(scope="module")
def bench_train():
    """The wrapper as a module, for the checks that need no training."""
    return load_script(BENCH_TRAIN)


def bench_args(model: str, output_dir: Path, **extra) -> list[str]:
    extra.setdefault("metrics_path", output_dir / "bench.json")
    extra.setdefault("skip_warmup_steps", 1)
    extra.setdefault("system_metrics_interval", 0.2)
    return cli_args(model, str(output_dir), **extra)


def start_bench(args: list[str], torchrun: bool = False, **env: str) -> subprocess.Popen:
    launcher = [sys.executable]
    if torchrun:
        launcher += ["-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}"]
    return subprocess.Popen(
        [*launcher, str(BENCH_TRAIN), *args],
        env=subprocess_env(**env),
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def run_bench(args: list[str], torchrun: bool = False, timeout: float = 300, **env: str):
    process = start_bench(args, torchrun, **env)
    stdout, stderr = process.communicate(timeout=timeout)
    return process.returncode, stdout, stderr


def read_dump(path: Path) -> dict:
    dump = json.loads(path.read_text())
    assert validate_dump(dump) == []
    return dump


def series(dump: dict, name: str, context: dict | None = None) -> dict:
    return next(m for m in dump["metrics"] if m["name"] == name and m["context"] == (context or {}))


def steps_in_journal(path: Path) -> list[int]:
    if not path.exists():
        return []
    lines = path.read_text().splitlines()[:-1]  # the last line may be mid-write
    return [r["step"] for r in map(json.loads, lines) if r["type"] == "point" and r["name"] == STEP_TIME]


def rebuild(journal: Path) -> dict:
    """``python -m tuning.benchmarking.rebuild`` as users run it; the dump it wrote beside the journal."""
    rebuilt = subprocess.run(
        [sys.executable, "-m", "tuning.benchmarking.rebuild", str(journal)],
        env=subprocess_env(),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert rebuilt.returncode == 0, rebuilt.stderr
    return read_dump(journal.with_name(journal.name.replace(".journal.jsonl", ".rebuilt.json")))


@pytest.fixture
def small_filesystem(tmp_path):
    """``mount(size)``: a real tmpfs of that size (``4m``), unmounted afterwards; skips where mounting is not
    allowed (needs root or CAP_SYS_ADMIN)."""
    mounted = []

    def mount(size: str) -> Path:
        where = tmp_path / f"fs{len(mounted)}"
        where.mkdir()
        result = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True, text=True
        )
        if result.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip() or result.returncode}")
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], check=False)


def wait_for_steps(path: Path, count: int, process: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while len(steps_in_journal(path)) < count:
        assert process.poll() is None, process.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "training did not get going"
        time.sleep(0.2)


# ---- runs that end well ----


@pytest.mark.slow
def test_aim_run_with_metadata_file(tiny_model, tmp_path):
    metadata_file = tmp_path / "meta.yaml"
    metadata_file.write_text("model: tiny-llama\nbatch_size: 4\nhardware:\n  accelerator: cpu\n  cores: 2\n")
    aim_repo = tmp_path / "aim"
    args = bench_args(
        tiny_model,
        tmp_path / "out",
        max_steps=4,
        tracker="aim",
        aim_repo=aim_repo,
        experiment="123",
        exp_metadata='{"dataset_id": "samples", "batch_size": 1}',
        metadata_path=metadata_file,
        metadata='{"benchmark_id": "b-7", "nightly": true}',
        callbacks=f"{HELPERS}:AddsMetric",
    )
    returncode, _, stderr = run_bench(args)
    assert returncode == 0, stderr[-3000:]

    dump = read_dump(tmp_path / "out" / "bench.json")
    assert dump["status"] == "ok" and dump["error"] is None and dump["training_steps"] == 4
    assert dump["experiment"] == "123"  # the trainer parser's type, not fire's int
    assert dump["metadata"] == {
        "dataset_id": "samples",
        "batch_size": 4,  # the file overrides --exp_metadata
        "model": "tiny-llama",
        "hardware": {"accelerator": "cpu", "cores": 2},
        "benchmark_id": "b-7",
        "nightly": True,
    }
    assert series(dump, STEP_TIME)["steps"] == [1, 2, 3, 4]
    aggregates = {(a["name"], json.dumps(a["context"])): a for a in dump["aggregates"]}
    assert aggregates[(STEP_TIME, "{}")]["count"] == 3  # warmup step 1 left out
    assert dump["summary"]["tokens_per_second"] > 0 and dump["summary"]["measured_steps"] == 3
    # A --callbacks extension's own number, added to the trainer's logs, reaches the dump and Aim like ours.
    assert series(dump, "my_metric")["steps"] == [1, 2, 3, 4]
    assert series(dump, "my_metric")["values"] == [1.5, 3.0, 4.5, 6.0]

    query = 'run.experiment_metadata.hardware.accelerator == "cpu" and run.experiment_metadata.benchmark_id == "b-7"'
    runs = read_runs(aim_repo, query)
    assert [run["hash"] for run in runs] == [dump["run_hash"]]
    run = runs[0]
    assert run["experiment"] == "123"
    assert run["params"]["experiment_metadata"] == dump["metadata"]
    # The step series reach Aim at most once a second, as means since their previous point, and always the last.
    step_times = dict(zip(series(dump, STEP_TIME)["steps"], series(dump, STEP_TIME)["values"], strict=True))
    for name in (STEP_TIME, TOKENS_PER_SECOND):
        assert set(run["metrics"][(name, "{}")]) <= {1, 2, 3, 4} and 4 in run["metrics"][(name, "{}")]
    for value in run["metrics"][(STEP_TIME, "{}")].values():
        assert min(step_times.values()) <= value <= max(step_times.values())
    assert run["metrics"][("my_metric", "{}")] == {1: 1.5, 2: 3.0, 3: 4.5, 4: 6.0}
    assert (STEP_SAMPLES, "{}") not in run["metrics"]  # in the dump only: Aim gets the series worth its time
    assert ("cpu_percent", "{}") in run["metrics"] and ("model_load_time", '{"subset": "additional_metrics"}') in run[
        "metrics"
    ]

    # The journal beside the dump rebuilds it exactly.
    records = read_journal(str(tmp_path / "out" / "bench.journal.jsonl"))
    assert build_dump(records, rebuilt_from_journal=True) == {**dump, "rebuilt_from_journal": True}


@pytest.mark.slow
def test_without_aim_auto_stop_leaves_a_complete_dump(tiny_model, tmp_path):
    args = bench_args(
        tiny_model,
        tmp_path,
        max_steps=200,
        tracker="none",
        auto_stop="True",
        auto_stop_min_steps=3,
        auto_stop_min_seconds=0,
        auto_stop_tolerance=0.5,
        callbacks=f"{HELPERS}:SlowSteps",
    )
    returncode, _, stderr = run_bench(args)
    assert returncode == 0, stderr[-3000:]
    dump = read_dump(tmp_path / "bench.json")
    assert dump["status"] == "stopped" and dump["stop_reason"] == "auto_stop" and dump["error"] is None
    assert 4 <= dump["training_steps"] < 30  # one warmup step, then at least three measured
    assert dump["run_hash"] is None and dump["world_size"] == 1
    assert all(value is not None for key, value in dump["summary"].items() if key != "cuda")
    assert dump["summary"]["peak_rss_bytes"] > 10_000_000 and dump["summary"]["measured_steps"] >= 3
    names = {m["name"] for m in dump["metrics"]}
    assert {"loss", "learning_rate", "model_load_time", "step_tokens", "cpu_percent", "process_rss_bytes"} <= names
    # Our token count (no sync per micro-batch) agrees with the one TRL logs; the trainer's own count stays off.
    assert sum(series(dump, "step_tokens")["values"]) == series(dump, "num_tokens")["values"][-1]
    assert "num_input_tokens_seen" not in names
    assert series(dump, "loss")["steps"] == list(range(1, dump["training_steps"] + 1))
    assert dump["environment"]["torch"] and dump["environment"]["cuda"] is None


@pytest.mark.slow
def test_stop_after_seconds_on_two_ranks_stops_both_at_the_same_step(tiny_model, tmp_path):
    """A rank stopping alone would leave the other waiting in DDP's all-reduce; rc 0 proves they agreed."""
    args = bench_args(
        tiny_model,
        tmp_path,
        max_steps=200,
        per_device_train_batch_size=2,
        tracker="none",
        stop_after_seconds=2,
        callbacks=f"{HELPERS}:SlowSteps,{HELPERS}:CountsStopCollectives",
    )
    returncode, _, stderr = run_bench(args, torchrun=True, COLLECTIVES_DIR=str(tmp_path))
    assert returncode == 0, stderr[-3000:]
    dump = read_dump(tmp_path / "bench.json")
    assert dump["status"] == "stopped" and dump["stop_reason"] == "stop_after_seconds" and dump["world_size"] == 2
    assert 2 <= dump["training_steps"] < 20
    for rank in (0, 1):  # the stop rule and the graceful stop share one all-reduce per step
        assert json.loads((tmp_path / f"rank{rank}.json").read_text()) == [1] * dump["training_steps"]
    assert dump["summary"]["train_runtime"] >= 2
    assert not list(tmp_path.glob("*.error.json"))
    # Throughput counts both ranks: the global batch, and the tokens TRL itself gathers from every rank.
    assert set(series(dump, "step_samples")["values"]) == {4}
    assert sum(series(dump, "step_tokens")["values"]) == series(dump, "num_tokens")["values"][-1]


# ---- runs that end badly ----


@pytest.mark.slow
def test_sigterm_to_one_rank_stops_both_after_the_same_step(tiny_model, tmp_path):
    """Rank 1 alone is signalled in step 3; with a stop rule active too, one all-reduce per step still decides."""
    args = bench_args(
        tiny_model,
        tmp_path,
        max_steps=200,
        per_device_train_batch_size=2,
        tracker="none",
        stop_after_seconds=3600,
        callbacks=f"{HELPERS}:SigtermOnLastRankInStep3,{HELPERS}:CountsStopCollectives",
    )
    returncode, _, stderr = run_bench(args, torchrun=True, COLLECTIVES_DIR=str(tmp_path))
    assert returncode != 0
    for rank in (0, 1):
        assert f"TUNING_ERROR category=interrupted rank={rank} step=3 exit_code=143" in stderr, stderr[-3000:]
        assert json.loads((tmp_path / f"rank{rank}.json").read_text()) == [1, 1, 1]
    dump = read_dump(tmp_path / "bench.json")
    assert (dump["status"], dump["stop_reason"], dump["training_steps"]) == ("interrupted", None, 3)
    assert dump["error"]["category"] == "interrupted" and dump["error"]["message"] == "training stopped by SIGTERM"
    report = json.loads((tmp_path / "bench.json.rank1.error.json").read_text())
    assert (report["category"], report["exit_code"], report["global_step"]) == ("interrupted", 143, 3)


@pytest.mark.slow
def test_sigkill_leaves_a_journal_that_rebuilds_into_a_dump(tiny_model, tmp_path):
    journal = tmp_path / "bench.journal.jsonl"
    process = start_bench(bench_args(tiny_model, tmp_path, max_steps=200, callbacks=f"{HELPERS}:SlowSteps"))
    wait_for_steps(journal, 3, process)
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=30)
    assert not (tmp_path / "bench.json").exists()

    logged = steps_in_journal(journal)
    rebuilt = subprocess.run(
        [sys.executable, "-m", "tuning.benchmarking.rebuild", str(journal)],
        env=subprocess_env(),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert rebuilt.returncode == 0, rebuilt.stderr
    dump = read_dump(tmp_path / "bench.rebuilt.json")
    assert dump["rebuilt_from_journal"] and dump["status"] == "error" and dump["error"]["category"] is None
    steps = series(dump, STEP_TIME)["steps"]
    assert steps == list(range(1, len(steps) + 1)) and len(steps) >= len(logged) >= 3  # every step before the kill
    assert dump["training_steps"] == len(steps)
    losses = series(dump, "loss")["steps"]
    assert losses == list(range(1, len(losses) + 1)) and len(losses) >= len(logged) - 1


@pytest.mark.slow
def test_sigkilled_aim_run_rebuilds_with_its_run_hash(tiny_model, tmp_path):
    """The run hash is journaled when the Aim run opens, not at the end: a killed run's dump still links its run."""
    journal = tmp_path / "bench.journal.jsonl"
    args = bench_args(
        tiny_model, tmp_path, max_steps=1000, tracker="aim", aim_repo=tmp_path / "aim", callbacks=f"{HELPERS}:SlowSteps"
    )
    process = start_bench(args)
    wait_for_steps(journal, 2, process)
    while not (tmp_path / "aimstack_tracker.json").exists():
        assert process.poll() is None, process.communicate()[1][-3000:]
        time.sleep(0.2)
    wait_for_steps(journal, len(steps_in_journal(journal)) + 1, process)  # a journal flush after the hash came
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=30)

    dump = rebuild(journal)
    assert dump["rebuilt_from_journal"] and dump["status"] == "error"
    run_hash = json.loads((tmp_path / "aimstack_tracker.json").read_text())["run_hash"]
    assert run_hash and dump["run_hash"] == run_hash


@pytest.mark.slow
def test_second_run_on_the_same_metrics_path_is_refused(tiny_model, tmp_path):
    """Two real runs, one --metrics_path: the second is refused before it touches anything; the first's journal and
    dump stay its own."""
    metrics_path = tmp_path / "shared" / "bench.json"
    journal = metrics_path.with_name("bench.journal.jsonl")
    args = bench_args(
        tiny_model, tmp_path / "out", metrics_path=metrics_path, max_steps=1000, callbacks=f"{HELPERS}:SlowSteps"
    )
    first = start_bench(args)
    try:
        wait_for_steps(journal, 2, first)
        returncode, _, stderr = run_bench(args)
        assert first.poll() is None, "the first run should still be training"
    finally:
        first.send_signal(signal.SIGTERM)
        _, first_stderr = first.communicate(timeout=120)
    assert returncode == 1, stderr[-3000:]
    marker = [line for line in stderr.splitlines() if line.startswith("TUNING_ERROR")]
    assert len(marker) == 1 and "category=user_error" in marker[0]
    assert f"--metrics_path {metrics_path} is in use by another run (pid {first.pid} on host" in marker[0]
    assert "Traceback" not in stderr

    assert first.returncode == 143, first_stderr[-3000:]
    dump = read_dump(metrics_path)
    assert dump["error"]["category"] == "interrupted" and dump["error"]["pid"] == first.pid
    steps = series(dump, STEP_TIME)["steps"]
    assert steps == list(range(1, dump["training_steps"] + 1)) and len(steps) >= 2
    records = read_journal(str(journal))
    assert [record["type"] for record in records].count("start") == 1
    assert build_dump(records) == dump  # the journal is the first run's alone

    # Once the first run is over, the path is free again.
    returncode, _, stderr = run_bench(bench_args(tiny_model, tmp_path / "out", metrics_path=metrics_path, max_steps=1))
    assert returncode == 0, stderr[-3000:]
    assert read_dump(metrics_path)["status"] == "ok"


@pytest.mark.slow
def test_disk_full_mid_run_writes_the_whole_dump_to_the_output_dir(tiny_model, tmp_path, small_filesystem):
    """A real filesystem that fills up while training: the journal says so on a line of its own, the dump goes whole
    to the output directory, named on stderr and in the termination log, and the run exits ``storage``."""
    full = small_filesystem("24m")
    termination_log = tmp_path / "termination-log"
    args = bench_args(
        tiny_model,
        tmp_path / "out",
        metrics_path=full / "bench.json",
        max_steps=10,
        callbacks=f"{HELPERS}:FillsDiskAfterStep2",
    )
    returncode, _, stderr = run_bench(args, FILL_DIR=str(full), TERMINATION_LOG_FILE=str(termination_log))

    assert returncode == 209, stderr[-3000:]
    fallback = tmp_path / "out" / "bench.json"
    dump = read_dump(fallback)
    assert dump["status"] == "ok" and series(dump, STEP_TIME)["steps"] == list(range(1, 11))  # the last steps too
    lines = stderr.split("\n")  # a progress bar's line ends with \r, not a line break
    assert any(line.startswith("journal ") and "No space left on device" in line for line in lines), stderr[-3000:]
    assert f"wrote it to {fallback} instead" in stderr
    assert "TUNING_ERROR category=storage rank=0 step=10 exit_code=209" in stderr
    (line,) = termination_log.read_text().splitlines()
    assert line.startswith("storage: StorageError: cannot write the dump to --metrics_path") and str(fallback) in line


@pytest.mark.slow
def test_failed_run_on_a_full_disk_keeps_its_category_and_names_the_fallback(tiny_model, tmp_path, small_filesystem):
    full = small_filesystem("24m")
    termination_log = tmp_path / "termination-log"
    args = bench_args(
        tiny_model,
        tmp_path / "out",
        metrics_path=full / "bench.json",
        max_steps=10,
        callbacks=f"{HELPERS}:FillsDiskAfterStep2,{HELPERS}:OutOfMemoryOnLastRank",
    )
    returncode, _, stderr = run_bench(args, FILL_DIR=str(full), TERMINATION_LOG_FILE=str(termination_log))

    assert returncode == 204, stderr[-3000:]  # the run's own failure decides
    fallback = tmp_path / "out" / "bench.json"
    dump = read_dump(fallback)
    assert dump["status"] == "error" and dump["error"]["category"] == "gpu_oom" and dump["training_steps"] == 2
    assert f"wrote it to {fallback} instead" in stderr
    failure, storage = termination_log.read_text().splitlines()
    assert failure.startswith("gpu_oom: OutOfMemoryError")
    assert storage.startswith("storage: cannot write the dump to --metrics_path") and str(fallback) in storage


@pytest.mark.slow
def test_aim_server_killed_mid_run(tiny_model, tmp_path):
    server = AimServer(tmp_path / "aim")
    try:
        args = bench_args(
            tiny_model,
            tmp_path,
            max_steps=10,
            tracker="aim",
            aim_url=server.url,
            aim_close_timeout=3,
            callbacks=f"{HELPERS}:SlowSteps",
        )
        process = start_bench(args)
        wait_for_steps(tmp_path / "bench.journal.jsonl", 2, process)
        while not (tmp_path / "aimstack_tracker.json").exists():  # the run exists on the server
            assert process.poll() is None, process.communicate()[1][-3000:]
            time.sleep(0.2)
        server.kill()
        _, stderr = process.communicate(timeout=180)
    finally:
        server.stop()
    assert process.returncode == 0, stderr[-3000:]
    dump = read_dump(tmp_path / "bench.json")
    assert dump["status"] == "ok" and dump["training_steps"] == 10
    assert dump["aim_degraded_reason"] and dump["run_hash"]
    assert series(dump, STEP_TIME)["steps"] == list(range(1, 11))


@pytest.mark.slow
def test_fault_on_one_rank_gives_per_rank_reports(tiny_model, tmp_path):
    args = bench_args(tiny_model, tmp_path, max_steps=6, tracker="none", callbacks=f"{HELPERS}:OutOfMemoryOnLastRank")
    returncode, _, stderr = run_bench(args, torchrun=True, TERMINATION_LOG_FILE=str(tmp_path / "termination-log"))
    assert returncode != 0
    assert "TUNING_ERROR category=gpu_oom rank=1 step=2 exit_code=204" in stderr

    report = json.loads((tmp_path / "bench.json.rank1.error.json").read_text())
    assert report["category"] == "gpu_oom" and report["rank"] == 1 and report["global_step"] == 2
    assert "injected by the test" in report["message"] and report["world_size"] == 2
    dump = read_dump(tmp_path / "bench.json")  # rank 0 saw its peer vanish: its own, truthful report
    assert dump["error"]["rank"] == 0 and dump["error"]["category"] in ("communication", "interrupted")
    assert dump["status"] == ("interrupted" if dump["error"]["category"] == "interrupted" else "error")
    assert not (tmp_path / "bench.json.rank0.error.json").exists()
    assert "gpu_oom: rank 1: OutOfMemoryError" in (tmp_path / "termination-log").read_text()


@pytest.mark.slow
def test_stall_is_reported_as_hang(tiny_model, tmp_path):
    args = bench_args(tiny_model, tmp_path, max_steps=6, tracker="none", stall_timeout=2)
    args += ["--callbacks", f"{HELPERS}:StallAtStep2"]
    started = time.monotonic()
    returncode, _, stderr = run_bench(args, timeout=120, TERMINATION_LOG_FILE=str(tmp_path / "termination-log"))
    assert returncode == 208, stderr[-3000:]
    assert time.monotonic() - started < 100  # the helper would have slept for 300 s
    assert "TUNING_ERROR category=hang rank=0 step=2" in stderr
    dump = read_dump(tmp_path / "bench.json")
    error = dump["error"]
    assert dump["status"] == "error" and error["category"] == "hang" and error["global_step"] == 2
    assert "on_step_end" in error["thread_stacks"] and "bench_callbacks.py" in error["thread_stacks"]
    assert (tmp_path / "termination-log").read_text().startswith("hang: TrainingStalled")


# ---- the command line, without training ----


@pytest.mark.parametrize(
    ("make_flags", "message"),
    [
        (lambda d: {"metadata_path": d / "missing.yaml"}, "cannot read --metadata_path"),
        (lambda d: {"metadata_path": write(d / "m.yaml", "a: [1, 2\n")}, "is not valid JSON/YAML"),
        (lambda d: {"metadata_path": write(d / "m.json", '{"a": }')}, "is not valid JSON/YAML"),
        (lambda d: {"metadata_path": write(d / "m.yaml", "- a\n- b\n")}, "must hold an object"),
        (lambda d: {"metadata": "[1, 2]"}, "--metadata must hold an object"),
        (lambda d: {"metadata": "{nope"}, "--metadata is not valid JSON"),
        (lambda d: {"metrics_path": write(d / "file", "") / "bench.json"}, "cannot write --metrics_path"),
        (lambda d: {"stop_after_seconds": "soon"}, "--stop_after_seconds 'soon' is not a valid float"),
        (lambda d: {"callbacks": "tests.helpers.nowhere:Nothing"}, "--callbacks tests.helpers.nowhere:Nothing"),
    ],
)
def test_bad_input_fails_before_training(bench_train, tiny_model, tmp_path, capsys, make_flags, message):
    flags = {"metrics_path": tmp_path / "bench.json", **make_flags(tmp_path)}
    assert bench_train.main(cli_args(tiny_model, str(tmp_path), **flags)) == 1
    marker = [line for line in capsys.readouterr().err.splitlines() if line.startswith("TUNING_ERROR")]
    assert len(marker) == 1 and "category=user_error" in marker[0] and message in marker[0]
    journal = tmp_path / "bench.journal.jsonl"
    if journal.exists():  # the metrics path was usable: the dump says what went wrong, and nothing trained
        dump = read_dump(tmp_path / "bench.json")
        assert dump["status"] == "error" and dump["error"]["category"] == "user_error"
        assert dump["training_steps"] == 0 and not dump["metrics"]


def test_almost_full_filesystem_is_refused_before_training(bench_train, tiny_model, tmp_path, capsys, small_filesystem):
    full = small_filesystem("4m")
    assert bench_train.main(cli_args(tiny_model, str(tmp_path), metrics_path=full / "bench.json")) == 209
    marker = [line for line in capsys.readouterr().err.splitlines() if line.startswith("TUNING_ERROR")]
    assert len(marker) == 1 and "category=storage" in marker[0] and f"--metrics_path {full / 'bench.json'}" in marker[0]
    assert "MiB free" in marker[0] and not (full / "bench.journal.jsonl").exists()


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_help_lists_wrapper_and_trainer_flags(bench_train, capsys):
    assert bench_train.main(["--help"]) == 0
    shown = capsys.readouterr().out
    for flag in ("--metadata_path", "--stop_after_seconds", "--stall_timeout", "--training_data_path", "--aim_repo"):
        assert flag in shown


def test_trainer_flags_reach_the_trainer_parser_as_typed(bench_train):
    trainer_tokens = ["--experiment", "123", "--exp_metadata", '{"a": 1}', "--max_steps", "3", "--use_peft"]
    wrapper_tokens = ["--metadata", '{"b": true}', "--auto_stop", "--metrics-path=m.json", "--stall_timeout", "9"]
    wrapper, trainer = bench_train.split_argv(trainer_tokens[:4] + wrapper_tokens + trainer_tokens[4:])
    assert wrapper == wrapper_tokens and trainer == trainer_tokens
    assert bench_train.split_argv(["--auto_stop", "False", "--r", "4"]) == (["--auto_stop", "False"], ["--r", "4"])
    trainer_flags = set(re.findall(r"--\w+", get_parser().format_help()))
    assert not {f"--{name}" for name in bench_train._FLAG_NAMES} & trainer_flags

    flags, args = bench_train.parse_command_line(["--output_dir", "out", *trainer_tokens, *wrapper_tokens])
    assert args.aim_config.experiment == "123" and args.experiment_metadata == {"a": 1}
    assert args.training_args.max_steps == 3 and args.tune_config.r == 8
    assert flags.metadata == '{"b": true}' and flags.auto_stop is True and flags.stall_timeout == 9.0
    assert flags.metrics_path == "m.json" and flags.system_metrics_interval == 5.0


@pytest.mark.slow
def test_a_rerun_into_the_same_output_dir_measures_a_whole_run(tiny_model, tmp_path):
    """sft_trainer resumes from output_dir's last checkpoint (fms-hf-tuning v3.1.0); bench_train only when told."""
    args = bench_args(tiny_model, tmp_path, max_steps=2, save_strategy="steps", save_steps=1, skip_warmup_steps=0)
    for _ in range(2):
        code, _, stderr = run_bench(args)
        assert code == 0, stderr[-3000:]
        assert series(read_dump(tmp_path / "bench.json"), STEP_TIME)["steps"] == [1, 2]
    assert (tmp_path / "checkpoint-2").is_dir()
    assert not list(tmp_path.glob("*.safetensors"))  # no final model unless --save_model_dir
