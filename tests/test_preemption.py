"""Preemption: a SIGTERM'd ``sft_trainer`` (one rank, or two under torchrun) writes a checkpoint of the step it stops
at and exits 143; the same command then finishes the run as if nothing happened. A restart skips checkpoints whose
write did not finish, naming them, and resumes from the newest complete one."""

import json
import shutil
import signal
import statistics
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.helpers.bench import bench_args, csv_by, read_dump, rebuild, run_bench, series, start_bench
from tests.helpers.graceful_stop import SignalAtStep
from tests.helpers.training import (
    BENCH_CALLBACKS,
    REPO_ROOT,
    SFT_TRAINER,
    TORCHRUN,
    Job,
    cli_args,
    logged_steps,
    make_args,
    run_main,
    run_python,
    two_ranks,
    wait_for_steps,
)
from tuning.benchmarking.dump import STEP_TIME, STEP_TOKENS, TOKENS_PER_SECOND
from tuning.config.configs import TrainingArguments
from tuning.sft_trainer import get_parser, resume_checkpoint, train
from tuning.utils.checkpoints import STATUS_FILE, checkpoint_problem, newest_complete_checkpoint
from tuning.utils.error_logging import UserInputError
from tuning.utils.graceful_stop import GracefulStopCallback

SAVE_STEPS, MAX_STEPS = 8, 18  # a SIGTERM after step 9 may land up to 6 steps late on a loaded machine
RANKS = 2  # torchrun ranks of the preempted job
TRAIN_IN_TURN = str(REPO_ROOT / "tests" / "helpers" / "train_in_turn.py")
BENCH_REPORT = str(REPO_ROOT / "wrappers" / "bench_report.py")


