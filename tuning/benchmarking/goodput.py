"""``summary.goodput``: where a run's wall time went, from its first process's start to its dump, as Google's
ml-goodput-measurement and NVIDIA's resiliency guides split it. Every part is measured (docs/benchmarking.md,
"Goodput", says where); a part that was not measured is null with its reason, and its time falls into ``leftover``,
which is the wall time less every measured part, so that the parts always sum to the wall time.

Step times come from the step series (each step's time runs from the previous step's end, so that evaluation and a
checkpoint save between two steps fall inside the next step's time): the evaluation and checkpoint-save intervals are
taken out of the steps they overlap. A step a later segment trained again (the preempted process's steps after its
last checkpoint) counts as ``repeated_steps``, whether it was warm-up or not.

Times are compared on one clock (``tuning.benchmarking.clocks``): a gap is never negative, and where clocks disagree
(a part measured below 0, parts that exceed the wall time) ``clock_notes`` says so and the parts stay non-negative and
sum to the wall time.
"""

from typing import Any

from tuning.benchmarking.clocks import PSUTIL_PRECISION_S, segment_gap

PARTS = (
    "startup",
    "model_load",
    "data_preparation",
    "trackers_start",
    "checkpoint_restore",
    "warmup_steps",
    "productive_steps",
    "evaluation",
    "checkpoint_save",
    "repeated_steps",
    "gaps",
    "leftover",
)
# Journal notes and series the parts are read from; the writers use these names.
STARTUP_END = "startup_end"  # note: when the recipe began (interpreter started and imports done)
TRACKERS_START = "trackers_start_seconds"  # note: seconds the trackers took to start
TRAIN_ENTERED = "train_entered"  # note: when Trainer.train() was called (resume loads before train begin)
MODEL_LOAD_TIME = "model_load_time"
DATA_PREPARATION_TIME = "data_preparation_time"
EVALUATION_TIME = "evaluation_seconds"  # per evaluation, at its end
CHECKPOINT_SAVE_TIME = "checkpoint_save_seconds"  # per checkpoint, at its end
STEPS = "steps"  # SegmentTimes.points' key of the step-time series

NOT_NOTED = "not noted in the journal (a recipe without BenchmarkJob, or a dump from before goodput)"
UNMEASURED = {
    "startup": f"process start to the recipe's first line {NOT_NOTED}",
    "model_load": "no model_load_time was tracked (a run that loaded no model, or a trainer other than train()'s)",
    "data_preparation": "no data_preparation_time was tracked (a trainer other than train()'s)",
    "trackers_start": f"the trackers' start {NOT_NOTED}",
    "checkpoint_restore": f"Trainer.train()'s entry {NOT_NOTED}",
}
_ROUNDING_S = 1e-6  # sums of differences of float timestamps may exceed their total by this much: no disagreement

# The parts a process that failed before training was in when it ended, in the order train() goes through them: the
# first one it never tracked (its trackers had started) took the time until the end, which falls into leftover.
ENDED_DURING = {
    "data_preparation": "the run ended before its data preparation finished (its time so far is in leftover)",
    "model_load": "the run ended before its model finished loading (its time so far is in leftover)",
}
FAILED = ("error", "interrupted")  # segment endings of a process that failed


class SegmentTimes:
    """What one process of a run recorded for goodput: its start, its end, its notes, its first step (0 fresh, N
    resumed, None before training began), per series (the step times under ``STEPS``) its ``(step, value, time)``
    points, how it ended (its ``end`` record's status; None: not known), and how early its start may be dated
    (``start_precision``, seconds)."""

    def __init__(
        self,
        start: float,
        end: float,
        notes: dict[str, Any],
        first_step: int | None,
        points: dict,
        status: str | None = None,
        start_precision: float = PSUTIL_PRECISION_S,
    ):
        self.start, self.end, self.notes, self.first_step, self.points = start, end, notes, first_step, points
        self.status, self.start_precision = status, start_precision

    def values(self, name: str) -> list[float]:
        return [value for _, value, _ in self.points.get(name, []) if value is not None]


def _overlap(low: float, high: float, intervals: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(high, end) - max(low, start)) for start, end in intervals)


