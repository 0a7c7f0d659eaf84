"""Which ``checkpoint-N`` folders a run can resume from. transformers writes a checkpoint in place, file by file and
rank by rank, so a job killed mid-save leaves a folder that looks like a checkpoint and is not one. ``TuningTrainer``
therefore writes ``tuning_checkpoint.json`` into each checkpoint twice: ``{"complete": false}`` before any rank writes
a file, and ``{"complete": true, ...}`` (an atomic replace) once every rank has written its part.

A checkpoint is complete when its trainer state parses, its weights are readable, and its status file, when there is
one, says complete. One without a status file was written by transformers without tuning-bench (or before it wrote
one): the first two rules decide alone."""

import contextlib
import json
import logging
import os
import re
import shutil

from safetensors import SafetensorError, safe_open
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

STATUS_FILE = "tuning_checkpoint.json"
TRAINER_STATE_NAME = "trainer_state.json"  # transformers.trainer's name, without importing that module
_CHECKPOINT = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-(\d+)$")
# Weights as transformers and PEFT write them: safetensors (single or sharded), torch pickles, FSDP shard folders.
_WEIGHTS = re.compile(r"^(model|adapter_model)(-\d+-of-\d+)?\.safetensors$|^(pytorch_model|adapter_model).*\.bin$")
_FSDP_SHARDS = re.compile(r"^pytorch_model_fsdp_\d+$")
logger = logging.getLogger(__name__)


def _write_status(checkpoint: str, status: dict) -> None:
    """Replace ``checkpoint``'s status file in one step: a reader sees the old file or the new one, never half."""
    path = os.path.join(checkpoint, STATUS_FILE)
    with open(f"{path}.tmp", "w", encoding="utf-8") as handle:
        json.dump(status, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(f"{path}.tmp", path)


def mark_writing(checkpoint: str) -> None:
    """Mark ``checkpoint`` (created if need be) as being written, before any of its files is (re)written."""
    os.makedirs(checkpoint, exist_ok=True)
    _write_status(checkpoint, {"complete": False})


def _sync_folder(folder: str) -> None:
    """Flush every file under ``folder``, and the folders themselves, to disk: transformers writes without ``fsync``,
    so a node that goes down soon after could otherwise lose files a complete mark vouches for."""
    for directory, _, names in os.walk(folder):
        for path in [*(os.path.join(directory, name) for name in names), directory]:
            descriptor = os.open(path, os.O_RDONLY)
            try:
                os.fsync(descriptor)
            finally:
                os.close(descriptor)


def mark_complete(checkpoint: str, global_step: int, world_size: int) -> None:
    """Mark ``checkpoint`` complete once its files are on disk: call once every rank has written its part."""
    _sync_folder(checkpoint)
    _write_status(checkpoint, {"complete": True, "global_step": global_step, "world_size": world_size})


def _marked_unfinished(checkpoint: str) -> bool:
    """Whether ``checkpoint``'s status file exists and does not say complete (a write this package began)."""
    try:
        with open(os.path.join(checkpoint, STATUS_FILE), encoding="utf-8") as handle:
            return json.load(handle).get("complete") is not True
    except FileNotFoundError:
        return False
    except (OSError, ValueError, AttributeError):
        return True


def remove_unfinished(output_dir: str) -> list[str]:
    """Delete the ``checkpoint-N`` folders of ``output_dir`` whose write this package began and never finished (a
    process killed mid-save), and return them: call once a newer complete checkpoint exists, so that no run resumes
    from them and they do not take disk space forever. Folders without a status file are left alone (not ours)."""
    removed = []
    for name in sorted(os.listdir(output_dir)):
        folder = os.path.join(output_dir, name)
        if _CHECKPOINT.match(name) and os.path.isdir(folder) and _marked_unfinished(folder):
            shutil.rmtree(folder, ignore_errors=True)
            logger.warning("removed %s: its write never finished (a newer checkpoint is complete)", folder)
            removed.append(folder)
    return removed


def checkpoint_problem(checkpoint: str) -> str | None:
    """What makes ``checkpoint`` unusable for resuming (None: it is complete). Reads JSON files and safetensors
    headers only."""
    status_path = os.path.join(checkpoint, STATUS_FILE)
    if os.path.exists(status_path):
        try:
            with open(status_path, encoding="utf-8") as handle:
                complete = json.load(handle).get("complete") is True
        except (OSError, ValueError, AttributeError):
            complete = False
        if not complete:
            return f"its write did not finish ({STATUS_FILE} does not say complete)"
    try:
        with open(os.path.join(checkpoint, TRAINER_STATE_NAME), encoding="utf-8") as handle:
            json.load(handle)
    except FileNotFoundError:
        return f"{TRAINER_STATE_NAME} is missing"
    except (OSError, ValueError) as exc:
        return f"{TRAINER_STATE_NAME} is not readable: {exc}"
    names = sorted(os.listdir(checkpoint))
    weights = [name for name in names if _WEIGHTS.match(name)]
    if not weights and not any(_FSDP_SHARDS.match(name) for name in names):
        return "no model or adapter weights"
    for name in weights:
        if name.endswith(".safetensors"):
            try:
                with safe_open(os.path.join(checkpoint, name), framework="np"):
                    pass
            except (OSError, SafetensorError) as exc:
                return f"{name} is not a complete safetensors file: {exc}"
    return None


def trained_steps(checkpoint: str) -> int:
    """The global step ``checkpoint``'s trainer state reached (read from a complete checkpoint)."""
    return trainer_state(checkpoint)["global_step"]


def checkpoint_step(checkpoint: str) -> int | None:
    """The step in ``checkpoint``'s folder name (None: no ``checkpoint-N`` name)."""
    match = _CHECKPOINT.match(os.path.basename(os.path.normpath(checkpoint)))
    return int(match.group(1)) if match else None


def newest_complete_checkpoint(output_dir: str) -> tuple[str | None, list[tuple[str, str]]]:
    """The highest-numbered complete ``checkpoint-N`` in ``output_dir`` (None: none), and each newer one skipped with
    its problem, newest first."""
    if not os.path.isdir(output_dir):
        return None, []
    folders = [os.path.join(output_dir, name) for name in os.listdir(output_dir) if _CHECKPOINT.match(name)]
    skipped = []
    for folder in sorted(filter(os.path.isdir, folders), key=checkpoint_step, reverse=True):
        problem = checkpoint_problem(folder)
        if problem is None:
            return folder, skipped
        skipped.append((folder, problem))
    return None, skipped


# Written into ``output_dir`` by rank 0 when a run trains to its final step, removed when a run begins training: a
# rerun of a finished job (resume on) reads it, so that the job stays finished even without a final checkpoint
# (``--save_strategy no``).
COMPLETED_FILE = "training_completed.json"


def mark_run_complete(output_dir: str, global_step: int, max_steps: int, num_train_epochs: float) -> None:
    """Record in ``output_dir`` that its run trained to its final step (``global_step`` of ``max_steps``)."""
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, COMPLETED_FILE)
    with open(f"{path}.tmp", "w", encoding="utf-8") as handle:
        json.dump({"global_step": global_step, "max_steps": max_steps, "num_train_epochs": num_train_epochs}, handle)
    os.replace(f"{path}.tmp", path)


