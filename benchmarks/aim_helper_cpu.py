"""CPU-seconds the Aim helper process spends per tracked point: the aim tracker's own helper
(``python -m tuning.trackers.isolated``) writing into a new local repo, fed as training feeds it (one trainer log of
``--values`` numbers per step, a step every ``--step_seconds``). CPU time, not wall time: the figure holds on a
machine shared with other work.

Each round runs the helper twice for the same wall time, into one repository created beforehand: once idle
(imported, run created, closed) and once tracking ``--steps`` steps; the helper's CPU is read from this process's
reaped-children usage. The cost per point is the difference of the two medians over the points tracked, so what every
job pays once (Aim's import, the run's creation and close) is left out, and reported as the idle figure. A new
repository costs more once: Aim migrates its database in a subprocess of the helper.

    python benchmarks/aim_helper_cpu.py                       # 1000 steps of 7 values, 100 steps a second, 3 rounds
    python benchmarks/aim_helper_cpu.py --steps 500 --rounds 5
"""

import argparse
import json
import resource
import statistics
import tempfile
import time
from typing import Any

from aim import Repo

from tuning.trackers.aimstack_tracker import SafeAimCallback

# A trainer log of the tiny model with --logging_steps 1, in its order.
LOG_KEYS = ("loss", "grad_norm", "learning_rate", "entropy", "mean_token_accuracy", "num_tokens", "epoch")


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def helper_cpu(repo: str, steps: int, values: int, step_seconds: float, tracking: bool) -> float:
    """CPU-seconds of one helper's whole life: created, run opened, ``steps`` steps long with a log of ``values``
    numbers each (``tracking``) or none, closed."""
    before = children_cpu_seconds()
    callback = SafeAimCallback(repo)
    opened = []
    callback.when_run_info_known(opened.append)
    callback.set_params({"benchmark": "aim_helper_cpu"}, "experiment_metadata")
    while not opened and not callback.degraded:
        time.sleep(0.01)
    keys = (LOG_KEYS * (values // len(LOG_KEYS) + 1))[:values]
    for step in range(1, steps + 1):
        if tracking:
            callback.track_many([(f"{key}_{index}", 1.0 / step, step, None) for index, key in enumerate(keys)])
        time.sleep(step_seconds)
    callback.close()
    if callback.degraded:
        raise RuntimeError(f"Aim tracking stopped: {callback.degraded_reason}")
    return children_cpu_seconds() - before


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--values", type=int, default=len(LOG_KEYS), help="numbers per trainer log")
    parser.add_argument("--step_seconds", type=float, default=0.01)
    parser.add_argument("--rounds", type=int, default=3)
    flags = parser.parse_args(argv)
    idle, tracked = [], []
    with tempfile.TemporaryDirectory() as repo:
        Repo.from_path(repo, init=True)
        for _ in range(flags.rounds):
            for tracking, figures in ((False, idle), (True, tracked)):
                figures.append(helper_cpu(repo, flags.steps, flags.values, flags.step_seconds, tracking))
    points = flags.steps * flags.values
    per_point = (statistics.median(tracked) - statistics.median(idle)) / points
    result = {
        "steps": flags.steps,
        "values_per_step": flags.values,
        "rounds": flags.rounds,
        "helper_cpu_s_idle": idle,
        "helper_cpu_s_tracking": tracked,
        "cpu_ms_per_point": round(per_point * 1000, 4),
        "cpu_ms_per_step": round(per_point * flags.values * 1000, 4),
    }
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
