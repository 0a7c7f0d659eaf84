"""The first lines of a training script (``tuning/sft_trainer.py``, ``wrappers/bench_train.py`` or a copy of it, the
``sft_trainer`` console script through ``tuning.launch``), run before it imports torch. Imports nothing heavy."""

from typing import TYPE_CHECKING

from tuning.utils import prologue as ground

if TYPE_CHECKING:
    from tuning.trackers.helper_transport import EarlyHelpers


def prologue(argv: list[str], script: str | None = None) -> "EarlyHelpers":
    """Everything a training script does before its heavy imports, in this order: ``script``'s folder off
    ``sys.path`` and the signal handlers (``tuning.utils.prologue``), then the helper processes of the trackers
    ``argv`` asks for (Aim, MLflow), which import their libraries while this process imports torch, not beside the
    first training steps. Returned, for the script to hand to the trackers it builds
    (``build_trackers(..., early_helpers)``), which adopt them. The garbage collector is paused until the script's
    ``train()`` begins (``tuning.utils.prologue.pause_collector``): a script that calls this trains with
    ``tuning.train``."""
    ground.pause_collector()
    ground.prologue(argv, script)
    from tuning.trackers import start_helpers  # after the script's folder is off the path

    return start_helpers(argv)