def clear_run_complete(output_dir: str) -> None:
    """Forget a finished run's mark: the run in ``output_dir`` is training again (its final step not reached yet)."""
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(output_dir, COMPLETED_FILE))


def run_completion(output_dir: str) -> dict | None:
    """The mark ``mark_run_complete`` left in ``output_dir`` (``global_step``, ``max_steps``, ``num_train_epochs``);
    None without a readable one."""
    try:
        with open(os.path.join(output_dir, COMPLETED_FILE), encoding="utf-8") as handle:
            mark = json.load(handle)
    except (OSError, ValueError):
        return None
    return mark if isinstance(mark, dict) and isinstance(mark.get("global_step"), int) else None


def trainer_state(checkpoint: str) -> dict:
    """The trainer state of a complete checkpoint (``global_step``, ``max_steps``, ``num_train_epochs``, ...)."""
    with open(os.path.join(checkpoint, TRAINER_STATE_NAME), encoding="utf-8") as handle:
        return json.load(handle)


def reached_the_end(state: dict, max_steps: int, num_train_epochs: float) -> bool:
    """Whether training that got to ``state`` (a trainer state, or the completed mark) has nothing left of a run of
    ``max_steps`` (above 0), or else of ``num_train_epochs`` epochs: its final step is the state's own ``max_steps``,
    which the trainer worked out from the same data, unless more epochs are asked for now."""
    step = state.get("global_step", 0)
    if max_steps > 0:
        return step >= max_steps
    final = state.get("max_steps")
    epochs = state.get("num_train_epochs")
    return isinstance(final, int) and final > 0 and step >= final and epochs is not None and num_train_epochs <= epochs
