"""Time to train as MLPerf counts it (tuning.benchmarking.mlperf) through bench_train's main in this process: a run
that reaches its eval-loss target, one that cannot, and one stopped by a real SIGTERM and resumed; their dumps and
MLPerf result logs. The cadence and skip rule at two global batch sizes (4 and 2, the second by accumulation)."""

import json
from pathlib import Path

import pytest

from tests.helpers.bench import bench_args, csv_by, read_dump
from tests.helpers.training import BENCH_CALLBACKS, BENCH_TRAIN, load_script
from tuning.benchmarking.mlperf import eval_interval, skipped_evaluations
from tuning.errors import UserInputError
from tuning.utils.tiny_model import SAMPLE_VALIDATION_PATH

REQUIRED_ONCE = ("submission_benchmark", "submission_division", "submission_org", "submission_platform")
REQUIRED_ONCE += ("init_stop", "run_start", "run_stop", "train_samples", "eval_samples", "global_batch_size")
COUNTED = ("block_start", "block_stop", "eval_start", "eval_stop", "eval_accuracy")


@pytest.fixture(scope="module")
def bench_train():
    return load_script(BENCH_TRAIN)


def time_to_train_args(model: str, output_dir: Path, **flags) -> list[str]:
    """A time-to-train run on the tiny model, validated on the shipped validation rows, with its MLPerf log."""
    flags.setdefault("validation_data_path", SAMPLE_VALIDATION_PATH)
    flags.setdefault("mlperf_log", output_dir / "mlperf.log")
    return bench_args(model, output_dir, tracker="none", system_metrics_interval=0, **flags)


def log_lines(path: Path) -> list[dict]:
    """The log's events; every line is ``:::MLLOG`` and one JSON object of the six fields mllog writes."""
    events = []
    for line in path.read_text().splitlines():
        assert line.startswith(":::MLLOG {"), line
        event = json.loads(line.removeprefix(":::MLLOG "))
        assert list(event) == ["namespace", "time_ms", "event_type", "key", "value", "metadata"], line
        assert isinstance(event["time_ms"], int) and isinstance(event["metadata"], dict), line
        kind = event["key"].rpartition("_")[2]
        assert event["event_type"] == {"start": "INTERVAL_START", "stop": "INTERVAL_END"}.get(kind, "POINT_IN_TIME")
        events.append(event)
    return events


def assert_one_run(events: list[dict]) -> dict[str, dict]:
    """The rules of mlcommons' checker (training 6.0.0, common.yaml) that a run's log must keep: each key once,
    init_start → init_stop → run_start → blocks and evaluations (each with samples_count) → run_stop with a status;
    returns the events by key (the last of each)."""
    keys = [event["key"] for event in events]
    for key in REQUIRED_ONCE:
        assert keys.count(key) == 1, (key, keys)
    assert keys.count("init_start") >= 1 and keys.count("cache_clear") >= 1 and keys.count("eval_accuracy") >= 1
    assert keys.index("init_start") < keys.index("init_stop") < keys.index("run_start") < keys.index("block_start")
    assert keys[-1] == "run_stop" and "status" in events[-1]["metadata"]
    times = [event["time_ms"] for event in events if event["key"] not in ("init_start",)]
    assert times == sorted(times)  # written as the run goes (init_start is dated the process's start)
    for event in events:
        if event["key"] in COUNTED:
            assert event["metadata"]["samples_count"] >= 0, event
    return {event["key"]: event for event in events}


@pytest.fixture(scope="module")
def converged(bench_train, tiny_model, tmp_path_factory):
    """Full fine-tuning on the validation rows themselves at a high learning rate (global batch 4): its eval loss
    falls below 0.9 within 200 steps, evaluated every 32 samples, none skipped."""
    output_dir = tmp_path_factory.mktemp("converged")
    args = time_to_train_args(
        tiny_model,
        output_dir,
        data=SAMPLE_VALIDATION_PATH,
        max_steps=200,
        learning_rate=3e-3,
        target_eval_loss=0.9,
        eval_every_samples=32,
        eval_skip=0,
        logging_strategy="no",
        mlperf_org="tuning-bench tests",
    )
    assert bench_train.main(args) == 0
    return read_dump(output_dir / "bench.json"), log_lines(output_dir / "mlperf.log"), output_dir / "bench.json"


