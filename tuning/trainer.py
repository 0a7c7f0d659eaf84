"""The one ``Trainer`` of this package: TRL's ``SFTTrainer``, subclassed in one place so that every feature that
must change how a step or a checkpoint runs (the loss's reduction, per-rank data timing, a checkpoint at SIGTERM)
extends this class instead of adding a trainer of its own. ``tuning.sft_trainer.train()`` builds it; importing this
module loads TRL, so callers import it lazily."""

import time
from collections.abc import Iterator
from typing import Any

from trl import SFTTrainer


class TuningTrainer(SFTTrainer):
    """``SFTTrainer`` as ``train()`` runs it. Features override its hooks here, each calling ``super()``.

    Per-rank data timing: each optimizer step's batches are fetched in ``get_batch_samples``, which then counts the
    batch's items across ranks (a collective: every rank waits there for the slowest). Only the data loader's
    ``next`` calls are timed, and every callback with an ``on_batches_fetched(seconds)`` method gets this rank's
    own fetch time of the step's batches (``tuning.benchmarking``'s callback does)."""

    def get_batch_samples(self, epoch_iterator: Iterator, num_batches: int, device: Any) -> tuple[list, Any]:
        timed = _TimedIterator(epoch_iterator)
        result = super().get_batch_samples(timed, num_batches, device)
        for callback in self.callback_handler.callbacks:
            if (on_fetched := getattr(callback, "on_batches_fetched", None)) is not None:
                on_fetched(timed.seconds)
        return result


class _TimedIterator:
    """``iterator``, adding the time each ``next`` takes to ``seconds``."""

    def __init__(self, iterator: Iterator):
        self.iterator = iterator
        self.seconds = 0.0

    def __iter__(self) -> "_TimedIterator":
        return self

    def __next__(self) -> Any:
        start = time.perf_counter()
        try:
            return next(self.iterator)
        finally:
            self.seconds += time.perf_counter() - start
