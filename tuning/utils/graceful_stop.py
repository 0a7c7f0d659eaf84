"""Stopping training at an optimizer-step boundary on every rank at once: on a signal (``GracefulStopCallback``), or
on a callback's own rule (``tuning.benchmarking.callback.BenchmarkCallback``), decided by one ``StopAgreement``.

On SIGTERM (a Kubernetes preemption, torchrun's shutdown) or SIGINT, in order: each rank finishes the optimizer step
it is in; the ranks agree at that step's end (one all-reduce) that training stops there; every rank writes its part
of a checkpoint of that step into ``output_dir`` (the kind ``--save_strategy`` writes: weights or adapter, optimizer,
scheduler, RNG and trainer state), and ``TuningTrainer`` marks it complete once all have; the trainer returns, the
trackers flush, and the caller raises ``TrainingInterrupted`` (exit 143). No checkpoint with ``--save_strategy no``
or ``--save_on_preemption false``, and no evaluation. A restart with the same command resumes from that checkpoint;
one the grace period cut short is skipped with a warning (``tuning.utils.checkpoints``)."""

import enum
import logging
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from transformers import TrainerCallback, TrainerControl
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, SaveStrategy

from tuning.utils.error_logging import record_global_step, record_stop_signal

logger = logging.getLogger(__name__)


class Vote(enum.IntEnum):
    """What a callback votes at a step end (0: go on), and its place in the all-reduced tensor."""

    SIGNAL = 0  # the number of the stop signal caught
    STOP_REASON = 1  # a stop rule's reason: 1 + its index in tuning.benchmarking.stopping.STOP_REASONS


OnAgreed = Callable[[int, TrainerControl], None]


class StopAgreement:
    """One stop decision per optimizer step, agreed by all ranks (a rank stopping alone would block the others in
    their next collective). Each stopping callback joins at train begin with its kind of vote and a handler, then votes
    at every step end; the step's last vote runs one all-reduce (MAX) of all votes on a CPU (gloo) group, so no device
    sync, and gives each handler the agreed value of its kind. In a single process the votes stand as they are.
    ``collective_seconds``: the time spent in those all-reduces so far (the step anatomy's communication).
    """

    def __init__(self) -> None:
        self._handlers: dict[Vote, OnAgreed] = {}
        self._votes: dict[Vote, int] = {}
        self._joint = False
        self._group: Any = None
        self.collective_seconds = 0.0

    def join(self, kind: Vote, on_agreed: OnAgreed) -> None:
        """Vote ``kind`` from now on. Every rank joins the same kinds in the same order: the first join on a non-gloo
        backend creates the CPU group, itself a collective."""
        self._joint = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        if self._joint and self._group is None and "gloo" not in str(dist.get_backend()):
            self._group = dist.new_group(backend="gloo")
        self._handlers[kind] = on_agreed
        self._votes.clear()

    def vote(self, kind: Vote, value: int, control: TrainerControl) -> None:
        """This rank's ``value`` (0: go on) for this step; the step's last vote runs the agreement."""
        self._votes[kind] = value
        if not self._handlers.keys() <= self._votes.keys():
            return
        votes = [self._votes.get(each, 0) for each in Vote]
        self._votes = {}
        if self._joint:
            began = time.perf_counter()
            tensor = torch.tensor(votes, dtype=torch.int64)
            dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=self._group)
            votes = tensor.tolist()
            self.collective_seconds += time.perf_counter() - began
        for each, on_agreed in self._handlers.items():
            on_agreed(votes[each], control)


class GracefulStopCallback(TrainerCallback):
    """Turn SIGTERM/SIGINT into a stop at the next optimizer-step boundary on every rank; the trainer returns normally
    (trackers flush) and the caller raises ``TrainingInterrupted`` from ``received_signal``. A second signal before
    the stop gets the previous handler (the user can still force it). Once the stop is agreed, a repeated SIGTERM
    (torchrun's to every worker once one exits) is ignored until ``restore_signal_handlers()``, so that it cannot cut
    the checkpoint or a report short. At the stop, a checkpoint of that step is due unless ``save_at_stop`` is off
    (``TuningTrainer`` sets it from ``--save_on_preemption``) or ``save_strategy`` is ``no``; no evaluation.
    Also records the global step for error reports.
    """

    signals = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, agreement: StopAgreement | None = None, save_at_stop: bool = True) -> None:
        self.agreement = agreement if agreement is not None else StopAgreement()
        self.save_at_stop = save_at_stop
        self._checkpoint_at_stop = False  # this step's, known at its end
        self._step = 0
        self._save_started = 0.0
        self.received_signal: int | None = None  # caught here or, with several ranks, by another rank
        self._caught: int | None = None
        self._previous: dict[int, Any] = {}
        self._stopping = False  # agreed by all ranks, unlike received_signal which may be local

    def on_train_begin(self, args, state, control, **kwargs):
        record_global_step(state.global_step)
        record_stop_signal(self.received_signal)
        if threading.current_thread() is threading.main_thread() and not self._previous:
            self._previous = {signum: signal.signal(signum, self._handle) for signum in self.signals}
        self.agreement.join(Vote.SIGNAL, self._on_agreed)

    def _handle(self, signum: int, frame: Any) -> None:
        if self._caught is None:
            self._caught = signum
            self.received_signal = self.received_signal or signum
            record_stop_signal(self.received_signal)
            logger.warning(
                "Received %s: stopping after the current step (send it again to stop now)", signal.Signals(signum).name
            )
            return
        if self._stopping and signum == signal.SIGTERM:
            return  # already stopping as fast as it can (no logging here: it may interrupt a write to stderr)
        previous = self._previous.get(signum)
        self.restore_signal_handlers()
        if callable(previous):
            previous(signum, frame)
        elif previous in (signal.SIG_DFL, None):
            signal.raise_signal(signum)

    def restore_signal_handlers(self) -> None:
        """Put back the handlers found at train begin (SIG_DFL for ones installed outside Python)."""
        for signum, previous in self._previous.items():
            signal.signal(signum, signal.SIG_DFL if previous is None else previous)
        self._previous = {}

    def on_step_end(self, args, state, control, **kwargs):
        record_global_step(state.global_step)
        self._step = state.global_step
        self._checkpoint_at_stop = self.save_at_stop and args.save_strategy != SaveStrategy.NO
        self.agreement.vote(Vote.SIGNAL, self.received_signal or 0, control)

    def _on_agreed(self, signum: int, control: TrainerControl) -> None:
        if not signum:
            return
        self.received_signal = self.received_signal or signum
        record_stop_signal(self.received_signal)
        self._stopping = True
        control.should_training_stop = True
        control.should_save = self._checkpoint_at_stop
        control.should_evaluate = False
        if self._checkpoint_at_stop:
            logger.warning("Stopping after step %d: writing %s-%d first", self._step, PREFIX_CHECKPOINT_DIR, self._step)
            self._save_started = time.perf_counter()

    def on_save(self, args, state, control, **kwargs):
        if self._stopping:
            seconds = time.perf_counter() - self._save_started
            logger.warning("Wrote %s-%d in %.2f s", PREFIX_CHECKPOINT_DIR, state.global_step, seconds)

    def on_epoch_end(self, args, state, control, **kwargs):
        if self._stopping:  # the step's checkpoint, if any, is written
            control.should_save = False
            control.should_evaluate = False

    def on_train_end(self, args, state, control, **kwargs):
        if not self._stopping:
            self.restore_signal_handlers()
