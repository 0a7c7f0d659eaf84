"""tuning.benchmarking.api as the one surface a wrapper uses: a copy of bench_train.py, edited as a third party would,
runs outside the repo; bench_train takes nothing else from the project; light entry points stay light."""

import ast
import json
import sys

import pytest

import tuning.benchmarking.api
from tests.helpers.training import BENCH_TRAIN, cli_args, run_python
from tuning.benchmarking.dump import STEP_TIME
from tuning.benchmarking.schema import validate_dump


def test_bench_train_uses_only_the_exported_names():
    """What bench_train reads from ``benchmarking`` is the api module's ``__all__``, which editors and type checkers
    see as ordinary imports; its only other imports from the project are what it does before torch loads."""
    tree = ast.parse(BENCH_TRAIN.read_text(encoding="utf-8"))
    used = {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "benchmarking"
    }
    assert used and used <= set(tuning.benchmarking.api.__all__), used - set(tuning.benchmarking.api.__all__)
    project_imports = {
        (node.module, alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "tuning"
        for alias in node.names
    }
    assert project_imports == {
        ("tuning.benchmarking", "api"),
        ("tuning.benchmarking.api", "flag"),
        ("tuning.prologue", "prologue"),  # before torch loads
    }
    modules = {
        alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
    }
    modules |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert modules - sys.stdlib_module_names == {"tuning", "fire"}


@pytest.mark.slow
def test_a_copy_written_against_the_package_itself_finds_every_name_and_loads_no_pydantic():
    """Copies of bench_train made before ``api`` existed read the surface as ``tuning.benchmarking.<name>``. Loading
    it, as a wrapper does, imports no pydantic: only ``validate_dump`` needs the schema's models, whose classes would
    cost every job's start-up. One fresh interpreter for both (a process start is what this costs)."""
    code = (
        "import sys\n"
        "import tuning.benchmarking.api\n"
        "from tuning import benchmarking, train\n"
        "print(benchmarking.train is train, benchmarking.BenchmarkCallback)\n"
        "print(sorted(m for m in sys.modules if m.startswith(('pydantic', 'tuning.benchmarking.schema'))))"
    )
    result = run_python("-c", code, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    surface, heavy = result.stdout.strip().splitlines()[-2:]
    assert surface.startswith("True <class") and "BenchmarkCallback" in surface, result.stdout
    assert heavy == "[]", heavy
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        import tuning.benchmarking

        _ = tuning.benchmarking.no_such_name


@pytest.mark.slow  # a fresh interpreter per module
@pytest.mark.parametrize(
    ("module", "unwanted"),
    [
        ("tuning.benchmarking", ("torch", "transformers", "tuning.sft_trainer", "tuning.benchmarking.api")),
        ("tuning.benchmarking.rebuild", ("torch", "transformers")),
        ("tuning.benchmarking import journal", ("torch", "transformers")),  # a submodule, not one of api's names
        ("tuning.benchmarking.schema", ("torch", "transformers")),
        ("tuning.benchmarking.dump", ("torch", "transformers")),
        ("tuning.utils.tiny_model", ("tuning.data", "torch")),
        ("tuning.trackers import start_helpers", ("torch", "transformers", "aim", "mlflow")),  # before torch loads
        ("tuning.prologue", ("torch", "transformers", "aim", "mlflow")),
        ("tuning.utils.prologue", ("torch", "tuning.trackers")),  # the ground floor's part
    ],
)
def test_light_modules_import_nothing_heavy(module, unwanted):
    statement = f"from {module}" if " import " in module else f"import {module}"
    code = f"import sys; {statement}; print(sorted(m for m in sys.modules if m.startswith({unwanted!r})))"
    result = run_python("-c", code, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stderr[-3000:]


@pytest.mark.slow
def test_a_copy_of_bench_train_outside_the_repo_runs_with_its_own_default(tiny_model, tmp_path):
    """Copied into an empty folder and given another default warmup, it trains against the package as it is."""
    mine = tmp_path / "my-bench"
    mine.mkdir()
    source = BENCH_TRAIN.read_text(encoding="utf-8")
    edited = source.replace("skip_warmup_steps: int = flag(5,", "skip_warmup_steps: int = flag(2,")
    assert edited != source
    (mine / "my_bench.py").write_text(edited, encoding="utf-8")
    metrics = tmp_path / "out" / "bench.json"
    args = cli_args(tiny_model, str(tmp_path / "out"), max_steps=4, tracker="none", metrics_path=metrics)
    result = run_python(
        str(mine / "my_bench.py"), *args, "--system_metrics_interval", "0", "--memory_estimate", "False", cwd=mine
    )
    assert result.returncode == 0, result.stderr[-3000:]
    dump = json.loads(metrics.read_text())
    assert validate_dump(dump) == [] and dump["status"] == "ok"
    assert dump["warmup_steps"] == 2  # the copy's own default
    step_time = next(a for a in dump["aggregates"] if a["name"] == STEP_TIME)
    assert step_time["count"] == 2


OLD_COPY = BENCH_TRAIN.parents[1] / "tests" / "helpers" / "third_party" / "bench_train_before_the_recipe.py"


def test_a_copy_of_the_bench_train_before_the_recipe_finds_every_name_it_uses():
    """The building blocks an earlier bench_train assembled itself stay in ``api.__all__`` (deprecated)."""
    tree = ast.parse(OLD_COPY.read_text(encoding="utf-8"))
    used = {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "benchmarking"
    }
    assert len(used) > 40 and used <= set(tuning.benchmarking.api.__all__), used - set(tuning.benchmarking.api.__all__)


@pytest.mark.slow
def test_a_copy_of_the_bench_train_before_the_recipe_still_runs(tiny_model, tmp_path):
    mine = tmp_path / "old-bench"
    mine.mkdir()
    (mine / "old_bench.py").write_text(OLD_COPY.read_text(encoding="utf-8"), encoding="utf-8")
    metrics = tmp_path / "out" / "bench.json"
    args = cli_args(tiny_model, str(tmp_path / "out"), max_steps=3, tracker="none", metrics_path=metrics)
    result = run_python(str(mine / "old_bench.py"), *args, "--system_metrics_interval", "0", cwd=mine)
    assert result.returncode == 0, result.stderr[-3000:]
    dump = json.loads(metrics.read_text())
    assert validate_dump(dump) == [] and dump["status"] == "ok" and dump["training_steps"] == 3
