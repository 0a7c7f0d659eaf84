"""wrappers/bench_train.py end to end: real training of the tiny model in child processes (python and torchrun), real
Aim (local repo and a real server), real signals. Faults come in through the wrapper's public ``--callbacks`` flag
(tests/helpers/bench_callbacks.py); nothing is mocked."""

import base64
import dataclasses
import hashlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.aim import AimServer, existing_repo, read_runs
from tests.helpers.bench import (
    assert_parts_sum_to_step_times,
    bench_args,
    csv_by,
    read_dump,
    rebuild,
    run_bench,
    series,
    start_bench,
)
from tests.helpers.data_files import data_caches, write_config
from tests.helpers.file_reads import FileReads
from tests.helpers.flops import LORA_WEIGHTS, attention_flops, tiny_llama_matmul_weights
from tests.helpers.mlflow import MlflowServer
from tests.helpers.nvml import load_fake_nvml
from tests.helpers.training import (
    BENCH_CALLBACKS,
    BENCH_TRAIN,
    REPO_ROOT,
    cli_args,
    load_script,
    logged_steps,
    termination_lines,
    wait_for_steps,
    wait_until,
)
from tuning.benchmarking.dump import (
    STEP_SAMPLES,
    STEP_TIME,
    STEP_TOKENS,
    TIME_TO_TRAIN_KEYS,
    TOKENS_PER_SECOND,
    build_dump,
    utc_iso,
)
from tuning.benchmarking.journal import read_journal
from tuning.data.cache import OWNER_FILE
from tuning.sft_trainer import get_parser
from tuning.trackers.aimstack_tracker import DEGRADED_WARNING as AIM_WARNING
from tuning.trackers.aimstack_tracker import RUN_HASH_FILENAME
from tuning.trackers.mlflow_tracker import DEGRADED_WARNING as MLFLOW_WARNING
from tuning.trackers.mlflow_tracker import RUN_URI_FILENAME
from tuning.utils.checkpoints import STATUS_FILE, checkpoint_problem, newest_complete_checkpoint, trained_steps
from tuning.utils.tiny_model import SAMPLE_TRAIN_PATH


@pytest.fixture(scope="module")
def bench_train():
    """The wrapper as a module, for the checks that need no training."""
    return load_script(BENCH_TRAIN)


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


# ---- runs that end well ----


@pytest.mark.slow  # Aim's helper process and its repo
def test_aim_run_with_metadata_file(bench_train, tiny_model, tmp_path, capfd):
    metadata_file = tmp_path / "meta.yaml"
    metadata_file.write_text("model: tiny-llama\nbatch_size: 4\nhardware:\n  accelerator: cpu\n  cores: 2\n")
    aim_repo = existing_repo(tmp_path / "aim")
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
        callbacks=f"{BENCH_CALLBACKS}:AddsMetric",
    )
    assert bench_train.main(args) == 0, capfd.readouterr().err[-3000:]

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
    # The goodput parts as of training's end, at its last step: the dump's, less what came after (the final dump).
    assert 0 < run["metrics"][("goodput", "{}")][4] <= 1
    for part in ("startup", "model_load", "data_preparation", "productive_steps"):  # leftover grows after it
        tracked = run["metrics"][(f"goodput_{part}_seconds", "{}")][4]
        assert tracked == pytest.approx(dump["summary"]["goodput"]["parts"][part], abs=0.5), part

    # The journal beside the dump rebuilds it exactly.
    records = read_journal(str(tmp_path / "out" / "bench.journal.jsonl"))
    assert build_dump(records, rebuilt_from_journal=True) == {**dump, "rebuilt_from_journal": True}


