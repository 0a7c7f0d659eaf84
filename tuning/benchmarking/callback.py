"""The training-loop side of a benchmark: one transformers callback that measures every optimizer step.

Per step, on global rank 0: the wall time since the previous step ended (data loading, logging, evaluation and
checkpoints in between count), the global batch, the non-padding tokens of all ranks and their throughput, the label
tokens all ranks trained on; trainer
logs as every tracker names them, noted by ``log_recorder``, a callback of its own that goes after every callback
adding numbers to the logs. A step's end only notes its time: points are built and recorded every
``RECORD_INTERVAL_S``, several steps together, off the caches the step just used. Trackers (the ``mirror``) get the
step time and throughput at most every ``MIRROR_INTERVAL_S``, as the mean since their previous point: each tracked
point costs the tracker's library real work beside training, and the dump keeps every step.
"""

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import torch
from transformers import TrainerCallback, TrainerControl

from tuning.benchmarking.anatomy import StepAnatomy
from tuning.benchmarking.dump import (
    DATA_FETCH_SHARE,
    STEP_IMAGE_TOKENS,
    STEP_LABEL_TOKENS,
    STEP_PART_SERIES,
    STEP_SAMPLES,
    STEP_TIME,
    STEP_TOKENS,
    TOKENS_PER_SECOND,
)
from tuning.benchmarking.flops import parameter_counts, peak_tflops_of
from tuning.benchmarking.goodput import CHECKPOINT_SAVE_TIME, EVALUATION_TIME, TRAIN_ENTERED, rank_goodput
from tuning.benchmarking.placement import rank_place
from tuning.benchmarking.ranks import RankFigures, RankTimes, gather_objects
from tuning.benchmarking.record import Points, RunRecord
from tuning.benchmarking.stopping import STOP_REASONS, StopRule
from tuning.benchmarking.system_metrics import SystemMetricsSampler
from tuning.benchmarking.tokens import StepTokenCounter
from tuning.benchmarking.watchdog import StallWatchdog
from tuning.trackers.tracker import log_series
from tuning.utils.graceful_stop import StopAgreement, Vote

logger = logging.getLogger(__name__)

RECORD_INTERVAL_S = 0.1
MIRROR_INTERVAL_S = 1.0
# The dump's data_fetch_unmeasurable, when each rank's own fetch of its batches cannot be measured.
DISPATCHED_BATCHES = (
    "batches are dispatched from rank 0 (accelerate's dispatch_batches, its default for iterable datasets): "
    "per-rank data fetch is not measurable"
)
NO_FETCH_REPORTS = "the trainer reported no batch fetches (tuning.trainer.TuningTrainer does): not measured"


