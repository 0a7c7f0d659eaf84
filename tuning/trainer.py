"""The one ``Trainer`` of this package: TRL's ``SFTTrainer``, subclassed in one place so that every feature that
must change how a step or a checkpoint runs (the loss's reduction, per-rank data timing, a checkpoint at SIGTERM)
extends this class instead of adding a trainer of its own. ``tuning.sft_trainer.train()`` builds it; importing this
module loads TRL, so callers import it lazily."""

from trl import SFTTrainer


class TuningTrainer(SFTTrainer):
    """``SFTTrainer`` as ``train()`` runs it. Features override its hooks here, each calling ``super()``."""