def goodput(segments: list[SegmentTimes], last_steps: list[float], in_warmup: list) -> dict[str, Any]:
    """The ``summary.goodput`` of a run's segments; ``last_steps``: per segment, its last step that no later segment
    trained again; ``in_warmup``: per segment, whether one of its steps is warm-up."""
    parts: dict[str, float | None] = dict.fromkeys(PARTS, 0.0)
    unmeasured: dict[str, str] = {}
    clock_notes: list[str] = []
    overlap = 0.0  # seconds by which restarts are dated before their previous segment's stop
    for index, segment in enumerate(segments):
        notes = segment.notes
        timed = {
            "startup": notes[STARTUP_END] - segment.start if STARTUP_END in notes else None,
            "model_load": sum(segment.values(MODEL_LOAD_TIME)) if segment.values(MODEL_LOAD_TIME) else None,
            "data_preparation": (
                sum(segment.values(DATA_PREPARATION_TIME)) if segment.values(DATA_PREPARATION_TIME) else None
            ),
            "trackers_start": notes.get(TRACKERS_START),
            "checkpoint_restore": 0.0,
        }
        if segment.first_step:  # resumed: from Trainer.train()'s entry to train begin, the checkpoint's loading
            entered, began = notes.get(TRAIN_ENTERED), notes.get("train_start")
            timed["checkpoint_restore"] = began - entered if entered is not None and began is not None else None
        if segment.first_step is None:  # never began training: nothing to restore, load or prepare may be absent
            timed = {key: value for key, value in timed.items() if value is not None or key == "startup"}
            if segment.status in FAILED and TRACKERS_START in notes:  # failed inside train(): in the first untracked
                part = next((part for part in ENDED_DURING if part not in timed), None)
                if part is not None:
                    parts[part] = None
                    unmeasured.setdefault(part, ENDED_DURING[part])
        for part, seconds in timed.items():
            if seconds is None:
                parts[part] = None
                unmeasured.setdefault(part, UNMEASURED[part])
            elif parts[part] is not None:
                parts[part] += _counted(part, seconds, clock_notes)
        phases = {
            name: [(at - seconds, at) for _, seconds, at in segment.points.get(series, []) if seconds is not None]
            for name, series in (("evaluation", EVALUATION_TIME), ("checkpoint_save", CHECKPOINT_SAVE_TIME))
        }
        between = [interval for intervals in phases.values() for interval in intervals]
        for name, intervals in phases.items():
            parts[name] += sum(end - start for start, end in intervals)
        for step, seconds, at in segment.points.get(STEPS, []):
            if seconds is None or step is None:
                continue
            own = max(0.0, seconds - _overlap(at - seconds, at, between))
            kind = (
                "repeated_steps"
                if step > last_steps[index]
                else "warmup_steps"
                if in_warmup[index](step)
                else "productive_steps"
            )
            parts[kind] += own
        if index:
            gap = segment_gap(segments[index - 1].end, segment.start, segment.start_precision)
            parts["gaps"] += gap.seconds
            overlap += max(0.0, segments[index - 1].end - segment.start)
            if gap.disagree:
                clock_notes.append(f"segment {index}: {gap.note}")
    # The first start to the last end, each segment's own span whole where a restart is dated before the stop before it.
    wall = balance(parts, segments[-1].end - segments[0].start + overlap, clock_notes)
    return {
        "wall_seconds": wall,
        "productive_fraction": parts["productive_steps"] / wall if wall > 0 else None,
        "parts": parts,
        "not_measured": unmeasured,
        "clock_notes": clock_notes,
    }


def _counted(part: str, seconds: float, clock_notes: list[str]) -> float:
    """``seconds`` of ``part``, or 0 (said in ``clock_notes``) for a time measured below 0: clocks that disagree."""
    if seconds >= 0:
        return seconds
    clock_notes.append(f"{part} measured {seconds:.3f} s: clocks disagree; counted as 0")
    return 0.0


def balance(parts: dict[str, float | None], wall: float, clock_notes: list[str]) -> float:
    """Set ``parts["leftover"]`` to the wall time less every other part and return the wall time, every part
    non-negative: a part measured below 0, or parts summing to more than ``wall``, can only come from clocks that
    disagree (the wall clock stepped during the run); each is said in ``clock_notes``, the part counted as 0 and the
    wall time taken as the parts' sum."""
    for part, seconds in parts.items():
        if part != "leftover" and seconds is not None:
            parts[part] = _counted(part, seconds, clock_notes)
    measured = sum(seconds for part, seconds in parts.items() if seconds and part != "leftover")
    if measured - wall > _ROUNDING_S:
        clock_notes.append(
            f"the measured parts exceed the wall time ({wall:.3f} s) by {measured - wall:.3f} s: clocks disagree; "
            "the wall time is their sum"
        )
    wall = max(wall, measured)
    parts["leftover"] = wall - measured
    return wall


def rank_goodput(
    start: float,
    end: float,
    timed: dict[str, float | None],
    steps: dict[int, float],
    last_warmup_step: int | None,
    between_steps: dict[int, float],
) -> dict[str, Any]:
    """One rank's goodput of its own process, from its start to ``end`` (train end), for ``summary.rank_goodput``:
    ``timed`` the parts it timed itself (startup, model_load, data_preparation, trackers_start, checkpoint_restore,
    evaluation, checkpoint_save; None: not measured), ``steps`` its step times (each from the previous step's end),
    ``between_steps`` the seconds spent in evaluation and saves after each step (inside the next step's time)."""
    parts: dict[str, float | None] = {part: timed.get(part) for part in PARTS if part not in ("gaps", "leftover")}
    parts.update(warmup_steps=0.0, productive_steps=0.0, repeated_steps=0.0)
    for step, seconds in steps.items():
        own = max(0.0, seconds - between_steps.get(step - 1, 0.0))
        warmup = last_warmup_step is None or step <= last_warmup_step
        parts["warmup_steps" if warmup else "productive_steps"] += own
    parts["gaps"] = 0.0
    clock_notes: list[str] = []
    wall = balance(parts, end - start, clock_notes)
    return {
        "wall_seconds": wall,
        "productive_fraction": parts["productive_steps"] / wall if wall > 0 else None,
        "parts": parts,
        "clock_notes": clock_notes,
    }
