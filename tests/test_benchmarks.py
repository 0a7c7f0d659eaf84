"""benchmarks/overhead.py's machinery on a two-step run of every arm: the commands work, the timings are parsed,
the work is identical across arms and the results file is complete. No timing is asserted: that is the benchmark's
job, on a quiet machine."""

import json

from benchmarks import overhead


def test_every_arm_runs_the_same_work_and_the_results_are_written(tmp_path, capsys):
    output = tmp_path / "overhead.json"
    overhead.main(["--pairs", "1", "--max_steps", "2", "--no_warmup", "--dump_points", "1000", "--output", str(output)])
    results = json.loads(output.read_text())
    assert [run["arm"] for run in results["runs"]] == ["trl", "sft_trainer", "bench_train", "bench_train_no_aim"]
    for run in results["runs"]:
        assert len(run["losses"]) == 2
        assert 0 < run["loop_s"] < run["process_s"] and 0 < run["startup_s"] < run["process_s"]
        assert 0 < run["step_s"] < run["loop_s"] and run["cpu_s"] > 0
        # The in-run attribution saw the trainer's callbacks in every arm, and ours only in ours.
        hooks = run["attribution"]["hook_seconds"]
        assert run["attribution"]["steps"] == 2 and any(name.startswith("transformers.") for name in hooks)
        ours = {name.rsplit(".", 1)[-1] for name in hooks if not name.startswith(("transformers.", "trl."))}
        expected = {
            "trl": set(),
            "sft_trainer": {"FileLoggingCallback", "GracefulStopCallback"},
            "bench_train": {"BenchmarkCallback", "BenchmarkAimCallback", "GracefulStopCallback"},
            "bench_train_no_aim": {"BenchmarkCallback", "GracefulStopCallback"},
        }
        assert ours == expected[run["arm"]]
    # The Aim writer is a child process of bench_train with Aim only.
    children = {arm: row["attribution"]["child_processes_cpu_us"] for arm, row in results["summary"].items()}
    assert children["bench_train"] > 0 == children["trl"] == children["bench_train_no_aim"]
    for arm, row in results["summary"].items():
        assert row["same_work"], arm
        assert row["runs"] == 1 and row["process"]["ratio"] > 0
    assert results["dump"]["points"] == 1000 and results["dump"]["bytes"] > 0
    table = capsys.readouterr().out
    assert "| bench_train | 1 |" in table and "Dump of 1,000 points" in table and "our hooks µs/step" in table
