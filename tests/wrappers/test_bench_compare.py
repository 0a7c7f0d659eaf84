"""wrappers/bench_compare.py: the statistics on synthetic dumps with known answers (in process), the command line's
bad input, and two real sweeps of the tiny model: a candidate slowed by 30 % per step is slower at every point (exit
1); two identical sweeps with ``repeats: 3`` are the same at --threshold 0.15."""

import json
import math
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers.bench import csv_by
from tests.helpers.dumps import write_dump
from tests.helpers.training import (
    BENCH_CALLBACKS,
    REPO_ROOT,
    RESPONSE_TEMPLATE,
    load_script,
    run_python,
    subprocess_env,
)
from tuning.utils.tiny_model import SAMPLE_TRAIN_PATH

BENCH_COMPARE = REPO_ROOT / "wrappers" / "bench_compare.py"
BENCH_SWEEP = REPO_ROOT / "wrappers" / "bench_sweep.py"
T_975_DF4 = 2.7764451051977987  # Student's t, 97.5 % quantile, 4 degrees of freedom (any table)


@pytest.fixture(scope="module")
def bench_compare():
    sys.path.insert(0, str(REPO_ROOT / "wrappers"))  # bench_compare imports bench_report from beside itself
    yield load_script(BENCH_COMPARE)
    sys.path.remove(str(REPO_ROOT / "wrappers"))


def compare_command(*args: str) -> subprocess.CompletedProcess:
    return run_python(str(BENCH_COMPARE), *args, timeout=120)


def read_rows(path: Path) -> dict[str, dict[str, str]]:
    return csv_by(path, "point")


@pytest.mark.parametrize(("df", "quantile"), [(1, 12.706204736), (2, 4.30265273), (4, T_975_DF4), (30, 2.04227246)])
def test_t_quantile_matches_the_tables(bench_compare, df, quantile):
    assert bench_compare.t_quantile(0.975, df) == pytest.approx(quantile, rel=1e-4)


def runs(directory: Path, seconds_per_run: list[float], metadata: dict, **extra) -> None:
    """One dump per entry: a run of 4 steps of that many seconds (100 tokens each, the first step warmup)."""
    for index, seconds in enumerate(seconds_per_run):
        write_dump(directory / f"{metadata}-{index}.json", [seconds] * 4, {**metadata, "repeat": index}, **extra)


def test_over_runs_the_interval_is_welch_s_on_the_log_ratio(bench_compare, tmp_path):
    """Three runs a side, the candidate's throughputs 0.7 times the baseline's: equal relative spreads give exactly 4
    degrees of freedom, so the interval is 0.7 × exp(±t(0.975, 4) × se) with se from the runs' spread."""
    baseline_tps = [200.0, 210.0, 190.0]
    runs(tmp_path / "base", [100 / tps for tps in baseline_tps], {"batch": 1})
    runs(tmp_path / "cand", [100 / (0.7 * tps) for tps in baseline_tps], {"batch": 1})
    code = bench_compare.main(str(tmp_path / "base"), str(tmp_path / "cand"), output_dir=str(tmp_path / "out"))
    relative_variance = statistics.variance(baseline_tps) / statistics.fmean(baseline_tps) ** 2
    spread = T_975_DF4 * math.sqrt(2 * relative_variance / 3)
    (row,) = read_rows(tmp_path / "out" / "comparison.csv").values()
    assert row["point"] == "batch=1" and row["interval"] == "over runs"
    assert float(row["ratio"]) == pytest.approx(0.7)
    assert float(row["ci_low"]) == pytest.approx(0.7 * math.exp(-spread), rel=1e-4)
    assert float(row["ci_high"]) == pytest.approx(0.7 * math.exp(spread), rel=1e-4)
    assert row["verdict"] == "slower" and code == 1
    assert (tmp_path / "out" / "comparison.png").read_bytes()[:4] == b"\x89PNG"


