"""``sft_trainer --tracker aim`` end to end on the tiny model: real jobs, a real Aim server, real failures.

Jobs run as users run them (torchrun for the seed command); the three jobs that only need a healthy setup run
through sft_trainer's main in this process, to keep this file short on two cores. A server killed under a running
job is tests/wrappers/test_bench_train.py's test_tracking_server_killed_mid_run (a training process of its own: one
warning, every step trained and recorded, exit 0, soon) and test_aim_tracker.py's
test_server_killed_mid_run_costs_a_warning_not_the_job (the tracker's calls and close stay within their bounds).
"""

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.aim import METADATA, METADATA_QUERY, AimServer, existing_repo, read_runs, series
from tests.helpers.training import (
    REPO_ROOT,
    SEED_COMMAND,
    SFT_TRAINER,
    cli_args,
    free_port,
    logged_steps,
    subprocess_env,
)
from tuning.sft_trainer import main
from tuning.trackers.aimstack_tracker import DEGRADED_WARNING, RUN_HASH_FILENAME

METADATA_FLAG = json.dumps(METADATA)
MAX_STEPS = 4


def aim_job_args(model: str, output_dir: Path, max_steps: int = MAX_STEPS, **aim_flags: str) -> list[str]:
    """A short job tracked by the file logger and Aim together; Aim's trouble must not touch the file logger."""
    args = cli_args(model, str(output_dir), max_steps=max_steps, per_device_train_batch_size=4)
    args += ["--trackers", "file_logger", "aim", "--experiment", "e2e", "--exp_metadata", METADATA_FLAG]
    for flag, value in aim_flags.items():
        args += [f"--{flag}", value]
    return args


def check_run(run: dict, output_dir: Path, max_steps: int = MAX_STEPS) -> None:
    assert json.loads((output_dir / RUN_HASH_FILENAME).read_text()) == {"run_hash": run["hash"]}
    assert run["experiment"] == "e2e"
    assert run["params"]["experiment_metadata"] == METADATA
    assert sorted(series(run, "loss")) == list(range(1, max_steps + 1))
    assert len(series(run, "model_load_time", {"subset": "additional_metrics"})) == 1