def _checkpoint(path: Path, step: int, status: dict | None = None) -> Path:
    """A checkpoint folder as transformers writes one (trainer state, weights), with our status file if given."""
    path.mkdir(parents=True)
    (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    save_file({"weight": torch.zeros(4)}, str(path / "model.safetensors"))
    if status is not None:
        (path / STATUS_FILE).write_text(json.dumps(status))
    return path


def test_resume_takes_the_newest_complete_checkpoint_and_names_the_skipped_ones(tmp_path):
    _checkpoint(tmp_path / "checkpoint-2", 2, {"complete": True, "global_step": 2, "world_size": 1})
    _checkpoint(tmp_path / "checkpoint-4", 4)  # written without tuning-bench: complete if readable
    _checkpoint(tmp_path / "checkpoint-6", 6, {"complete": False})  # its writer was killed
    truncated = _checkpoint(tmp_path / "checkpoint-8", 8) / "model.safetensors"
    truncated.write_bytes(truncated.read_bytes()[:-8])
    (_checkpoint(tmp_path / "checkpoint-10", 10) / "trainer_state.json").unlink()
    (tmp_path / "checkpoint-12").mkdir()
    newest, skipped = newest_complete_checkpoint(str(tmp_path))
    assert newest == str(tmp_path / "checkpoint-4")
    assert [(Path(folder).name, problem.split(" ")[0]) for folder, problem in skipped] == [
        ("checkpoint-12", "trainer_state.json"),
        ("checkpoint-10", "trainer_state.json"),
        ("checkpoint-8", "model.safetensors"),
        ("checkpoint-6", "its"),
    ]
    args = TrainingArguments(output_dir=str(tmp_path), resume_from_checkpoint=str(tmp_path / "checkpoint-6"))
    with pytest.raises(UserInputError, match="checkpoint-6 is not a complete checkpoint: its write did not finish"):
        resume_checkpoint(args)
    args.resume_from_checkpoint = "true"
    assert resume_checkpoint(args) == str(tmp_path / "checkpoint-4")


def test_a_bare_resume_from_checkpoint_means_true():
    parser = get_parser()
    for flags, expected in (
        ([], None),
        (["--resume_from_checkpoint"], "true"),
        (["--resume_from_checkpoint", "x"], "x"),
    ):
        args = parser.parse_args_into_dataclasses(args=["--output_dir", "o", *flags], return_remaining_strings=True)
        assert args[2].resume_from_checkpoint == expected, flags


def _flags(tiny_model: str, output_dir: Path, **extra) -> list[str]:
    """The job's flags: checkpoints every SAVE_STEPS steps, 16 sequences per optimizer step on RANKS ranks."""
    options = {
        "max_steps": MAX_STEPS,
        "per_device_train_batch_size": 4 // RANKS,
        "gradient_accumulation_steps": 4,  # steps long enough for a SIGTERM to land between two checkpoints
        "save_strategy": "steps",
        "save_steps": SAVE_STEPS,
        "save_total_limit": 1,
        "save_model_dir": str(output_dir / "final"),
    }
    return [*cli_args(tiny_model, str(output_dir), **{**options, **extra}), "--ddp_timeout", "60"]


def _final_weights(output_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(output_dir / "final" / "model.safetensors"))


@pytest.mark.slow
def test_sigterm_between_checkpoints_then_the_same_flags_finish_the_run_exactly(tiny_model, tmp_path):
    """On two ranks (one process's SIGTERM, checkpoint and resume through the command line:
    test_bench_train_writes_the_checkpoint_at_sigterm below, and test_error_logging_e2e's step boundary and exit
    143). The resumed run and an uninterrupted reference then train in one torchrun start
    (tests/helpers/train_in_turn.py), each as its own job of sft_trainer's flags."""
    output_dir = tmp_path / "out"
    preempted = Job([*TORCHRUN, *two_ranks(SFT_TRAINER, _flags(tiny_model, output_dir))], tmp_path / "preempted")
    wait_for_steps(output_dir / "training_logs.jsonl", SAVE_STEPS + 1, preempted, signal.SIGTERM)
    stderr = preempted.finish(timeout=180)
    stopped = logged_steps(output_dir / "training_logs.jsonl")[-1]
    assert f"Stopping after step {stopped}: writing checkpoint-{stopped} first" in stderr, stderr[-3000:]
    assert stderr.count("exit_code=143") == RANKS, stderr[-3000:]
    assert SAVE_STEPS < stopped < 2 * SAVE_STEPS  # between two scheduled checkpoints
    assert checkpoint_problem(str(output_dir / f"checkpoint-{stopped}")) is None
    assert [path.name for path in output_dir.glob("checkpoint-*")] == [f"checkpoint-{stopped}"]  # rotated once complete
    status = json.loads((output_dir / f"checkpoint-{stopped}" / STATUS_FILE).read_text())
    assert status == {"complete": True, "global_step": stopped, "world_size": RANKS}

    reference = _flags(tiny_model, tmp_path / "reference", save_strategy="no")
    in_turn = run_python(*TORCHRUN, *two_ranks(TRAIN_IN_TURN, [*_flags(tiny_model, output_dir), "--then", *reference]))
    assert in_turn.returncode == 0, in_turn.stderr[-3000:]
    # From the step the preempted run logged last: no step is trained twice.
    assert f"resuming from checkpoint-{stopped} (global step {stopped})" in in_turn.stderr
    assert logged_steps(output_dir / "training_logs.jsonl") == list(range(1, MAX_STEPS + 1))
    expected = _final_weights(tmp_path / "reference")
    for name, tensor in _final_weights(output_dir).items():
        torch.testing.assert_close(tensor, expected[name], rtol=1e-5, atol=1e-6, msg=name)


def test_a_restart_skips_checkpoints_cut_short_and_keeps_one_log_record_per_step(
    tiny_model, tmp_path, monkeypatch, capfd, caplog
):
    """Both runs through sft_trainer's main in this process (the damage is made by hand, no process is killed)."""
    output_dir = tmp_path / "out"
    flags = cli_args(tiny_model, str(output_dir), max_steps=5, save_strategy="steps", save_steps=2)
    exit_code, stderr = run_main(flags, monkeypatch, capfd)
    assert exit_code == 0, stderr[-3000:]
    assert sorted(path.name for path in output_dir.glob("checkpoint-*")) == [
        "checkpoint-2",
        "checkpoint-4",
        "checkpoint-5",
    ]
    # checkpoint-5 as a kill before every rank had written its part leaves it; checkpoint-6 as a writer without the
    # status file leaves one killed while it wrote the weights.
    (output_dir / "checkpoint-5" / STATUS_FILE).write_text(json.dumps({"complete": False}))
    shutil.copytree(output_dir / "checkpoint-4", output_dir / "checkpoint-6")
    (output_dir / "checkpoint-6" / STATUS_FILE).unlink()
    weights = output_dir / "checkpoint-6" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])

    caplog.clear()
    restart = cli_args(tiny_model, str(output_dir), max_steps=6, save_strategy="steps", save_steps=2)
    exit_code, stderr = run_main(restart, monkeypatch, capfd)
    assert exit_code == 0, stderr[-3000:]
    assert f"skipping {output_dir / 'checkpoint-6'}: model.safetensors is not a complete" in caplog.text
    assert f"skipping {output_dir / 'checkpoint-5'}: its write did not finish" in caplog.text
    assert "resuming from checkpoint-4 (global step 4)" in caplog.text
    assert logged_steps(output_dir / "training_logs.jsonl") == [1, 2, 3, 4, 5, 6]  # step 5: the restart's
    assert checkpoint_problem(str(output_dir / "checkpoint-6")) is None  # rewritten in place, complete
    assert not (output_dir / "checkpoint-5").exists()  # left unfinished: removed once checkpoint-6 was complete


