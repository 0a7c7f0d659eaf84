"""wrappers/bench_compare.py: synthetic dumps with known answers (in process) for each way the data can fail to
support a verdict (values that are not positive numbers, one run a side, identical values, different configurations,
dumps without a config block, failed runs), the command line's bad input, and real sweeps of the tiny model (one
baseline sweep of four repeats, one candidate sweep slowed by 30 % per step, run at the same time): the candidate
is slower within run than the baseline's first repeat (exit 1); the baseline's repeats, 2 a side, are inconclusive,
never slower (exit 0), and say how many runs would decide."""

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path
from statistics import median

import pytest
import yaml

from tests.helpers.bench import csv_by
from tests.helpers.dumps import mlperf_runs, write_dump
from tests.helpers.training import (
    BENCH_CALLBACKS,
    REPO_ROOT,
    RESPONSE_TEMPLATE,
    cli_args,
    load_script,
    run_python,
    subprocess_env,
)
from tuning.benchmarking import compare, quality, statistics
from tuning.utils.tiny_model import SAMPLE_TRAIN_PATH

BENCH_COMPARE = REPO_ROOT / "wrappers" / "bench_compare.py"
BENCH_SWEEP = REPO_ROOT / "wrappers" / "bench_sweep.py"
CONFIG = {"model_name_or_path": "tiny", "per_device_train_batch_size": 2, "max_seq_length": 128, "world_size": 1}
# Seconds per step of six runs: about 1 % apart from run to run.
SECONDS = [0.500, 0.504, 0.497, 0.502, 0.495, 0.506]


@pytest.fixture(scope="module")
def bench_compare():
    return load_script(BENCH_COMPARE)


def series_values(dump: dict, name: str) -> list[float]:
    return next(one["values"] for one in dump["metrics"] if one["name"] == name and not one["context"])


def compare_command(*args: str) -> subprocess.CompletedProcess:
    return run_python(str(BENCH_COMPARE), *args, timeout=120)


def read_rows(path: Path) -> dict[str, dict[str, str]]:
    return csv_by(path, "point")


def runs(directory: Path, seconds_per_run: list[float], metadata: dict, config: dict | None = CONFIG, **summary):
    """One dump per entry: a run of 4 steps of that many seconds (100 tokens each, the first step warmup), the
    ``config`` block of its arguments (none: an older dump), ``summary`` values overriding the measured ones."""
    paths = []
    for index, seconds in enumerate(seconds_per_run):
        path = directory / f"{json.dumps(metadata, sort_keys=True)}-{json.dumps(config, sort_keys=True)}-{index}.json"
        dump = write_dump(path, [seconds] * 4, {**metadata, "repeat": index})
        if config is not None:
            dump["config"] = config
        dump["summary"].update(summary)
        path.write_text(json.dumps(dump))
        paths.append(path)
    return paths


def run_compare(bench_compare, tmp_path, capsys, **flags) -> tuple[int, dict[str, dict[str, str]], str]:
    out = tmp_path / "out"
    code = bench_compare.main(str(tmp_path / "base"), str(tmp_path / "cand"), output_dir=str(out), **flags)
    return code, read_rows(out / "comparison.csv"), capsys.readouterr().out


def test_six_runs_a_side_decide_with_the_statistics_module_s_numbers(bench_compare, tmp_path, capsys):
    """10 % faster at batch 1, 0.5 % slower at batch 2 (inside ±2 %), on the same six-run noise: faster and same,
    exit 0; the row's numbers are the statistics module's over the runs' throughputs."""
    runs(tmp_path / "base", SECONDS, {"batch": 1})
    runs(tmp_path / "cand", [s / 1.1 for s in SECONDS], {"batch": 1})
    runs(tmp_path / "base", SECONDS, {"batch": 2})
    runs(tmp_path / "cand", [s * 1.005 for s in reversed(SECONDS)], {"batch": 2})
    code, rows, out = run_compare(bench_compare, tmp_path, capsys)
    assert {point: row["verdict"] for point, row in rows.items()} == {"batch=1": "faster", "batch=2": "same"}
    assert code == 0 and "exit 0: all 2 points decided, none slower" in out
    base, cand = [100 / s for s in SECONDS], [100 / (s * 1.005) for s in reversed(SECONDS)]
    (expected,) = statistics.compare_points([(base, cand)], 0.02, True)[:1]
    row = rows["batch=2"]
    assert float(row["ratio"]) == pytest.approx(expected.ratio) and float(row["ratio"]) == pytest.approx(1 / 1.005)
    assert float(row["ci_low"]) == pytest.approx(expected.ci_low) and row["interval"] == "over runs"
    assert row["baseline_runs"] == row["candidate_runs"] == "6" and row["min_runs"] == "5"
    assert (tmp_path / "out" / "comparison.png").read_bytes()[:4] == b"\x89PNG"


