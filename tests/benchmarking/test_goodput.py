"""summary.goodput and the segments of a killed run, from journals with known times (in process): each part is the
time the journal says, the parts sum to the wall time, a killed segment ends at its last record and the gap before
its restart is the real one."""

import pytest

from tests.helpers.dumps import ENVIRONMENT
from tuning.benchmarking.dump import STEP_TIME, build_dump, utc_iso
from tuning.benchmarking.goodput import ENDED_DURING, PARTS
from tuning.benchmarking.schema import validate_dump

HEADER = {
    "schema_version": 1,
    "experiment": None,
    "host": "h",
    "rank": 0,
    "world_size": 1,
    "environment": ENVIRONMENT,
}


def _point(name: str, value: float, at: float, step: int | None = None, context: dict | None = None) -> dict:
    return {"type": "point", "name": name, "context": context or {}, "step": step, "value": value, "time": at}


def _note(at: float, **facts) -> dict:
    return {"type": "note", "time": at, **facts}


def _process(
    start: float,
    first_step: int,
    steps: dict[int, tuple[float, float]],
    warmup: int,
    setup: float,
    start_clock: dict | None = None,
) -> list[dict]:
    """One process's records: its start at ``start`` (process start, dated by ``start_clock``), 1 s of startup, 0.5 s
    of trackers, 1 s of data preparation, 2 s of model load, ``setup`` seconds from Trainer.train() to train begin;
    then ``steps`` (step: (seconds, end time)), ``warmup`` steps of warm-up."""
    records = [
        {"type": "start", "time": start, **HEADER, **({"start_clock": start_clock} if start_clock else {})},
        _note(start + 1, startup_end=start + 1),
        _note(start + 1.5, trackers_start_seconds=0.5),
        _point("data_preparation_time", 1.0, start + 2.5, context={"subset": "additional_metrics"}),
        _point("model_load_time", 2.0, start + 4.5, context={"subset": "additional_metrics"}),
        _note(start + 4.5 + setup, train_entered=start + 4.5, train_start=start + 4.5 + setup, first_step=first_step),
    ]
    for step, (seconds, end) in steps.items():
        records.append(_point(STEP_TIME, seconds, end, step))
        if step == first_step + warmup:
            records.append(_note(end, warmup_steps=step, warmup_seconds=1.0))
    return records


def _killed_then_resumed(restart: float = 120, setup: float = 1.0, start_clock: dict | None = None) -> list[dict]:
    """Process 1 trains steps 1-6 (1 s each; a 0.5 s checkpoint save after step 4 falls in step 5's 1.5 s; a 0.5 s
    evaluation after step 6) and is SIGKILLed after its last record at 112; process 2 starts at ``restart`` (dated by
    ``start_clock``), resumes from checkpoint 4 after ``setup`` seconds of loading, trains steps 5-8 (ending 7 s after
    its start) and ends 11 s after its start."""
    first = _process(100, 0, {1: (1, 106), 2: (1, 107), 3: (1, 108), 4: (1, 109)}, warmup=2, setup=0.5)
    first += [_point("checkpoint_save_seconds", 0.5, 109.5, 4), _point(STEP_TIME, 1.5, 110.5, 5)]
    first += [_point(STEP_TIME, 1.0, 111.5, 6), _point("evaluation_seconds", 0.5, 112.0, 6)]
    steps = {step: (1, restart + step + 2) for step in range(5, 9)}
    second = _process(restart, 4, steps, warmup=1, setup=setup, start_clock=start_clock)
    end = {"type": "end", "time": restart + 11, "status": "ok", "stop_reason": None, "error": None}
    return first + second + [{**end, "training_steps": 8, "peak_rss_bytes": None, "cuda": None}]


def test_a_killed_segment_ends_at_its_last_record_and_the_gap_is_the_real_one():
    first, second = build_dump(_killed_then_resumed(), rebuilt_from_journal=True)["segments"]
    assert (first["status"], first["stop_time"]) == ("error", utc_iso(112.0))
    assert (second["start_time"], second["gap_seconds"]) == (utc_iso(120.0), 8.0)


def test_a_resumed_run_s_goodput_counts_its_repeated_steps_its_gap_and_its_restore_and_sums_to_the_wall():
    dump = build_dump(_killed_then_resumed(), rebuilt_from_journal=True)
    assert validate_dump(dump) == []
    goodput = dump["summary"]["goodput"]
    assert goodput["wall_seconds"] == 31.0
    assert goodput["not_measured"] == {}
    assert goodput["parts"] == {
        "startup": 2.0,
        "model_load": 4.0,
        "data_preparation": 2.0,
        "trackers_start": 1.0,
        "checkpoint_restore": 1.0,  # process 2 only: process 1 began fresh
        "warmup_steps": 3.0,  # steps 1-2, then 5 again
        "productive_steps": 5.0,  # steps 3-4, then 6-8
        "evaluation": 0.5,
        "checkpoint_save": 0.5,
        "repeated_steps": 2.0,  # process 1's steps 5 (its save taken out) and 6
        "gaps": 8.0,
        "leftover": 2.0,
    }
    assert list(goodput["parts"]) == list(PARTS)
    assert sum(goodput["parts"].values()) == pytest.approx(goodput["wall_seconds"])
    assert goodput["productive_fraction"] == pytest.approx(5.0 / 31.0)