def test_without_aim_auto_stop_leaves_a_complete_dump(bench_train, tiny_model, tmp_path, capfd):
    args = bench_args(
        tiny_model,
        tmp_path,
        max_steps=200,
        tracker="none",
        auto_stop="True",
        auto_stop_min_steps=3,
        auto_stop_min_seconds=0,
        auto_stop_tolerance=0.5,
        callbacks=f"{BENCH_CALLBACKS}:SteadySteps",
    )
    assert bench_train.main(args) == 0, capfd.readouterr().err[-3000:]
    dump = read_dump(tmp_path / "bench.json")
    assert dump["status"] == "stopped" and dump["stop_reason"] == "auto_stop" and dump["error"] is None
    assert 4 <= dump["training_steps"] < 30  # one warmup step, then at least three measured
    assert dump["run_hash"] is None and dump["experiment"] is None and dump["world_size"] == 1  # nothing tracked it
    # Null by design without a GPU (no device peak, no NVML); every other summary figure is there.
    without_gpu = {"cuda", "peak_tflops_per_device", "mfu", "energy_joules", "energy_joules_per_gpu"}
    without_gpu |= {"joules_per_token", "energy_source"}
    assert all(dump["summary"][key] is None for key in without_gpu)
    # Null when there is nothing to say: not resumed, fetch measurable, no straggler on one process, no image tokens.
    nothing_to_say = {"resumed_from_step", "data_fetch_unmeasurable", "straggler_rank", "straggler_cause"}
    nothing_to_say |= {"straggler_node", "nodes", "slowest_node", "rank_collective_wait_p50"}  # one node, one process
    nothing_to_say |= {"text_tokens_per_second", "image_tokens_per_second"}
    nothing_to_say |= {"language_flops_per_token", "vision_flops_per_image_token", "vision_flops_fraction"}
    nothing_to_say |= {"peak_tensor_bytes", "memory_estimate_ratio"}  # bench_args: --memory_estimate False
    nothing_to_say |= set(TIME_TO_TRAIN_KEYS)  # no --target_eval_loss
    assert all(dump["summary"][key] is None for key in nothing_to_say) and len(dump["segments"]) == 1
    nulls = [key for key, value in dump["summary"].items() if value is None and key not in without_gpu | nothing_to_say]
    assert not nulls, nulls
    assert dump["summary"]["peak_rss_bytes"] > 10_000_000 and dump["summary"]["measured_steps"] >= 3
    # The one rank's own throughput, over its own step times, is the run's.
    assert dump["summary"]["rank_tokens_per_second"] == [pytest.approx(dump["summary"]["tokens_per_second"], rel=0.02)]
    names = {m["name"] for m in dump["metrics"]}
    assert {"loss", "learning_rate", "model_load_time", "step_tokens", "cpu_percent", "process_rss_bytes"} <= names
    # Our token count (no sync per micro-batch) agrees with the one TRL logs; the trainer's own count stays off.
    assert sum(series(dump, "step_tokens")["values"]) == series(dump, "num_tokens")["values"][-1]
    assert "num_input_tokens_seen" not in names
    assert series(dump, "loss")["steps"] == list(range(1, dump["training_steps"] + 1))
    # Every step trained on label tokens (the responses: fewer than its tokens); the summary says how many in all.
    labels, tokens = series(dump, "step_label_tokens"), series(dump, "step_tokens")
    assert labels["steps"] == tokens["steps"]
    assert all(0 < n < t for n, t in zip(labels["values"], tokens["values"], strict=True))
    assert dump["summary"]["label_tokens"] == sum(labels["values"])
    assert dump["environment"]["torch"] and dump["environment"]["cuda"] is None
    # Step anatomy: SlowSteps sleeps in a callback after each step's end, host work that the next step's rest holds.
    assert_parts_sum_to_step_times(dump)
    assert dump["summary"]["bound_by"] == "host" and dump["summary"]["step_parts"]["rest"] > 0.5


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
        callbacks=f"{BENCH_CALLBACKS}:SlowSteps,{BENCH_CALLBACKS}:CountsStopCollectives",
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
    # Each rank's own goodput, from its own clocks, gathered at train end: its parts sum to its wall time.
    ranks = dump["summary"]["rank_goodput"]
    assert len(ranks) == 2 and ranks[0]["parts"]["productive_steps"] == pytest.approx(
        dump["summary"]["goodput"]["parts"]["productive_steps"], rel=0.2
    )
    for own in ranks:
        assert sum(own["parts"].values()) == pytest.approx(own["wall_seconds"])
        assert min(own["parts"][part] for part in ("startup", "model_load", "data_preparation", "productive_steps")) > 0
        assert 0 <= own["parts"]["leftover"] < 0.3 * own["wall_seconds"], own


# ---- runs that end badly ----


@pytest.mark.slow
def test_sigterm_to_one_rank_stops_both_after_the_same_step(tiny_model, tmp_path):
    """Rank 1 alone is signalled in step 3 (a real SIGTERM to its own process); with a stop rule active too, one
    all-reduce per step still decides; each rank writes its own termination line."""
    args = bench_args(
        tiny_model,
        tmp_path,
        max_steps=200,
        per_device_train_batch_size=2,
        tracker="none",
        stop_after_seconds=3600,
        callbacks=f"{BENCH_CALLBACKS}:SigtermOnLastRankInStep3,{BENCH_CALLBACKS}:CountsStopCollectives",
    )
    log = tmp_path / "termination-log"
    returncode, _, stderr = run_bench(args, torchrun=True, COLLECTIVES_DIR=str(tmp_path), TERMINATION_LOG_FILE=str(log))
    assert returncode != 0
    assert sorted(termination_lines(log)) == [
        f"interrupted: rank {rank}: TrainingInterrupted: training stopped by SIGTERM" for rank in (0, 1)
    ]
    for rank in (0, 1):
        assert f"TUNING_ERROR category=interrupted rank={rank} step=3 exit_code=143" in stderr, stderr[-3000:]
        assert json.loads((tmp_path / f"rank{rank}.json").read_text()) == [1, 1, 1]
    dump = read_dump(tmp_path / "bench.json")
    assert (dump["status"], dump["stop_reason"], dump["training_steps"]) == ("interrupted", None, 3)
    assert dump["error"]["category"] == "interrupted" and dump["error"]["message"] == "training stopped by SIGTERM"
    report = json.loads((tmp_path / "bench.json.rank1.error.json").read_text())
    assert (report["category"], report["exit_code"], report["global_step"]) == ("interrupted", 143, 3)


