"""Did the candidate learn as well as the baseline? The loss side of bench_compare's verdict, MLPerf Training's rule
in a benchmark's terms: a speed claim holds only at the reference's quality.

Per point, each run's training loss (the dump's ``loss`` series without a context, as the trainer logs it) is read at
the steps every run of the point logged (matched steps), smoothed by a trailing mean over a tenth of them, and
compared over the last quarter of them: the gap is the candidate's median run minus the baseline's. The tolerance
is, unless given, ``TOLERANCE_SIGMAS`` times the baseline's own noise there: the larger of its runs' step-to-step
spread around their smoothed curves and (two runs or more) the spread of their end losses from run to run, and at
least ``MIN_RELATIVE_TOLERANCE`` of the baseline's loss. A gap beyond it is ``diverged`` (worse) or ``better``;
within it ``matched``. A run without a loss series, or runs with fewer than ``MIN_MATCHED_STEPS`` common steps, are
said, never read as equal. ``--target_loss``: the first step whose smoothed loss reaches the target, and the step
time up to it. docs/benchmarking.md, "Quality beside speed", states the rules.
"""

import statistics
from dataclasses import dataclass
from typing import Any

from tuning.benchmarking.dump import STEP_TIME

LOSS = "loss"
TOLERANCE_SIGMAS = 3.0
MIN_RELATIVE_TOLERANCE = 0.01  # the default tolerance is at least 1 % of the baseline's loss (noise never measured 0)
MIN_MATCHED_STEPS = 4  # fewer matched steps (a loss logged once an epoch) cannot show a trend nor its noise
SMOOTHING_FRACTION = 10  # the trailing mean's window: a tenth of the matched steps (at least 1)
END_FRACTION = 4  # the compared region: the last quarter of the matched steps (at least 1)
MATCHED, BETTER, DIVERGED = "matched", "better", "diverged"
NO_LOSS, NO_MATCHED_STEPS = "no loss series", "too few matched steps"


@dataclass(frozen=True)
class Quality:
    """One point's loss comparison: the verdict, each side's smoothed loss over ``steps`` (the first and last step
    compared), the gap (candidate minus baseline), the tolerance and the line that says it."""

    verdict: str
    baseline: float | None = None
    candidate: float | None = None
    gap: float | None = None
    tolerance: float | None = None
    steps: tuple[int, int] | None = None
    note: str = ""


def losses(dump: dict[str, Any]) -> dict[int, float]:
    """``{step: training loss}`` of a dump, nulls left out; empty without a loss series."""
    found = next((one for one in dump["metrics"] if one["name"] == LOSS and not one["context"]), None)
    if found is None:
        return {}
    pairs = zip(found["steps"], found["values"], strict=True)
    return {step: value for step, value in pairs if step is not None and value is not None}


def smooth(values: list[float], window: int) -> list[float]:
    """The trailing mean of ``window`` values at each position (fewer at the start)."""
    result, total = [], 0.0
    for index, value in enumerate(values):
        total += value - (values[index - window] if index >= window else 0.0)
        result.append(total / min(index + 1, window))
    return result


def _spread(values: list[float]) -> float:
    return statistics.pstdev(values) if len(values) > 1 else 0.0


def compare_losses(
    baseline: list[dict[int, float]], candidate: list[dict[int, float]], tolerance: float | None = None
) -> Quality:
    """The point's ``Quality`` from each side's runs' ``losses``; ``tolerance`` in loss units (None: from the
    baseline's noise)."""
    missing = [sum(not run for run in side) for side in (baseline, candidate)]
    if any(missing):
        return Quality(NO_LOSS, note=f"runs without a loss series: {missing[0]} baseline, {missing[1]} candidate")
    matched = sorted(set.intersection(*(set(run) for run in (*baseline, *candidate))))
    if len(matched) < MIN_MATCHED_STEPS:
        return Quality(
            NO_MATCHED_STEPS,
            note=f"the runs logged their losses at {len(matched)} common steps, {MIN_MATCHED_STEPS} needed "
            "(log the loss per step: --logging_strategy steps)",
        )
    window, region = max(1, len(matched) // SMOOTHING_FRACTION), max(1, len(matched) // END_FRACTION)
    ends: tuple[list[float], list[float]] = ([], [])
    noise = []
    for side, runs in zip(ends, (baseline, candidate), strict=True):
        for run in runs:
            raw = [run[step] for step in matched]
            smoothed = smooth(raw, window)
            side.append(statistics.fmean(smoothed[-region:]))
            if side is ends[0]:
                noise.append(_spread([a - b for a, b in zip(raw[-region:], smoothed[-region:], strict=True)]))
    base, cand = statistics.median(ends[0]), statistics.median(ends[1])
    if tolerance is None:
        noise_level = TOLERANCE_SIGMAS * max(statistics.median(noise), _spread(ends[0]))
        tolerance = max(noise_level, MIN_RELATIVE_TOLERANCE * abs(base))
    gap = cand - base
    verdict = DIVERGED if gap > tolerance else BETTER if gap < -tolerance else MATCHED
    steps = (matched[-region], matched[-1])
    note = (
        f"loss {cand:.4g} vs baseline {base:.4g} over steps {steps[0]}-{steps[1]} "
        f"({describe_gap(gap, base)}; tolerance {tolerance:.3g})"
    )
    return Quality(verdict, base, cand, gap, tolerance, steps, note)


def describe_gap(gap: float, base: float) -> str:
    """``gap +0.12, +4.0%``; ``no gap`` for equal losses; the relative gap only where it shows at one decimal."""
    if gap == 0:
        return "no gap"
    relative = gap / base if base else 0.0
    return f"gap {gap:+.4g}" + (f", {relative:+.1%}" if round(relative, 3) else "")


def steps_to_target(run: dict[int, float], target: float) -> int | None:
    """The first logged step whose smoothed loss (the trailing mean over a tenth of the run's logged steps) is at or
    below ``target``; None: never reached."""
    steps = sorted(run)
    smoothed = smooth([run[step] for step in steps], max(1, len(steps) // SMOOTHING_FRACTION))
    return next((step for step, value in zip(steps, smoothed, strict=True) if value <= target), None)


def time_to_step(dump: dict[str, Any], last: int) -> float | None:
    """Seconds of step time through step ``last`` (gaps between a resumed run's segments excluded); None without
    step times."""
    found = next((one for one in dump["metrics"] if one["name"] == STEP_TIME and not one["context"]), None)
    if found is None:
        return None
    pairs = zip(found["steps"], found["values"], strict=True)
    return sum(value for step, value in pairs if step is not None and value is not None and step <= last)
