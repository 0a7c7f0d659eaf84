"""tuning.benchmarking without training: journal, record → dump, aggregates, rebuild, schema, stop rule, watchdog,
system metrics. Real files, threads and psutil; the training end to end lives in test_bench_train.py."""

import contextlib
import json
import os
import statistics
import threading
import time

import pytest

from tests.helpers.training import REPO_ROOT
from tuning.benchmarking.dump import (
    PROCESS_ANON_RSS,
    STEP_SAMPLES,
    STEP_TIME,
    STEP_TOKENS,
    build_dump,
    rank_report_path,
)
from tuning.benchmarking.job import load_callbacks
from tuning.benchmarking.journal import Journal, journal_path, read_journal
from tuning.benchmarking.paths import rebuilt_dump_path
from tuning.benchmarking.rebuild import main as rebuild_main
from tuning.benchmarking.record import RunRecord
from tuning.benchmarking.schema import json_schema, markdown_with_schema, validate_dump
from tuning.benchmarking.stopping import StopRule
from tuning.benchmarking.system_metrics import SystemMetricsSampler, peak_rss_bytes
from tuning.benchmarking.tokens import StepTokenCounter
from tuning.benchmarking.watchdog import StallWatchdog, thread_stacks
from tuning.utils.error_logging import UserInputError

ENVIRONMENT = {
    "python": "3.11",
    "torch": "2",
    "transformers": "5",
    "trl": "1",
    "peft": "0.21",
    "aim": None,
    "cuda": None,
    "cuda_driver": None,
    "gpus": [],
}
HEADER = {"experiment": "e", "host": "h", "rank": 0, "world_size": 1, "environment": ENVIRONMENT}


def simulated_run(path, steps: int = 6, warmup: int = 2) -> RunRecord:
    """A run of ``steps`` steps of 0.5 s + 0.1 s * step, 100 tokens and 4 samples each, warmup ``warmup`` steps."""
    record = RunRecord(Journal(str(path), sync_interval=0.0), HEADER)
    record.note(metadata={"dataset": "d"}, train_start=time.time())
    record.track(1.5, "model_load_time")
    for step in range(1, steps + 1):
        record.record(STEP_TIME, 0.5 + 0.1 * step, step=step)
        record.record(STEP_TOKENS, 100, step=step)
        record.record(STEP_SAMPLES, 4, step=step)
        record.record("loss", float("nan") if step == 3 else 1.0 / step, step=step)
        record.record("cpu_percent", 10.0 * step, step=step, context={})
        if step == warmup:
            record.note(warmup_steps=warmup)
    return record


def test_the_summary_peak_of_anonymous_memory_is_the_largest_sample_warmup_included(tmp_path):
    record = simulated_run(tmp_path / "run.journal.jsonl")
    assert record.finish("ok", training_steps=6)["summary"]["peak_anon_rss_bytes"] is None  # no samples, no figure
    record = simulated_run(tmp_path / "sampled.journal.jsonl")
    for step, value in ((1, 300.0), (4, 200.0), (6, 250.0)):
        record.record(PROCESS_ANON_RSS, value, step=step, context={})
    dump = record.finish("ok", training_steps=6, peak_rss_bytes=1000)
    assert validate_dump(dump) == []
    assert (dump["summary"]["peak_anon_rss_bytes"], dump["summary"]["peak_rss_bytes"]) == (300, 1000)


