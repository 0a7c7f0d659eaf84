"""benchmarks/: the overhead comparison's machinery on a two-step run of every arm, and the record-size measurement.
No timing is asserted: that is the benchmarks' job, on a quiet machine."""

import json

import pytest

from benchmarks import overhead, record_size


@pytest.mark.slow
def test_every_arm_runs_the_same_work_and_the_results_are_written(tmp_path, capsys):
    """One round of two arms, then each under py-spy (the dev extra installs it): bare TRL and bench_train, the two
    ends (sft_trainer's arm is bench_train's command without the wrapper, and the arm with Aim on the same command
    with --tracker aim: its Aim is tested in tests/trackers/)."""
    output = tmp_path / "overhead.json"
    argv = ["--cases", "stress", "--pairs", "1", "--max_steps", "5", "--no_warmup", "--output", str(output)]
    arms = ["trl", "bench_train_no_aim"]
    overhead.main([*argv, "--arms", ",".join(arms)])
    results = json.loads(output.read_text())
    assert [run["arm"] for run in results["runs"]] == arms
    for run in results["runs"]:
        assert len(run["losses"]) == 5
        assert 0 < run["step_s"] < run["loop_s"] < run["process_s"]
    for row in results["summary"]:
        assert row["same_work"] and row["runs"] == 1 and row["process"]["ratio"] > 0, row
    out = capsys.readouterr().out
    assert "| stress | bench_train_no_aim | 1 |" in out
    assert [row["arm"] for row in results["profile"]] == arms
    for row in results["profile"]:
        assert row["loop_samples"] > 0 and 0 <= row["share_low"] <= row["share"] <= row["share_high"], row
    # Bare TRL runs no code of ours inside its loop: nothing the arms share is counted as ours.
    assert results["profile"][0]["own_loop_samples"] == 0
    for row in results["profile"][1:]:  # every process imports, parses flags and builds its trainer: some of it ours
        assert 0 < row["own_process_samples"] < row["process_samples"], row
        assert row["process_share_low"] <= row["process_share"] <= row["process_share_high"], row
    assert "| stress | bench_train_no_aim |" in out.split("ours in the loop")[1]


def test_py_spy_samples_count_our_code_in_the_loop_and_in_the_process():
    root, lib = overhead.REPO_ROOT, "/venv/lib/python3.11/site-packages"
    loop = f"Trainer._inner_training_loop ({lib}/transformers/trainer.py:1660)"
    above = f"thread (7): MainThread;<module> ({root}/wrappers/bench_train.py:9);train ({root}/tuning/sft_trainer.py:4)"
    data = f"tokenize_and_mask ({root}/tuning/data/masking.py:40)"
    raw = "\n".join(
        [
            f"{above};Trainer.train ({lib}/transformers/trainer.py:1576);{loop};backward ({lib}/torch/a.py:1) 90",
            f"{above};{loop};CallbackHandler.call_event ({lib}/transformers/t.py:5);BenchmarkCallback.on_step_end "
            f"({root}/tuning/benchmarking/callback.py:130);sum ({lib}/torch/b.py:7) 7",
            f"thread (7);{loop};FileLoggingCallback.on_log ({root}/tuning/trackers/filelogging_tracker.py:74) 3",
            # After the loop's train_runtime: closing a tracker is the process's time, not the loop's.
            f"{above};{loop};Trainer._finalize_training ({lib}/transformers/trainer.py:2038);on_train_end ({root}/"
            "tuning/trackers/isolated.py:9) 30",
            f"thread (9): journal-writer;Journal._write_queued ({root}/tuning/benchmarking/journal.py:80) 40",
            f"{above};load_model ({lib}/transformers/modeling.py:3) 500",
            f"{above};{data};encode ({lib}/tokenizers/t.py:2) 60",  # bare TRL builds its dataset with it too
            f"{above};{data};_rows ({root}/tuning/data/masking.py:70) 20",
            f"thread (7): MainThread;<module> ({root}/wrappers/bench_train.py:30);<module> (/venv/fire/core.py:1) 45",
            f"thread (7): MainThread;main ({root}/wrappers/bench_train.py:460);close ({root}/tuning/i.py:1) 15",
            "thread (7): MainThread 1000",  # the interpreter's teardown: no Python frame
            f"{above};<module> (<generated",  # a frame name holding a line break cuts its stack in two
            "(---- code>:1) 4",
        ]
    )
    shared = overhead.baseline_functions(
        f"thread (3): MainThread;main (/x/bare_trl.py:5);{data};_rows ({root}/tuning/data/masking.py:71) 5"
    )
    assert shared == {f"tokenize_and_mask ({root}/tuning/data/masking.py", f"_rows ({root}/tuning/data/masking.py"}
    assert overhead.count_samples(raw, shared) == (100, 10, 770, 7 + 3 + 30 + 45 + 15)
    # Without the baseline's functions the dataset glue would count as ours too.
    assert overhead.count_samples(raw).own_process_samples == 7 + 3 + 30 + 45 + 15 + 20
    share, low, high = overhead.share_interval(10, 100)
    assert low < share == 0.1 < high and overhead.share_interval(0, 100)[1] == 0


def test_ratios_are_medians_of_per_round_ratios_to_the_baseline():
    """Each round's run against the same round's trl run, so that a machine's drift between rounds cancels."""

    def run(arm: str, round_index: int, seconds: float) -> overhead.Run:
        return overhead.Run("stress", arm, round_index, seconds, seconds / 2, seconds / 200, [1.0])

    runs = [run("trl", 0, 10), run("bench_train", 0, 11), run("trl", 1, 20), run("bench_train", 1, 22)]
    runs.append(run("trl", 2, 30))
    runs.append(overhead.Run("stress", "bench_train", 2, 30.3, 15.15, 0.1515, [2.0]))
    rows = {row["arm"]: row for row in overhead.summarise(runs)}
    assert rows["bench_train"]["process"]["ratio"] == pytest.approx(1.1)
    assert rows["bench_train"]["process"]["median_s"] == 22 and rows["trl"]["loop"]["ratio"] == 1
    assert not rows["bench_train"]["same_work"] and rows["trl"]["same_work"]
    # The middle half of the three rounds' ratios (1.1, 1.1, 1.01): a 1.08 target inside it is unresolved.
    process = rows["bench_train"]["process"]
    assert (process["ratio_q1"], process["ratio_q3"]) == (pytest.approx(1.055), pytest.approx(1.1))
    assert overhead.verdict(process, 1.08) == "≈"
    assert overhead.verdict(process, 1.2) == "✓" and overhead.verdict(process, 1.0) == "✗"


def test_record_size_measures_bytes_per_point_and_the_dump(capsys):
    result = record_size.main(["--points", "2000"])
    assert result["points"] == 2000 and result["bytes_per_point"] > 0
    assert result["build_s"] > 0 and result["dump_mb"] > 0
    assert "2,000 points" in capsys.readouterr().out


@pytest.mark.slow
def test_aim_helper_cpu_measures_the_helpers_cpu_idle_and_tracking(capsys):
    from benchmarks import aim_helper_cpu  # imports Aim: only where it runs

    result = aim_helper_cpu.main(["--steps", "20", "--step_seconds", "0.01", "--rounds", "1"])
    assert (result["steps"], result["values_per_step"], result["rounds"]) == (20, 7, 1)
    assert result["helper_cpu_s_idle"][0] > 0 and result["helper_cpu_s_tracking"][0] > 0
    assert json.loads(capsys.readouterr().out) == result