class WarningRecords(logging.Handler):
    """The messages of the warnings logged while it is attached to the root logger."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture(scope="module")
def healthy_jobs(tiny_model, tmp_path_factory):
    """A local-repo job, a live-server job and a job whose server never existed, one after the other through
    sft_trainer's main in this process (the Aim writers are helper processes as always; the command as users type it
    is test_seed_torchrun_command_makes_exactly_one_aim_run's): each job's logged warnings."""
    root = tmp_path_factory.mktemp("aim-e2e")
    server = AimServer(root / "server-repo")
    warnings = {}
    try:
        flags = {
            "local": {"aim_repo": str(existing_repo(root / "local-repo"))},
            "remote": {"aim_remote_server_ip": "127.0.0.1", "aim_remote_server_port": str(server.port)},
            "never": {"aim_url": f"aim://127.0.0.1:{free_port()}"},
        }
        for name, flag in flags.items():
            records = WarningRecords()
            logging.getLogger().addHandler(records)
            try:
                with pytest.MonkeyPatch.context() as patch:
                    patch.setattr(sys, "argv", [SFT_TRAINER, *aim_job_args(tiny_model, root / name, **flag)])
                    assert main() == 0, name
            finally:
                logging.getLogger().removeHandler(records)
            warnings[name] = records.messages
    finally:
        server.stop()
    return root, server, warnings


@pytest.mark.slow
def test_local_repo_gets_one_run_with_logs_load_time_and_metadata(healthy_jobs):
    root, _server, warnings = healthy_jobs
    assert not [message for message in warnings["local"] if DEGRADED_WARNING in message]
    (run,) = read_runs(root / "local-repo", METADATA_QUERY)
    check_run(run, root / "local")
    assert logged_steps(root / "local" / "training_logs.jsonl") == list(range(1, MAX_STEPS + 1))


@pytest.mark.slow
def test_live_server_gets_the_same_run(healthy_jobs):
    root, server, warnings = healthy_jobs
    assert not [message for message in warnings["remote"] if DEGRADED_WARNING in message]
    (run,) = read_runs(server.repo, METADATA_QUERY)
    check_run(run, root / "remote")


@pytest.mark.slow
def test_server_that_never_existed_costs_one_warning(healthy_jobs):
    root, _server, warnings = healthy_jobs
    (warning,) = [message for message in warnings["never"] if DEGRADED_WARNING in message]
    assert "unreachable" in warning
    assert logged_steps(root / "never" / "training_logs.jsonl") == list(range(1, MAX_STEPS + 1))
    assert not (root / "never" / RUN_HASH_FILENAME).exists()


@pytest.mark.slow
def test_seed_torchrun_command_makes_exactly_one_aim_run(tiny_model, sample_train, tmp_path):
    """The design notes' command with Aim added: one Aim run, and the same training and files as without it (the
    file logger stays on: rank 0's records; the processed-data cache: rank 0 builds the entry, rank 1 reads it)."""
    repo, output_dir, cache = existing_repo(tmp_path / "aim"), tmp_path / "out", tmp_path / "data-cache"
    command = SEED_COMMAND.format(port=free_port(), model=tiny_model, data=sample_train, output=output_dir)
    command += f"--tracker aim --aim_repo {repo} --experiment sft-llama7b-test --exp_metadata '{METADATA_FLAG}'"
    env = subprocess_env(PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    env["TUNING_DATA_CACHE_DIR"] = str(cache)
    result = subprocess.run(command, shell=True, env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(line) for line in (output_dir / "training_logs.jsonl").read_text().splitlines()]
    assert [r["name"] for r in records].count("model_load_time") == 1  # rank 0 only
    assert len(list(cache.glob("*/meta.json"))) == 1
    # 96 records / (2 ranks x batch 1 x accumulation 8) = 6 steps: the ranks really split the data, and only rank 0
    # logs (logging_strategy defaults to epoch, as in fms-hf-tuning).
    assert [r["data"]["step"] for r in records if r["name"] == "training_loss"] == [6]
    assert (output_dir / "added_tokens_info.json").exists()  # no --save_model_dir: no final adapter (v3.1.0)
    assert DEGRADED_WARNING not in result.stderr
    (run,) = read_runs(repo)
    assert read_runs(repo, f'{METADATA_QUERY} and run.experiment == "sft-llama7b-test"')[0]["hash"] == run["hash"]
    assert run["params"]["experiment_metadata"] == METADATA
    assert len(series(run, "model_load_time", {"subset": "additional_metrics"})) == 1
    assert series(run, "loss", {"subset": "train"})  # the trainer's final train_loss
    assert json.loads((output_dir / RUN_HASH_FILENAME).read_text()) == {"run_hash": run["hash"]}


BAD_INPUTS = {
    "unknown tracker": (["--trackers", "file_logger", "aimm"], "Requested Tracker aimm not found"),
    "aim without repo or server": (["--trackers", "file_logger", "aim"], "--aim_repo DIR or an Aim server"),
    "invalid metadata JSON": (["--exp_metadata", "{gpu_model: A100}"], "--exp_metadata is not valid JSON"),
    "metadata not an object": (["--exp_metadata", '["A100"]'], "--exp_metadata must be a JSON object"),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_tracker_input_fails_clearly_before_the_model_loads(case, tiny_model, tmp_path, monkeypatch, capsys):
    """The CLI's ``main()`` in this process: each rejection happens while reading arguments, so no job is needed."""
    extra, message = BAD_INPUTS[case]
    monkeypatch.setattr(sys, "argv", [SFT_TRAINER, *cli_args(tiny_model, str(tmp_path)), *extra])
    monkeypatch.setenv("TERMINATION_LOG_FILE", str(tmp_path / "termination-log"))
    assert main() == 1
    stderr = capsys.readouterr().err
    assert message in stderr and "Traceback" not in stderr
    assert message in (tmp_path / "termination-log").read_text()
    # The file logger records model_load_time right after loading: the job stopped before that.
    assert not (tmp_path / "training_logs.jsonl").exists()