def test_dump_from_a_finished_run(tmp_path):
    record = simulated_run(tmp_path / "run.journal.jsonl")
    dump = record.finish("ok", training_steps=6, peak_rss_bytes=123)
    assert validate_dump(dump) == []
    assert dump["status"] == "ok" and dump["training_steps"] == 6 and dump["warmup_steps"] == 2
    assert dump["metadata"] == {"dataset": "d"}
    summary = dump["summary"]
    measured = [0.5 + 0.1 * step for step in (3, 4, 5, 6)]
    assert summary["measured_steps"] == 4
    assert summary["tokens_per_second"] == pytest.approx(400 / sum(measured))
    assert summary["samples_per_second"] == pytest.approx(16 / sum(measured))
    assert summary["step_time_p50"] == pytest.approx(statistics.median(measured))
    assert summary["model_load_time"] == 1.5 and summary["peak_rss_bytes"] == 123
    loss = next(m for m in dump["metrics"] if m["name"] == "loss")
    assert loss["steps"] == [1, 2, 3, 4, 5, 6] and loss["values"][2] is None  # NaN kept as null
    aggregates = {a["name"]: a for a in dump["aggregates"]}
    assert aggregates["cpu_percent"] == {
        "name": "cpu_percent",
        "context": {},
        "min": 30.0,
        "avg": 45.0,
        "max": 60.0,
        "count": 4,
    }
    assert aggregates["loss"]["count"] == 3  # warmup steps and the NaN left out
    assert aggregates["model_load_time"]["count"] == 1  # no step: never warmup
    json.dumps(dump, allow_nan=False)  # strict JSON


def test_journal_rebuilds_the_same_dump_and_survives_a_torn_line(tmp_path):
    path = tmp_path / "run.journal.jsonl"
    live = simulated_run(path).finish("stopped", training_steps=6, stop_reason="auto_stop")
    rebuilt = build_dump(read_journal(str(path)), rebuilt_from_journal=True)
    assert rebuilt == {**live, "rebuilt_from_journal": True}

    cut = tmp_path / "cut.journal.jsonl"
    lines = path.read_text().splitlines()
    cut.write_text("\n".join(lines[:12]) + "\n" + lines[12][:20])  # died in the middle of a write, no end record
    dump = build_dump(read_journal(str(cut)), rebuilt_from_journal=True)
    assert validate_dump(dump) == []
    assert dump["status"] == "error" and dump["error"]["category"] is None and "killed" in dump["error"]["message"]
    assert dump["training_steps"] == max(s for m in dump["metrics"] if m["name"] == STEP_TIME for s in m["steps"])

    broken = tmp_path / "broken.journal.jsonl"
    broken.write_text(lines[0] + "\n{oops\n" + lines[1] + "\n")
    with pytest.raises(ValueError, match=":2: not a journal record"):
        read_journal(str(broken))


def test_point_lines_are_exactly_the_json_of_their_records(tmp_path):
    """Points are written without building their dicts: each line must still be what json writes for the record."""
    import numpy as np

    path = tmp_path / "run.journal.jsonl"
    record = RunRecord(Journal(str(path)), HEADER)
    points = [
        ("loss", 1.25, 3, None),
        ('we"ird\\name é', np.float32(0.1), None, {"subset": "eval"}),
        ("gpu_memory_used_bytes", 2**40, np.int64(7), {"gpu": 1}),
        ("zero", -0.0, 0, {}),
        ("tiny", 1e-300, 10**12, {"nested": {"a": [1, "b"]}}),
        ("nan", float("nan"), 1, None),
    ]
    record.record_many(points)
    record.record_many([("loss", 0.5, 4, None), ("loss", 0.25, 5, None)], at=1.5)  # measured together: one time
    record.finish("ok", training_steps=1)
    lines = path.read_text().splitlines()[1:-1]
    written = [json.loads(line) for line in lines]
    assert [p["time"] for p in written[-2:]] == [1.5, 1.5] and written[0]["time"] > 1.5
    assert [p["value"] for p in written[-2:]] == [0.5, 0.25]
    lines, written = lines[:-2], written[:-2]
    assert [(p["name"], p["step"], p["context"]) for p in written] == [
        (name, None if step is None else int(step), context or {}) for name, _, step, context in points
    ]
    assert [p["value"] for p in written] == [1.25, float(np.float32(0.1)), 2.0**40, -0.0, 1e-300, None]
    assert lines == [json.dumps(p, allow_nan=False) for p in written]


