"""Tracker callbacks driven in-process: the hook sequence of a short training run, and the warnings of a tracker that
stopped."""

from pathlib import Path

import numpy as np
from transformers import TrainerCallback, TrainerState, TrainingArguments
from transformers.trainer_callback import TrainerControl


def drive(callback: TrainerCallback, output_dir: Path, steps: int = 5) -> TrainerState:
    """The hook sequence of a short training run, with real transformers objects."""
    args = TrainingArguments(output_dir=str(output_dir), report_to="none")
    state, control = TrainerState(), TrainerControl()
    callback.on_init_end(args, state, control)
    callback.on_train_begin(args, state, control)
    for step in range(1, steps + 1):
        state.global_step, state.epoch = step, step / steps
        callback.on_log(args, state, control, logs={"loss": 1.0 / step, "learning_rate": 1e-5, "epoch": state.epoch})
    # numpy numbers (callbacks log them too) are numbers in the tracker, not strings
    callback.on_log(
        args, state, control, logs={"train_runtime": 1.5, "train_loss": 0.4, "train_tflops": np.float32(2.5)}
    )
    callback.on_train_end(args, state, control)
    return state


def degraded_warnings(caplog, warning: str) -> list[str]:
    """The captured log messages holding a tracker's ``warning`` that it stopped."""
    return [record.getMessage() for record in caplog.records if warning in record.getMessage()]