@pytest.fixture(scope="module")
def not_converged(bench_train, tiny_model, tmp_path_factory):
    """LoRA, global batch 2 (1 row x 2 accumulation), an evaluation asked every 3 samples (rounded up to 4), MLPerf's
    default skip (FLOOR(0.125 x 2 + 2) = 2), eight steps: evaluations at 12 and 16 samples, none reaching loss 0."""
    output_dir = tmp_path_factory.mktemp("not-converged")
    args = time_to_train_args(
        tiny_model,
        output_dir,
        peft_method="lora",
        max_steps=8,
        per_device_train_batch_size=1,
        gradient_accumulation_steps=2,
        target_eval_loss=0.0,
        eval_every_samples=3,
    )
    assert bench_train.main(args) == 0  # it measured what was asked: its status says it missed the target
    return read_dump(output_dir / "bench.json"), log_lines(output_dir / "mlperf.log"), output_dir / "bench.json"


def test_the_cadence_and_skip_rule_follow_mlperf_at_any_global_batch():
    assert [eval_interval(batch) for batch in (1, 2, 4, 5, 8, 100, 1000)] == [384, 384, 384, 385, 384, 400, 1000]
    assert [skipped_evaluations(batch) for batch in (1, 2, 4, 5, 8, 100)] == [2, 2, 2, 2, 3, 14]
    assert eval_interval(4, 30) == 32 and eval_interval(2, 3) == 4 and skipped_evaluations(8, 0) == 0


def test_a_run_that_reaches_its_target_stops_at_that_evaluation_and_its_clock_is_the_log_s(converged):
    dump, events, _ = converged
    summary = dump["summary"]
    assert dump["status"] == "converged" and dump["stop_reason"] is None and summary["converged"] is True
    evaluations = summary["evaluations"]
    assert [one["samples"] for one in evaluations] == [32 * n for n in range(1, len(evaluations) + 1)]
    losses = [one["eval_loss"] for one in evaluations]
    assert losses[-1] <= 0.9 < min(losses[:-1]) and dump["training_steps"] * 4 == evaluations[-1]["samples"]
    assert summary["time_to_train"] == evaluations[-1]["seconds"] > 0 and summary["init_seconds"] > 0
    by_key = assert_one_run(events)
    assert by_key["run_stop"]["metadata"] == {"status": "success", "samples_count": evaluations[-1]["samples"]}
    logged = (by_key["run_stop"]["time_ms"] - by_key["run_start"]["time_ms"]) / 1000
    assert summary["time_to_train"] == pytest.approx(logged, abs=0.002)
    accuracies = [event for event in events if event["key"] == "eval_accuracy"]
    assert [(event["value"], event["metadata"]["samples_count"]) for event in accuracies] == [
        (one["eval_loss"], one["samples"]) for one in evaluations
    ]
    assert (by_key["submission_org"]["value"], by_key["submission_division"]["value"]) == ("tuning-bench tests", "open")
    assert by_key["global_batch_size"]["value"] == 4 and "lora_rank" not in by_key  # full fine-tuning
    assert by_key["train_samples"]["value"] == by_key["eval_samples"]["value"] == 16
    assert by_key["cache_clear"]["value"] is True and by_key["cache_clear"]["metadata"]["data_cache"] != "hit"


def test_a_run_that_cannot_reach_its_target_ends_not_converged_with_its_evaluations(not_converged):
    dump, events, _ = not_converged
    summary = dump["summary"]
    assert dump["status"] == "not_converged" and summary["converged"] is False and summary["time_to_train"] is None
    assert dump["training_steps"] == 8 and [one["samples"] for one in summary["evaluations"]] == [12, 16]
    by_key = assert_one_run(events)
    assert by_key["run_stop"]["metadata"] == {"status": "aborted", "reason": "not_converged"}
    assert by_key["global_batch_size"]["value"] == 2 and by_key["gradient_accumulation_steps"]["value"] == 2
    assert (by_key["lora_rank"]["value"], by_key["lora_alpha"]["value"]) == (8, 32)
    assert by_key["opt_learning_rate_training_steps"]["value"] == 8 and by_key["seed"]["value"] == dump["seed"] == 42


