"""Per-rank compute and data time, to find a straggler. In synchronous data-parallel training every rank's step lasts
as long as the slowest rank's (the others wait in the gradient all-reduce), so step times cannot name it; the time
each rank spends in its own work can. Per optimizer step: the forward time summed over the step's micro-batches
(forward hooks on the model, timed with CUDA events on a GPU, read once they are done, without a device
synchronisation per step; with the clock elsewhere); the rank's own fetch of the step's batches (``batches_fetched``,
fed by ``TuningTrainer.get_batch_samples``: the data loader's ``next`` calls only, before the cross-rank count of the
batch's items); the wait from the previous step's end to this step's begin, which holds that fetch but also the
wait for the other ranks in that count; the time blocked in the collectives the step runs outside the backward pass
(``collective_waited``: that count and the stop agreement, as the step anatomy's ``communication``); and the rank's own
non-padding tokens (``tokens_counted``), for its throughput. Medians and throughputs are gathered from every rank once,
at the end.
"""

import statistics
import time
from collections import deque
from typing import Any, NamedTuple

import torch
import torch.distributed as dist


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def gather_objects(mine: Any) -> list[Any]:
    """Every rank's ``mine``, in rank order (a collective under torch.distributed: every rank must call it)."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        everyone: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
        return everyone
    return [mine]


def _after(after_step: int | None, per_step: dict[int, Any]) -> list[Any]:
    """The values of the steps after ``after_step`` (None or none left: every step's)."""
    after = [value for step, value in per_step.items() if after_step is None or step > after_step]
    return after or list(per_step.values())


class RankFigures(NamedTuple):
    """One rank's figures over the steps after the warmup (medians per step; None for one without any step), or as
    ``RankTimes.gather`` gives them, each a list in rank order."""

    forward: Any  # seconds in the model's forward passes
    data_wait: Any  # seconds from the previous step's end to this one's begin
    data_fetch: Any  # seconds fetching the step's batches from the data loader
    data_fetch_share: Any  # that fetch over the rank's own step time
    collective_wait: Any  # seconds blocked in the step's collectives outside the backward pass
    tokens_per_second: Any  # the rank's own non-padding tokens over its step time (a rate, not a median)


class RankTimes:
    """Forward time, data wait, collective wait and tokens of each optimizer step of this rank's ``model``."""

    def __init__(self, model: torch.nn.Module, device: torch.device):
        self._cuda = device.type == "cuda"
        self._started: Any = None  # the running forward's start: an event or a clock reading
        self._step_seconds = 0.0  # clock-timed forward seconds of the running step
        self._step_events: list[tuple[Any, Any]] = []  # (start, end) events of the running step
        self._unresolved: deque[tuple[int, float, list[tuple[Any, Any]]]] = deque()
        self._last_step_end = time.perf_counter()
        self.forward_seconds: dict[int, float] = {}  # by optimizer step
        self.data_wait_seconds: dict[int, float] = {}
        self.data_fetch_seconds: dict[int, float] = {}
        self.step_seconds: dict[int, float] = {}  # from the previous step's end to this one's
        self.collective_seconds: dict[int, float] = {}
        self.tokens: dict[int, int] = {}  # this rank's own non-padding tokens
        self._collective = 0.0  # seconds blocked in collectives of the running step
        self._fetched: float | None = None  # fetch seconds of the coming step's batches; None: none reported
        self._handles = [
            model.register_forward_pre_hook(self._forward_begins),
            model.register_forward_hook(self._forward_ends),
        ]

    def _now(self) -> Any:
        if not self._cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def _forward_begins(self, module: torch.nn.Module, args: tuple) -> None:
        self._started = self._now() if module.training else None

    def _forward_ends(self, module: torch.nn.Module, args: tuple, output: Any) -> None:
        if self._started is None:
            return
        if self._cuda:
            self._step_events.append((self._started, self._now()))
        else:
            self._step_seconds += time.perf_counter() - self._started
        self._started = None

    def batches_fetched(self, seconds: float) -> None:
        """This rank spent ``seconds`` fetching the batches of the coming optimizer step (maybe in several calls)."""
        self._fetched = (self._fetched or 0.0) + seconds

    def collective_waited(self, seconds: float) -> None:
        """This rank spent ``seconds`` blocked in a collective of the running step, outside its backward pass."""
        self._collective += seconds

    def tokens_counted(self, step: int, tokens: int) -> None:
        """This rank's ``tokens`` non-padding tokens of optimizer step ``step``."""
        self.tokens[step] = tokens

    def step_begins(self, step: int) -> None:
        """The trainer has fetched the batches of optimizer step ``step`` (the one it is about to complete)."""
        self.data_wait_seconds[step] = time.perf_counter() - self._last_step_end
        if self._fetched is not None:
            self.data_fetch_seconds[step], self._fetched = self._fetched, None

    def step_ends(self, step: int) -> None:
        now = time.perf_counter()
        self.step_seconds[step], self._last_step_end = now - self._last_step_end, now
        self.collective_seconds[step], self._collective = self._collective, 0.0
        self._unresolved.append((step, self._step_seconds, self._step_events))
        self._step_seconds, self._step_events = 0.0, []
        self._resolve(wait=False)

    def _resolve(self, wait: bool) -> None:
        """Turn the steps whose events are done (``wait``: all) into seconds."""
        while self._unresolved:
            step, seconds, events = self._unresolved[0]
            if events and not events[-1][1].query():
                if not wait:
                    return
                events[-1][1].synchronize()
            self._unresolved.popleft()
            self.forward_seconds[step] = seconds + sum(start.elapsed_time(end) / 1000.0 for start, end in events)

    def medians(self, after_step: int | None) -> RankFigures:
        """This rank's figures over the steps after ``after_step`` (None or none left: every step). The fetch share: a
        step's fetch over its time; the throughput: the steps' tokens over their time (None without either)."""
        self._resolve(wait=True)
        shares = {
            step: fetched / self.step_seconds[step]
            for step, fetched in self.data_fetch_seconds.items()
            if self.step_seconds.get(step)
        }
        per_steps = (self.forward_seconds, self.data_wait_seconds, self.data_fetch_seconds, shares)
        result = [median(_after(after_step, per_step)) for per_step in (*per_steps, self.collective_seconds)]
        measured = _after(after_step, {step: step for step in self.tokens if step in self.step_seconds})
        busy = sum(self.step_seconds[step] for step in measured)
        rate = sum(self.tokens[step] for step in measured) / busy if busy > 0 else None
        return RankFigures(*result, rate)

    def gather(self, after_step: int | None) -> RankFigures:
        """Every rank's figures, each a list in rank order; every rank must call it (a collective)."""
        return RankFigures(*(list(figure) for figure in zip(*gather_objects(self.medians(after_step)), strict=True)))

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
