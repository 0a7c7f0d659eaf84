"""Callbacks the bench_train tests load with ``--callbacks tests.helpers.bench_callbacks:Name``: real slowness, a
real stall, a real exception inside the training loop, a filesystem that fills up and a third party's measurement,
through the wrapper's public extension point."""

import errno
import json
import os
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import TrainerCallback

from tuning.errors import UserInputError

STEP_SECONDS = 0.3
STEADY_STEP_SECONDS = 0.1
STALL_SECONDS = 300


class SlowSteps(TrainerCallback):
    """Every optimizer step takes STEP_SECONDS longer: room to kill things mid-run, and steady step times."""

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(STEP_SECONDS)


class SteadySteps(TrainerCallback):
    """Every optimizer step takes STEADY_STEP_SECONDS longer: steady step times (a sleep outweighing the tiny model's
    step and its jitter), for rules that wait for steady steps, at a third of SlowSteps' cost."""

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(STEADY_STEP_SECONDS)


class StallAtStep2(TrainerCallback):
    """After step 2 the training loop blocks, as in a deadlocked collective."""

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 2:
            time.sleep(STALL_SECONDS)


class ExitsWithoutReport(TrainerCallback):
    """The process ends at once, as a crashed interpreter does: no error report, no TUNING_ERROR line."""

    def __init__(self):
        print("fatal: the device went away (injected)", flush=True)
        os._exit(3)


class OutOfMemoryOnLastRank(TrainerCallback):
    """The highest rank runs out of GPU memory when step 2 begins (torch's own exception, as CUDA raises it)."""

    def on_step_begin(self, args, state, control, **kwargs):
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        if state.global_step == 2 and int(os.environ.get("RANK", "0")) == world_size - 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (injected by the test)")


class SigkillOnLastRankInStep3(TrainerCallback):
    """The highest rank alone gets a real SIGKILL as step 3 begins, as from the kernel's OOM killer: no report."""

    def on_step_begin(self, args, state, control, **kwargs):
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        if state.global_step == 2 and int(os.environ.get("RANK", "0")) == world_size - 1:
            os.kill(os.getpid(), signal.SIGKILL)


class SigtermOnLastRankInStep3(TrainerCallback):
    """The highest rank alone gets a real SIGTERM as step 3 begins, as from a preemption of one node."""

    def on_step_begin(self, args, state, control, **kwargs):
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        if state.global_step == 2 and int(os.environ.get("RANK", "0")) == world_size - 1:
            os.kill(os.getpid(), signal.SIGTERM)


class CountsStopCollectives(TrainerCallback):
    """Counts the MAX all-reduces (the stop agreement's op) of each optimizer step, through its own wrapper of
    ``dist.all_reduce`` installed at train begin; at train end writes the counts to ``$COLLECTIVES_DIR/rank<N>.json``.
    Loaded after the wrapper's own callbacks, its step end closes each step's count."""

    def __init__(self):
        self.per_step: list[int] = []
        self.count = 0

    def on_train_begin(self, args, state, control, **kwargs):
        all_reduce = dist.all_reduce

        def counting_all_reduce(tensor, op=dist.ReduceOp.SUM, *rest, **kwargs):
            if op == dist.ReduceOp.MAX:
                self.count += 1
            return all_reduce(tensor, op, *rest, **kwargs)

        dist.all_reduce = counting_all_reduce

    def on_step_end(self, args, state, control, **kwargs):
        self.per_step.append(self.count)
        self.count = 0

    def on_train_end(self, args, state, control, **kwargs):
        path = Path(os.environ["COLLECTIVES_DIR"]) / f"rank{os.environ.get('RANK', '0')}.json"
        path.write_text(json.dumps(self.per_step))