@pytest.mark.slow
def test_sigkill_leaves_a_journal_that_rebuilds_into_a_dump_and_a_restart_shows_the_gap_and_the_lost_steps(
    tiny_model, tmp_path
):
    """SIGKILL after 5 steps (checkpoints every 2), then at once, as if the kill had hit the newest checkpoint's save,
    that one is marked unfinished (and an older save left checkpoint-9 unfinished) and the same command resumes from
    the checkpoint before it. The killed journal (a copy) rebuilds into a dump. The resumed dump says where the time
    went: the first segment ends at its last journal record; the restart's start is dated no earlier than its launch
    less its clock's precision, so the gap is the real one (0 with a note where the two are closer than that
    precision, never negative); the steps trained again are goodput's repeated steps; the unfinished folder is
    removed once a newer checkpoint is complete. The killed run's tokenised-data cache (tuning.data.cache) is left
    behind, its owner file naming the dead process, and the restart, the next run on that HF_DATASETS_CACHE, removes
    it."""
    journal = tmp_path / "bench.journal.jsonl"
    data_cache = {"HF_DATASETS_CACHE": str(tmp_path / "datasets-cache")}
    args = bench_args(
        tiny_model,
        tmp_path,
        max_steps=10,
        save_strategy="steps",
        save_steps=2,
        callbacks=f"{BENCH_CALLBACKS}:SlowSteps",
    )
    process = start_bench(args, **data_cache)
    wait_for_steps(journal, 5, process, signal.SIGKILL)
    process.communicate(timeout=30)
    [left_behind] = data_caches(tmp_path / "datasets-cache")
    assert (left_behind / OWNER_FILE).exists()
    killed_journal = Path(shutil.copy(journal, tmp_path / "killed.journal.jsonl"))
    newest, _ = newest_complete_checkpoint(str(tmp_path))
    (Path(newest) / STATUS_FILE).write_text(json.dumps({"complete": False}))
    (tmp_path / "checkpoint-9").mkdir()
    (tmp_path / "checkpoint-9" / STATUS_FILE).write_text(json.dumps({"complete": False}))
    resumed_from = newest_complete_checkpoint(str(tmp_path))[0]
    assert not (tmp_path / "bench.json").exists()
    launched = time.time()
    returncode, _, stderr = run_bench([*args, "--resume_from_checkpoint"], **data_cache)
    assert returncode == 0, stderr[-3000:]
    assert f"resuming from {Path(resumed_from).name}" in stderr
    assert data_caches(tmp_path / "datasets-cache") == []
    assert not (tmp_path / "checkpoint-9").exists() and checkpoint_problem(str(newest)) is None

    logged = logged_steps(killed_journal)
    dump = rebuild(killed_journal)
    assert dump["rebuilt_from_journal"] and dump["status"] == "error" and dump["error"]["category"] is None
    steps = series(dump, STEP_TIME)["steps"]
    assert steps == list(range(1, len(steps) + 1)) and len(steps) >= len(logged) >= 3  # every step before the kill
    assert dump["training_steps"] == len(steps)
    losses = series(dump, "loss")["steps"]
    assert losses == list(range(1, len(losses) + 1)) and len(losses) >= len(logged) - 1

    dump = read_dump(tmp_path / "bench.json")
    first, second = dump["segments"]
    killed_records = read_journal(str(killed_journal))
    last_record = max(record["time"] for record in killed_records)
    restart = next(record for record in read_journal(str(journal))[1:] if record["type"] == "start")["time"]
    precision = second["start_clock"]["precision_seconds"]
    assert second["start_clock"]["source"] == "proc_stat_starttime" and precision <= 0.011
    assert launched - precision <= restart < time.time()
    assert first["stop_time"] == utc_iso(last_record) and second["start_time"] == utc_iso(restart)
    assert second["gap_seconds"] == pytest.approx(max(0.0, restart - last_record))
    assert (second["gap_note"] is not None) == (restart < last_record), second["gap_note"]
    goodput = dump["summary"]["goodput"]
    start = killed_records[0]["time"]
    kept = trained_steps(resumed_from)
    lost = [
        record["value"]
        for record in killed_records
        if record.get("name") == STEP_TIME and not record["context"] and record["step"] > kept
    ]
    assert len(lost) >= 2 and goodput["parts"]["repeated_steps"] == pytest.approx(sum(lost), abs=0.35 * len(lost))
    assert goodput["parts"]["gaps"] == pytest.approx(second["gap_seconds"])
    assert goodput["parts"]["checkpoint_restore"] > 0 and goodput["not_measured"] == {}
    assert goodput["clock_notes"] == []
    overlap = max(0.0, last_record - restart)  # a restart dated before the stop within its precision
    assert goodput["wall_seconds"] == pytest.approx(read_journal(str(journal))[-1]["time"] - start + overlap)
    assert sum(goodput["parts"].values()) == pytest.approx(goodput["wall_seconds"])
    assert min(goodput["parts"].values()) >= 0
    assert goodput["parts"]["leftover"] < 0.2 * goodput["wall_seconds"], goodput