def test_a_stuck_journal_writer_costs_close_its_timeout_not_a_hang(tmp_path, caplog):
    """A journal whose writes block (a FIFO nobody reads any more, as a file on a hung filesystem) while more than a
    pipe's worth of records waits: close() gives up on the writer after its timeout, and what was read before stays."""
    path = tmp_path / "j.jsonl"
    os.mkfifo(path)
    reader = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        journal = Journal(str(path), flush_interval=0.05)
        journal.write({"type": "start", "time": 1.0, "schema_version": 1})
        received = b""
        deadline = time.monotonic() + 30
        while b"\n" not in received and time.monotonic() < deadline:
            time.sleep(0.05)
            with contextlib.suppress(BlockingIOError):
                received += os.read(reader, 65536)
        journal.write(*[{"type": "note", "time": 2.0, "filler": "x" * 1000} for _ in range(300)])  # ~300 KB
        start = time.monotonic()
        journal.close(timeout=0.25)
        assert time.monotonic() - start < 10
        assert journal._writer.is_alive() and "did not finish within 0.25 s" in caplog.text
        assert [json.loads(line)["time"] for line in received.decode().splitlines()] == [1.0]
    finally:
        os.close(reader)  # the abandoned writer's blocked write fails now, and its thread ends
    journal._writer.join(10)
    assert not journal._writer.is_alive()


def test_rebuild_command(tmp_path, capsys):
    path = tmp_path / "run.journal.jsonl"
    simulated_run(path)  # never finished: as after SIGKILL, once the writer thread flushed
    deadline = time.monotonic() + 10
    while len(path.read_text().splitlines()) < 1 + 2 + 6 * 5 + 1:  # start, notes and track, points, warmup note
        assert time.monotonic() < deadline, "the journal was not flushed within 10 s"
        time.sleep(0.05)
    assert rebuild_main([str(path)]) == 0
    output = tmp_path / "run.rebuilt.json"
    assert rebuilt_dump_path(str(path)) == str(output)
    dump = json.loads(output.read_text())
    assert dump["rebuilt_from_journal"] and dump["status"] == "error" and validate_dump(dump) == []
    assert "status error, 6 steps" in capsys.readouterr().out
    assert rebuild_main([str(tmp_path / "missing.journal.jsonl")]) == 1
    assert "cannot rebuild" in capsys.readouterr().err


def test_file_names():
    assert journal_path("out/bench.json") == "out/bench.journal.jsonl"
    assert journal_path("out/bench.json", rank=8) == "out/bench.rank8.journal.jsonl"
    assert rank_report_path("out/bench.json", 3) == "out/bench.json.rank3.error.json"


def test_validate_dump_reports_every_problem(tmp_path):
    dump = simulated_run(tmp_path / "j.jsonl").finish("ok", training_steps=6)
    expected = ["$: error must be set exactly when status is 'error' or 'interrupted'"]
    assert validate_dump({**dump, "status": "error"}) == expected
    assert validate_dump({**dump, "status": "interrupted"}) == expected
    problems = validate_dump({**dump, "training_steps": "6", "rank": True, "summary": {}})
    assert "$.training_steps: Input should be a valid integer, got str" in problems
    assert "$.rank: Input should be a valid integer, got bool" in problems
    assert "$.summary: missing key 'tokens_per_second'" in problems
    short = {**dump["metrics"][0], "steps": dump["metrics"][0]["steps"][:-1]}
    assert validate_dump({**dump, "metrics": [short]}) == [
        "$.metrics[0]: steps, values and timestamps differ in length"
    ]
    del dump["metrics"]
    assert validate_dump(dump) == ["$: missing key 'metrics'"]


def test_stop_rule():
    def reason(rule: StopRule, elapsed: float, times: list[float]) -> str | None:
        return rule.reason(elapsed, len(times), sum(times), times[-rule.min_steps :])

    budget = StopRule(stop_after_seconds=10)
    assert reason(budget, 9.9, []) is None and reason(budget, 10, []) == "stop_after_seconds"
    auto = StopRule(auto_stop=True, min_steps=3, min_seconds=1.0, tolerance=0.05)
    assert reason(auto, 100, [0.5, 0.5]) is None  # too few steps
    assert reason(auto, 100, [0.2, 0.2, 0.2]) is None  # too few seconds
    assert reason(auto, 100, [1.0, 0.5, 0.9]) is None  # not settled
    assert reason(auto, 100, [3.0, 0.5, 0.51, 0.5]) == "auto_stop"  # the last window settled
    assert not StopRule().active
    for bad in (dict(stop_after_seconds=0), dict(min_steps=1), dict(tolerance=-1)):
        with pytest.raises(UserInputError):
            StopRule(**bad)


