"""tuning.benchmarking.sweep.state in process: what the driver writes into a point's files between its runs."""

import re
from pathlib import Path

from tuning.benchmarking.sweep import Sweep, grid


def test_a_resumed_point_s_attempt_is_numbered_after_those_its_log_holds(tmp_path):
    """A point's log is appended to across drivers (a point running when its driver was killed runs again under the
    next one; --rerun_failed reruns a failed one): the next attempt's header counts the attempts before it."""
    (point,) = grid({"base": {}, "axes": {"max_steps": [1]}, "metadata": {}, "repeats": 1})
    sweep = Sweep([point], tmp_path, retries=1, point_timeout=None, bench_train=Path("bench_train.py"))
    (tmp_path / "points").mkdir()
    sweep.begin_attempt(point)
    log = Path(sweep.run_paths(point).log)
    with log.open("a") as output:
        output.write("the output of a point whose driver was SIGKILLed\n")
    sweep.begin_attempt(point)  # the next driver's first attempt at it
    assert re.findall(r"=== bench_sweep: max_steps=1, attempt (\d+) ===", log.read_text()) == ["1", "2"]