@pytest.mark.slow
def test_bench_train_writes_the_checkpoint_at_sigterm_and_a_bare_resume_flag_resumes_from_it(tiny_model, tmp_path):
    """bench_train gets the behaviour through train(): its own GracefulStopCallback, no flag of its own. The resumed
    run's dump keeps both segments (docs/benchmarking.md, "A resumed run")."""
    args = bench_args(
        tiny_model,
        tmp_path,
        max_steps=8,
        save_strategy="steps",
        save_steps=100,
        callbacks=f"{BENCH_CALLBACKS}:SlowSteps",
    )
    preempted = start_bench(args, log_dir=tmp_path / "preempted")
    wait_for_steps(tmp_path / "training_logs.jsonl", 2, preempted, signal.SIGTERM)
    stderr = preempted.finish(timeout=120)
    assert preempted.returncode == 143, stderr[-3000:]
    stopped = read_dump(tmp_path / "bench.json")["training_steps"]
    assert checkpoint_problem(str(tmp_path / f"checkpoint-{stopped}")) is None

    returncode, _, stderr = run_bench([*args, "--resume_from_checkpoint"])
    assert returncode == 0, stderr[-3000:]
    assert f"resuming from checkpoint-{stopped} (global step {stopped})" in stderr
    assert logged_steps(tmp_path / "training_logs.jsonl") == list(range(1, 9))

    # The dump tells the whole story: both processes, every step once, rates without the restart.
    dump = read_dump(tmp_path / "bench.json")
    assert (dump["status"], dump["training_steps"], dump["summary"]["resumed_from_step"]) == ("ok", 8, stopped)
    first, second = dump["segments"]
    assert (first["status"], first["error"]["category"]) == ("interrupted", "interrupted")
    assert first["training_steps"] == stopped
    assert (second["status"], second["resumed_from_step"], second["training_steps"]) == ("ok", stopped, 8)
    assert (first["steps"], second["steps"]) == (stopped, 8 - stopped)
    assert second["warmup_steps"] == stopped + 1  # --skip_warmup_steps 1, in each segment
    assert second["gap_seconds"] > 0
    for name in (STEP_TIME, STEP_TOKENS, TOKENS_PER_SECOND):
        assert series(dump, name)["steps"] == list(range(1, 9)), name
    rates = [first["tokens_per_second"], second["tokens_per_second"]]
    assert min(rates) <= dump["summary"]["tokens_per_second"] <= max(rates)
    assert dump["summary"]["tokens_per_second"] == pytest.approx(statistics.mean(rates), rel=0.3)
    assert rebuild(tmp_path / "bench.journal.jsonl")["segments"] == dump["segments"]
    shown = run_python(BENCH_REPORT, str(tmp_path / "bench.json"), "--output_dir", str(tmp_path / "report"))
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert csv_by(tmp_path / "report" / "report.csv", "run")["bench"]["resumed_from_step"] == str(stopped)


@pytest.mark.parametrize("save_on_preemption", [pytest.param(True, marks=pytest.mark.slow), False])  # True: 2 runs
def test_save_on_preemption_reaches_the_trainer_through_train(tiny_model, sample_train, tmp_path, save_on_preemption):
    """In process: train() hands --save_on_preemption to TuningTrainer, which sets the stop's checkpoint by it."""
    stop = GracefulStopCallback()
    model_args, data_args, train_args = make_args(
        tiny_model,
        str(tmp_path),
        sample_train,
        max_steps=6,
        save_strategy="steps",
        save_steps=4,
        save_on_preemption=save_on_preemption,
    )
    try:
        trainer, info, _ = train(
            model_args, data_args, train_args, additional_callbacks=[SignalAtStep(2, signal.SIGTERM), stop]
        )
    finally:
        stop.restore_signal_handlers()
    assert (trainer.state.global_step, stop.received_signal, info["resumed_from_step"]) == (2, signal.SIGTERM, None)
    assert [path.name for path in tmp_path.glob("checkpoint-*")] == ["checkpoint-2"] * save_on_preemption
    if save_on_preemption:
        assert json.loads((tmp_path / "checkpoint-2" / STATUS_FILE).read_text())["complete"] is True
        trainer, info, _ = train(model_args, data_args, train_args)  # the restart: where it resumed, for the dump
        assert trainer.state.global_step == 6
        assert (info["resumed_from_checkpoint"], info["resumed_from_step"]) == (str(tmp_path / "checkpoint-2"), 2)
