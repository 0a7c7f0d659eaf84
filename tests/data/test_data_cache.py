"""Tokenised-data caches: removed however a run ends, after a kill by the next run (real processes and signals). A
SIGKILLed run's cache, left behind and removed by the next run: tests/wrappers/test_bench_train.py's SIGKILL and
restart (test_sigkill_leaves_a_journal_that_rebuilds_into_a_dump_and_a_restart_shows_the_gap_and_the_lost_steps)."""

import json
import signal
import subprocess
import sys
from pathlib import Path

import datasets
import psutil
import pytest
from transformers import TrainerCallback

from tests.helpers.data_files import data_caches
from tuning.config.configs import DataArguments, ModelArguments, TrainingArguments
from tuning.data.cache import OWNER_FILE, PREFIX, new_cache_dir, remove_orphaned_caches
from tuning.sft_trainer import train


def dead_process() -> tuple[int, float]:
    """The PID and start time of a process that has been SIGKILLed and reaped."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    started = psutil.Process(process.pid).create_time()
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    return process.pid, started


def write_owner(root: Path, name: str, owner: object) -> Path:
    path = root / f"{PREFIX}{name}"
    path.mkdir()
    (path / OWNER_FILE).write_text(json.dumps(owner))
    return path


def test_only_caches_of_dead_owners_on_this_host_are_removed(tmp_path):
    mine = Path(new_cache_dir(str(tmp_path)))
    me = json.loads((mine / OWNER_FILE).read_text())
    pid, started = dead_process()
    dead = write_owner(tmp_path, "dead", {**me, "pid": pid, "started": started})
    recycled = write_owner(tmp_path, "recycled", {**me, "started": me["started"] - 3600})  # my PID, another start
    kept = [
        mine,
        write_owner(tmp_path, "other-host", {**me, "host": "elsewhere", "pid": pid, "started": started}),
        write_owner(tmp_path, "other-pid-namespace", {**me, "pid_namespace": "pid:[1]", "pid": pid}),
        write_owner(tmp_path, "garbage", ["not", "an", "owner"]),
        tmp_path / f"{PREFIX}being-created",
        tmp_path / "someone-elses-dataset",
    ]
    kept[-2].mkdir()
    kept[-1].mkdir()
    assert sorted(remove_orphaned_caches(str(tmp_path))) == sorted([str(dead), str(recycled)])
    assert all(path.exists() for path in kept) and not dead.exists() and not recycled.exists()


class FailAtTrainBegin(TrainerCallback):
    def __init__(self, cache_root: Path):
        self.cache_root = cache_root
        self.caches_seen: list[Path] = []

    def on_train_begin(self, args, state, control, **kwargs):
        self.caches_seen = data_caches(self.cache_root)
        raise RuntimeError("failing on purpose")


@pytest.mark.slow
def test_train_removes_its_cache_when_it_returns_and_when_it_raises(tiny_model, sample_train, tmp_path, monkeypatch):
    root = tmp_path / "datasets-cache"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(root))
    model_args = ModelArguments(model_name_or_path=tiny_model, torch_dtype="float32")
    data_args = DataArguments(
        training_data_path=sample_train, dataset_text_field="output", response_template="\n### Response:"
    )
    train_args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=1, save_strategy="no", report_to="none")
    train(model_args, data_args, train_args, tracker_configs=None, trackers=[])
    assert root.is_dir() and data_caches(root) == []
    failing = FailAtTrainBegin(root)
    again = TrainingArguments(output_dir=str(tmp_path / "again"), max_steps=1, save_strategy="no", report_to="none")
    with pytest.raises(RuntimeError, match="failing on purpose"):  # elsewhere: "out" holds a finished job
        train(model_args, data_args, again, callbacks=[failing], trackers=[])
    assert len(failing.caches_seen) == 1 and data_caches(root) == []


@pytest.mark.slow
def test_sigterm_mid_training_leaves_no_cache(sigtermed_sft_trainer):
    """The job SIGTERMed after its first logged step (the shared fixture; its exit status and reports:
    test_error_logging_e2e.py::test_sigterm_stops_at_a_step_boundary_and_exits_143)."""
    job = sigtermed_sft_trainer
    assert len(job.caches_while_training) == 1
    assert job.returncode == 143, job.stderr[-3000:]
    assert data_caches(job.data_cache) == []
