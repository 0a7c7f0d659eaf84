"""The optimizer and learning-rate scheduler state of a run whose model is sharded as it loads (``--fast_moe`` above 1
under torchrun), which transformers does not checkpoint (it saves such a model only, as ``save_only_model``). Each
checkpoint of such a run gets ``sharded_state/`` beside its Hugging Face files (which stay a loadable model):

- the optimizer's state through ``torch.distributed.checkpoint`` (each rank writes its shards of the state of the
  sharded parameters, one rank that of the replicated ones, such as LoRA adapters on a sharded model);
- ``scheduler.pt``, the scheduler's ``state_dict`` (the same on every rank);
- ``layout.json``: the world size and expert-parallel degree the shards were cut for.

A resume reads them back at train begin (``ShardedTrainingState``, a callback), and ``check_resume_layout`` refuses,
before the model loads, a resume under another layout than the checkpoint's. Torch is imported inside the functions."""

import json
import logging
import os
from typing import Any

from transformers import TrainerCallback

from tuning.utils.error_logging import UserInputError

STATE_DIR = "sharded_state"  # no "optimizer" in the name: transformers would take the folder for its own state
LAYOUT_FILE = "layout.json"
SCHEDULER_FILE = "scheduler.pt"
WHOLE_OPTIMIZER_FILES = ("optimizer.pt", "optimizer.bin")  # transformers' state of an unsharded run
logger = logging.getLogger(__name__)


def _describe(layout: dict | None) -> str:
    if layout is None:
        return "no expert parallelism"
    return f"{layout['world_size']} processes at expert-parallel degree {layout['ep_degree']}"


def read_layout(checkpoint: str) -> dict | None:
    """The layout a checkpoint's sharded state was written for; None when it has none."""
    try:
        with open(os.path.join(checkpoint, STATE_DIR, LAYOUT_FILE), encoding="utf-8") as handle:
            return json.load(handle)
    except FileNotFoundError:
        return None


def check_resume_layout(checkpoint: str, layout: dict | None) -> bool:
    """Refuse (``UserInputError``) a resume from ``checkpoint`` by a run of another ``layout`` (None: the model is
    not sharded), naming both; return whether the checkpoint holds sharded state this run will read."""
    written = read_layout(checkpoint)
    name = os.path.basename(checkpoint)
    whole_optimizer = any(os.path.exists(os.path.join(checkpoint, file)) for file in WHOLE_OPTIMIZER_FILES)
    if written is not None and written != layout or written is None and layout is not None and whole_optimizer:
        raise UserInputError(
            f"{name} was written by a run with {_describe(written)} and this run has {_describe(layout)}: its "
            "optimizer state fits its layout only; resume with the same torchrun --nproc_per_node and --fast_moe, "
            "or start in a new --output_dir"
        )
    if written is None and layout is not None:
        logger.warning(
            "%s holds the model only (no %s/): the resumed run restarts the optimizer's state", name, STATE_DIR
        )
    return written is not None


def _torch_optimizer(optimizer: Any) -> Any:
    """The torch optimizer behind accelerate's wrapper (whose ``step`` would count as a training step)."""
    return getattr(optimizer, "optimizer", optimizer)


class ShardedTrainingState(TrainerCallback):
    """Writes a sharded run's optimizer and scheduler state into each checkpoint (``write``, which ``TuningTrainer``
    calls on every rank before it marks the checkpoint complete) and, resuming, reads them back at train begin, once
    transformers has built the optimizer and scheduler."""

    def __init__(self, layout: dict, resume_from: str | None = None):
        self.layout = layout
        self.resume_from = resume_from

    def write(self, checkpoint: str, model: Any, optimizer: Any, scheduler: Any, main_process: bool) -> None:
        import torch
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        folder = os.path.join(checkpoint, STATE_DIR)
        dcp.save({"optimizer": get_optimizer_state_dict(model, _torch_optimizer(optimizer))}, checkpoint_id=folder)
        if main_process:
            torch.save(scheduler.state_dict(), os.path.join(folder, SCHEDULER_FILE))
            with open(os.path.join(folder, LAYOUT_FILE), "w", encoding="utf-8") as handle:
                json.dump(self.layout, handle)

    def on_train_begin(self, args, state, control, model=None, optimizer=None, lr_scheduler=None, **kwargs):
        if self.resume_from is None:
            return
        import torch
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

        folder = os.path.join(self.resume_from, STATE_DIR)
        inner = _torch_optimizer(optimizer)
        loaded = {"optimizer": get_optimizer_state_dict(model, inner)}
        dcp.load(loaded, checkpoint_id=folder)
        set_optimizer_state_dict(model, inner, loaded["optimizer"])
        lr_scheduler.load_state_dict(torch.load(os.path.join(folder, SCHEDULER_FILE), weights_only=True))
        logger.info("resumed the optimizer and scheduler state from %s", folder)