def test_watchdog_fires_once_with_every_stack():
    fired: list[float] = []
    stuck = threading.Event()

    def stuck_worker():
        stuck.wait(10)

    worker = threading.Thread(target=stuck_worker, name="stuck-worker", daemon=True)
    worker.start()
    watchdog = StallWatchdog(0.4, fired.append)
    watchdog.arm()
    for _ in range(3):  # beats keep it quiet
        time.sleep(0.2)
        watchdog.beat()
    assert fired == []
    deadline = time.monotonic() + 10
    while not fired and time.monotonic() < deadline:  # fires once 0.4 s pass without a beat
        time.sleep(0.02)
    time.sleep(0.5)  # more than another timeout without a beat: still once
    assert len(fired) == 1 and fired[0] >= 0.4
    stacks = thread_stacks()
    assert stacks.startswith("Thread MainThread") and "stuck-worker" in stacks and "stuck_worker" in stacks
    stuck.set()


def test_system_metrics_sampler():
    points: list[tuple[str, float, dict]] = []
    sampler = SystemMetricsSampler(0.05, lambda name, value, context: points.append((name, value, context)))
    sampler.start()
    time.sleep(0.3)
    sampler.stop()
    names = {name for name, _, _ in points}
    assert {"cpu_percent", "memory_percent", "process_rss_bytes"} <= names
    rss = [value for name, value, _ in points if name == "process_rss_bytes"]
    assert 0 < max(rss) <= peak_rss_bytes() * 1.05  # the kernel's high-water mark lags a little behind
    count = len(points)
    time.sleep(0.15)
    assert len(points) == count  # stopped means stopped