@pytest.mark.slow
def test_sigkilled_aim_run_rebuilds_with_its_run_hash(tiny_model, tmp_path):
    """The run hash is journaled when the Aim run opens, not at the end: a killed run's dump still links its run."""
    journal = tmp_path / "bench.journal.jsonl"
    args = bench_args(
        tiny_model,
        tmp_path,
        max_steps=1000,
        tracker="aim",
        aim_repo=existing_repo(tmp_path / "aim"),
        callbacks=f"{BENCH_CALLBACKS}:SlowSteps",
    )
    process = start_bench(args)
    wait_for_steps(journal, 2, process)
    wait_until((tmp_path / "aim_tracker.json").exists, process, "its Aim run")
    # a journal flush after the hash came, then the kill
    wait_for_steps(journal, len(logged_steps(journal)) + 1, process, signal.SIGKILL)
    process.communicate(timeout=30)

    dump = rebuild(journal)
    assert dump["rebuilt_from_journal"] and dump["status"] == "error"
    run_hash = json.loads((tmp_path / "aim_tracker.json").read_text())["run_hash"]
    assert run_hash and dump["run_hash"] == run_hash


@pytest.mark.slow
def test_second_run_on_the_same_metrics_path_is_refused(bench_train, tiny_model, tmp_path, capfd):
    """Two runs, one --metrics_path (the first a process of its own, the second bench_train's main in this process):
    the second is refused before it touches anything; the first's journal and dump stay its own."""
    metrics_path = tmp_path / "shared" / "bench.json"
    journal = metrics_path.with_name("bench.journal.jsonl")
    args = bench_args(
        tiny_model,
        tmp_path / "out",
        metrics_path=metrics_path,
        max_steps=1000,
        callbacks=f"{BENCH_CALLBACKS}:SlowSteps",
    )
    first = start_bench(args)
    try:
        wait_for_steps(journal, 2, first)
        capfd.readouterr()
        returncode = bench_train.main(args)
        stderr = capfd.readouterr().err
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
    returncode = bench_train.main(bench_args(tiny_model, tmp_path / "out", metrics_path=metrics_path, max_steps=1))
    assert returncode == 0, capfd.readouterr().err[-3000:]
    assert read_dump(metrics_path)["status"] == "ok"


def test_disk_full_mid_run_writes_the_whole_dump_to_the_output_dir(
    bench_train, tiny_model, tmp_path, small_filesystem, monkeypatch, capfd
):
    """A real filesystem that fills up while training (bench_train's main in this process): the journal says so on a
    line of its own, the dump goes whole to the output directory, named on stderr and in the termination log, and
    the run exits ``storage``."""
    full = small_filesystem("24m")
    termination_log = tmp_path / "termination-log"
    args = bench_args(
        tiny_model,
        tmp_path / "out",
        metrics_path=full / "bench.json",
        max_steps=10,
        callbacks=f"{BENCH_CALLBACKS}:FillsDiskAfterStep2",
    )
    monkeypatch.setenv("FILL_DIR", str(full))
    monkeypatch.setenv("TERMINATION_LOG_FILE", str(termination_log))
    returncode = bench_train.main(args)
    stderr = capfd.readouterr().err

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


def test_failed_run_on_a_full_disk_keeps_its_category_and_names_the_fallback(
    bench_train, tiny_model, tmp_path, small_filesystem, monkeypatch, capfd
):
    full = small_filesystem("24m")
    termination_log = tmp_path / "termination-log"
    args = bench_args(
        tiny_model,
        tmp_path / "out",
        metrics_path=full / "bench.json",
        max_steps=10,
        callbacks=f"{BENCH_CALLBACKS}:FillsDiskAfterStep2,{BENCH_CALLBACKS}:OutOfMemoryOnLastRank",
    )
    monkeypatch.setenv("FILL_DIR", str(full))
    monkeypatch.setenv("TERMINATION_LOG_FILE", str(termination_log))
    returncode = bench_train.main(args)
    stderr = capfd.readouterr().err

    assert returncode == 204, stderr[-3000:]  # the run's own failure decides
    fallback = tmp_path / "out" / "bench.json"
    dump = read_dump(fallback)
    assert dump["status"] == "error" and dump["error"]["category"] == "gpu_oom" and dump["training_steps"] == 2
    assert f"wrote it to {fallback} instead" in stderr
    failure, storage = termination_log.read_text().splitlines()
    assert failure.startswith("gpu_oom: OutOfMemoryError")
    assert storage.startswith("storage: cannot write the dump to --metrics_path") and str(fallback) in storage


