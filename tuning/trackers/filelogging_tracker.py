"""file_logger: the default tracker, one JSON line per logged loss (and ``train_tokens_per_second`` when the trainer
reports it) in ``output_dir``."""

import json
import os
import time
from typing import TextIO

from transformers import TrainerCallback

from tuning.config.tracker_configs import FileLoggingTrackerConfig
from tuning.trackers.tracker import Tracker, is_main_process

# Trainer log keys → record names in training_logs.jsonl (the fms-hf-tuning names).
_LOGGED_NAMES = {
    "loss": "training_loss",
    "eval_loss": "validation_loss",
    "train_tokens_per_second": "train_tokens_per_second",
}


def format_record(name: str, value: float, step: int | None, epoch: float | None) -> str:
    record = {"name": name, "data": {"epoch": epoch, "step": step, "value": value, "timestamp": time.time()}}
    return json.dumps(record) + "\n"


def _logged_after(line: str, step: int) -> bool:
    """``line`` is a record of a step after ``step`` (a torn last line of a killed run counts as one)."""
    try:
        logged = json.loads(line)["data"]["step"]
    except (ValueError, KeyError, TypeError):
        return True
    return logged is not None and logged > step


class FileLoggingCallback(TrainerCallback):
    """Appends to ``<output_dir>/<logs_filename>`` (the trainer's ``output_dir``) on global rank 0.

    The file stays open until train end and every record is flushed: a killed job keeps everything logged before the
    kill, and no log pays for opening the file. Records handed to ``record`` before the trainer exists
    (``model_load_time``) wait until its ``output_dir`` is known.
    """

    def __init__(self, logs_filename: str = "training_logs.jsonl"):
        self.logs_filename = logs_filename
        self.path: str | None = None
        self._file: TextIO | None = None
        self._pending: list[str] = []

    def record(self, name: str, value: float) -> None:
        """One record without step or epoch."""
        self._pending.append(format_record(name, value, None, None))
        if self.path is not None:
            self._write([])

    def _write(self, records: list[str]) -> None:
        """Append the pending records and ``records``, opening the file on first use."""
        if self._file is None:
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - open until train end
        if self._pending:
            records, self._pending = self._pending + records, []
        self._file.write("".join(records))
        self._file.flush()

    def on_init_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero and self.path is None:
            self.path = os.path.join(args.output_dir, self.logs_filename)
            if self._pending:
                self._write([])

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero and state.global_step > 0:
            self.path = self.path or os.path.join(args.output_dir, self.logs_filename)
            self._drop_records_after(state.global_step)

    def _drop_records_after(self, step: int) -> None:
        """Resuming at ``step``: drop the records of later steps, which the run before the restart logged and this
        one logs again, so that the file keeps one record per step (the surviving run's). Rewritten aside, then
        swapped in, so that a kill meanwhile loses nothing."""
        if self._file is not None:
            self._file.close()
            self._file = None
        if not os.path.exists(self.path):
            return
        with open(self.path, encoding="utf-8") as handle:
            lines = handle.readlines()
        kept = [line for line in lines if not _logged_after(line, step)]
        if len(kept) < len(lines):
            with open(f"{self.path}.tmp", "w", encoding="utf-8") as handle:
                handle.writelines(kept)
            os.replace(f"{self.path}.tmp", self.path)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        records = [
            format_record(name, logs[key], state.global_step, state.epoch)
            for key, name in _LOGGED_NAMES.items()
            if key in logs
        ]
        if records:
            if self.path is None:  # a callback added after the trainer was created
                self.path = os.path.join(args.output_dir, self.logs_filename)
            self._write(records)

    def on_train_end(self, args, state, control, **kwargs):
        if self._file is not None:
            self._file.close()
            self._file = None


class FileLoggingTracker(Tracker):
    """The ``file_logger`` tracker: losses and ``track``-ed metrics as JSON lines in the trainer's output_dir."""

    def __init__(self, tracker_config: FileLoggingTrackerConfig):
        super().__init__(name="file_logger", tracker_config=tracker_config)
        self.callback = FileLoggingCallback(tracker_config.training_logs_filename)

    def track(self, metric: float, name: str, stage: str = "additional_metrics") -> None:
        if is_main_process():
            self.callback.record(name, metric)
