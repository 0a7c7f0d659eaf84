"""The first lines of a training script (``tuning/sft_trainer.py``, ``wrappers/bench_train.py``, a copy of it), run
before it imports torch. Imports nothing heavy itself."""

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tuning.trackers.helper_transport import EarlyHelpers


def prologue(argv: list[str], script: str | None = None) -> "EarlyHelpers":
    """Everything a training script does before its heavy imports, in this order:

    1. ``script``'s own folder off ``sys.path`` (given by a script inside the package, run by its path: its folder
       would shadow top-level packages such as ``datasets``' own imports with ``tuning/data``, ``tuning/config``...);
    2. SIGTERM and Ctrl-C handlers, so that a signal while torch loads still ends the job as ``interrupted``;
    3. the helper processes of the trackers ``argv`` asks for (Aim, MLflow), which import their libraries while this
       process imports torch, not beside the first training steps. Returned, for the script to hand to the
       trackers it builds (``build_trackers(..., early_helpers)``), which adopt them.
    """
    if script is not None:
        here = os.path.dirname(os.path.abspath(script))
        sys.path[:] = [path for path in sys.path if os.path.abspath(path or ".") != here]
    from tuning.utils.error_logging import install_early_signal_handlers

    install_early_signal_handlers()
    from tuning.trackers import start_helpers

    return start_helpers(argv)
