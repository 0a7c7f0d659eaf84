"""The one ``Trainer`` of this package: TRL's ``SFTTrainer``, subclassed in one place so that every feature that
must change how a step or a checkpoint runs (the loss's reduction, per-rank data timing, a checkpoint at SIGTERM)
extends this class instead of adding a trainer of its own. Callbacks with these methods hear of what no transformers
event tells: ``on_train_entered(time)``, ``on_batches_fetched(seconds)``, ``on_batches_counted(seconds)``,
``on_micro_batch_end()``, ``on_time_spent(what, seconds)``.
``tuning.sft_trainer.train()`` builds it; importing this module loads TRL, so callers import it lazily."""

import os
import time
from collections.abc import Iterator
from typing import Any

import torch
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints
from trl import SFTTrainer

from tuning.utils.checkpoints import STATUS_FILE, mark_complete, mark_writing, remove_unfinished
from tuning.utils.graceful_stop import GracefulStopCallback
from tuning.utils.sharded_state import ShardedTrainingState

_NOT_MODEL_FILES = (STATUS_FILE, "trainer_state.json")


def link_model_files(checkpoint: str, folder: str) -> None:
    """Hard-link ``checkpoint``'s model, config and tokenizer files (its safetensors and JSON files but its status
    and trainer state) into ``folder``."""
    os.makedirs(folder, exist_ok=True)
    for name in os.listdir(checkpoint):
        source, target = os.path.join(checkpoint, name), os.path.join(folder, name)
        if name.endswith((".safetensors", ".json")) and name not in _NOT_MODEL_FILES and not os.path.exists(target):
            os.link(source, target)


IGNORE_INDEX = -100  # labels of tokens outside the loss (prompt, padding), as transformers and TRL mark them