def test_bench_report_shows_the_time_to_train_beside_the_throughput(converged, not_converged, tmp_path):
    """Both runs did their work (a row each in the points' count); only the converged one has a time to train."""
    from tuning.benchmarking.report import write_report

    write_report([str(converged[2]), str(not_converged[2])], [], None, None, str(tmp_path))
    runs = csv_by(tmp_path / "report.csv", "status")
    assert (runs["converged"]["converged"], runs["not_converged"]["converged"]) == ("True", "False")
    reported = float(runs["converged"]["time_to_train"])
    assert reported == pytest.approx(converged[0]["summary"]["time_to_train"], abs=1e-3)
    assert runs["not_converged"]["time_to_train"] == "" and runs["converged"]["seed"] == "42"
    (point,) = csv_by(tmp_path / "points.csv", "runs").values()
    assert (
        point["done_runs"] == "2" and float(point["time_to_train_median"]) == converged[0]["summary"]["time_to_train"]
    )


def test_a_sigtermed_and_resumed_run_is_not_presented_as_one_mlperf_run(bench_train, tiny_model, tmp_path):
    """A real SIGTERM as step 3 begins: the log's run stops aborted, naming the interruption. The same command
    resumed appends a second run to the log (so no checker takes it for one), and its dump has no time to train."""
    flags = {"max_steps": 4, "target_eval_loss": 100.0, "eval_every_samples": 16, "eval_skip": 0}
    flags.update(save_strategy="steps", save_steps=100)  # the one checkpoint: the graceful stop's
    sigterm = f"{BENCH_CALLBACKS}:SigtermOnLastRankInStep3"
    assert bench_train.main(time_to_train_args(tiny_model, tmp_path, callbacks=sigterm, **flags)) == 143
    interrupted = log_lines(tmp_path / "mlperf.log")
    assert interrupted[-1]["key"] == "run_stop" and interrupted[-1]["metadata"]["status"] == "aborted"
    assert interrupted[-1]["metadata"]["reason"].startswith("interrupted")
    assert read_dump(tmp_path / "bench.json")["status"] == "interrupted"

    assert bench_train.main(time_to_train_args(tiny_model, tmp_path, resume_from_checkpoint="true", **flags)) == 0
    dump = read_dump(tmp_path / "bench.json")
    assert dump["summary"]["resumed_from_step"] == 3 and dump["status"] == "converged"
    assert dump["summary"]["time_to_train"] is None and "not one MLPerf run" in dump["summary"]["time_to_train_note"]
    events = log_lines(tmp_path / "mlperf.log")
    keys = [event["key"] for event in events]
    assert keys[len(interrupted)] == "run_resumed" and keys.count("run_start") == keys.count("run_stop") == 2


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"mlperf_log": "x.log"}, "--mlperf_log needs --target_eval_loss"),
        ({"target_eval_loss": 1.0, "validation_data_path": None}, "needs validation data"),
        ({"target_eval_loss": 1.0, "auto_stop": True}, "--auto_stop with --target_eval_loss"),
        ({"target_eval_loss": 1.0, "eval_strategy": "steps"}, "leave --eval_strategy no"),
        ({"target_eval_loss": 1.0, "eval_every_samples": 0}, "--eval_every_samples must be at least 1"),
        ({"target_eval_loss": 1.0, "mlperf_division": "x"}, "choose open or closed"),
    ],
)
def test_time_to_train_flags_are_checked_before_anything_loads(bench_train, tmp_path, flags, message):
    from tuning.benchmarking.job import check_time_to_train

    flags = {"validation_data_path": SAMPLE_VALIDATION_PATH, **flags}
    argv = bench_args("model", tmp_path, **flags)
    parsed_flags, args = bench_train.benchmarking.parse_command_line(bench_train.BenchmarkFlags, argv)
    with pytest.raises(UserInputError, match=message):
        check_time_to_train(parsed_flags, args)