def test_token_counter_counts_training_forwards_per_step(tiny_model):
    """Mask sums of training micro-batches only, every token of a row without a mask, nothing once detached."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    input_ids = torch.ones((2, 6), dtype=torch.int64)
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])
    counter = StepTokenCounter(model, torch.device("cpu"))
    model.train()
    model(input_ids=input_ids, attention_mask=mask)
    model(input_ids=input_ids[:1])  # unpadded: all 6 count
    model.eval()
    model(input_ids=input_ids, attention_mask=mask)  # evaluation does not count
    counter.end_step(1, 0.5)
    counter.end_step(2, 0.25)  # a step without a training forward
    assert counter.ready() == [(1, 0.5, 16), (2, 0.25, 0)]
    assert counter.rank_tokens == {1: 16, 2: 0}  # this rank's own (all of them, on one process)
    counter.detach()
    model.train()
    model(input_ids=input_ids, attention_mask=mask)
    counter.end_step(3, 0.5)
    assert counter.ready(wait=True) == [(3, 0.5, 0)]


def test_benchmark_callback_records_batched_steps_each_under_its_own_time(tmp_path):
    """Steps and logs noted between record intervals keep their own time and order, logs are copied when noted, and
    ``close`` (the way out when training raised or stalled) records whatever was still waiting."""
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from tuning.benchmarking.callback import RECORD_INTERVAL_S, BenchmarkCallback

    record = RunRecord(Journal(str(tmp_path / "j.jsonl")), HEADER)
    mirrored = []
    callback = BenchmarkCallback(record, StopRule(), warmup_steps=0, mirror=mirrored.extend)
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=3, report_to=[])
    state, control = TrainerState(), TrainerControl()
    callback.on_train_begin(args, state, control)
    step_ends = {}
    for step in (1, 2, 3):
        state.global_step = step
        logs = {"loss": 1.0 / step, "total_flos": 9.0}
        callback.log_recorder.on_log(args, state, control, logs=logs)
        logs.pop("total_flos")  # as transformers' PrinterCallback does, after this callback noted the log
        callback.on_step_end(args, state, control)
        step_ends[step] = callback._last_step_end
    assert time.time() - callback._recorded_at < RECORD_INTERVAL_S, "the steps came faster than the interval"
    callback.close()
    dump = record.finish("error", training_steps=3)
    series = {item["name"]: item for item in dump["metrics"]}
    assert series[STEP_TIME]["steps"] == [1, 2, 3]
    assert series[STEP_TIME]["timestamps"] == [step_ends[1], step_ends[2], step_ends[3]]
    assert series[STEP_SAMPLES]["values"] == [3, 3, 3]
    assert series["loss"]["values"] == [1.0, 0.5, pytest.approx(1 / 3)]
    assert series["total_flos"]["steps"] == [1, 2, 3]
    # Trackers get one point for the three quick steps: their mean, under the last step.
    assert mirrored == [(STEP_TIME, pytest.approx(statistics.mean(series[STEP_TIME]["values"])), 3, None)]
    points = [record for record in read_journal(str(tmp_path / "j.jsonl")) if record["type"] == "point"]
    assert [point["time"] for point in points] == sorted(point["time"] for point in points)


def test_benchmark_callback_mirrors_each_step_slower_than_the_mirror_interval(tmp_path):
    """A step that takes longer than the mirror interval reaches the trackers as its own point, with its own value."""
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from tuning.benchmarking.callback import RECORD_INTERVAL_S, BenchmarkCallback

    record = RunRecord(Journal(str(tmp_path / "j.jsonl")), HEADER)
    mirrored = []
    callback = BenchmarkCallback(record, StopRule(), warmup_steps=0, mirror=mirrored.extend, mirror_interval=0.05)
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=3, report_to=[])
    state, control = TrainerState(), TrainerControl()
    callback.on_train_begin(args, state, control)
    for step in (1, 2, 3):
        time.sleep(RECORD_INTERVAL_S + 0.02)
        state.global_step = step
        callback.on_step_end(args, state, control)
    callback.close()
    step_times = {item["name"]: item for item in record.finish("ok", training_steps=3)["metrics"]}[STEP_TIME]
    assert mirrored == [
        (STEP_TIME, value, step, None) for step, value in zip((1, 2, 3), step_times["values"], strict=True)
    ]


def test_the_dump_schema_page_shows_the_generated_json_schema():
    """docs/dump-schema.md's schema block is what ``python -m tuning.benchmarking.schema --markdown`` writes."""
    page = (REPO_ROOT / "docs" / "dump-schema.md").read_text(encoding="utf-8")
    assert markdown_with_schema(page) == page, (
        "run: python -m tuning.benchmarking.schema --markdown docs/dump-schema.md"
    )
    assert json_schema()["required"][:3] == ["schema_version", "status", "stop_reason"]


def _segment(path, first_step: int, last_step: int, seconds: float, warmup: int, status: str, append: bool):
    """One process of a resumed run through the real record and journal: steps after ``first_step`` up to
    ``last_step`` of ``seconds`` each and 100 tokens, ``warmup`` steps of warm-up, ended with ``status``."""
    previous = read_journal(str(path)) if append else []
    record = RunRecord(Journal(str(path), sync_interval=0.0, append=append), HEADER, previous)
    record.note(train_start=time.time(), first_step=first_step)
    for step in range(first_step + 1, last_step + 1):
        record.record_many([(STEP_TIME, seconds, step, None), (STEP_TOKENS, 100, step, None)])
        record.record("cpu_percent", 10.0, step=step, context={})
        if step == first_step + warmup:
            record.note(warmup_steps=step, warmup_seconds=warmup * seconds)
    error = {"category": "interrupted", "message": "stopped by SIGTERM", "global_step": last_step}
    return record.finish(status, training_steps=last_step, error=error if status == "interrupted" else None)