@pytest.mark.slow
@pytest.mark.parametrize(
    ("tracker", "server_class", "url_flag", "warning", "export_file", "reason_key", "run_key"),
    [
        ("aim", AimServer, "aim_url", AIM_WARNING, RUN_HASH_FILENAME, "aim_degraded_reason", "run_hash"),
        (
            "mlflow",
            MlflowServer,
            "mlflow_tracking_uri",
            MLFLOW_WARNING,
            RUN_URI_FILENAME,
            "mlflow_degraded_reason",
            "mlflow_run_id",
        ),
    ],
    ids=["aim", "mlflow"],
)
def test_tracking_server_killed_mid_run(
    tracker, server_class, url_flag, warning, export_file, reason_key, run_key, tiny_model, tmp_path
):
    """The server dies once the run exists on it: one warning, the reason in the dump, every step trained and
    recorded, exit 0, and the job ends soon after training, never waiting on the dead server."""
    server = server_class(tmp_path / tracker)
    try:
        # a close timeout that creating the run on a loaded machine stays within
        flags = {url_flag: server.url, f"{tracker}_close_timeout": 20}
        args = bench_args(
            tiny_model, tmp_path, max_steps=10, tracker=tracker, callbacks=f"{BENCH_CALLBACKS}:SlowSteps", **flags
        )
        process = start_bench(args)
        wait_for_steps(tmp_path / "bench.journal.jsonl", 2, process)
        wait_until((tmp_path / export_file).exists, process, "its run on the server")
        server.kill()
        killed_at = time.monotonic()
        stderr = process.finish(timeout=180)
        ended_after = time.monotonic() - killed_at
    finally:
        server.stop()
    assert process.returncode == 0, stderr[-3000:]
    assert stderr.count(warning) == 1
    dump = read_dump(tmp_path / "bench.json")
    assert dump["status"] == "ok" and dump["training_steps"] == 10
    assert "unreachable" in dump[reason_key] and dump[run_key]
    assert series(dump, STEP_TIME)["steps"] == list(range(1, 11))
    assert ended_after < 120  # ten slow steps, saving and exit


@pytest.mark.slow
def test_stall_is_reported_as_hang(tiny_model, tmp_path):
    args = bench_args(tiny_model, tmp_path, max_steps=6, tracker="none", stall_timeout=2)
    args += ["--callbacks", f"{BENCH_CALLBACKS}:StallAtStep2"]
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


# ---- MFU, energy, rank skew ----

FAKE_GPU = {
    "uuid": "GPU-a",
    "utilization": 50,
    "memory_used": 2**30,
    "power_mw": [200_000],
    "enforced_limit_mw": 400_000,
}


def use_fake_nvml(monkeypatch, *devices: dict) -> None:
    """This process's NVML is the stand-in, over ``devices``, for the test's duration."""
    monkeypatch.setitem(sys.modules, "pynvml", load_fake_nvml())
    monkeypatch.setenv("FAKE_NVML_DEVICES", json.dumps(list(devices)))


def measured(dump: dict, name: str) -> float:
    """The sum of a step series over the steps after the warmup."""
    found = series(dump, name)
    return sum(
        value for step, value in zip(found["steps"], found["values"], strict=True) if step > dump["warmup_steps"]
    )


def test_full_fine_tuning_dump_has_mfu_and_the_energy_counter_s_difference(
    bench_train, tiny_model, tmp_path, monkeypatch, capfd
):
    """NVML's counter advances 7 J per read: read at train begin, warmup end and train end, so 7 J after the warmup.
    (bench_train's main in this process, its NVML the stand-in module.)"""
    args = bench_args(tiny_model, tmp_path, max_steps=6, peak_tflops=0.002)
    use_fake_nvml(monkeypatch, {**FAKE_GPU, "energy_mj_per_read": 7_000})
    assert bench_train.main(args) == 0, capfd.readouterr().err[-3000:]
    dump = read_dump(tmp_path / "bench.json")
    summary, tokens = dump["summary"], measured(dump, STEP_TOKENS)
    sequence_length = tokens / measured(dump, STEP_SAMPLES)
    vocab = json.loads((Path(tiny_model) / "config.json").read_text())["vocab_size"]
    flops = 6 * tiny_llama_matmul_weights(vocab) + attention_flops(sequence_length)
    assert summary["model_flops_per_token"] == pytest.approx(flops)
    assert summary["achieved_tflops_per_device"] == pytest.approx(summary["tokens_per_second"] * flops / 1e12)
    assert summary["mfu"] == pytest.approx(summary["achieved_tflops_per_device"] / 0.002)
    assert summary["energy_source"] == "nvml_energy_counter"
    assert summary["energy_joules_per_gpu"] == [7.0] and summary["energy_joules"] == 7.0
    assert summary["joules_per_token"] == pytest.approx(7.0 / tokens)
    assert len(summary["rank_forward_time_p50"]) == 1 and summary["rank_skew"] == 1.0


def test_lora_dump_without_a_counter_integrates_power_and_has_no_mfu_on_cpu(
    bench_train, tiny_model, tmp_path, monkeypatch, capfd
):
    """A GPU drawing a steady 200 W without an energy counter: 200 W times the time after the warmup, within 5 %.
    (bench_train's main in this process, its NVML the stand-in module.)"""
    gpu = {**FAKE_GPU, "unsupported": ["nvmlDeviceGetTotalEnergyConsumption"]}
    args = bench_args(tiny_model, tmp_path, max_steps=8, peft_method="lora", system_metrics_interval=0.05)
    use_fake_nvml(monkeypatch, gpu)
    assert bench_train.main(args) == 0, capfd.readouterr().err[-3000:]
    dump = read_dump(tmp_path / "bench.json")
    summary, tokens = dump["summary"], measured(dump, STEP_TOKENS)
    vocab = json.loads((Path(tiny_model) / "config.json").read_text())["vocab_size"]
    sequence_length = tokens / measured(dump, STEP_SAMPLES)
    flops = 4 * tiny_llama_matmul_weights(vocab) + 6 * LORA_WEIGHTS + attention_flops(sequence_length)
    assert summary["model_flops_per_token"] == pytest.approx(flops)
    assert summary["mfu"] is None and summary["peak_tflops_per_device"] is None  # CPU: no guessed peak
    notes = {}
    for record in read_journal(str(tmp_path / "bench.journal.jsonl")):
        if record["type"] == "note":
            notes.update(record)
    truth = 200.0 * (notes["train_end"] - notes["train_start"] - notes["warmup_seconds"])
    assert summary["energy_source"] == "integrated_power"
    assert summary["energy_joules"] == pytest.approx(truth, rel=0.05)
    assert summary["joules_per_token"] == pytest.approx(summary["energy_joules"] / tokens)


