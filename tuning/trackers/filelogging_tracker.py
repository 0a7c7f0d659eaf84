"""file_logger: the default tracker, one JSON line per logged loss in ``output_dir``."""

import json
import os
import time
from typing import TextIO

from transformers import TrainerCallback

from tuning.config.tracker_configs import FileLoggingTrackerConfig
from tuning.trackers.tracker import Tracker, is_main_process

# Trainer log keys → record names in training_logs.jsonl (the fms-hf-tuning names).
_LOSS_NAMES = {"loss": "training_loss", "eval_loss": "validation_loss"}


def format_record(name: str, value: float, step: int | None, epoch: float | None) -> str:
    record = {"name": name, "data": {"epoch": epoch, "step": step, "value": value, "timestamp": time.time()}}
    return json.dumps(record) + "\n"


def append_record(path: str, name: str, value: float, step: int | None, epoch: float | None) -> None:
    """Append one record to ``path`` (opened for just this record)."""
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(format_record(name, value, step, epoch))


class FileLoggingCallback(TrainerCallback):
    """Keeps the file open from the first log to train end, flushing every record: a killed job keeps everything
    logged before the kill, and no log pays for opening the file."""

    def __init__(self, path: str):
        self.path = path
        self._file: TextIO | None = None

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        records = [
            format_record(name, logs[key], state.global_step, state.epoch)
            for key, name in _LOSS_NAMES.items()
            if key in logs
        ]
        if not records:
            return
        if self._file is None:
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - open until train end
        self._file.write("".join(records))
        self._file.flush()

    def on_train_end(self, args, state, control, **kwargs):
        if self._file is not None:
            self._file.close()
            self._file = None


class FileLoggingTracker(Tracker):
    name = "file_logger"

    def __init__(self, config: FileLoggingTrackerConfig, output_dir: str):
        self.path = os.path.join(output_dir, config.training_logs_filename)

    def get_hf_callback(self) -> TrainerCallback:
        return FileLoggingCallback(self.path)

    def track(self, metric: float, name: str, stage: str = "additional_metrics") -> None:
        if is_main_process():
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            append_record(self.path, name, metric, step=None, epoch=None)
