"""The suite's root: an offline, single-threaded environment before anything imports the libraries, the shared
fixtures of tests/helpers/fixtures.py, and a note on unmarked tests that take seconds. Shared helpers live in
tests/helpers/."""

import os

import pytest

from tuning.utils.prologue import pause_collector, resume_collector

# Collecting imports torch, transformers and peft: with the collector paused, as in a training script's prologue.
pause_collector()

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The tiny model's math is too small to gain from threads, which only contend with each other: in-process
# training runs single-threaded, as the child jobs do (subprocess_env), unless the caller sets its own.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# The processed-data cache (--data_cache_dir) is off unless a test names its own directory: tests never read or fill
# the user's cache, nor each other's entries.
os.environ["TUNING_DATA_CACHE_DIR"] = "none"

pytest_plugins = ["tests.helpers.fixtures"]


# Fixtures that run jobs or start servers for several tests. Under pytest-xdist (`make test`: --dist loadgroup) the
# tests that use one go to one worker, so that it runs once; the other tests spread one by one.
SHARED_FIXTURES = (
    "local_grid",
    "bench_runs",
    "healthy_jobs",
    "aim_server",
    "mlflow_server",
    "ray_nodes_sweep",
    "compare_sweeps",
    "sigtermed_sft_trainer",
    "sigtermed_twice",
)


@pytest.hookimpl(wrapper=True)
def pytest_collection(session: pytest.Session):
    """Collected (or, in pytest-xdist's controller, which collects nothing, past collection), the libraries are
    imported: their hundreds of thousands of objects are moved out of the garbage collector's sight (``gc.freeze``)
    and the collector is back on (``resume_collector``, what ``train()`` does after a script's prologue), so that each
    full collection (accelerate runs one at every ``train()``'s end, the collector on its own now and then) walks only
    what the tests made since."""
    try:
        return (yield)
    finally:
        resume_collector()


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook, which reads the groups into the test ids
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests sharing a fixture of SHARED_FIXTURES go to one worker; and the slow tests (processes, servers) are
    handed out first, in their files' order, so that the suite ends on the in-process tests, which the workers share
    out evenly, not on one worker's sweep while the other waits."""
    for item in items:
        shared = [name for name in SHARED_FIXTURES if name in getattr(item, "fixturenames", ())]
        if shared:
            item.add_marker(pytest.mark.xdist_group(shared[0]))
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


# A test not marked slow that takes seconds pushes `make test-fast` past its inner-loop budget: the summary names it
# (a note, never a failure: timings vary by machine).
FAST_TEST_SECONDS = 3.0
_unmarked_test_seconds: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if "slow" not in report.keywords:
        _unmarked_test_seconds[report.nodeid] = _unmarked_test_seconds.get(report.nodeid, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    over = {nodeid: seconds for nodeid, seconds in _unmarked_test_seconds.items() if seconds > FAST_TEST_SECONDS}
    if over:
        terminalreporter.section("tests not marked slow that took seconds: mark them slow or make them cheaper")
        for nodeid, seconds in sorted(over.items(), key=lambda item: -item[1]):
            terminalreporter.write_line(f"{seconds:6.1f} s  {nodeid}")