def test_a_slower_candidate_exits_1_and_step_time_reads_the_other_way(bench_compare, tmp_path, capsys):
    runs(tmp_path / "base", SECONDS, {"batch": 1})
    runs(tmp_path / "cand", [s * 1.1 for s in SECONDS], {"batch": 1})
    for metric in ("tokens_per_second", "step_time_p50"):
        code, rows, out = run_compare(bench_compare, tmp_path, capsys, metric=metric)
        assert rows["batch=1"]["verdict"] == "slower" and code == 1, out
    code, rows, _ = run_compare(bench_compare, tmp_path, capsys, metric="step_time_p50")
    assert float(rows["batch=1"]["ratio"]) == pytest.approx(1.1)


@pytest.mark.parametrize(("side", "value", "reason"), [("cand", math.nan, "NaN"), ("base", None, "missing or null")])
def test_a_value_that_is_not_a_number_names_file_and_key_and_never_passes(
    bench_compare, tmp_path, capsys, side, value, reason
):
    """A NaN (or null) throughput in one run of either side: the point is invalid, not same; exit 2."""
    runs(tmp_path / "base", SECONDS, {"batch": 1})
    runs(tmp_path / "cand", SECONDS, {"batch": 1})
    (bad,) = runs(tmp_path / side, [0.5], {"batch": 1, "odd": 1}, tokens_per_second=value)
    bad.rename(bad.with_name("bad.json"))
    code, rows, out = run_compare(bench_compare, tmp_path, capsys, match="batch")
    assert rows["batch=1"]["verdict"] == "invalid" and code == 2
    assert f"bad.json: summary.tokens_per_second is {reason}" in rows["batch=1"]["note"]
    assert "exit 2: 1 of 1 points not compared" in out


def test_a_zero_baseline_is_named_not_a_traceback(bench_compare, tmp_path, capsys):
    runs(tmp_path / "base", SECONDS[:3], {"batch": 1}, tokens_per_second=0.0)
    runs(tmp_path / "cand", SECONDS[:3], {"batch": 1})
    code, rows, _ = run_compare(bench_compare, tmp_path, capsys)
    assert rows["batch=1"]["verdict"] == "invalid" and "summary.tokens_per_second is zero" in rows["batch=1"]["note"]
    assert code == 2


def test_one_run_a_side_is_inconclusive_unless_within_run_is_asked_for(bench_compare, tmp_path, capsys):
    """Ten steps of 0.500 to 0.527 s after the warmup, the candidate's 10 % longer: without --within_run no verdict
    (exit 0, or 3 with --strict); with it the steps decide, and the row says what its interval ignores."""
    steps = [0.5 + 0.003 * k for k in (3, 7, 0, 9, 4, 1, 8, 5, 2, 6)]
    write_dump(tmp_path / "base" / "a.json", [1.0, *steps], {"batch": 1})
    write_dump(tmp_path / "cand" / "a.json", [1.0, *(step * 1.1 for step in reversed(steps))], {"batch": 1})
    for side in ("base", "cand"):
        dump = json.loads((tmp_path / side / "a.json").read_text())
        (tmp_path / side / "a.json").write_text(json.dumps({**dump, "config": CONFIG}))
    code, rows, out = run_compare(bench_compare, tmp_path, capsys)
    row = rows["batch=1"]
    assert row["verdict"] == "inconclusive" and row["ci_low"] == "" and code == 0
    assert "one sample on a side (n=1/1)" in row["note"] and "--within_run" in row["note"]
    assert "at least 4 runs a side: the minimum the test needs (no spread to size it)" in out
    assert run_compare(bench_compare, tmp_path, capsys, strict=True)[0] == 3
    code, rows, out = run_compare(bench_compare, tmp_path, capsys, within_run=True)
    row = rows["batch=1"]
    assert row["interval"] == "within run (steps): ignores run-to-run noise" and row["candidate_runs"] == "1"
    assert row["verdict"] == "slower" and code == 1 and float(row["ratio"]) == pytest.approx(1 / 1.1)


def test_identical_values_say_identical_with_n_and_no_interval(bench_compare, tmp_path, capsys):
    runs(tmp_path / "base", [0.5] * 4, {"batch": 1})
    runs(tmp_path / "cand", [0.5] * 4, {"batch": 1})
    code, rows, out = run_compare(bench_compare, tmp_path, capsys)
    row = rows["batch=1"]
    assert row["verdict"] == "identical" and "identical values (n=4/4)" in row["note"]
    assert row["ci_low"] == row["ci_high"] == "" and row["interval"] == "none" and code == 0
    assert "| 4/4 | 200 | 200 | 1.000 | — | none |" in out
    assert run_compare(bench_compare, tmp_path, capsys, strict=True)[0] == 3


def test_different_configurations_outside_a_sweep_never_match(bench_compare, tmp_path):
    """Batch size 2 against 4, the same (empty) metadata: no ratio between them; the error names the key."""
    runs(tmp_path / "base", [0.5], {})
    runs(tmp_path / "cand", [0.5], {}, config={**CONFIG, "per_device_train_batch_size": 4})
    with pytest.raises(SystemExit) as refused:
        bench_compare.main(str(tmp_path / "base"), str(tmp_path / "cand"), output_dir=str(tmp_path / "out"))
    assert "no point is on both sides: the 2 points differ in config.per_device_train_batch_size" in str(refused.value)