@pytest.mark.slow
def test_a_rank_with_a_slow_forward_pass_is_named_by_its_forward_time(tiny_model, tmp_path):
    """Rank 1's forward passes sleep 50 ms: both ranks' steps last as long, its forward time shows it. (Rank 0's own
    compute is not a floor: on two shared cores it gets the CPU rank 1 sleeps away.) Rank 0 waits for rank 1 in the
    step's collectives; steps 2-3 are profiled on both ranks, each into its own trace."""
    args = bench_args(
        tiny_model, tmp_path, max_steps=6, callbacks=f"{BENCH_CALLBACKS}:SlowForward", profile_steps="2-3"
    )
    returncode, _, stderr = run_bench(args, torchrun=True, SLOW_FORWARD_SECONDS="0.05", SLOW_FORWARD_RANK="1")
    assert returncode == 0, stderr
    dump = read_dump(tmp_path / "bench.json")
    summary = dump["summary"]
    assert_parts_sum_to_step_times(dump)
    assert summary["step_parts"]["communication"] > 0
    traces = dump["profile"]["traces"]
    assert [entry["rank"] for entry in traces] == [0, 1] and all(entry["missing"] is None for entry in traces)
    assert len({entry["trace"] for entry in traces}) == 2 and all((tmp_path / e["trace"]).is_file() for e in traces)
    fast, slow = summary["rank_forward_time_p50"]
    assert slow >= 0.05 and slow > fast
    assert summary["rank_skew"] == pytest.approx(slow / fast) and summary["rank_skew"] > 1
    assert len(summary["rank_data_wait_p50"]) == 2 and len(summary["rank_data_fetch_p50"]) == 2
    assert (summary["straggler_rank"], summary["straggler_cause"]) == (1, "compute")


@pytest.mark.slow
def test_a_rank_with_a_slow_input_pipeline_is_named_by_its_own_data_fetch(tiny_model, tmp_path):
    """Rank 0's collation sleeps 0.15 s per micro-batch. Both ranks' data wait holds it (the count of the batch's
    items across ranks waits for rank 0); only rank 0's own fetch does, so the dump and bench_report name rank 0 and
    "data". The dump's config says what ran: two processes of the flags given."""
    args = bench_args(
        tiny_model,
        tmp_path / "runs",
        max_steps=6,
        callbacks=f"{BENCH_CALLBACKS}:SlowDataFetch",
        system_metrics_interval=0,
    )
    returncode, _, stderr = run_bench(args, torchrun=True, SLOW_FETCH_SECONDS="0.15", SLOW_FETCH_RANK="0")
    assert returncode == 0, stderr
    dump = read_dump(tmp_path / "runs" / "bench.json")
    summary = dump["summary"]
    slow, fast = summary["rank_data_fetch_p50"]
    assert slow >= 0.15 > fast and min(summary["rank_data_wait_p50"]) >= 0.15
    assert (summary["straggler_rank"], summary["straggler_cause"], summary["data_fetch_unmeasurable"]) == (
        0,
        "data",
        None,
    )
    # Rank 1 waits for rank 0's batches in the count of their items, a collective; rank 0 hardly waits.
    waiting, waited_for = summary["rank_collective_wait_p50"][1], summary["rank_collective_wait_p50"][0]
    assert waiting >= 0.1 > waited_for
    assert sum(summary["rank_tokens_per_second"]) == pytest.approx(summary["tokens_per_second"], rel=0.1)
    config = dump["config"]
    assert (config["world_size"], config["per_device_train_batch_size"], config["max_steps"]) == (2, 4, 6)
    assert config["model_name_or_path"] == tiny_model and "output_dir" not in config
    report = load_script(REPO_ROOT / "wrappers" / "bench_report.py")
    report.main(str(tmp_path / "runs"), output_dir=str(tmp_path / "report"))
    assert csv_by(tmp_path / "report" / "report.csv", "run")["bench"]["straggler"] == "rank 0: data"


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
        (
            lambda d: {"stop_after_seconds": "soon"},
            "--stop_after_seconds/--stop-after-seconds: invalid float value: 'soon'",
        ),
        (lambda d: {"callbacks": "tests.helpers.nowhere:Nothing"}, "--callbacks tests.helpers.nowhere:Nothing"),
        (lambda d: {"peak_tflops": "0"}, "--peak_tflops must be positive, got 0.0"),
        (lambda d: {"profile_steps": "50-60"}, "--profile_steps 50-60 ends after the run's last step (--max_steps 3)"),
        (lambda d: {"profile_memory": "True"}, "--profile_memory needs --profile_steps"),
        (lambda d: {"max_stesp": "3"}, "unknown flag --max_stesp; did you mean --max_steps?"),
        (lambda d: {"stop_after_second": "3"}, "unknown flag --stop_after_second; did you mean --stop_after_seconds?"),
        (
            lambda d: {"max_seq_length": "4"},
            f"--training_data_path {SAMPLE_TRAIN_PATH}: none of its 96 rows keeps a token to train on: 96 lost every "
            "label to truncation at --max_seq_length 4",
        ),
    ],
)
def test_bad_input_fails_before_training(bench_train, tiny_model, tmp_path, capsys, make_flags, message):
    flags = {"metrics_path": tmp_path / "bench.json", "memory_estimate": False, **make_flags(tmp_path)}
    assert bench_train.main(cli_args(tiny_model, str(tmp_path), **flags)) == 1
    marker = [line for line in capsys.readouterr().err.splitlines() if line.startswith("TUNING_ERROR")]
    assert len(marker) == 1 and "category=user_error" in marker[0] and message in marker[0]
    journal = tmp_path / "bench.journal.jsonl"
    if journal.exists():  # the metrics path was usable: the dump says what went wrong, and nothing trained
        dump = read_dump(tmp_path / "bench.json")
        assert dump["status"] == "error" and dump["error"]["category"] == "user_error"
        assert dump["training_steps"] == 0 and not dump["metrics"]


