"""Callbacks the bench_train tests load with ``--callbacks tests.helpers.bench_callbacks:Name``: real slowness, a
real stall and a real exception inside the training loop, injected through the wrapper's public extension point."""

import os
import time

import torch
from transformers import TrainerCallback

STEP_SECONDS = 0.3
STALL_SECONDS = 300


class SlowSteps(TrainerCallback):
    """Every optimizer step takes STEP_SECONDS longer: room to kill things mid-run, and steady step times."""

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(STEP_SECONDS)


class StallAtStep2(TrainerCallback):
    """After step 2 the training loop blocks, as in a deadlocked collective."""

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 2:
            time.sleep(STALL_SECONDS)


class OutOfMemoryOnLastRank(TrainerCallback):
    """The highest rank runs out of GPU memory when step 2 begins (torch's own exception, as CUDA raises it)."""

    def on_step_begin(self, args, state, control, **kwargs):
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        if state.global_step == 2 and int(os.environ.get("RANK", "0")) == world_size - 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (injected by the test)")


class SweepFaults(TrainerCallback):
    """Faults by batch size, for the sweep tests, when step 2 begins: at batch size 1 a communication error on the
    first attempt only (a marker file per output_dir in $FAULT_MARKER_DIR says it happened), at 2 and more CUDA OOM."""

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step != 1:
            return
        if args.per_device_train_batch_size >= 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (injected by the test)")
        marker = os.path.join(os.environ["FAULT_MARKER_DIR"], os.path.basename(args.output_dir))
        if not os.path.exists(marker):
            open(marker, "w").close()
            raise torch.distributed.DistNetworkError("Connection closed by peer [127.0.0.1]:29500 (injected)")