def test_points_match_on_metadata_and_config_and_list_one_sided_points(bench_compare, tmp_path, capsys):
    """A key that differs on every run (``started``) splits points unless --match leaves it out; --match never
    merges runs of different configurations; a point on one side only is listed as such, and exits 2."""
    for side, started in (("base", "09:00"), ("cand", "10:00")):
        runs(tmp_path / side, SECONDS[:4], {"model": "m", "started": started})
        runs(tmp_path / side, SECONDS[:4], {"model": "m", "started": started}, config={**CONFIG, "packing": True})
    runs(tmp_path / "base", SECONDS[:4], {"model": "n", "started": "11:00"})
    with pytest.raises(SystemExit, match="the 5 points differ in config.packing, model, started"):
        run_compare(bench_compare, tmp_path, capsys)
    code, rows, _ = run_compare(bench_compare, tmp_path, capsys, match="model")
    assert set(rows) == {'config.packing=true, model="m"', 'model="m"', 'model="n"'}
    assert rows['model="n"']["verdict"] == "baseline only" and code == 2
    assert rows['config.packing=true, model="m"']["baseline_runs"] == "4"
    assert rows['config.packing=true, model="m"']["verdict"] == "inconclusive"  # 4 runs a side: 5 can decide


def test_dumps_without_a_config_block_match_on_metadata_but_never_pass(bench_compare, tmp_path, capsys):
    """Older dumps: the configuration is not recorded, the point says so and the exit code is 2 even when the
    statistics say same."""
    runs(tmp_path / "base", SECONDS, {"batch": 1}, config=None)
    runs(tmp_path / "cand", list(reversed(SECONDS)), {"batch": 1}, config=None)
    code, rows, out = run_compare(bench_compare, tmp_path, capsys)
    (row,) = rows.values()
    assert row["verdict"] == "same" and code == 2
    assert "configuration not recorded (old schema)" in row["note"]
    assert "exit 2: 1 points without a recorded configuration" in out


def test_a_sweep_with_half_its_points_failed_exits_2_naming_them(bench_compare, tmp_path, capsys):
    """Two of four points of the candidate sweep ended in errors: their rows are baseline only, the failed runs are
    listed, exit 2, even though the points compared are the same."""
    for batch in (1, 2, 3, 4):
        runs(tmp_path / "base", SECONDS, {"batch": batch})
        paths = runs(tmp_path / "cand", list(reversed(SECONDS)), {"batch": batch})
        if batch > 2:
            for path in paths:
                dump = json.loads(path.read_text())
                error = {"category": "gpu_oom", "message": "CUDA out of memory", "global_step": 1}
                path.write_text(json.dumps({**dump, "status": "error", "error": error}))
    code, rows, out = run_compare(bench_compare, tmp_path, capsys)
    assert {point: row["verdict"] for point, row in rows.items()} == {
        "batch=1": "same",
        "batch=2": "same",
        "batch=3": "baseline only",
        "batch=4": "baseline only",
    }
    assert code == 2 and out.count("not compared: candidate run ") == 12
    assert "error (gpu_oom: CUDA out of memory)" in out
    assert "exit 2: 2 of 4 points not compared; 12 runs did not finish" in out


@pytest.mark.parametrize(
    ("make_args", "flags", "message"),
    [
        (lambda d: [d / "empty", d / "base"], {}, "dumps that ended ok, stopped, converged or not_converged in"),
        (lambda d: [d / "base", d / "other"], {"match": "batch"}, "no point is on both sides"),
        (lambda d: [d / "base", d / "old"], {}, "has schema_version 0, this compares 1 only"),
        (lambda d: [d / "base", d / "base"], {"metric": "speed"}, "--metric 'speed': choose one of"),
        (lambda d: [d / "base", d / "nowhere"], {}, "is not a directory"),
    ],
)
def test_bad_input_is_one_line_before_any_work(bench_compare, tmp_path, make_args, flags, message):
    """In process: each refusal is a one-line SystemExit (exit 1, its line on stderr, as the unknown flag's below
    shows through the command line) raised before anything is written."""
    write_dump(tmp_path / "base" / "a.json", [0.5] * 4, {"batch": 1})
    write_dump(tmp_path / "other" / "a.json", [0.5] * 4, {"batch": 2})
    old = write_dump(tmp_path / "old" / "a.json", [0.5] * 4, {"batch": 1})
    (tmp_path / "old" / "a.json").write_text(json.dumps({**old, "schema_version": 0}))
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit) as refused:
        bench_compare.main(*map(str, make_args(tmp_path)), output_dir=str(tmp_path / "out"), **flags)
    assert message in str(refused.value) and "\n" not in str(refused.value)
    assert not (tmp_path / "out").exists()  # nothing done before the check


@pytest.mark.slow  # starts bench_compare
def test_an_unknown_flag_is_one_line_and_exit_1(tmp_path):
    result = compare_command(str(tmp_path), str(tmp_path), "--metrc", "mfu", "--output_dir", str(tmp_path / "out"))
    assert result.returncode == 1
    assert result.stderr.strip() == "unknown flag --metrc; did you mean --metric?", result.stderr
    assert not (tmp_path / "out").exists()