def test_data_processing_only_writes_the_data_and_a_dump_of_no_steps_that_names_it(bench_train, tiny_model, tmp_path):
    """--do_dataprocessing_only: train() writes the processed data and trains nothing; the run exits 0 with a dump of
    status ok, 0 steps, the data it processed and no model, --save_model_dir notwithstanding."""
    flags = {
        "metrics_path": tmp_path / "bench.json",
        "do_dataprocessing_only": True,
        "num_train_dataset_shards": 2,
        "save_model_dir": tmp_path / "model",
        "system_metrics_interval": 0,
        "memory_estimate": False,
    }
    assert bench_train.main(cli_args(tiny_model, str(tmp_path / "out"), **flags)) == 0
    shards = sorted(path.name for path in (tmp_path / "out" / "train_dataset").glob("*.parquet"))
    assert shards == ["ds_00000.parquet", "ds_00001.parquet"] and not (tmp_path / "model").exists()
    dump = read_dump(tmp_path / "bench.json")
    assert (dump["status"], dump["training_steps"], dump["error"]) == ("ok", 0, None)
    assert dump["summary"]["tokens_per_second"] is None and dump["config"]["do_dataprocessing_only"] is True
    assert dump["data"]["data_config_path"] is None
    assert [(d["name"], d["data_paths"]) for d in dump["data"]["datasets"]] == [("training_data", [SAMPLE_TRAIN_PATH])]


def test_a_run_reads_its_data_config_once_and_dumps_the_hash_of_what_it_read(bench_train, tiny_model, tmp_path):
    """bench_train's job start (the dump's configuration, the checks, the vision test, the dump's description) and
    train() (the data preparation) read the data config file once between them; the dump's configuration and its
    data description both carry the hash of those bytes."""
    dataset = {"name": "samples", "data_paths": [SAMPLE_TRAIN_PATH]}
    config = write_config(tmp_path / "data.yaml", {"datasets": [dataset]})
    flags = {"training_data_path": None, "data_config_path": config, "metrics_path": tmp_path / "d.json"}
    flags.update(memory_estimate=False, system_metrics_interval=0)
    with FileReads(config) as reads:
        assert bench_train.main(cli_args(tiny_model, str(tmp_path / "out"), **flags)) == 0
        assert reads.count() == 1
    dump = read_dump(tmp_path / "d.json")
    read = hashlib.sha256(Path(config).read_bytes()).hexdigest()
    assert dump["status"] == "ok" and dump["config"]["data_config_sha256"] == dump["data"]["data_config_sha256"] == read


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


def test_one_parser_reads_both_flag_sets_as_typed(bench_train):
    """The wrapper's flags (a dataclass) and the trainer's, in any order, each value with its field's type."""
    trainer_tokens = ["--experiment", "123", "--exp_metadata", '{"a": 1}', "--max_steps", "3", "--use_peft"]
    wrapper_tokens = ["--metadata", '{"b": true}', "--auto_stop", "--metrics-path=m.json", "--stall_timeout", "9"]
    trainer_flags = set(re.findall(r"--\w+", get_parser().format_help()))
    assert not {f"--{spec.name}" for spec in dataclasses.fields(bench_train.BenchmarkFlags)} & trainer_flags

    argv = ["--output_dir", "out", *trainer_tokens[:4], *wrapper_tokens, *trainer_tokens[4:]]
    flags, args = bench_train.benchmarking.parse_command_line(bench_train.BenchmarkFlags, argv)
    assert args.aim_config.experiment == "123" and args.experiment_metadata == {"a": 1}
    assert args.training_args.max_steps == 3 and args.tune_config.r == 8
    assert flags.metadata == '{"b": true}' and flags.auto_stop is True and flags.stall_timeout == 9.0
    assert flags.metrics_path == "m.json" and flags.system_metrics_interval == 5.0
    flags, args = bench_train.benchmarking.parse_command_line(bench_train.BenchmarkFlags, ["--auto_stop", "False"])
    assert flags.auto_stop is False and args.tune_config is None


