"""The one ``Trainer`` of this package: TRL's ``SFTTrainer``, subclassed in one place so that every feature that
must change how a step or a checkpoint runs (the loss's reduction, per-rank data timing, a checkpoint at SIGTERM)
extends this class instead of adding a trainer of its own. ``tuning.sft_trainer.train()`` builds it; importing this
module loads TRL, so callers import it lazily."""

import torch
from trl import SFTTrainer

IGNORE_INDEX = -100  # labels of tokens outside the loss (prompt, padding), as transformers and TRL mark them


class TuningTrainer(SFTTrainer):
    """``SFTTrainer`` as ``train()`` runs it. Features override its hooks here, each calling ``super()``.

    ``reduce_loss_sum`` is ``--enable_reduce_loss_sum``, v3.1.0's experimental loss: the cross entropy of each
    micro-batch summed over its label tokens instead of averaged, then divided by the gradient accumulation steps by
    the Trainer (as v3.1.0's ``SumLossSFTTrainer`` has it), so that every token weighs the same whatever the number of
    label tokens in its micro-batch.
    """

    def __init__(self, *args, reduce_loss_sum: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.reduce_loss_sum = reduce_loss_sum
        if reduce_loss_sum:
            self.loss_is_scaled_for_ga = False  # the Trainer divides the summed loss by the accumulation steps

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