class TuningTrainer(SFTTrainer):
    """``SFTTrainer`` as ``train()`` runs it. Features override its hooks here, each calling ``super()``.

    Per-rank data timing: each optimizer step's batches are fetched in ``get_batch_samples``, which then counts the
    batch's items across ranks (a collective: every rank waits there for the slowest). Only the data loader's
    ``next`` calls are timed, and every callback with an ``on_batches_fetched(seconds)`` method gets this rank's
    own fetch time of the step's batches (``tuning.benchmarking``'s callback does), and ``on_batches_counted(seconds)``
    the rest of ``get_batch_samples`` (the count, a collective under torchrun); ``on_label_tokens(count)`` gets this
    rank's label tokens of those batches (``label_tokens``), the tokens its loss trains on. ``on_micro_batch_end()``
    follows each micro-batch's ``training_step`` (its forward and backward): the step anatomy's end of a backward pass.

    Checkpoints: each one is marked complete only after every rank has written its part (``tuning.utils.checkpoints``
    says how a resume tells), and ``save_total_limit`` rotates old ones out only then, so that the newest complete
    checkpoint survives until the next one is complete; then folders a killed save left unfinished are removed.
    ``save_on_preemption``: a ``GracefulStopCallback`` among the callbacks writes a checkpoint of the step it stops at
    (unless ``save_strategy`` is ``no``). Evaluations and checkpoint saves are timed for the callbacks.

    ``safetensors_folders``: fms-hf-tuning 3.2's layout for fast MoE checkpoints, each ``checkpoint-N`` also holding
    ``safetensors-N``, a loadable Hugging Face model: hard links to the checkpoint's own model and tokenizer files
    (its weights already are one), so no second copy is written.

    ``weights_from_checkpoint``: the checkpoint the model was loaded from (experts sharded at load time), whose
    weights a resume therefore does not load again.

    ``sharded_state``: a ``ShardedTrainingState`` (among the callbacks too), which writes the optimizer and scheduler
    state of a model sharded at load time into each checkpoint, on every rank, before the checkpoint is marked
    complete (transformers saves such a model only), and each rank's random generators' state, in transformers'
    own format and by its own method, which its resume reads back (dropout masks as in an uninterrupted run).

    ``reduce_loss_sum`` is ``--enable_reduce_loss_sum``, v3.1.0's experimental loss: the cross entropy of each
    micro-batch summed over its label tokens instead of averaged, then divided by the gradient accumulation steps by
    the Trainer (as v3.1.0's ``SumLossSFTTrainer`` has it), so that every token weighs the same whatever the number of
    label tokens in its micro-batch.
    """

    def __init__(
        self,
        *args,
        save_on_preemption: bool = True,
        reduce_loss_sum: bool = False,
        weights_from_checkpoint: str | None = None,
        safetensors_folders: bool = False,
        sharded_state: ShardedTrainingState | None = None,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        self.sharded_state = sharded_state
        self.reduce_loss_sum = reduce_loss_sum
        self.weights_from_checkpoint = weights_from_checkpoint
        self.safetensors_folders = safetensors_folders
        if reduce_loss_sum:
            self.loss_is_scaled_for_ga = False  # the Trainer divides the summed loss by the accumulation steps
        for callback in self.callback_handler.callbacks:
            if isinstance(callback, GracefulStopCallback):
                callback.save_at_stop = save_on_preemption

    def _tell(self, hook: str, *values: Any) -> None:
        """Call ``hook(*values)`` on every callback that has that method."""
        for callback in self.callback_handler.callbacks:
            if (method := getattr(callback, hook, None)) is not None:
                method(*values)

    def _report_time(self, what: str, seconds: float) -> None:
        """``on_time_spent(what, seconds)``: this rank just spent ``seconds`` in "evaluation" or "checkpoint_save"."""
        self._tell("on_time_spent", what, seconds)

    def train(self, *args, **kwargs):
        """``on_train_entered(time)`` first: what happens before train begin (a checkpoint's loading) is timed."""
        self._tell("on_train_entered", time.time())
        return super().train(*args, **kwargs)

    def evaluate(self, *args, **kwargs):
        began = time.time()
        try:
            return super().evaluate(*args, **kwargs)
        finally:
            self._report_time("evaluation", time.time() - began)

    def _save_checkpoint(self, model, trial):
        began = time.time()
        try:
            self._save_marked_checkpoint(model, trial)
        finally:
            self._report_time("checkpoint_save", time.time() - began)

    def _save_marked_checkpoint(self, model, trial):
        """transformers' checkpoint (as TRL extends it), between the two marks of its status file, with the rotation
        moved after the second. Overridden as TRL does: transformers offers no public hook before a save."""
        checkpoint = os.path.join(self.args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        if self.args.should_save:
            mark_writing(checkpoint)
        self.accelerator.wait_for_everyone()  # no rank rewrites a file of a folder still marked complete
        limit, self.args.save_total_limit = self.args.save_total_limit, None
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self.args.save_total_limit = limit
        if self.sharded_state is not None:
            self.sharded_state.write(checkpoint, self.model, self.optimizer, self.lr_scheduler, self.args.should_save)
            self._save_rng_state(checkpoint)  # skipped with save_only_model; transformers' resume reads it back
        self.accelerator.wait_for_everyone()  # every rank's part is on disk
        if self.args.should_save:
            if self.safetensors_folders:
                link_model_files(checkpoint, os.path.join(checkpoint, f"safetensors-{self.state.global_step}"))
            mark_complete(checkpoint, self.state.global_step, self.args.world_size)
            remove_unfinished(self.args.output_dir)
            rotate_checkpoints(
                self.args.output_dir, limit, best_model_checkpoint=self.state.best_model_checkpoint, use_mtime=True
            )

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        """transformers' loading of a resumed checkpoint's weights, skipped when the model was loaded from that very
        checkpoint (``weights_from_checkpoint``: a model sharded at load time, which transformers cannot load
        into). Overridden as ``_save_checkpoint`` is: transformers offers no public hook for it.

        The trained parameters keep the dtype they were built with: TRL casts a quantised model's LoRA weights to
        bfloat16, and transformers' resume reloads the adapter in float32 (peft's default), so a resumed QLoRA run
        would train on in another precision than the run it continues."""
        if self.weights_from_checkpoint is not None and os.path.samefile(
            self.weights_from_checkpoint, resume_from_checkpoint
        ):
            return
        target = model if model is not None else self.model
        built = {name: parameter.dtype for name, parameter in target.named_parameters() if parameter.requires_grad}
        super()._load_from_checkpoint(resume_from_checkpoint, model)
        for name, parameter in target.named_parameters():
            if parameter.requires_grad and built.get(name, parameter.dtype) != parameter.dtype:
                parameter.data = parameter.data.to(built[name])

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if not self.reduce_loss_sum:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        labels = inputs["labels"]
        outputs = model(**{key: value for key, value in inputs.items() if key != "labels"}, use_cache=False)
        # Prompt tuning puts its virtual tokens before the sequence: their logits predict no label.
        logits = outputs.logits[:, -labels.shape[1] :, :]
        loss = torch.nn.functional.cross_entropy(
            logits[:, :-1, :].flatten(0, 1).float(),
            labels[:, 1:].flatten().to(logits.device),
            ignore_index=IGNORE_INDEX,
            reduction="sum",
        )
        return (loss, outputs) if return_outputs else loss

    def get_batch_samples(self, epoch_iterator: Iterator, num_batches: int, device: Any) -> tuple[list, Any]:
        began = time.perf_counter()
        timed = _TimedIterator(epoch_iterator)
        result = super().get_batch_samples(timed, num_batches, device)
        self._tell("on_batches_fetched", timed.seconds)
        self._tell("on_label_tokens", label_tokens(result[0]))
        self._tell("on_batches_counted", time.perf_counter() - began - timed.seconds)
        return result

    def training_step(self, *args, **kwargs):
        loss = super().training_step(*args, **kwargs)
        self._tell("on_micro_batch_end")
        return loss


def label_tokens(batches: list[dict[str, Any]]) -> torch.Tensor | int:
    """The label tokens of one optimizer step's batches that the loss counts (a tensor where the labels lie): a
    causal LM predicts each label from the tokens before it, so a row's first label is no target; a collator's
    ``shift_labels`` (padding-free) are counted as given."""
    counts = [
        (batch["shift_labels"] if "shift_labels" in batch else batch["labels"][..., 1:]).ne(IGNORE_INDEX).sum()
        for batch in batches
        if isinstance(batch, dict) and isinstance(batch.get("shift_labels", batch.get("labels")), torch.Tensor)
    ]
    return torch.stack(counts).sum() if counts else 0


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
