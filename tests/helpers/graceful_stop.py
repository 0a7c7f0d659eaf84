"""A trainer small enough to stop by signal in a child process: a linear regression on random data, and a callback
that sends real signals at a given step."""

import signal
import threading
from pathlib import Path

import torch
from transformers import Trainer, TrainerCallback, TrainingArguments


class Regression(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)

    def forward(self, x, y):
        return {"loss": torch.nn.functional.mse_loss(self.linear(x).squeeze(-1), y)}


def tiny_trainer(tmp_path: Path, callbacks: list[TrainerCallback], max_steps: int = 50) -> Trainer:
    """A transformers ``Trainer`` of the regression on CPU, a checkpoint due every 3 steps, a log every step."""
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=max_steps,
        per_device_train_batch_size=2,
        save_strategy="steps",
        save_steps=3,  # a checkpoint would be due at the step the signal arrives
        logging_strategy="steps",
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    data = [{"x": torch.randn(4), "y": torch.randn(())} for _ in range(64)]
    return Trainer(model=Regression(), args=args, train_dataset=data, callbacks=callbacks)


class SignalAtStep(TrainerCallback):
    """Sends ``signums``, in order, to this process's main thread when optimizer step ``step`` ends."""

    def __init__(self, step: int, *signums: int):
        self.step, self.signums = step, signums

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            for signum in self.signums:
                # A real signal, to the main thread, so that each is delivered, and handled, before the next is sent
                # (a signal sent while one of its kind is still pending is lost).
                signal.pthread_kill(threading.main_thread().ident, signum)
