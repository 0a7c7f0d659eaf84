"""Step anatomy: where each optimizer step's time goes, measured on every run without a profiler. A step lasts from
the previous step's end to its own (the dump's ``step_time_seconds``); its parts:

- ``data``: the rank's own fetch of the step's batches from its data loader (``TuningTrainer.get_batch_samples``);
- ``forward``: the model's training forward passes (forward hooks on the model), the loss included where the model
  computes it;
- ``backward``: from each forward's end to the end of its micro-batch's training step (the trainer's
  ``training_step``): loss scaling and the backward pass, under DDP with the gradient all-reduce it overlaps;
- ``optimizer``: from the last micro-batch's end to the step's end: gradient clipping, the optimizer and scheduler
  steps, zeroing the gradients;
- ``communication`` (torchrun only): time blocked in the collectives a step runs outside the backward pass, the
  cross-rank count of the batch's items and the stop agreement;
- ``rest``: the step less all of these: callbacks, logging, checkpoints and evaluations, moving inputs to the device.

On a GPU forward, backward and optimizer are CUDA events recorded at those points (no synchronisation added: a step's
events are read once its last one is done), data and communication the host's clock (both block the host), and the
rest what is left of the step's wall time. On a CPU every part is the clock. Without a trainer that reports its
micro-batches' ends (``on_micro_batch_end``) backward and optimizer are not measured and fall into the rest.

``bound_by`` names what a run's steps wait on most, from the parts' median shares: ``data``, ``compute`` (forward +
backward + optimizer), ``communication`` or ``host`` (the rest; on a GPU also the share of compute time the device
sat idle, by its sampled utilisation).

Imports no torch at module level: the dump's builder, which must not load it, reads ``PARTS`` and ``bound_by``.
"""

import time
from collections import deque
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    import torch

PARTS = ("data", "forward", "backward", "optimizer", "communication", "rest")
COMPUTE_PARTS = ("forward", "backward", "optimizer")
BOUND_BY = ("data", "compute", "communication", "host")

FORWARD_BEGIN, FORWARD_END, MICRO_BATCH_END = "forward_begin", "forward_end", "micro_batch_end"


class _Mark(NamedTuple):
    kind: str
    clock: float
    event: Any  # a CUDA event recorded then, None on a CPU


