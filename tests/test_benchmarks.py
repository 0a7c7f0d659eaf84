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
            "bench_train": {"BenchmarkCallback", "SafeAimCallback", "GracefulStopCallback"},
            "bench_train_no_aim": {"BenchmarkCallback", "GracefulStopCallback"},
        }
        assert ours == expected[run["arm"]]
        # Each step's end, and the helper processes' spells of work (the journal's writer's, Aim's), were recorded.
        assert len(run["attribution"]["step_ends"]) == 2
        spells = run["attribution"]["helper_spells"]
        assert (len(spells) > 0) == run["arm"].startswith("bench_train")
        assert all(start <= end for start, end in spells)
        # The journal's writer in both bench arms (the tracker helper's messages are not timed by the attribution).
        helpers = {"trl": 0, "sft_trainer": 0, "bench_train": 1, "bench_train_no_aim": 1}
        assert run["attribution"]["helper_processes"] == helpers[run["arm"]]
    # Child processes' CPU (counted in 10 ms ticks: over two steps it may round either way) only where there are some.
    children = {arm: row["attribution"]["child_processes_cpu_us"] for arm, row in results["summary"].items()}
    assert children["trl"] == children["sft_trainer"] == 0
    for arm, row in results["summary"].items():
        assert row["same_work"], arm
        assert row["runs"] == 1 and row["process"]["ratio"] > 0
    assert results["dump"]["points"] == 1000 and results["dump"]["bytes"] > 0
    assert results["interference"]["slowdown_percent"] is None  # two steps are too few to measure it
    table = capsys.readouterr().out
    assert "| bench_train | 1 |" in table and "Dump of 1,000 points" in table and "our hooks µs/step" in table
    assert "Too few steps overlapped helper work" in table


def test_interference_is_the_slowdown_of_steps_beside_helper_work_within_their_run():
    """Steps a helper's spell covers against the other steps of the same run; placebos (spells moved) find none."""
    durations = [0.010] * 300
    spells = []
    for first in (50, 150):
        durations[first : first + 10] = [0.012] * 10  # 20 % slower beside the helper
    step_ends = [sum(durations[: index + 1]) for index in range(len(durations))]
    for first in (50, 150):
        spells.append([step_ends[first - 1], step_ends[first + 9]])
    attribution = {"step_ends": step_ends, "helper_spells": spells}
    run = overhead.Run("bench_train", 0, 1.0, 1.0, 1.0, 1.0, 0.01, [], attribution)
    measured = overhead.interference([run])
    assert measured["steps"] == 20 and round(measured["slowdown_percent"], 6) == 20
    assert all(abs(percent) < 1e-9 for percent in measured["placebo_percent"])  # moved, they cover usual steps


def test_interference_compares_with_the_steps_around_so_that_drift_cancels():
    """A machine that slows down through the run (10 ms steps to 20 ms): late steps are slow anyway, so only their
    neighbours tell what a helper's work added (against the run's median they came out 28 % slower)."""
    durations = [0.010 + 0.010 * index / 299 for index in range(300)]
    firsts = range(150, 290, 10)
    for first in firsts:
        durations[first] *= 1.1  # 10 % slower beside the helper
    step_ends = [sum(durations[: index + 1]) for index in range(len(durations))]
    attribution = {
        "step_ends": step_ends,
        "helper_spells": [[step_ends[first - 1], step_ends[first]] for first in firsts],
    }
    run = overhead.Run("bench_train", 0, 1.0, 1.0, 1.0, 1.0, 0.01, [], attribution)
    measured = overhead.interference([run])
    assert measured["steps"] == len(firsts) and abs(measured["slowdown_percent"] - 10) < 0.5
    assert all(abs(percent) < 1 for percent in measured["placebo_percent"])
