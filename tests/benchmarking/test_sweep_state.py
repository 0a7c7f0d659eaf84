"""tuning.benchmarking.sweep.state in process: what the driver writes into a point's files between its runs."""

import contextlib
import fcntl
import os
import re
import signal
from pathlib import Path

import pytest

from tuning.benchmarking.sweep import Sweep, grid
from tuning.benchmarking.sweep.local_executor import LocalExecutor
from tuning.benchmarking.sweep.spec import spec_problems


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


def test_nnodes_is_a_count_and_a_point_across_nodes_needs_the_ray_executor(tmp_path):
    """``nnodes`` as a base flag or an axis: a positive integer, not a flag of bench_train, in the point's hash only
    when above 1 (one node's points keep their state lines); the local executor refuses a point across nodes."""
    assert next(spec_problems({"axes": {"nnodes": [2, 0]}})) == "nnodes must be a positive integer, got 0"
    spec = {"base": {"nproc_per_node": 2}, "axes": {"nnodes": [1, 2]}, "metadata": {}, "repeats": 1}
    one, two = grid(spec)
    assert (one.nnodes, one.nproc, two.nnodes, two.nproc) == (1, 2, 2, 2) and "nnodes" not in two.flags
    with pytest.raises(SystemExit, match=r"^point nnodes=2 spans 2 nodes; run it with --executor ray$"):
        LocalExecutor([one, two], tmp_path, "bench_train.py", None, None)


def test_a_sweep_gives_its_directory_and_the_stop_signals_back_however_it_ends(tmp_path):
    """Inside ``claimed`` the one-driver lock and SIGINT/SIGTERM are the sweep's; after it they are given back, the
    block returned or raised, so that a program running sweeps in its own process can run the same directory again
    (a second claim would otherwise wait forever on its own first) and keeps its own handlers."""
    (point,) = grid({"base": {}, "axes": {"max_steps": [1]}, "metadata": {}, "repeats": 1})
    spec = tmp_path / "sweep.yaml"
    spec.write_text("axes: {max_steps: [1]}\n")
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}

    def lock_is_free() -> bool:
        descriptor = os.open(tmp_path / "sweep" / "sweep.lock", os.O_RDWR)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False
        finally:
            os.close(descriptor)

    for ending in ("returns", "raises"):
        sweep = Sweep([point], tmp_path / "sweep", retries=0, point_timeout=None, bench_train=Path("bench_train.py"))
        with contextlib.suppress(RuntimeError), sweep.claimed(str(spec)):
            assert not lock_is_free()
            sweep.start_executor("local", None)  # takes the signals again, as it does after ray.init()
            assert all(signal.getsignal(signum) == sweep.on_signal for signum in before)
            if ending == "raises":
                raise RuntimeError(ending)
        assert lock_is_free(), ending
        assert {signum: signal.getsignal(signum) for signum in before} == before, ending
