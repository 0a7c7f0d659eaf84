"""Tracker callbacks driven in-process: the hook sequence of a short training run, and the warnings of a tracker that
stopped."""

from pathlib import Path

import numpy as np
from transformers import TrainerCallback, TrainerState, TrainingArguments
from transformers.trainer_callback import TrainerControl

# What bench_train mirrors to a tracker in one call: a system series twice in a row (step None: the tracker counts
# on, and each must stay a point of its own), then a step's time and throughput.
MIRRORED_POINTS = [
    ("gpu_power_watts", 100.0, None, {"gpu": 0}),
    ("gpu_power_watts", 120.0, None, {"gpu": 0}),
    ("step_time_seconds", 0.25, 3, None),
    ("tokens_per_second", 400.0, 3, None),
]


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