class AddsMetric(TrainerCallback):
    """A third party's measurement: every training log gains ``my_metric``, 1.5 times the step."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is not None and "loss" in logs:
            logs["my_metric"] = 1.5 * state.global_step


class FillsDiskAfterStep2(TrainerCallback):
    """After step 2 the filesystem holding ``$FILL_DIR`` is full, as when another job fills a shared volume."""

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 2:
            fill(Path(os.environ["FILL_DIR"]))


def fill(directory: Path) -> None:
    """Write a file in ``directory`` until its filesystem is full (a short write fills the last page)."""
    chunk = b"\0" * 2**16
    with open(directory / "filler", "wb", buffering=0) as handle:
        try:
            while True:
                handle.write(chunk)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise


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


class SlowForward(TrainerCallback):
    """Every training forward pass sleeps ``$SLOW_FORWARD_SECONDS`` on the rank ``$SLOW_FORWARD_RANK`` (every rank
    when unset): a straggler, or a slower candidate build. A forward pre-hook registered at train begin, after the
    benchmark's own, so that the benchmark's forward timing includes the sleep."""

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        rank = os.environ.get("SLOW_FORWARD_RANK")
        if rank is None or int(rank) == int(os.environ.get("RANK", "0")):
            seconds = float(os.environ["SLOW_FORWARD_SECONDS"])
            model.register_forward_pre_hook(lambda module, _: time.sleep(seconds) if module.training else None)


class SlowStepsByFraction(TrainerCallback):
    """Every optimizer step is followed by a sleep of ``$SLOW_STEP_FRACTION`` times its own duration: a candidate
    build that is that much slower per step (the benchmark counts the sleep in the next step's time)."""

    def __init__(self):
        self.fraction = float(os.environ["SLOW_STEP_FRACTION"])
        self.step_began = time.perf_counter()

    def on_step_begin(self, args, state, control, **kwargs):
        self.step_began = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(self.fraction * (time.perf_counter() - self.step_began))


class SlowDataFetch(TrainerCallback):
    """Every micro-batch's collation sleeps ``$SLOW_FETCH_SECONDS`` on the rank ``$SLOW_FETCH_RANK``: a rank with a
    slow input pipeline. Its data loader's collate function is wrapped at train begin, before the epoch's iterator
    exists (which takes the function then)."""

    def on_train_begin(self, args, state, control, train_dataloader=None, **kwargs):
        if int(os.environ["SLOW_FETCH_RANK"]) == int(os.environ.get("RANK", "0")):
            loader = getattr(train_dataloader, "base_dataloader", train_dataloader)  # accelerate's adapter iterates it
            seconds, collate = float(os.environ["SLOW_FETCH_SECONDS"]), loader.collate_fn

            def slow_collate(samples):
                time.sleep(seconds)
                return collate(samples)

            loader.collate_fn = slow_collate


class FreezeLearning(TrainerCallback):
    """A silent regression: every step's learning rate is set to 0 before the optimizer steps, so that the run goes
    at the usual speed and learns nothing (as a zeroed learning rate or a broken kernel would)."""

    def on_pre_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        for group in optimizer.param_groups:
            group["lr"] = 0.0


def on_node_1() -> bool:
    """Whether this process is a worker of the job's node 1 (torchrun's GROUP_RANK)."""
    return os.environ.get("GROUP_RANK") == "1"


class SigkillsNode1LauncherInStep3(TrainerCallback):
    """As step 3 begins, node 1's launcher (its first worker's parent) gets a real SIGKILL, as when the node's pod
    or Ray worker dies; that worker then blocks, so that the step cannot finish before what runs the node notices."""

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == 2 and on_node_1() and os.environ.get("LOCAL_RANK") == "0":
            os.kill(os.getppid(), signal.SIGKILL)
            time.sleep(STALL_SECONDS)


class UserErrorOnNode1InStep2(TrainerCallback):
    """Node 1's ranks fail with a user error as step 2 begins, their peers on node 0 in the step's collectives."""

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == 1 and on_node_1():
            raise UserInputError("the data of node 1 is not what this job expects (injected by the test)")