def test_a_job_config_holds_the_trainer_s_arguments_and_may_hold_the_wrapper_s(bench_train, monkeypatch):
    """With SFT_TRAINER_CONFIG_JSON_*, the trainer's arguments come from the job config; the wrapper's flags from its
    keys and, over those, the command line."""
    config = {"model_name_or_path": "m", "max_steps": 7, "auto_stop_min_steps": 3, "stall_timeout": 4}
    monkeypatch.setenv("SFT_TRAINER_CONFIG_JSON_ENV_VAR", base64.b64encode(json.dumps(config).encode()).decode())
    argv = ["--stall_timeout", "9", "--max_steps", "99"]
    flags, args = bench_train.benchmarking.parse_command_line(bench_train.BenchmarkFlags, argv)
    assert args.model_args.model_name_or_path == "m" and args.training_args.max_steps == 7
    assert (flags.auto_stop_min_steps, flags.stall_timeout, flags.skip_warmup_steps) == (3, 9.0, 5)


def test_a_rerun_into_the_same_output_dir_measures_a_whole_run(bench_train, tiny_model, tmp_path, capfd):
    """sft_trainer resumes from output_dir's last checkpoint (fms-hf-tuning v3.1.0); bench_train only when told."""
    args = bench_args(tiny_model, tmp_path, max_steps=2, save_strategy="steps", save_steps=1, skip_warmup_steps=0)
    for _ in range(2):
        assert bench_train.main(args) == 0, capfd.readouterr().err[-3000:]
        assert series(read_dump(tmp_path / "bench.json"), STEP_TIME)["steps"] == [1, 2]
    assert (tmp_path / "checkpoint-2").is_dir()
    assert not list(tmp_path.glob("*.safetensors"))  # no final model unless --save_model_dir


def test_a_resume_with_another_configuration_is_refused_naming_the_difference(bench_train, tiny_model, tmp_path):
    """A resumed run continues its journal; resumed with other work (another batch size here) it would mix two runs'
    steps in one dump: refused as a user error naming each difference, the journal left as it was."""
    import numpy
    from safetensors.numpy import save_file

    from tuning.benchmarking.job import BenchmarkJob
    from tuning.errors import UserInputError
    from tuning.utils.checkpoints import mark_complete

    def start(batch_size: int, **extra) -> BenchmarkJob:
        argv = [*bench_args(tiny_model, tmp_path, per_device_train_batch_size=batch_size, **extra)]
        flags, args = bench_train.benchmarking.parse_command_line(bench_train.BenchmarkFlags, argv)
        job = BenchmarkJob()
        try:
            job.start(flags, args)
        finally:
            if job.metrics_path_lock is not None:
                os.close(job.metrics_path_lock)
        return job

    start(2).record.journal.close()  # the first segment's start, as a run preempted before its first step leaves it
    checkpoint = tmp_path / "checkpoint-1"
    checkpoint.mkdir()
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": 1}))
    save_file({"w": numpy.zeros(2, dtype=numpy.float32)}, str(checkpoint / "adapter_model.safetensors"))
    mark_complete(str(checkpoint), 1, 1)
    journal = tmp_path / "bench.journal.jsonl"
    before = journal.read_bytes()
    with pytest.raises(UserInputError, match=r"another configuration \(per_device_train_batch_size 2 → 4\)"):
        start(4, resume_from_checkpoint="true")
    assert journal.read_bytes() == before
    start(2, resume_from_checkpoint="true").record.journal.close()  # the same work resumes
    assert [record["type"] for record in read_journal(str(journal))].count("start") == 2


def test_a_run_that_never_leaves_its_warmup_says_so(bench_train, tiny_model, tmp_path, caplog, capfd):
    """Its figures then cover the warmup too and goodput has no productive part: one warning names the flags. A run
    past its warmup gets none."""
    with caplog.at_level(logging.WARNING, logger="tuning.benchmarking.job"):
        assert bench_train.main(bench_args(tiny_model, tmp_path / "short", max_steps=2, skip_warmup_steps=5)) == 0
        short = read_dump(tmp_path / "short" / "bench.json")
        warned = [record.getMessage() for record in caplog.records if "never left its warmup" in record.getMessage()]
        caplog.clear()
        assert bench_train.main(bench_args(tiny_model, tmp_path / "long", max_steps=3)) == 0, capfd.readouterr().err
        long = read_dump(tmp_path / "long" / "bench.json")
        assert not [record for record in caplog.records if "never left its warmup" in record.getMessage()]
    assert short["summary"]["measured_steps"] == 0 and short["summary"]["goodput"]["parts"]["productive_steps"] == 0
    assert warned == [
        "the run never left its warmup (--skip_warmup_steps, --skip_warmup_seconds): its step figures cover all 2 "
        "steps, warmup included, and goodput has no productive part; train longer or warm up less"
    ]
    assert long["summary"]["measured_steps"] == 2
