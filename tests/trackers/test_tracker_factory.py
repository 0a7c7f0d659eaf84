"""tuning.trackers.tracker_factory: a tracker whose package is missing is refused with the extra to install."""

import os
import textwrap

import pytest

from tests.helpers.training import REPO_ROOT, run_python


@pytest.mark.slow
@pytest.mark.parametrize(
    ("tracker", "configs"),
    [("aim", "TrackerConfigFactory(aim_config=AimConfig(aim_repo={repo!r}))"), ("mlflow", "TrackerConfigFactory()")],
)
def test_a_missing_backend_names_the_extra_to_install(tracker, configs, tmp_path):
    (tmp_path / "sitecustomize.py").write_text(
        f"import sys\nsys.modules[{tracker!r}] = None  # import -> ImportError\n"
    )
    code = textwrap.dedent(
        f"""
        from tuning.config.tracker_configs import AimConfig, TrackerConfigFactory
        from tuning.trackers.tracker_factory import build_trackers
        from tuning.utils.error_logging import UserInputError
        try:
            build_trackers([{tracker!r}], {configs.format(repo=str(tmp_path / "r"))})
        except UserInputError as exc:
            print(exc)
        """
    )
    result = run_python("-c", code, timeout=120, PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO_ROOT)]))
    assert result.returncode == 0, result.stderr
    assert f"pip install 'tuning-bench[{tracker}]'" in result.stdout
