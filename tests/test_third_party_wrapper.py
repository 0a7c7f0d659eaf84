"""A third-party wrapper in IBM ado's v3.x style (tests/helpers/third_party/ado_style_wrapper.py; a folder of its own,
where no helper module shadows the ``aim`` package) runs on tuning-bench as it runs on fms-hf-tuning v3.1.0."""

import base64
import json
import subprocess
from pathlib import Path

import pytest

from tests.helpers.aim import existing_repo
from tests.helpers.training import REPO_ROOT, RESPONSE_TEMPLATE, run_python
from tuning.utils.tiny_model import SAMPLE_TRAIN_PATH

WRAPPER = str(REPO_ROOT / "tests" / "helpers" / "third_party" / "ado_style_wrapper.py")
# What ado always passes besides the job's own flags (transformers 4 and TRL flags that v3.1.0 leaves unparsed).
ADO_EXTRAS = ["--include_tokens_per_second", "True", "--dataset_kwargs", '{"skip_prepare_dataset": true}']


def job(tiny_model: str, output_dir: str, data: str = SAMPLE_TRAIN_PATH) -> dict:
    return {
        "model_name_or_path": tiny_model,
        "training_data_path": data,
        "dataset_text_field": "output",
        "response_template": RESPONSE_TEMPLATE,
        "output_dir": output_dir,
        "max_steps": 3,
        "per_device_train_batch_size": 4,
        "logging_strategy": "steps",
        "logging_steps": 1,
        "save_strategy": "no",
        "torch_dtype": "float32",
        "use_flash_attn": False,
    }


def run_wrapper(argv: list[str], **env: str) -> subprocess.CompletedProcess:
    return run_python(WRAPPER, *argv, **env)


@pytest.mark.slow
def test_ado_style_wrapper_trains_with_its_own_aim_callback(tiny_moe, tmp_path):
    """Also ado's ``fast_moe`` parameter (a list, as ado writes it) on a tiny MoE, handed to ``train()`` as
    ``fast_moe_config``: its checkpoint gets fast MoE's ``safetensors-N`` folder."""
    config = dict(
        job(tiny_moe, str(tmp_path / "out")),
        include_tokens_per_second=True,
        dataset_kwargs={"a": 1},
        fast_moe=[1],
        save_strategy="steps",
        save_steps=3,
    )
    info_path = tmp_path / "aim_info.json"
    result = run_wrapper(
        ["--aim_repo", str(existing_repo(tmp_path / "aim")), "--info_path", str(info_path), *ADO_EXTRAS],
        SFT_TRAINER_CONFIG_JSON_ENV_VAR=base64.b64encode(json.dumps(config).encode()).decode(),
        TERMINATION_LOG_FILE=str(tmp_path / "termination-log"),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    info = json.loads(info_path.read_text())
    assert info["run_hash"] and info["training_steps"] == 3
    assert info["metrics"]["train_tokens_per_second"] > 0  # what ado's metrics reader requires
    assert [line for line in result.stderr.splitlines() if "ignoring job config keys" in line][0].endswith(
        "dataset_kwargs"
    )
    logs = [json.loads(line) for line in (tmp_path / "out" / "training_logs.jsonl").read_text().splitlines()]
    assert [r["data"]["step"] for r in logs if r["name"] == "training_loss"] == [1, 2, 3]  # the file logger, alone
    for name in ("aim_tracker.json", "aimstack_tracker.json"):  # v3.1.0's name and the 2.x one
        assert not (tmp_path / "out" / name).exists()  # no tracker of ours beside ado's callback
    assert not (tmp_path / "termination-log").exists()
    assert (tmp_path / "out" / "checkpoint-3" / "safetensors-3" / "model.safetensors").is_file()


@pytest.mark.slow
def test_ado_style_wrapper_ends_a_broken_data_line_as_user_error(tiny_model, tmp_path):
    data = tmp_path / "train.jsonl"
    first_record = Path(SAMPLE_TRAIN_PATH).read_text().splitlines()[0]
    data.write_text(first_record + '\n{"output": "cut short\n')
    flags = [f"--{key}={value}" for key, value in job(tiny_model, str(tmp_path / "out"), str(data)).items()]
    info_path = tmp_path / "aim_info.json"
    result = run_wrapper(
        ["--aim_repo", str(tmp_path / "aim"), "--info_path", str(info_path), *flags, *ADO_EXTRAS],
        TERMINATION_LOG_FILE=str(tmp_path / "termination-log"),
    )
    assert result.returncode == 1, result.stderr[-3000:]
    line = (tmp_path / "termination-log").read_text()
    assert line.startswith("user_error: ") and f"{data} on line 2" in line
    assert f"{data} on line 2" in json.loads(info_path.read_text())["exception"]
    assert "no sft_trainer flag: --dataset_kwargs" in result.stderr  # the leftover flags, named once
