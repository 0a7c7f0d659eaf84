"""benchmarks/overhead.py's machinery on a two-step run of every arm: the commands work, the timings are parsed,
the work is identical across arms and the results file is complete. No timing is asserted: that is the benchmark's
job, on a quiet machine."""

import json

from benchmarks import overhead


def test_every_arm_runs_the_same_work_and_the_results_are_written(tmp_path, capsys):
    output = tmp_path / "overhead.json"
    overhead.main(["--pairs", "1", "--max_steps", "2", "--no_warmup", "--dump_points", "1000", "--output", str(output)])
    results = json.loads(output.read_text())
    assert [run["arm"] for run in results["runs"]] == ["trl", "sft_trainer", "bench_train"]
    for run in results["runs"]:
        assert len(run["losses"]) == 2
        assert 0 < run["loop_s"] < run["process_s"] and 0 < run["startup_s"] < run["process_s"]
        assert run["cpu_s"] > 0
    for arm, row in results["summary"].items():
        assert row["same_work"], arm
        assert row["runs"] == 1 and row["process"]["ratio"] > 0
    assert results["dump"]["points"] == 1000 and results["dump"]["bytes"] > 0
    table = capsys.readouterr().out
    assert "| bench_train | 1 |" in table and "Dump of 1,000 points" in table