class BenchmarkCallback(TrainerCallback):
    """Measures steps into ``record`` (None on ranks that record nothing), owns the system-metrics sampler and stall
    watchdog, and votes its ``StopRule`` through ``stop_agreement`` (the run's ``GracefulStopCallback``'s).

    ``peak_tflops`` is the device's dense peak for MFU (default: ``flops.PEAK_TFLOPS``'s row for the CUDA device).
    ``mirror(points)`` gets ``(name, value, step, context)`` points of the step time, throughput (per series the mean
    since its previous point, every ``mirror_interval`` seconds and at the end) and system series (step None).
    ``step_anatomy``: rank 0 records each step's parts (``tuning.benchmarking.anatomy``); off only to measure its cost.
    """

    def __init__(
        self,
        record: RunRecord | None,
        stop_rule: StopRule,
        warmup_steps: int = 5,
        warmup_seconds: float = 0.0,
        system_metrics_interval: float | None = None,
        watchdog: StallWatchdog | None = None,
        mirror: Callable[[Points], None] | None = None,
        stop_agreement: StopAgreement | None = None,
        mirror_interval: float = MIRROR_INTERVAL_S,
        peak_tflops: float | None = None,
        process_times: dict[str, float] | None = None,
        step_anatomy: bool = True,
    ):
        self.record = record
        self.stop_rule = stop_rule
        self.warmup_steps = warmup_steps
        self.warmup_seconds = warmup_seconds
        self.watchdog = watchdog
        self._beat: Callable[[], None] = watchdog.beat if watchdog is not None else lambda: None
        self.mirror = mirror
        self.mirror_interval = mirror_interval
        self.peak_tflops = peak_tflops
        # This process's own times for its rank's goodput (BenchmarkJob fills it): "start", "startup_end" and the parts
        # it timed ("trackers_start", "model_load", "data_preparation"); None: no per-rank goodput.
        self.process_times = process_times
        self._spent = {"evaluation": 0.0, "checkpoint_save": 0.0}
        self._between_steps: dict[int, float] = {}  # step: seconds of evaluation and saves after it
        self.stop_agreement = stop_agreement if stop_agreement is not None else StopAgreement()
        self.sampler = (
            SystemMetricsSampler(system_metrics_interval, self._system_point) if system_metrics_interval else None
        )
        self.global_step: int | None = None  # optimizer steps done; None until training begins
        self.stop_reason: str | None = None
        self._first_step = 0
        self._train_entered: float | None = None
        self._train_start = self._last_step_end = self._recorded_at = self._mirrored_at = 0.0  # times, set at begin
        self._tokens: StepTokenCounter | None = None
        self._rank_times: RankTimes | None = None
        self._fetch_unmeasurable: str | None = None  # why each rank's own data fetch cannot be timed, if so
        self.step_anatomy = step_anatomy
        self._anatomy: StepAnatomy | None = None
        self._collective_seconds = 0.0  # the stop agreement's, as of the last step end
        self._distributed = False  # several ranks: their collectives are measured
        # Steps (step, end time, duration) and trainer logs (step, time, logs) not yet recorded, oldest first.
        self._unrecorded: deque[tuple[int, float, float | dict[str, Any]]] = deque()
        # Per mirrored series since its last point: [sum of values, sum of weights, last step]. The step time is the
        # mean duration (weight 1 per step), the throughput tokens over seconds (weight: the step's duration).
        self._unmirrored: dict[str, list] = {}
        self._record_lock = threading.Lock()
        self._last_warmup_step: int | None = None
        self._recent: deque[float] = deque(maxlen=stop_rule.min_steps)  # step times after the warmup
        self._measured_steps = 0
        self._measured_seconds = 0.0
        self._main = False
        self._global_batch = 0  # samples per optimizer step over all ranks
        self.log_recorder = _LogRecorder(self)

    def on_train_begin(self, args, state, control, **kwargs):
        self._main = state.is_world_process_zero
        self._global_batch = args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size
        self._distributed = args.world_size > 1
        self.global_step = self._first_step = state.global_step
        model = kwargs.get("model")
        if model is not None:
            self._tokens = StepTokenCounter(model, args.device, _image_token_id(model))
            self._rank_times = RankTimes(model, args.device)
            if self.step_anatomy and self._main and self.record is not None:
                self._anatomy = StepAnatomy(model, args.device, distributed=self._distributed)
        self._fetch_unmeasurable = _dispatched(kwargs.get("train_dataloader"), args.world_size)
        if self.sampler is not None:
            self.sampler.start()
        rank_nodes = gather_objects(rank_place())  # where every rank runs: a run that fails mid-way says it too
        self._train_start = self._last_step_end = self._recorded_at = self._mirrored_at = time.time()
        if self._anatomy is not None:
            self._anatomy.begin()
        if self._main and self.record is not None:
            self.record.note(
                rank_nodes=rank_nodes,
                **({TRAIN_ENTERED: self._train_entered} if self._train_entered is not None else {}),
                train_start=self._train_start,
                first_step=state.global_step,  # N > 0: resumed from a checkpoint of step N
                flops_counts=_flops_counts(model),
                peak_tflops=self.peak_tflops or _device_peak(args.device),
                energy_mj_at_train_start=self._energy(),
            )
        self._end_warmup_if_over(state.global_step, 0.0)
        if self.stop_rule.active:
            self.stop_agreement.join(Vote.STOP_REASON, self._on_agreed)
        if self.watchdog is not None:
            self.watchdog.arm()

    def on_train_entered(self, at: float) -> None:
        """``TuningTrainer``'s report: ``Trainer.train()`` was called at ``at`` (what follows until train begin, a
        resumed run's checkpoint loading, is goodput's ``checkpoint_restore``)."""
        self._train_entered = at

    def on_time_spent(self, what: str, seconds: float) -> None:
        """``TuningTrainer``'s report: this rank just spent ``seconds`` in an evaluation or a checkpoint save."""
        series = {"evaluation": EVALUATION_TIME, "checkpoint_save": CHECKPOINT_SAVE_TIME}.get(what)
        if series is not None:
            self._spent[what] += seconds
            step = self.global_step or 0
            self._between_steps[step] = self._between_steps.get(step, 0.0) + seconds
        if series is not None and self._main and self.record is not None:
            now = time.time()
            self._record_unrecorded(now)  # the journal stays in time order
            self.record.record_many([(series, seconds, self.global_step, None)], at=now)

    def on_batches_fetched(self, seconds: float) -> None:
        """``TuningTrainer``'s report: this rank fetched the coming optimizer step's batches in ``seconds``."""
        if self._rank_times is not None:
            self._rank_times.batches_fetched(seconds)
        if self._anatomy is not None:
            self._anatomy.batches_fetched(seconds)

    def on_batches_counted(self, seconds: float) -> None:
        """``TuningTrainer``'s report: counting the fetched batches' items (across ranks) took ``seconds``."""
        if self._anatomy is not None:
            self._anatomy.batches_counted(seconds)
        if self._rank_times is not None and self._distributed:
            self._rank_times.collective_waited(seconds)

    def on_micro_batch_end(self) -> None:
        """``TuningTrainer``'s report: a micro-batch's forward and backward are done."""
        if self._anatomy is not None:
            self._anatomy.micro_batch_ends()

    def on_label_tokens(self, count: Any) -> None:
        """``TuningTrainer``'s report: the label tokens of this rank's batches of the coming optimizer step."""
        if self._tokens is not None:
            self._tokens.add_label_tokens(count)

    def on_step_begin(self, args, state, control, **kwargs):
        if self._rank_times is not None:
            self._rank_times.step_begins(state.global_step + 1)

    def on_step_end(self, args, state, control, **kwargs):
        now = time.time()
        waited, self._collective_seconds = (
            self.stop_agreement.collective_seconds - self._collective_seconds,
            self.stop_agreement.collective_seconds,
        )
        if self._anatomy is not None:
            self._anatomy.collective_waited(waited)
            self._anatomy.step_ends(state.global_step)
        step, duration = state.global_step, now - self._last_step_end
        self._last_step_end, self.global_step = now, step
        if self._tokens is not None:
            self._tokens.end_step(step, duration)
        if self._rank_times is not None:
            self._rank_times.collective_waited(waited)
            self._rank_times.step_ends(step)
        if self._main:
            self._unrecorded.append((step, now, duration))
        if now - self._recorded_at >= RECORD_INTERVAL_S:
            self._record_unrecorded(now)
        if self._last_warmup_step is not None:
            self._recent.append(duration)
            self._measured_steps += 1
            self._measured_seconds += duration
        self._end_warmup_if_over(step, now - self._train_start)
        if self.stop_rule.active:
            reason = self.stop_rule.reason(
                now - self._train_start, self._measured_steps, self._measured_seconds, self._recent
            )
            self.stop_agreement.vote(Vote.STOP_REASON, STOP_REASONS.index(reason) + 1 if reason else 0, control)
        self._beat()

    def _on_progress(self, args, state, control, **kwargs):
        """Progress between step ends (gradient accumulation, evaluation, checkpoints): the watchdog's beat."""
        self._beat()

    on_substep_end = on_prediction_step = on_evaluate = on_save = _on_progress

    def on_train_end(self, args, state, control, **kwargs):
        self._record_unrecorded(time.time(), wait=True)
        energy = self._energy()
        figures = self._rank_times.gather(self._last_warmup_step) if self._rank_times else RankFigures(*[[]] * 6)
        fetch = figures.data_fetch
        rank_goodput = gather_objects(self._rank_goodput()) if self.process_times is not None else None
        unmeasurable = self._fetch_unmeasurable
        if unmeasurable is None and fetch and None in fetch:
            unmeasurable = NO_FETCH_REPORTS
        if self._main and self.record is not None:
            self.record.note(
                train_end=time.time(),
                energy_mj_at_train_end=energy,
                rank_forward_time_p50=figures.forward or None,
                rank_data_wait_p50=figures.data_wait or None,
                rank_data_fetch_p50=None if unmeasurable else fetch or None,
                rank_data_fetch_share_p50=None if unmeasurable else figures.data_fetch_share or None,
                rank_collective_wait_p50=(figures.collective_wait or None) if self._distributed else None,
                rank_tokens_per_second=figures.tokens_per_second or None,
                data_fetch_unmeasurable=unmeasurable,
                rank_goodput=rank_goodput,
            )
            if self.mirror is not None:  # before the trackers' own on_train_end closes their runs
                self.mirror(_goodput_points(self.record.goodput(), state.global_step))
        self.close()

    def _rank_goodput(self) -> dict[str, Any]:
        """This rank's goodput from its process's start to now (train end), from its own clocks."""
        times = self.process_times
        resumed = self._first_step > 0 and self._train_entered is not None
        timed = {
            "startup": times["startup_end"] - times["start"] if "startup_end" in times else None,
            **{part: times.get(part) for part in ("trackers_start", "model_load", "data_preparation")},
            "checkpoint_restore": self._train_start - self._train_entered if resumed else 0.0,
            **self._spent,
        }
        steps = self._rank_times.step_seconds if self._rank_times is not None else {}
        return rank_goodput(times["start"], time.time(), timed, steps, self._last_warmup_step, self._between_steps)

    def _energy(self) -> list[float | None] | None:
        """The GPUs' energy counters now, on the rank that samples them (None elsewhere and without NVML)."""
        if self.sampler is None:
            return None
        return self.sampler.energy_millijoules() or None

    def close(self) -> None:
        """Record what is left and stop the helpers; also the way out when training raised or stalled (then without
        waiting for token counts still on a device, which may hang)."""
        self._record_unrecorded(time.time(), final=True)
        if self._tokens is not None:
            self._tokens.detach()
            self._tokens = None
        if self._rank_times is not None:
            self._rank_times.detach()
            self._rank_times = None
        if self._anatomy is not None:
            self._anatomy.detach()
            self._anatomy = None
        if self.watchdog is not None:
            self.watchdog.disarm()
        if self.sampler is not None:
            self.sampler.stop()

    def _system_point(self, name: str, value: float, context: dict[str, Any]) -> None:
        if self.record is not None:
            self.record.record(name, value, step=(self.global_step or 0) + 1, context=context)
        if self.mirror is not None and self._main:
            self.mirror([(name, value, None, context)])

    def _record_unrecorded(self, now: float, wait: bool = False, final: bool = False) -> None:
        """Record the steps and logs noted since the last call and the token totals on the host (``wait``: all);
        mirror when the interval is over (``final``: in any case). Every rank drains its token count; rank 0 records.
        The lock: the stall watchdog may get here (through ``close``) while the training thread is stuck."""
        with self._record_lock:
            self._recorded_at = now
            counted = self._tokens.ready(wait) if self._tokens is not None else []
            if self._rank_times is not None:
                for step, _, _ in counted:
                    self._rank_times.tokens_counted(step, self._tokens.rank_tokens.pop(step))
            batches: list[tuple[float, Points]] = []  # (time, points measured then), journaled with one write
            while self._unrecorded:
                step, at, entry = self._unrecorded.popleft()
                if type(entry) is float:  # a step's duration
                    points: Points = [(STEP_TIME, entry, step, None), (STEP_SAMPLES, self._global_batch, step, None)]
                    fetched = self._rank_times.data_fetch_seconds.get(step) if self._rank_times else None
                    if fetched is not None and entry > 0 and self._fetch_unmeasurable is None:
                        points.append((DATA_FETCH_SHARE, fetched / entry, step, None))
                    self._unmirrored_add(STEP_TIME, entry, 1, step)
                else:  # a trainer log
                    points = [(name, value, step, context) for name, context, value in log_series(entry)]
                batches.append((at, points))
            if self._anatomy is not None and (anatomy := self._anatomy.ready(wait)):
                points = [
                    (STEP_PART_SERIES[part], seconds, step, None)
                    for step, parts in anatomy
                    for part, seconds in parts.items()
                    if seconds is not None
                ]
                batches.append((now, points))
            if counted and self._main:
                points = []
                for step, duration, tokens in counted:
                    throughput = tokens / duration if duration > 0 else math.nan
                    points += [(STEP_TOKENS, tokens, step, None), (TOKENS_PER_SECOND, throughput, step, None)]
                    if (images := self._tokens.image_tokens.pop(step, None)) is not None:
                        points.append((STEP_IMAGE_TOKENS, images, step, None))
                    if (labels := self._tokens.label_tokens.pop(step, None)) is not None:
                        points.append((STEP_LABEL_TOKENS, labels, step, None))
                    self._unmirrored_add(TOKENS_PER_SECOND, tokens, duration, step)
                batches.append((now, points))
            if batches and self.record is not None:
                self.record.record_batches(batches)
            if self._unmirrored and (final or now - self._mirrored_at >= self.mirror_interval):
                self._mirrored_at = now
                series, self._unmirrored = self._unmirrored, {}
                means = [
                    (name, total / weight if weight > 0 else math.nan, step, None)
                    for name, (total, weight, step) in series.items()
                ]
                self.mirror(sorted(means, key=lambda point: point[2]))

    def _unmirrored_add(self, name: str, value: float, weight: float, step: int) -> None:
        if self.mirror is None:
            return
        totals = self._unmirrored.setdefault(name, [0.0, 0.0, step])
        totals[0] += value
        totals[1] += weight
        totals[2] = step

    def _end_warmup_if_over(self, step: int, elapsed: float) -> None:
        """Warmup ends with the first step at which both thresholds are passed; that step is its last."""
        if self._last_warmup_step is not None:
            return
        if step - self._first_step >= self.warmup_steps and elapsed >= self.warmup_seconds:
            self._last_warmup_step = step
            if self._main and self.record is not None:
                self._record_unrecorded(time.time())  # the journal stays in time order
                self.record.note(warmup_steps=step, warmup_seconds=elapsed, energy_mj_at_warmup_end=self._energy())

    def _on_agreed(self, code: int, control: TrainerControl) -> None:
        if code:
            self.stop_reason = STOP_REASONS[code - 1]
            control.should_training_stop = True


