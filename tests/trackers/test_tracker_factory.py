"""tuning.trackers.tracker_factory: a tracker whose package is missing is refused with the extra to install; the
helpers of the trackers a command line names start before the script's heavy imports."""

import re
import sys
import textwrap

import pytest

from tests.helpers.training import run_python, wait_for_exit
from tuning.config.tracker_configs import AimConfig, TrackerConfigFactory
from tuning.trackers import tracker_factory
from tuning.utils.error_logging import UserInputError


@pytest.mark.parametrize(
    ("tracker", "module"), [("aim", "tuning.trackers.aimstack_tracker"), ("mlflow", "tuning.trackers.mlflow_tracker")]
)
def test_a_missing_backend_names_the_extra_to_install(tracker, module, tmp_path, monkeypatch):
    """The backend made unimportable (``sys.modules[name] = None``, as for a package not installed) and its tracker
    module imported afresh: building the tracker is a user error naming the extra."""
    monkeypatch.setitem(sys.modules, tracker, None)
    monkeypatch.delitem(sys.modules, module, raising=False)
    configs = TrackerConfigFactory(aim_config=AimConfig(aim_repo=str(tmp_path / "r")))
    with pytest.raises(UserInputError, match=re.escape(f"pip install 'tuning-bench[{tracker}]'")):
        tracker_factory.build_trackers([tracker], configs)


# What each command line starts early: the helpers of the trackers its --trackers/--tracker flags name, nothing else.
HELPER_ARGVS = [
    (["--trackers", "aim", "mlflow", "--output_dir", "out"], ["aim_writer", "mlflow_writer"]),
    (["--tracker=aim", "--trackers", "aim"], ["aim_writer"]),
    (["--trackers", "file_logger", "--output_dir", "aim"], []),
    (["--trackers", "none"], []),
    (["--trackers", "aim,mlflow"], []),  # refused by the parser later, with a hint
]


@pytest.mark.slow
@pytest.mark.parametrize(("argv", "helpers"), HELPER_ARGVS)
def test_start_helpers_starts_the_helpers_the_command_line_asks_for(argv, helpers):
    """A script's first lines start the helpers of the trackers its flags name; they are stopped at exit when no
    tracker adopted them."""
    code = textwrap.dedent(
        f"""
        import time
        import psutil
        from tuning.trackers import start_helpers
        start_helpers({argv!r})
        for child in psutil.Process().children():
            deadline = time.monotonic() + 30
            while len(child.cmdline()) < 4 and time.monotonic() < deadline:  # forked, not yet exec'd: our cmdline
                time.sleep(0.05)
            print(child.pid, child.cmdline()[3].split(":")[0].rsplit(".", 1)[1])
        """
    )
    result = run_python("-c", code, timeout=120)
    assert result.returncode == 0 and result.stderr == "", result.stderr[-2000:]
    started = [line.split() for line in result.stdout.splitlines()]
    assert sorted(backend for _pid, backend in started) == helpers
    for pid, _backend in started:
        wait_for_exit(int(pid), 30, "a helper no tracker adopted outlived its process")


@pytest.mark.slow
def test_start_helpers_starts_nothing_beside_rank_zero():
    code = "import psutil\nfrom tuning.trackers import start_helpers\nstart_helpers(['--trackers', 'aim'])\n"
    code += "print(len(psutil.Process().children()))"
    result = run_python("-c", code, timeout=120, RANK="1")
    assert result.returncode == 0 and result.stdout.strip() == "0", result.stderr[-2000:]