def test_verdicts_follow_the_interval_against_the_threshold(bench_compare, tmp_path):
    """Batch 1: 10 % faster, tight: faster. Batch 2: 1 % slower, inside ±2 %: same. Batch 4: baseline only. With
    step time, lower is better: the same data gives the same verdicts."""
    runs(tmp_path / "base", [0.50, 0.51, 0.49], {"batch": 1})
    runs(tmp_path / "cand", [0.50 / 1.1, 0.51 / 1.1, 0.49 / 1.1], {"batch": 1})
    runs(tmp_path / "base", [0.50, 0.50, 0.50], {"batch": 2})
    runs(tmp_path / "cand", [0.505, 0.505, 0.505], {"batch": 2})
    runs(tmp_path / "base", [0.5, 0.5], {"batch": 4})
    for metric in ("tokens_per_second", "step_time_p50"):
        out = tmp_path / metric
        code = bench_compare.main(str(tmp_path / "base"), str(tmp_path / "cand"), metric=metric, output_dir=str(out))
        rows = read_rows(out / "comparison.csv")
        assert {point: row["verdict"] for point, row in rows.items()} == {
            "batch=1": "faster",
            "batch=2": "same",
            "batch=4": "baseline only",
        }
        assert code == 0


def test_one_run_a_side_gives_a_within_run_interval_over_the_steps(bench_compare, tmp_path, capsys):
    """Steps of 0.5 and 0.6 s alternating after the warmup (tokens/s 200 and 166.7), the candidate's the same: the
    ratio is 1 and the interval is the steps' (Welch over the per-step throughputs)."""
    write_dump(tmp_path / "base" / "a.json", [1.0, 0.5, 0.6, 0.5, 0.6, 0.5, 0.6], {"batch": 1})
    write_dump(tmp_path / "cand" / "a.json", [1.0, 0.6, 0.5, 0.6, 0.5, 0.6, 0.5], {"batch": 1})
    code = bench_compare.main(str(tmp_path / "base"), str(tmp_path / "cand"), output_dir=str(tmp_path / "out"))
    (row,) = read_rows(tmp_path / "out" / "comparison.csv").values()
    steps = [200.0, 100 / 0.6] * 3
    relative_variance = statistics.variance(steps) / statistics.fmean(steps) ** 2
    spread = bench_compare.t_quantile(0.975, 10) * math.sqrt(2 * relative_variance / 6)
    assert row["interval"] == "within run (steps)" and float(row["ratio"]) == pytest.approx(1.0)
    assert float(row["ci_high"]) == pytest.approx(math.exp(spread), rel=1e-4)
    assert row["verdict"] == "same" and code == 0
    assert "not run-to-run noise" in capsys.readouterr().out


def test_points_match_on_metadata_but_not_keys_unique_to_each_run(bench_compare, tmp_path):
    """``started`` differs on every run (like a timestamp): ignored; ``--match`` picks keys itself."""
    for side, started in (("base", "09:00"), ("cand", "10:00")):
        write_dump(tmp_path / side / "a.json", [0.5] * 4, {"batch": 1, "model": "m", "started": started})
        write_dump(tmp_path / side / "b.json", [0.5] * 4, {"batch": 2, "model": "m", "started": started + "x"})
    bench_compare.main(str(tmp_path / "base"), str(tmp_path / "cand"), output_dir=str(tmp_path / "out"))
    assert set(read_rows(tmp_path / "out" / "comparison.csv")) == {'batch=1, model="m"', 'batch=2, model="m"'}
    bench_compare.main(str(tmp_path / "base"), str(tmp_path / "cand"), match="model", output_dir=str(tmp_path / "m"))
    (row,) = read_rows(tmp_path / "m" / "comparison.csv").values()
    assert row["point"] == 'model="m"' and row["baseline_runs"] == "2"


@pytest.mark.parametrize(
    ("make_args", "message"),
    [
        (lambda d: [str(d / "empty"), str(d / "base")], "no ok or stopped benchmark dumps in"),
        (lambda d: [str(d / "base"), str(d / "other"), "--match", "batch"], "no point is on both sides"),
        (lambda d: [str(d / "base"), str(d / "old")], "has schema_version 0, this compares 1 only"),
        (
            lambda d: [str(d / "base"), str(d / "base"), "--metrc", "mfu"],
            "unknown flag --metrc; did you mean --metric?",
        ),
        (lambda d: [str(d / "base"), str(d / "base"), "--metric", "speed"], "--metric 'speed': choose one of"),
        (lambda d: [str(d / "base"), str(d / "nowhere")], "is not a directory"),
    ],
)
def test_bad_input_is_one_line_and_exit_1(tmp_path, make_args, message):
    write_dump(tmp_path / "base" / "a.json", [0.5] * 4, {"batch": 1})
    write_dump(tmp_path / "other" / "a.json", [0.5] * 4, {"batch": 2})
    old = write_dump(tmp_path / "old" / "a.json", [0.5] * 4, {"batch": 1})
    (tmp_path / "old" / "a.json").write_text(json.dumps({**old, "schema_version": 0}))
    (tmp_path / "empty").mkdir()
    result = compare_command(*make_args(tmp_path), "--output_dir", str(tmp_path / "out"))
    assert result.returncode == 1
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "out").exists()  # nothing done before the check