def _goodput_points(goodput: dict[str, Any], step: int) -> Points:
    """Goodput as of training's end for Aim and MLflow: ``goodput`` (productive share of the wall time) and each
    measured part as ``goodput_<part>_seconds``, at the last step."""
    points: Points = [
        (f"goodput_{part}_seconds", seconds, step, None)
        for part, seconds in goodput["parts"].items()
        if seconds is not None
    ]
    if goodput["productive_fraction"] is not None:
        points.append(("goodput", goodput["productive_fraction"], step, None))
    return points


def _image_token_id(model: Any) -> int | None:
    """The image token of a vision-language model (its config's ``image_token_id``), None for a text-only one."""
    config = getattr(model, "config", None)
    if getattr(config, "vision_config", None) is None:
        return None
    token = getattr(config, "image_token_id", getattr(config, "image_token_index", None))
    return token if isinstance(token, int) else None


def _flops_counts(model: Any) -> dict[str, int] | None:
    """``flops.parameter_counts`` of the model, or None for a model without a transformers config (logged)."""
    if model is None:
        return None
    try:
        return parameter_counts(model)
    except Exception as exc:  # noqa: BLE001 - a model the formula cannot describe costs its MFU, never the run
        logger.warning("no model FLOPs per token: cannot count the model's parameters: %s", exc)
        return None


def _dispatched(dataloader: Any, world_size: int) -> str | None:
    """Why per-rank fetch times mean nothing for ``dataloader``: one rank of several fetches every batch and sends
    each rank its share (accelerate's ``dispatch_batches``, its default for iterable datasets); None otherwise."""
    from accelerate.data_loader import DataLoaderDispatcher

    return DISPATCHED_BATCHES if world_size > 1 and isinstance(dataloader, DataLoaderDispatcher) else None


def _device_peak(device: Any) -> float | None:
    return peak_tflops_of(torch.cuda.get_device_name(device)) if device.type == "cuda" else None


class _LogRecorder(TrainerCallback):
    """The ``on_log`` of a ``BenchmarkCallback``, as a callback of its own (see the module docstring)."""

    def __init__(self, bench: BenchmarkCallback):
        self.bench = bench

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.bench._beat()
        if self.bench._main and self.bench.record is not None and logs:  # a copy: later callbacks may edit the logs
            self.bench._unrecorded.append((state.global_step, time.time(), dict(logs)))
