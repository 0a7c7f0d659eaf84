"""tuning.benchmarking as the one surface a wrapper uses: a copy of bench_train.py, edited as a third party would,
runs outside the repo; every exported name resolves; light entry points stay light."""

import json
import subprocess
import sys

import pytest

import tuning.benchmarking
from tests.conftest import REPO_ROOT, cli_args, subprocess_env
from tuning.benchmarking.dump import STEP_TIME
from tuning.benchmarking.schema import validate_dump

BENCH_TRAIN = REPO_ROOT / "wrappers" / "bench_train.py"


def test_every_exported_name_resolves():
    for name in tuning.benchmarking.__all__:
        assert getattr(tuning.benchmarking, name) is not None, name
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        tuning.benchmarking.nope  # noqa: B018


@pytest.mark.parametrize(
    ("module", "unwanted"),
    [
        ("tuning.benchmarking.rebuild", ("torch", "transformers")),
        ("tuning.benchmarking.schema", ("torch", "transformers")),
        ("tuning.benchmarking.dump", ("torch", "transformers")),
        ("tuning.utils.tiny_model", ("tuning.data", "torch")),
    ],
)
def test_light_modules_import_nothing_heavy(module, unwanted):
    code = f"import sys, {module}; print(sorted(m for m in sys.modules if m.startswith({unwanted!r})))"
    result = subprocess.run(
        [sys.executable, "-c", code], env=subprocess_env(), capture_output=True, text=True, timeout=120, check=True
    )
    assert result.stdout.strip() == "[]"


@pytest.mark.slow
def test_a_training_run_imports_no_pydantic():
    """Only ``validate_dump`` needs the schema's models: every other name of the surface resolves without pydantic,
    whose model classes would cost every job's start-up."""
    code = (
        "import sys, tuning.benchmarking as surface\n"
        "for name in set(surface.__all__) - {'validate_dump'}: getattr(surface, name)\n"
        "print(sorted(m for m in sys.modules if m.startswith(('pydantic', 'tuning.benchmarking.schema'))))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], env=subprocess_env(), capture_output=True, text=True, timeout=300, check=True
    )
    assert result.stdout.strip() == "[]"


@pytest.mark.slow
def test_a_copy_of_bench_train_outside_the_repo_runs_with_its_own_default(tiny_model, tmp_path):
    """Copied into an empty folder and given another default warmup, it trains against the package as it is."""
    mine = tmp_path / "my-bench"
    mine.mkdir()
    source = BENCH_TRAIN.read_text(encoding="utf-8")
    edited = source.replace("skip_warmup_steps: int = 5,", "skip_warmup_steps: int = 2,")
    assert edited != source
    (mine / "my_bench.py").write_text(edited, encoding="utf-8")
    metrics = tmp_path / "out" / "bench.json"
    args = cli_args(tiny_model, str(tmp_path / "out"), max_steps=4, tracker="none", metrics_path=metrics)
    result = subprocess.run(
        [sys.executable, str(mine / "my_bench.py"), *args, "--system_metrics_interval", "0"],
        cwd=mine,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    dump = json.loads(metrics.read_text())
    assert validate_dump(dump) == [] and dump["status"] == "ok"
    assert dump["warmup_steps"] == 2  # the copy's own default
    step_time = next(a for a in dump["aggregates"] if a["name"] == STEP_TIME)
    assert step_time["count"] == 2
