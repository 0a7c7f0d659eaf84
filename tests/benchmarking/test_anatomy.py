"""Step anatomy and profiles (tuning.benchmarking.anatomy, .profiling) through bench_train's main in this process: the
tiny model, a real collate function that sleeps, a real profiler window and a real out-of-memory error raised inside
the training loop (CUDA's own exception type: no GPU here)."""

import gzip
import json
from pathlib import Path

import pytest

from tests.helpers.bench import assert_parts_sum_to_step_times, bench_args, read_dump
from tests.helpers.training import BENCH_CALLBACKS, BENCH_TRAIN, load_script
from tuning.benchmarking.anatomy import PARTS, bound_by
from tuning.benchmarking.profiling import parse_window
from tuning.errors import UserInputError


@pytest.fixture(scope="module")
def bench_train():
    return load_script(BENCH_TRAIN)


def short_run(model: str, output_dir: Path, **flags) -> list[str]:
    """bench_train's flags for four steps, no tracker, no system samples; ``flags`` added."""
    return bench_args(model, output_dir, max_steps=4, tracker="none", system_metrics_interval=0, **flags)


def test_a_run_whose_collate_sleeps_is_bound_by_data_and_its_window_traces_steps_3_and_4_only(
    bench_train, tiny_model, tmp_path, monkeypatch, capfd
):
    """Every micro-batch's collation sleeps 0.2 s: the steps wait on data, and the dump says so with the shares that
    decided it. Steps 3-4 are profiled: one gzipped trace holding those two steps, the top operators in the dump and
    their table beside the trace."""
    monkeypatch.setenv("SLOW_FETCH_SECONDS", "0.2")
    monkeypatch.setenv("SLOW_FETCH_RANK", "0")
    args = short_run(tiny_model, tmp_path, callbacks=f"{BENCH_CALLBACKS}:SlowDataFetch", profile_steps="3-4")
    assert bench_train.main(args) == 0, capfd.readouterr().err[-3000:]
    dump = read_dump(tmp_path / "bench.json")
    summary = dump["summary"]
    assert summary["bound_by"] == "data", summary["bound_by_shares"]
    assert summary["step_parts"]["data"] > 0.5 and summary["bound_by_shares"]["data"] == summary["step_parts"]["data"]
    assert set(summary["step_parts"]) == set(PARTS) - {"communication"}  # one process: no collectives
    assert_parts_sum_to_step_times(dump)

    profile = dump["profile"]
    assert profile["steps"] == profile["profiled_steps"] == [3, 4] and profile["missing"] is None
    (files,) = profile["traces"]
    assert files["rank"] == 0 and files["missing"] is None and files["steps"] == [3, 4]
    with gzip.open(tmp_path / files["trace"]) as handle:
        events = json.load(handle)["traceEvents"]
    steps = {event["name"] for event in events if str(event.get("name", "")).startswith("ProfilerStep#")}
    assert steps == {"ProfilerStep#3", "ProfilerStep#4"}
    ops = profile["top_ops"]["cpu"]
    assert 0 < len(ops) <= 20 and any(op["name"] == "aten::mm" for op in ops)
    assert ops == sorted(ops, key=lambda op: op["self_cpu_us"], reverse=True)
    table = (tmp_path / files["table"]).read_text()
    assert "Self CPU" in table and ops[0]["name"][:40] in table


def test_no_room_for_the_trace_costs_the_trace_not_the_run_and_an_oom_says_why_it_has_no_snapshot(
    bench_train, tiny_model, tmp_path, capfd
):
    """The profile's folder cannot be made (a file stands in its place): steps 1-2 are profiled, nothing is written,
    training goes on to step 3, where CUDA's out-of-memory error ends it; the dump says the trace is missing and
    why, and that --oom_snapshot had no CUDA device to record (on a GPU: gpu_check)."""
    (tmp_path / "bench.profile").write_text("in the way")
    out_of_memory = f"{BENCH_CALLBACKS}:OutOfMemoryOnLastRank"
    args = short_run(tiny_model, tmp_path, callbacks=out_of_memory, profile_steps="1-2", oom_snapshot=True)
    assert bench_train.main(args) == 204, capfd.readouterr().err[-3000:]
    dump = read_dump(tmp_path / "bench.json")
    assert dump["error"]["category"] == "gpu_oom" and dump["training_steps"] == 2
    (files,) = dump["profile"]["traces"]
    assert files["trace"] is None and files["table"] is None
    assert files["missing"].startswith("trace: ") and "Not a directory" in files["missing"]
    assert dump["profile"]["top_ops"]["cpu"]  # measured all the same
    assert dump["oom_snapshot"] == {
        "memory_snapshot": None,
        "memory_snapshot_html": None,
        "missing": "no CUDA device was recording: a memory snapshot needs one",
    }


@pytest.mark.parametrize(
    ("window", "max_steps", "message"),
    [
        ("50-60", 20, "--profile_steps 50-60 ends after the run's last step (--max_steps 20)"),
        ("4-2", 20, "A must not exceed B"),
        ("0-2", 20, "the steps are counted from 1"),
        ("3", 20, "as A-B"),
        ("3-x", 20, "as A-B"),
    ],
)
def test_bad_windows_are_user_errors(window, max_steps, message):
    with pytest.raises(UserInputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_window(window, max_steps)


def test_a_window_past_an_epoch_run_s_unknown_end_is_accepted():
    assert parse_window(" 50 - 60 ", -1) == (50, 60)


def test_bound_by_counts_a_gpu_s_idle_compute_time_as_host():
    shares = {"data": 0.1, "forward": 0.3, "backward": 0.3, "optimizer": 0.1, "rest": 0.2}
    assert bound_by(shares)[0] == "compute"
    bound, figures = bound_by(shares, gpu_utilization=25.0)
    assert bound == "host" and figures["compute"] == pytest.approx(0.175) and figures["host"] == pytest.approx(0.725)
    assert bound_by({}) == (None, {})