# ---- two real sweeps ----


def write_sweep_spec(path: Path, model: str, repeats: int = 1, **extra) -> Path:
    base = {
        "model_name_or_path": model,
        "training_data_path": SAMPLE_TRAIN_PATH,
        "dataset_text_field": "output",
        "response_template": RESPONSE_TEMPLATE,
        "max_steps": 12,
        "save_strategy": "no",
        "torch_dtype": "float32",
        "use_flash_attn": False,
        "skip_warmup_steps": 2,
        "system_metrics_interval": 0,
        **extra,
    }
    spec = {"base": base, "axes": {"per_device_train_batch_size": [2, 4]}, "metadata": {"benchmark": "compare"}}
    path.write_text(yaml.safe_dump({**spec, "repeats": repeats}))
    return path


def run_sweeps(*specs_and_outputs: tuple[Path, Path]) -> None:
    """Run the sweeps at the same time: on a shared machine both sides then run under the same load, which a
    comparison of one run a side (within-run intervals) cannot otherwise tell from the change under test."""
    processes = [
        subprocess.Popen(
            [sys.executable, str(BENCH_SWEEP), str(spec), "--output_dir", str(out)],
            env=subprocess_env(SLOW_STEP_FRACTION="0.3"),
            cwd=REPO_ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for spec, out in specs_and_outputs
    ]
    for process in processes:
        _, stderr = process.communicate(timeout=900)
        assert process.returncode == 0, stderr[-3000:]


@pytest.mark.slow
def test_a_candidate_slowed_by_30_percent_per_step_is_slower_at_every_point(tiny_model, tmp_path):
    steps = {"max_steps": 40}  # a within-run interval narrows with the steps it has
    baseline = write_sweep_spec(tmp_path / "base.yaml", tiny_model, **steps)
    slowed = write_sweep_spec(
        tmp_path / "cand.yaml", tiny_model, callbacks=f"{BENCH_CALLBACKS}:SlowStepsByFraction", **steps
    )
    run_sweeps((baseline, tmp_path / "base"), (slowed, tmp_path / "cand"))
    result = compare_command(str(tmp_path / "base"), str(tmp_path / "cand"), "--output_dir", str(tmp_path / "out"))
    assert result.returncode == 1, result.stdout + result.stderr
    rows = read_rows(tmp_path / "out" / "comparison.csv")
    assert len(rows) == 2 and {row["verdict"] for row in rows.values()} == {"slower"}, result.stdout
    assert all(row["interval"] == "within run (steps)" for row in rows.values())
    assert "per_device_train_batch_size=2 | 1/1 |" in (tmp_path / "out" / "comparison.md").read_text()


@pytest.mark.slow
def test_two_identical_sweeps_with_three_repeats_are_the_same(tiny_model, tmp_path):
    """One sweep of six repeats a point, split into its even and odd repeats: two sides of identical configuration
    whose runs alternate in time, so a change of load on the machine falls on both alike (two sweeps run side by
    side drift apart, and then each side's points run beside different neighbours)."""
    run_sweeps((write_sweep_spec(tmp_path / "sweep.yaml", tiny_model, repeats=6), tmp_path / "sweep"))
    for side, parity in (("base", 0), ("cand", 1)):
        (tmp_path / side).mkdir()
        for repeat in range(parity, 6, 2):  # each batch size's dump of that repeat
            dumps = list((tmp_path / "sweep" / "points").glob(f"*_repeat-{repeat}-*.json"))
            assert len(dumps) == 2, dumps
            for dump in dumps:
                shutil.copy(dump, tmp_path / side / dump.name)
    result = compare_command(
        str(tmp_path / "base"), str(tmp_path / "cand"), "--threshold", "0.15", "--output_dir", str(tmp_path / "out")
    )
    assert result.returncode == 0, result.stdout + result.stderr
    rows = read_rows(tmp_path / "out" / "comparison.csv")
    assert len(rows) == 2 and {row["verdict"] for row in rows.values()} == {"same"}, result.stdout
    assert {(row["baseline_runs"], row["candidate_runs"], row["interval"]) for row in rows.values()} == {
        ("3", "3", "over runs")
    }
