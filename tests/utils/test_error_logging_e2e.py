"""End-to-end error reporting of ``python tuning/sft_trainer.py`` on the tiny model: real bad inputs, real faults
inside training steps and real signals. Ranks under torchrun: a SIGKILLed rank and its survivor in
tests/test_launch.py, a SIGTERM to one rank in tests/wrappers/test_bench_train.py."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.training import (
    SFT_TRAINER,
    cli_args,
    logged_steps,
    markers,
    run_python,
    run_sft_trainer,
    termination_lines,
)
from tuning.utils.error_logging import TERMINATION_LOG_MAX_BYTES

BAD_INPUTS = {
    "missing data file": {"training_data_path": "{tmp}/missing.jsonl"},
    "empty data file": {"training_data_path": "{tmp}/empty.jsonl"},
    "malformed data file": {"training_data_path": "{tmp}/malformed.jsonl"},
    "missing text field": {"dataset_text_field": "no_such_field"},
    "unknown template key": {
        "dataset_text_field": None,
        "data_formatter_template": "### Input: {{no_such_key}}\n\n### Response: {{response}}",
    },
    "missing model path": {"model_name_or_path": "{tmp}/no-such-model"},
    "zero epochs": {"max_steps": None, "num_train_epochs": "0"},
    "unknown peft method": {"peft_method": "qlora"},
    "unknown tracker": {"trackers": "no_such_tracker"},
    "invalid exp_metadata JSON": {"exp_metadata": "{not json"},
    "exp_metadata not an object": {"exp_metadata": "[1, 2]"},
}


def bad_input_args(name: str, model: str, tmp: Path) -> list[str]:
    (tmp / "empty.jsonl").write_text("")
    (tmp / "malformed.jsonl").write_text('{"output": "### Input: a\\n\\n### Response: b"}\n{"output": "unterminated\n')
    extra = {key: value and value.replace("{tmp}", str(tmp)) for key, value in BAD_INPUTS[name].items()}
    return cli_args(model, str(tmp / "out"), **extra)


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_bad_input_is_a_user_error_with_one_line_termination_log(name, tiny_model, tmp_path, monkeypatch, capfd):
    """main() in this process (the CLI's imports cost ~10 s a process; the script path is checked below)."""
    from tuning.sft_trainer import main

    log = tmp_path / "termination-log"
    monkeypatch.setenv("TERMINATION_LOG_FILE", str(log))
    monkeypatch.setattr(sys, "argv", [SFT_TRAINER, *bad_input_args(name, tiny_model, tmp_path)])
    exit_code = main()
    stderr = capfd.readouterr().err
    assert 1 <= exit_code <= 127, stderr[-3000:]
    lines = termination_lines(log)
    assert len(lines) == 1, lines
    assert lines[0].startswith("user_error: ") and len(lines[0].encode()) < TERMINATION_LOG_MAX_BYTES
    assert [m[0] for m in markers(stderr)] == ["user_error"]
    assert "Traceback" not in stderr  # the message is the whole story
    assert "Loading weights" not in stderr  # rejected before the model was loaded


def damaged_model(model: str, tmp: Path, file_name: str) -> str:
    """A copy of ``model`` whose ``file_name`` is cut to half its size, as an interrupted copy leaves it."""
    copy = tmp / "damaged-model"
    shutil.copytree(model, copy)
    data = (copy / file_name).read_bytes()
    (copy / file_name).write_bytes(data[: len(data) // 2])
    return str(copy)


EARLY_CHECKS = {
    "output_dir under a file": (lambda model, tmp: {"output_dir": f"{tmp}/file/out"}, "--output_dir {tmp}/file/out"),
    "batch size 0": (lambda model, tmp: {"per_device_train_batch_size": "0"}, "--per_device_train_batch_size"),
    "max_steps -5": (lambda model, tmp: {"max_steps": "-5"}, "--max_steps"),
    "corrupt config.json": (
        lambda model, tmp: {"model_name_or_path": damaged_model(model, tmp, "config.json")},
        "{tmp}/damaged-model/config.json is not valid JSON",
    ),
    "truncated safetensors": (
        lambda model, tmp: {"model_name_or_path": damaged_model(model, tmp, "model.safetensors")},
        "{tmp}/damaged-model/model.safetensors is not a complete safetensors file",
    ),
}


@pytest.mark.parametrize("name", list(EARLY_CHECKS))
def test_bad_input_is_named_before_the_model_loads(name, tiny_model, tmp_path, monkeypatch, capfd):
    """Each a user error (one line naming the flag or file, no traceback) before anything loads."""
    from tuning.sft_trainer import main

    (tmp_path / "file").write_text("")
    make_flags, culprit = EARLY_CHECKS[name]
    log = tmp_path / "termination-log"
    monkeypatch.setenv("TERMINATION_LOG_FILE", str(log))
    args = cli_args(tiny_model, **{"output_dir": str(tmp_path / "out"), **make_flags(tiny_model, tmp_path)})
    monkeypatch.setattr(sys, "argv", [SFT_TRAINER, *args])
    exit_code = main()
    stderr = capfd.readouterr().err
    assert exit_code == 1, stderr[-3000:]
    (line,) = termination_lines(log)
    assert line.startswith("user_error: UserInputError: ") and culprit.format(tmp=tmp_path) in line
    assert "Traceback" not in stderr and "Loading weights" not in stderr


@pytest.mark.slow
@pytest.mark.parametrize("name", ["missing data file"])  # each bad input in-process above; the script's exit once
def test_bad_input_through_the_script(name, tiny_model, tmp_path):
    log = tmp_path / "termination-log"
    result = run_sft_trainer(bad_input_args(name, tiny_model, tmp_path), timeout=240, TERMINATION_LOG_FILE=str(log))
    assert result.returncode == 1, result.stderr[-3000:]
    assert [line.split(":")[0] for line in termination_lines(log)] == ["user_error"]
    assert [m[0] for m in markers(result.stderr)] == ["user_error"]


def run_fault_injection(fault: str, args: list[str], tmp_path: Path, step: int) -> subprocess.CompletedProcess:
    return run_python(
        "-m",
        "tests.helpers.fault_injection",
        *args,
        FAULT=fault,
        FAULT_STEP=str(step),
        REPORT_PATH=str(tmp_path / "error_report.json"),
        TERMINATION_LOG_FILE=str(tmp_path / "termination-log"),
    )


@pytest.mark.slow
def test_gpu_oom_raised_inside_a_training_step(tiny_model, tmp_path):
    result = run_fault_injection("gpu_oom", cli_args(tiny_model, str(tmp_path / "out"), max_steps=10), tmp_path, 3)
    assert result.returncode == 204, result.stderr[-3000:]
    report = json.loads((tmp_path / "error_report.json").read_text())
    assert (report["category"], report["exit_code"], report["global_step"]) == ("gpu_oom", 204, 3)
    assert report["exception_type"] == "torch.OutOfMemoryError"
    assert "_inner_training_loop" in report["traceback"]
    lines = termination_lines(tmp_path / "termination-log")
    assert len(lines) == 1 and lines[0].startswith("gpu_oom: OutOfMemoryError: CUDA out of memory. Tried to allocate")
    assert markers(result.stderr) == [("gpu_oom", "0", "3", "204")]


@pytest.mark.slow
def test_real_host_oom_in_a_training_step(tiny_model, tmp_path):
    """One step of 32 x 512 tokens needs hundreds of MB; after step 1 the address space is capped just above use."""
    filler = " ".join(f"word{i % 50} and more text" for i in range(400))
    records = [{"output": f"### Input: q{i}\n\n### Response: {filler}"} for i in range(64)]
    data = tmp_path / "long.jsonl"
    data.write_text("".join(json.dumps(record) + "\n" for record in records))
    args = cli_args(tiny_model, str(tmp_path / "out"), data=str(data), max_steps=5, per_device_train_batch_size=32) + [
        "--max_seq_length",
        "512",
    ]
    result = run_fault_injection("host_oom", args, tmp_path, 1)
    assert result.returncode == 205, result.stderr[-3000:]
    report = json.loads((tmp_path / "error_report.json").read_text())
    assert (report["category"], report["global_step"]) == ("host_oom", 1)
    assert "training_step" in report["traceback"]  # the step failed, not start-up
    lines = termination_lines(tmp_path / "termination-log")
    assert len(lines) == 1 and lines[0].startswith("host_oom: ")


@pytest.mark.slow
def test_sigterm_stops_at_a_step_boundary_and_exits_143(sigtermed_sft_trainer):
    """The job SIGTERMed after its first logged step (the shared fixture; its data caches:
    test_data_cache.py::test_sigterm_mid_training_leaves_no_cache)."""
    job = sigtermed_sft_trainer
    assert job.returncode == 143, job.stderr[-3000:]
    assert termination_lines(job.termination_log) == ["interrupted: TrainingInterrupted: training stopped by SIGTERM"]
    [(category, rank, step, code)] = markers(job.stderr)
    assert (category, rank, code) == ("interrupted", "0", "143")
    assert logged_steps(job.training_logs)[-1] == int(step)  # every step up to the stop was logged and flushed
    assert int(step) < 100_000