def test_a_resumed_run_keeps_every_segment_one_point_per_step_and_rates_without_the_gap(tmp_path):
    """The preempted process trained steps 1-6 (its last checkpoint: 4), the restart 5-10: steps 5 and 6 are the
    restart's; warm-up is 2 steps in each; the time between the processes counts in no rate."""
    path = tmp_path / "run.journal.jsonl"
    _segment(path, 0, 6, 1.0, 2, "interrupted", append=False)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write('{"type": "point", "name": "torn')  # the preempted process died in the middle of a line
    time.sleep(0.2)  # the gap
    dump = _segment(path, 4, 10, 0.5, 2, "ok", append=True)
    assert validate_dump(dump) == []
    assert build_dump(read_journal(str(path))) == dump  # the rebuild reads the same segments
    step_time = next(one for one in dump["metrics"] if one["name"] == STEP_TIME)
    assert step_time["steps"] == list(range(1, 11))
    assert step_time["values"] == [1.0] * 4 + [0.5] * 6
    assert (dump["status"], dump["error"], dump["training_steps"]) == ("ok", None, 10)
    assert dump["summary"]["resumed_from_step"] == 4
    first, second = dump["segments"]
    assert (first["status"], first["error"]["category"], first["training_steps"]) == ("interrupted", "interrupted", 6)
    assert (first["resumed_from_step"], second["resumed_from_step"]) == (None, 4)
    assert (first["steps"], first["warmup_steps"], first["measured_steps"]) == (4, 2, 2)  # 5, 6: trained again
    assert (second["steps"], second["warmup_steps"], second["measured_steps"]) == (6, 6, 4)
    assert first["gap_seconds"] is None and second["gap_seconds"] >= 0.2
    assert (first["tokens_per_second"], second["tokens_per_second"]) == (100.0, 200.0)
    # Steps 3-4 (1 s each) and 7-10 (0.5 s each): 600 tokens in 4 s, the gap and the warm-ups out.
    assert dump["summary"]["measured_steps"] == 6
    assert dump["summary"]["tokens_per_second"] == pytest.approx(150.0)
    cpu = next(one for one in dump["aggregates"] if one["name"] == "cpu_percent")
    assert cpu["count"] == 6


def test_a_dump_from_before_segments_still_reads(tmp_path):
    """A dump written before resumed runs were segments (no ``segments``, no ``summary.resumed_from_step``) validates,
    and its post-warmup steps are still told by its ``warmup_steps``."""
    from tuning.benchmarking.dump import measured_step
    from tuning.benchmarking.report import load, row

    dump = simulated_run(tmp_path / "run.journal.jsonl").finish("ok", training_steps=6)
    del dump["segments"], dump["summary"]["resumed_from_step"]
    assert validate_dump(dump) == []
    assert [step for step in range(1, 7) if measured_step(dump, step)] == [3, 4, 5, 6]
    (tmp_path / "old.json").write_text(json.dumps(dump))
    (run,) = load([(tmp_path / "old.json", True)])
    assert row(run, [])["resumed_from_step"] is None


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_such_module:Callback", "--callbacks no_such_module:Callback: cannot load it (No module named"),
        ("json:NoSuchName", "--callbacks json:NoSuchName: cannot load it (module 'json' has no attribute"),
        ("collections:OrderedDict", "--callbacks collections:OrderedDict gave a OrderedDict, not a TrainerCallback"),
        ("json:dumps", "--callbacks json:dumps cannot be called without arguments (missing a required argument"),
        ("json:__doc__", "--callbacks json:__doc__ cannot be called without arguments ("),
    ],
)
def test_a_callback_that_cannot_be_loaded_is_a_user_error_naming_it(spec, message):
    """bench_train loads --callbacks right after its dump is claimed: a bad entry is a UserInputError (a point's
    user_error, never retried, as tests/wrappers/test_bench_sweep.py's OOM grid shows for such errors)."""
    with pytest.raises(UserInputError) as refused:
        load_callbacks(spec)
    assert str(refused.value).startswith(message), refused.value