class StepAnatomy:
    """The parts of each optimizer step of this rank's ``model``: ``ready()`` gives the steps whose parts are known as
    ``(step, {part: seconds})``, oldest first. ``distributed``: under torchrun (the communication part is measured)."""

    def __init__(self, model: "torch.nn.Module", device: "torch.device", distributed: bool = False):
        self._cuda = device.type == "cuda"
        self._event: Any = None
        if self._cuda:
            import torch

            self._event = torch.cuda.Event
        self._distributed = distributed
        self._marks: list[_Mark] = []
        self._step_began = self._now("step_end")  # the previous step's end
        self._data = self._communication = 0.0
        self._micro_batches_reported = False
        self._unresolved: deque[tuple[int, float, float, float, _Mark, list[_Mark]]] = deque()
        self._handles = [
            model.register_forward_pre_hook(self._forward_begins),
            model.register_forward_hook(self._forward_ends),
        ]

    def begin(self) -> None:
        """Training begins now: the first step's time runs from here."""
        self._step_began, self._marks = self._now("step_end"), []

    def _now(self, kind: str) -> _Mark:
        event = None
        if self._cuda:
            event = self._event(enable_timing=True)
            event.record()
        return _Mark(kind, time.perf_counter(), event)

    def _forward_begins(self, module: "torch.nn.Module", args: tuple) -> None:
        if module.training:
            self._marks.append(self._now(FORWARD_BEGIN))

    def _forward_ends(self, module: "torch.nn.Module", args: tuple, output: Any) -> None:
        if module.training:
            self._marks.append(self._now(FORWARD_END))

    def micro_batch_ends(self) -> None:
        """A micro-batch's training step (forward and backward) is done."""
        self._micro_batches_reported = True
        self._marks.append(self._now(MICRO_BATCH_END))

    def batches_fetched(self, seconds: float) -> None:
        """This rank spent ``seconds`` fetching batches of the running step from its data loader."""
        self._data += seconds

    def batches_counted(self, seconds: float) -> None:
        """The trainer spent ``seconds`` counting the fetched batches' items: across ranks (a collective) under
        torchrun, else host work (the rest)."""
        if self._distributed:
            self._communication += seconds

    def collective_waited(self, seconds: float) -> None:
        """This rank spent ``seconds`` blocked in a collective of the running step."""
        self._communication += seconds

    def step_ends(self, step: int) -> None:
        end = self._now("step_end")
        began, self._step_began = self._step_began, end
        marks, self._marks = self._marks, []
        self._unresolved.append((step, end.clock - began.clock, self._data, self._communication, began, [*marks, end]))
        self._data = self._communication = 0.0

    def ready(self, wait: bool = False) -> list[tuple[int, dict[str, float | None]]]:
        """The steps whose parts are known (``wait``: all of them, waiting for their events), oldest first."""
        done = []
        while self._unresolved:
            step, wall, data, communication, began, marks = self._unresolved[0]
            if self._cuda and not marks[-1].event.query():
                if not wait:
                    break
                marks[-1].event.synchronize()
            self._unresolved.popleft()
            parts = self._compute_parts(began, marks)
            parts.update(data=data, communication=communication if self._distributed else None)
            known = sum(seconds for seconds in parts.values() if seconds is not None)
            parts["rest"] = max(wall - known, 0.0)
            done.append((step, parts))
        return done

    def _compute_parts(self, began: _Mark, marks: list[_Mark]) -> dict[str, float | None]:
        """Forward, backward and optimizer seconds of one step, from its marks in the order they were taken."""
        seconds = self._seconds
        forward = backward = 0.0
        last_forward_end = last_micro_batch_end = None
        opened = None
        for mark in marks[:-1]:
            if mark.kind == FORWARD_BEGIN:
                opened = mark
            elif mark.kind == FORWARD_END and opened is not None:
                forward += seconds(opened, mark)
                last_forward_end, opened = mark, None
            elif mark.kind == MICRO_BATCH_END and last_forward_end is not None:
                backward += seconds(last_forward_end, mark)
                last_micro_batch_end, last_forward_end = mark, None
        if not self._micro_batches_reported:
            return {"forward": forward, "backward": None, "optimizer": None}
        optimizer = seconds(last_micro_batch_end, marks[-1]) if last_micro_batch_end is not None else 0.0
        return {"forward": forward, "backward": backward, "optimizer": optimizer}

    def _seconds(self, first: _Mark, second: _Mark) -> float:
        if self._cuda:
            return first.event.elapsed_time(second.event) / 1000.0
        return second.clock - first.clock

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()


def bound_by(shares: dict[str, float], gpu_utilization: float | None = None) -> tuple[str | None, dict[str, float]]:
    """(what the steps wait on most, the grouped shares that decided it) from the parts' median shares of the step
    time. ``gpu_utilization`` (percent, sampled while training on a GPU): the compute share's idle part, by it, counts
    as host time (launch overhead leaves the device waiting). (None, {}) without any share."""
    if not shares:
        return None, {}
    compute = sum(shares.get(part) or 0.0 for part in COMPUTE_PARTS)
    host = shares.get("rest") or 0.0
    if gpu_utilization is not None:
        busy = min(max(gpu_utilization / 100.0, 0.0), 1.0)
        compute, host = compute * busy, host + compute * (1.0 - busy)
    figures = {
        "data": shares.get("data") or 0.0,
        "compute": compute,
        "communication": shares.get("communication") or 0.0,
        "host": host,
    }
    return max(BOUND_BY, key=figures.__getitem__), figures