def test_a_part_that_was_not_recorded_is_null_with_its_reason_and_its_time_is_leftover():
    records = [
        record
        for record in _killed_then_resumed()
        if record.get("name") != "data_preparation_time" and "startup_end" not in record
    ]
    goodput = build_dump(records)["summary"]["goodput"]
    assert goodput["parts"]["data_preparation"] is None and goodput["parts"]["startup"] is None
    assert "data_preparation_time" in goodput["not_measured"]["data_preparation"]
    assert goodput["parts"]["leftover"] == 2.0 + 2.0 + 2.0  # the 2 s of each that nothing else claims
    assert sum(seconds for seconds in goodput["parts"].values() if seconds) == pytest.approx(31.0)


def test_a_run_that_failed_preparing_its_data_says_so_instead_of_a_zero():
    """Its data_preparation_time never came (tracked once the rows are ready): null with the reason, the time in
    leftover; the model it never began loading is 0."""
    records = [
        *_process(100, 0, {}, warmup=1, setup=0.5)[:3],
        {"type": "end", "time": 110.0, "status": "error", "stop_reason": None, "training_steps": 0},
    ]
    records[-1]["error"] = {"category": "user_error", "message": "no label tokens"}
    goodput = build_dump(records)["summary"]["goodput"]
    assert (goodput["parts"]["data_preparation"], goodput["parts"]["model_load"]) == (None, 0.0)
    assert goodput["not_measured"] == {"data_preparation": ENDED_DURING["data_preparation"]}
    assert goodput["parts"]["leftover"] == pytest.approx(10.0 - 1.0 - 0.5)


KERNEL_TICK = {"source": "proc_stat_starttime", "precision_seconds": 0.01}


@pytest.mark.parametrize(
    ("start_clock", "early", "disagree"),
    [
        (KERNEL_TICK, 0.004, False),  # a restart within a tick of the kill
        (KERNEL_TICK, 0.5, True),  # the wall clock stepped back, or the restart ran on another host
        (None, 0.079, False),  # a journal from before start_clock: psutil's create_time, dated up to 1 s early
    ],
)
def test_a_restart_dated_before_the_previous_stop_has_gap_0_with_a_note_and_goodput_stays_non_negative(
    start_clock, early, disagree
):
    dump = build_dump(_killed_then_resumed(restart=112 - early, start_clock=start_clock), rebuilt_from_journal=True)
    assert validate_dump(dump) == []
    second = dump["segments"][1]
    assert (second["gap_seconds"], second["start_clock"]) == (0.0, start_clock)
    assert f"{early:.3f} s before the previous segment's stop" in second["gap_note"]
    assert second["gap_note"].startswith("clocks disagree") == disagree
    goodput = dump["summary"]["goodput"]
    assert goodput["parts"]["gaps"] == 0.0 and min(goodput["parts"].values()) >= 0
    assert goodput["wall_seconds"] == pytest.approx(12 + 11)  # each segment's own span, nothing counted twice
    assert sum(goodput["parts"].values()) == pytest.approx(goodput["wall_seconds"])
    assert [note.startswith("segment 1: clocks disagree") for note in goodput["clock_notes"]] == [True] * disagree


def test_parts_measured_below_0_or_beyond_the_wall_count_0_and_the_wall_is_their_sum_said_in_clock_notes():
    """A wall clock stepped back during the restart's checkpoint loading (train begin noted before Trainer.train()'s
    entry), and a step that took longer than its whole process."""
    records = _killed_then_resumed(setup=-0.5)
    records[-2] = {**records[-2], "value": 40.0}  # step 8
    goodput = build_dump(records)["summary"]["goodput"]
    parts = goodput["parts"]
    assert parts["checkpoint_restore"] == 0.0 and min(parts.values()) >= 0 and parts["leftover"] == 0.0
    assert goodput["wall_seconds"] == pytest.approx(sum(parts.values())) and goodput["wall_seconds"] > 31.0
    restore, excess = goodput["clock_notes"]
    assert restore == "checkpoint_restore measured -0.500 s: clocks disagree; counted as 0"
    assert excess.startswith("the measured parts exceed the wall time (31.000 s) by ")