# ---- two real sweeps ----


def write_sweep_spec(path: Path, model: str, repeats: int = 1, batch_sizes: tuple[int, ...] = (2,), **extra) -> Path:
    base = {
        "model_name_or_path": model,
        "training_data_path": SAMPLE_TRAIN_PATH,
        "dataset_text_field": "output",
        "response_template": RESPONSE_TEMPLATE,
        "max_steps": 12,
        "logging_strategy": "steps",  # a loss per step: bench_compare's loss verdict needs the series
        "logging_steps": 1,
        "save_strategy": "no",
        "torch_dtype": "float32",
        "use_flash_attn": False,
        "skip_warmup_steps": 2,
        "system_metrics_interval": 0,
        "memory_estimate": False,  # the comparison reads no estimate: tracing the model would cost a second a run
        **extra,
    }
    axes = {"per_device_train_batch_size": list(batch_sizes)}
    spec = {"base": base, "axes": axes, "metadata": {"benchmark": "compare"}}
    path.write_text(yaml.safe_dump({**spec, "repeats": repeats}))
    return path


def run_sweeps(*runs: tuple[Path, Path, float], flags: tuple[str, ...] = ()) -> None:
    """Run the sweeps (spec, output, the fraction by which its steps are slowed) at the same time: on a shared machine
    both sides then run under the same load, which a comparison of one run a side (within-run intervals) cannot
    otherwise tell from the change under test."""
    processes = [
        subprocess.Popen(
            [sys.executable, str(BENCH_SWEEP), str(spec), "--output_dir", str(out), *flags],
            env=subprocess_env(SLOW_STEP_FRACTION=str(fraction)),
            cwd=REPO_ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for spec, out, fraction in runs
    ]
    for process in processes:
        _, stderr = process.communicate(timeout=900)
        assert process.returncode == 0, stderr[-3000:]


def assert_configs_recorded(directory: Path) -> None:
    """The comparisons below match points on the dumps' config block, which bench_train writes."""
    for path in (directory / "points").glob("*.json"):
        assert "config" in json.loads(path.read_text()), f"{path} has no config block"


REPEATS = 4  # the baseline sweep's: its even repeats against its odd ones


@pytest.fixture(scope="module")
def compare_sweeps(tiny_model, tmp_path_factory) -> dict[str, Path]:
    """Two real sweeps of one point (batch size 2, 80 steps, the slowing callback in both), run at the same time: the
    baseline, four repeats interleaved (its steps slowed by 0 %), and the candidate, one run slowed by 30 % per step.
    The candidate runs beside the baseline's first repeat, under the same load."""
    tmp = tmp_path_factory.mktemp("compare-sweeps")
    spec = {"callbacks": f"{BENCH_CALLBACKS}:SlowStepsByFraction", "max_steps": 80}
    base = write_sweep_spec(tmp / "base.yaml", tiny_model, repeats=REPEATS, **spec)
    cand = write_sweep_spec(tmp / "cand.yaml", tiny_model, **spec)
    run_sweeps((base, tmp / "base", 0.0), (cand, tmp / "cand", 0.3), flags=("--interleave",))
    for side in ("base", "cand"):
        assert_configs_recorded(tmp / side)
    return {"base": tmp / "base", "cand": tmp / "cand"}


def repeat_dumps(sweep_dir: Path, repeats: range, into: Path) -> Path:
    """The dumps of those repeats of a sweep's one point, copied into a directory of their own: one side."""
    into.mkdir()
    for repeat in repeats:
        dumps = list((sweep_dir / "points").glob(f"*_repeat-{repeat}-*.json"))
        assert len(dumps) == 1, dumps
        shutil.copy(dumps[0], into / dumps[0].name)
    return into


@pytest.mark.slow
def test_a_candidate_slowed_by_30_percent_per_step_is_slower_within_run(
    compare_sweeps, bench_compare, tmp_path, capsys
):
    """The same flags on both sides (the slowing callback too), one run of one point a side (the baseline's first
    repeat, which ran beside the candidate): inconclusive without --within_run (exit 0), slower with it (exit 1, from
    the command line: the exit code a shell sees), the row saying the interval is within run. (Several points matched
    and judged each: the synthetic dumps above.)"""
    base = repeat_dumps(compare_sweeps["base"], range(1), tmp_path / "base")
    sides = (str(base), str(compare_sweeps["cand"]))
    code = bench_compare.main(*sides, output_dir=str(tmp_path / "runs"))
    assert code == 0, capsys.readouterr().out
    assert {row["verdict"] for row in read_rows(tmp_path / "runs" / "comparison.csv").values()} == {"inconclusive"}
    result = compare_command(*sides, "--within_run", "--output_dir", str(tmp_path / "out"))
    assert result.returncode == 1, result.stdout + result.stderr
    rows = read_rows(tmp_path / "out" / "comparison.csv")
    assert len(rows) == 1 and {row["verdict"] for row in rows.values()} == {"slower"}, result.stdout
    assert {row["interval"] for row in rows.values()} == {"within run (steps): ignores run-to-run noise"}
    assert "per_device_train_batch_size=2 | 1/1 |" in (tmp_path / "out" / "comparison.md").read_text()


@pytest.mark.slow
def test_two_identical_sweeps_with_two_repeats_are_inconclusive_never_slower(
    compare_sweeps, bench_compare, tmp_path, capsys
):
    """The baseline's interleaved sweep of four repeats of one point, split into its even and odd repeats: two sides
    of identical configuration whose runs alternate in time, so a change of load on the machine falls on both alike.
    Two runs a side cannot decide one point (the exact test needs 4; that 3 cannot either is test_statistics'
    smallest exact p-values): inconclusive, exit 0, the runs it needs named, and --strict fails it. (Matching several
    points, and the same rules on more of them, are proved on synthetic dumps above.)"""
    for side, parity in (("base", 0), ("cand", 1)):
        repeat_dumps(compare_sweeps["base"], range(parity, REPEATS, 2), tmp_path / side)
    sides = (str(tmp_path / "base"), str(tmp_path / "cand"))
    code = bench_compare.main(*sides, threshold=0.15, output_dir=str(tmp_path / "out"))
    out = capsys.readouterr().out
    assert code == 0, out
    rows = read_rows(tmp_path / "out" / "comparison.csv")
    assert len(rows) == 1 and {row["verdict"] for row in rows.values()} == {"inconclusive"}, out
    assert {
        (row["baseline_runs"], row["candidate_runs"], row["interval"], row["min_runs"]) for row in rows.values()
    } == {("2", "2", "over runs", "4")}
    assert all("the test needs 4 a side to decide" in row["note"] for row in rows.values())
    assert bench_compare.main(*sides, threshold=0.15, strict=True, output_dir=str(tmp_path / "strict")) == 3


def learning_runs(path: Path, seconds: float, index: int, steps: int = 4, losses: list[float] | None = None) -> None:
    """Run ``index`` of a side at ``path``: ``steps`` steps of ``seconds``, ``losses`` (default 2/step), the config
    block recorded."""
    dump = write_dump(path / f"{index}.json", [seconds] * steps, {"repeat": index}, losses=losses)
    (path / f"{index}.json").write_text(json.dumps({**dump, "config": CONFIG}))


def diverging_sides(path: Path, steps: int = 40) -> None:
    """Six runs a side: the baseline's loss falls from 3 to 1, the candidate (10 % faster per step) stays at 3."""
    for index, seconds in enumerate(SECONDS):
        noise = [0.01 * ((step * 7 + index) % 5 - 2) for step in range(steps)]  # the runs differ a little
        learning = [3.0 - 2.0 * step / steps + wobble for step, wobble in enumerate(noise)]
        learning_runs(path / "base", seconds, index, steps, learning)
        learning_runs(path / "cand", seconds * 0.9, index, steps, [3.0 + wobble for wobble in noise])


def test_a_faster_candidate_whose_loss_stays_flat_is_diverged_exit_4_with_the_gap(bench_compare, tmp_path, capsys):
    """Six runs a side, the candidate 10 % faster per step and learning nothing: faster, and diverged, exit 4 (the
    loss verdict outranks any speed verdict); the gap and the tolerance are in the row and the exit line."""
    diverging_sides(tmp_path)
    code, rows, out = run_compare(bench_compare, tmp_path, capsys)
    (row,) = rows.values()
    assert code == compare.EXIT_DIVERGED == 4, out
    assert (row["verdict"], row["loss_verdict"]) == ("faster", "diverged")
    assert float(row["loss_gap"]) == pytest.approx(float(row["loss_candidate"]) - float(row["loss_baseline"]))
    assert 1.3 < float(row["loss_gap"]) < 1.9 and 0 < float(row["loss_tolerance"]) < 0.2
    assert row["loss_steps"] == "31-40"  # the last quarter of the matched steps
    assert "points diverged, whatever their speed" in out and f"gap +{float(row['loss_gap']):.4g}" in out
    # A tolerance wider than the gap: the same runs match, and the speed decides again.
    code, rows, _ = run_compare(bench_compare, tmp_path, capsys, loss_tolerance=2.0)
    assert (code, next(iter(rows.values()))["loss_verdict"]) == (0, "matched")


def test_a_diverged_point_stays_exit_4_when_its_candidate_never_reaches_the_target(bench_compare, tmp_path, capsys):
    """The worst news wins: a candidate that never reaches --target_loss is also short of it on every run (exit 2
    alone), but diverged stays the verdict and the exit code 4; the table's note says the candidate never reached the
    target (no empty step or time) and how far the baseline got."""
    diverging_sides(tmp_path)
    code, rows, out = run_compare(bench_compare, tmp_path, capsys, target_loss=2.0)
    (row,) = rows.values()
    assert code == compare.EXIT_DIVERGED and row["loss_verdict"] == "diverged", out
    assert row["candidate_steps_to_target"] == "" and row["candidate_not_converged"] == "6"
    assert "6 candidate runs never reached loss 2" in row["loss_note"] and "gap +" in row["loss_note"]
    step = float(row["baseline_steps_to_target"])
    seconds = format(float(row["baseline_time_to_target"]), ".3g")
    table = (tmp_path / "out" / "comparison.md").read_text()
    assert (
        f"baseline to target: step {step:.4g}, {seconds} s of steps; candidate to target: never reached (6 runs short)"
        in table
    )


def test_runs_without_a_loss_series_say_so_and_never_pass(bench_compare, tmp_path, capsys):
    for index, seconds in enumerate(SECONDS):
        learning_runs(tmp_path / "base", seconds, index)
        learning_runs(tmp_path / "cand", seconds, index, losses=[])
    code, rows, out = run_compare(bench_compare, tmp_path, capsys)
    (row,) = rows.values()
    assert code == 2 and row["loss_verdict"] == "no loss series", out
    assert "runs without a loss series: 0 baseline, 6 candidate" in row["loss_note"]
    assert "1 of 1 points without a loss comparison" in out
    for index, seconds in enumerate(SECONDS):  # a loss logged once an epoch: 2 points, no trend, no noise to size
        learning_runs(tmp_path / "cand", seconds, index, losses=[2.0, 1.0])
    code, rows, out = run_compare(bench_compare, tmp_path, capsys)
    assert code == 2 and next(iter(rows.values()))["loss_verdict"] == "too few matched steps", out
    assert "logged their losses at 2 common steps, 4 needed" in out


def test_target_loss_gives_steps_and_time_to_it_and_two_runs_short_fail_the_comparison(bench_compare, tmp_path, capsys):
    """Loss 2/step, so the target 0.5 is reached at step 4 (the smoothing window of 4 logged steps is 1); the step
    time through it is 4 x the run's seconds. Two candidate runs that stop at loss 1 fail the comparison (exit 2)."""
    for index, seconds in enumerate(SECONDS):
        learning_runs(tmp_path / "base", seconds, index)
        learning_runs(tmp_path / "cand", seconds, index, losses=[2.0, 1.5, 1.0, 1.0] if index < 2 else None)
    code, rows, out = run_compare(bench_compare, tmp_path, capsys, target_loss=0.5, loss_tolerance=10)
    (row,) = rows.values()
    assert float(row["baseline_steps_to_target"]) == float(row["candidate_steps_to_target"]) == 4
    assert float(row["baseline_time_to_target"]) == pytest.approx(4 * median(SECONDS))
    assert float(row["candidate_time_to_target"]) == pytest.approx(4 * median(SECONDS[2:]))
    assert (row["baseline_not_converged"], row["candidate_not_converged"]) == ("0", "2")
    assert code == 2 and row["loss_verdict"] == "not converged", out
    assert "2 candidate runs never reached loss 0.5" in row["loss_note"]


def test_olympic_drops_each_side_s_fastest_and_slowest_run_and_needs_five(bench_compare, tmp_path, capsys):
    base_seconds = [0.500, 0.504, 0.497, 0.502, 0.80]  # one run much slower: dropped, with the fastest
    runs(tmp_path / "base", base_seconds, {"model": "m"})
    runs(tmp_path / "cand", [0.45, 0.455, 0.452, 0.449, 0.30], {"model": "m"})
    code, rows, _ = run_compare(bench_compare, tmp_path, capsys, olympic=True)
    (row,) = rows.values()
    kept = ([100 / s for s in sorted(base_seconds)[1:-1]], [100 / s for s in [0.449, 0.45, 0.452]])
    assert row["interval"] == compare.OLYMPIC
    assert float(row["baseline"]) == pytest.approx(median(kept[0]), rel=1e-6)
    assert float(row["ratio"]) == pytest.approx(statistics.hodges_lehmann_ratio(*kept), rel=1e-6)
    assert statistics.olympic([3, 1, 2, 5, 4]) == [2, 3, 4]
    (tmp_path / "base" / next(iter(sorted(p.name for p in (tmp_path / "base").iterdir())))).unlink()
    code, rows, out = run_compare(bench_compare, tmp_path, capsys, olympic=True)
    assert code == 2 and next(iter(rows.values()))["verdict"] == "too few runs", out


@pytest.mark.parametrize("damage", ["cut short", "not JSON"])
def test_a_damaged_dump_exits_2_naming_it_unless_dropping_is_asked_for(bench_compare, tmp_path, capsys, damage):
    runs(tmp_path / "base", SECONDS, {"model": "m"})
    (path, *_) = runs(tmp_path / "cand", [seconds * 0.9 for seconds in SECONDS] + [0.45], {"model": "m"})
    path.write_text(path.read_text()[:200] if damage == "cut short" else "not json at all")
    code, rows, out = run_compare(bench_compare, tmp_path, capsys)
    assert code == 2 and f"not compared: candidate file {path}: not valid JSON" in out, out
    assert next(iter(rows.values()))["verdict"] == "faster"  # the others still compared, the exit says what is off
    code, _, out = run_compare(bench_compare, tmp_path, capsys, drop_damaged=True)
    assert code == 0 and f"dropped (--drop_damaged): candidate file {path}" in out, out


def test_one_run_a_side_says_the_runs_it_asks_for_are_the_minimum(bench_compare, tmp_path, capsys):
    runs(tmp_path / "base", SECONDS[:1], {"model": "m"})
    runs(tmp_path / "cand", SECONDS[1:2], {"model": "m"})
    code, _, out = run_compare(bench_compare, tmp_path, capsys)
    floor = statistics.min_runs_a_side(1)
    assert code == 0 and f"at least {floor} runs a side: the minimum the test needs (no spread to size it)" in out
    assert "would likely decide" not in out


@pytest.fixture(scope="module")
def learning_and_frozen(tiny_model, tmp_path_factory) -> tuple[Path, Path]:
    """Two real bench_train runs of one configuration on the tiny model, in process: a normal one and one whose
    FreezeLearning callback zeroes every step's learning rate (same speed, nothing learnt)."""
    bench_train = load_script(REPO_ROOT / "wrappers" / "bench_train.py")
    root = tmp_path_factory.mktemp("quality")
    for side, callbacks in (("base", None), ("cand", f"{BENCH_CALLBACKS}:FreezeLearning")):
        flags = {
            "metrics_path": root / side / "run.json",
            "max_steps": 24,
            "learning_rate": 0.01,
            "lr_scheduler_type": "constant",
            "system_metrics_interval": 0,
            "memory_estimate": False,
            "callbacks": callbacks,
        }
        assert bench_train.main(cli_args(tiny_model, str(root / side / "out"), **flags)) == 0
    return root / "base", root / "cand"


@pytest.mark.slow
def test_a_run_whose_learning_is_silently_frozen_is_diverged_against_a_normal_one(
    bench_compare, learning_and_frozen, tmp_path, capsys
):
    base, cand = learning_and_frozen
    code = bench_compare.main(str(base), str(cand), output_dir=str(tmp_path), within_run=True)
    (row,) = read_rows(tmp_path / "comparison.csv").values()
    out = capsys.readouterr().out
    assert code == 4 and row["loss_verdict"] == "diverged", out
    assert float(row["loss_gap"]) > float(row["loss_tolerance"]) > 0
    assert f"gap +{float(row['loss_gap']):.4g}" in out.splitlines()[-1]
    # Against itself the normal run matches.
    assert bench_compare.main(str(base), str(base), output_dir=str(tmp_path / "self")) == 0


@pytest.mark.slow
def test_time_to_target_on_the_tiny_model(bench_compare, learning_and_frozen, tmp_path, capsys):
    """A target halfway between the normal run's first and last smoothed loss: it reaches it at a step short of its
    end, after that many steps' time; the frozen run never does (one run short a side is allowed)."""
    base, cand = learning_and_frozen
    dump = json.loads((base / "run.json").read_text())
    losses = quality.losses(dump)
    target = (losses[min(losses)] + losses[max(losses)]) / 2
    code = bench_compare.main(str(base), str(cand), output_dir=str(tmp_path), target_loss=target, loss_tolerance=99)
    (row,) = read_rows(tmp_path / "comparison.csv").values()
    assert code == 0, capsys.readouterr().out
    step = quality.steps_to_target(losses, target)
    assert 1 < step < max(losses) and float(row["baseline_steps_to_target"]) == step
    times = series_values(dump, "step_time_seconds")[:step]
    assert float(row["baseline_time_to_target"]) == pytest.approx(sum(times))
    assert (row["candidate_steps_to_target"], row["candidate_not_converged"]) == ("", "1")


def test_a_slower_point_names_the_step_part_and_the_operators_that_grew_most(bench_compare, tmp_path, capsys):
    """The candidate's steps are 10 % longer, all of it in the backward pass, and its profile shows aten::bmm's self
    time up by 2.5 ms over its two profiled steps: the row names backward, by how much, and aten::bmm first."""
    shares = {"data": 0.1, "forward": 0.3, "backward": 0.3, "optimizer": 0.2, "rest": 0.1}
    grown = {part: (share + 0.1 if part == "backward" else share) / 1.1 for part, share in shares.items()}
    for side, factor, parts, bmm in (("base", 1.0, shares, 500.0), ("cand", 1.1, grown, 3000.0)):
        ops = [
            {"name": name, "calls": 2, "self_cpu_us": us, "cpu_total_us": us, "self_device_us": 0.0}
            for name, us in (("aten::mm", 1000.0), ("aten::bmm", bmm))
        ]
        profile = {"steps": [3, 4], "profiled_steps": [3, 4], "top_ops": {"cpu": ops}, "traces": [], "missing": None}
        for index, seconds in enumerate(SECONDS):
            path = tmp_path / side / f"run-{index}.json"
            dump = write_dump(path, [seconds * factor] * 4, {"batch": 1, "repeat": index}, parts=parts, profile=profile)
            dump["config"] = CONFIG
            path.write_text(json.dumps(dump))
    code, rows, out = run_compare(bench_compare, tmp_path, capsys)
    row = rows["batch=1"]
    assert code == 1 and row["verdict"] == "slower"
    backward = 1000 * 0.1 * median(SECONDS)  # the grown share of the median run's step, in ms
    assert row["slower_part"].startswith(f"backward +{backward:.3g} ms/step")
    assert row["slower_part"].endswith("cpu operators grown most per step: aten::bmm +1.25 ms")
    assert f"grew most: {row['slower_part']}" in out


def test_the_table_has_a_legend_of_its_columns_and_verdicts_and_marks_missing_values(bench_compare, tmp_path, capsys):
    """Under the table: a line each for the ratio (and which way is better), the interval, the p-value and the
    correction, and the verdicts the table shows; a value not computed reads as a dash; equal losses as no gap."""
    runs(tmp_path / "base", SECONDS, {"batch": 1})
    runs(tmp_path / "cand", [s / 1.1 for s in SECONDS], {"batch": 1})
    runs(tmp_path / "base", SECONDS[:3], {"batch": 2}, tokens_per_second=0.0)
    runs(tmp_path / "cand", SECONDS[:3], {"batch": 2})
    *_, out = run_compare(bench_compare, tmp_path, capsys, metric="step_time_p50")
    assert "- ratio (HL): the candidate's step_time_p50 " in out and "lower is better, so a ratio below 1" in out
    code, rows, out = run_compare(bench_compare, tmp_path, capsys)
    assert (rows["batch=1"]["verdict"], rows["batch=2"]["verdict"], code) == ("faster", "invalid", 2)
    text = (tmp_path / "out" / "comparison.md").read_text()
    table, legend = text.split("\n\n", 1)
    invalid = next(line for line in table.splitlines() if line.startswith("| batch=2 |"))
    cells = [cell.strip() for cell in invalid.strip("|").split(" | ")]
    assert cells[4:8] == ["—"] * 4  # ratio, interval, over, p (Holm): not computed
    assert "gap +0" not in text and "no gap" in text  # the default synthetic losses are the same on both sides
    lines = legend.splitlines()
    for column in ("ratio (HL)", "95 % interval", "over", "p (Holm)", "correction"):
        assert sum(line.startswith(f"- {column}: ") for line in lines) == 1, column
    assert "higher is better, so a ratio above 1 favours the candidate" in legend
    assert [line.split(":")[0] for line in lines if "verdict" in line.split(":")[0]] == [
        "- verdict faster",
        "- verdict invalid",
        "- loss verdict matched",
    ]
    assert legend in out


def test_mlperf_scores_each_side_dropping_its_fastest_and_slowest_and_a_non_converged_run(
    bench_compare, tmp_path, capsys
):
    """Four points, 10 runs a side unless said: all converged and the candidate 10 % faster (faster, scored as MLPerf
    scores); one candidate run short of the target (it is the slowest, dropped), beside a resumed run left out; two
    short (invalid); nine runs (too few runs, never scored). Exit 2: not every point could be scored."""
    template = write_dump(tmp_path / "template.json", [0.5] * 4, {})
    template["config"] = CONFIG
    base = [30.0 + 0.1 * index for index in range(10)]
    faster = [seconds * 0.9 for seconds in base]
    mlperf_runs(tmp_path / "base", template, "all", base)
    mlperf_runs(tmp_path / "cand", template, "all", faster)
    mlperf_runs(tmp_path / "base", template, "one", base)
    mlperf_runs(tmp_path / "cand", template, "one", [*faster[:9], None, "resumed"])
    mlperf_runs(tmp_path / "base", template, "two", base)
    mlperf_runs(tmp_path / "cand", template, "two", [*faster[:8], None, None])
    mlperf_runs(tmp_path / "base", template, "few", base)
    mlperf_runs(tmp_path / "cand", template, "few", faster[:9])
    code, rows, out = run_compare(bench_compare, tmp_path, capsys, mlperf=True)
    assert code == 2, out
    rows = {json.loads(key.removeprefix("point=")): row for key, row in rows.items()}
    kept = (sorted(base)[1:-1], sorted(faster)[1:-1])
    everything = rows["all"]
    assert everything["interval"] == compare.MLPERF and everything["verdict"] == "faster"
    assert float(everything["baseline_mlperf_score"]) == pytest.approx(sum(kept[0]) / 8)
    assert float(everything["candidate_mlperf_score"]) == pytest.approx(sum(kept[1]) / 8)
    assert float(everything["ratio"]) == pytest.approx(statistics.hodges_lehmann_ratio(*kept), rel=1e-6)
    one = rows["one"]
    assert one["candidate_not_converged_runs"] == "1" and "one-10.json left out: resumed" in one["note"]
    assert float(one["candidate_mlperf_score"]) == pytest.approx(sum(sorted(faster[:9])[1:]) / 8)
    assert one["verdict"] == "faster"
    assert rows["two"]["verdict"] == "invalid" and "2 of 10 runs did not converge" in rows["two"]["note"]
    assert rows["two"]["candidate_mlperf_score"] == ""
    assert rows["few"]["verdict"] == "too few runs" and "9 runs, MLPerf scores 10 or more" in rows["few"]["note"]
    with pytest.raises(SystemExit, match="leave out --olympic"):
        bench_compare.main(str(tmp_path / "base"), str(tmp_path / "cand"), mlperf=True, olympic=True)
