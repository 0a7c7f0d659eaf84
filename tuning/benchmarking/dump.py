"""Journal records → the benchmark dump, one code path for the live run and the rebuild command (so a dump rebuilt from
a complete journal equals the run's). Warmup points (step at most the ``warmup_steps`` note; never a point without a
step) are left out of aggregates and summary, unless no step came after the warmup: then the summary covers every step
and ``summary.measured_steps`` is 0.

A run resumed from a checkpoint appends to its journal: each ``start`` record begins a segment (one process's
training), with its own notes, warm-up and ``end``. Series keep one point per step, the segment's that trained it last
(a step a preempted process trained after its last checkpoint is trained again); the time between segments is no step
time, so rates exclude it.
"""

import json
import math
import statistics
from array import array
from datetime import UTC, datetime
from typing import Any, NamedTuple

from tuning.benchmarking.anatomy import PARTS as STEP_PARTS
from tuning.benchmarking.anatomy import bound_by
from tuning.benchmarking.clocks import segment_gap, start_precision
from tuning.benchmarking.flops import flops_per_token, vision_flops_per_image_token
from tuning.benchmarking.goodput import (
    CHECKPOINT_SAVE_TIME,
    DATA_PREPARATION_TIME,
    EVALUATION_TIME,
    MODEL_LOAD_TIME,
    STEPS,
    SegmentTimes,
    goodput,
)
from tuning.benchmarking.journal import Point
from tuning.benchmarking.paths import RunPaths
from tuning.utils.file_utils import write_json_atomic

SCHEMA_VERSION = 1  # the dump's; its models: tuning.benchmarking.schema
ALREADY_COMPLETE = "already_complete"  # the status of a rerun of a finished job: it trained nothing

# Series the summary is computed from; every writer uses these names.
# Notes of the memory estimate (tuning.benchmarking.memory): the dump's ``estimate`` and summary.peak_tensor_bytes.
MEMORY_ESTIMATE = "memory_estimate"
PEAK_TENSOR_BYTES = "peak_tensor_bytes"
STEP_TIME = "step_time_seconds"  # wall time of one optimizer step, from the end of the previous one
STEP_TOKENS = "step_tokens"  # non-padding tokens of one optimizer step, summed over all ranks
STEP_SAMPLES = "step_samples"  # samples of one optimizer step, all ranks (the global batch size)
TOKENS_PER_SECOND = "tokens_per_second"  # STEP_TOKENS / STEP_TIME, per step
STEP_IMAGE_TOKENS = "step_image_tokens"  # the image tokens among STEP_TOKENS (vision-language models only)
STEP_LABEL_TOKENS = "step_label_tokens"  # the label tokens one optimizer step's loss trained on, all ranks
PROCESS_RSS = "process_rss_bytes"
GPU_POWER = "gpu_power_watts"  # context {"gpu": CUDA index}
GPU_UTILIZATION = "gpu_utilization_percent"  # context {"gpu": CUDA index}
# Resident anonymous memory (heap, stacks, CPU tensors): RSS without file-backed pages such as memory-mapped data.
PROCESS_ANON_RSS = "process_anon_rss_bytes"
# Each step's parts (tuning.benchmarking.anatomy): step_data_seconds, step_forward_seconds... (rank 0's).
STEP_PART_SERIES = {part: f"step_{part}_seconds" for part in STEP_PARTS}
DATA_FETCH_SHARE = "data_fetch_share"  # rank 0's own data-loader fetch time of a step over the step's time
DATA_CACHE = "data_cache"  # train()'s params: how its rows were prepared (tuning.data.prepared_cache.Preparation)
LOADED_MODEL = "loaded_model"  # train()'s params: what the loaded model runs (experts_implementation)
# How much longer than the other ranks' median a rank's own time per step (forward + data fetch) must be for the dump
# to name it the straggler.
STRAGGLER_MIN_EXCESS = 0.10

INCOMPLETE_RUN_MESSAGE = (
    "the run ended without finishing its journal (killed by a signal, the OOM killer or a node failure); "
    "this dump was rebuilt from the points it had logged"
)


def rank_report_path(metrics_path: str, rank: int) -> str:
    """``RunPaths(metrics_path).rank_report(rank)`` (kept for older copies of bench_train)."""
    return RunPaths(metrics_path).rank_report(rank)


def utc_iso(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class _Series(NamedTuple):
    """One series' values (NaN for null) and, per point, the index of its moment in ``RunData``."""

    name: str
    context: dict[str, Any]
    values: array
    moments: array


class Segment:
    """One process's part of a run: its ``start`` record, its notes and its ``end`` (None while running or when the
    process died without one)."""

    def __init__(self, header: dict[str, Any]):
        self.header = header
        self.notes: dict[str, Any] = {}
        self.end: dict[str, Any] | None = None
        self.latest = header.get("time", 0.0)  # its latest record's time

    @property
    def first_step(self) -> int | None:
        """The global step its training began at (0 fresh, N resumed); None before train begin (or in a journal
        written before segments, then read as 0 for the first segment)."""
        return self.notes.get("first_step")


class RunData:
    """What a run's journal records say, kept compact however long the run: each series as arrays of 8-byte values
    and 4-byte indices into one table of moments (time, step and segment), which the points measured together share."""

    def __init__(self, header: dict[str, Any]):
        self.header = header
        self.segments = [Segment(header)]
        self.notes: dict[str, Any] = {}  # every segment's notes, later ones overriding
        self._series: dict[tuple[str, str], _Series] = {}  # by name and context (as JSON: contexts may nest)
        self._times, self._steps = array("d"), array("q")  # the moments; step -1 for none
        self._segment_of = array("I")  # per moment, its segment's index

    def add(self, record: dict[str, Any] | Point) -> None:
        """A journal record as read from a journal, or a ``Point`` as a live run records it."""
        if type(record) is tuple:
            self.add_point(*record)
            return
        kind = record["type"]
        if kind == "point":
            self.add_point(record["name"], record["context"], record["step"], record["value"], record["time"])
            return
        if kind == "start":  # a resumed run's next process: its time (the process's start) is no record of the last
            self.segments.append(Segment(record))
            return
        segment = self.segments[-1]
        segment.latest = max(segment.latest, record.get("time", 0.0))
        if kind == "note":
            facts = {key: value for key, value in record.items() if key != "type"}
            self.notes.update(facts)
            segment.notes.update(facts)
        elif kind == "end":
            segment.end = record

    def add_point(self, name: str, context: dict[str, Any], step: int | None, value: float | None, at: float) -> None:
        key = (name, json.dumps(context, sort_keys=True, default=str) if context else "")
        series = self._series.get(key)
        if series is None:
            # The context copied: recorders share context dicts.
            series = self._series[key] = _Series(name, dict(context), array("d"), array("I"))
        step_code = -1 if step is None else step
        segment = len(self.segments) - 1
        if not self._times or self._times[-1] != at or self._steps[-1] != step_code or self._segment_of[-1] != segment:
            self._times.append(at)
            self._steps.append(step_code)
            self._segment_of.append(segment)
        self.segments[-1].latest = max(self.segments[-1].latest, at)
        series.values.append(math.nan if value is None else value)
        series.moments.append(len(self._times) - 1)

    def segment_points(self, names: dict[str, str]) -> list[dict[str, list[tuple[int | None, float | None, float]]]]:
        """Per segment, for each ``key: series name`` of ``names``, the ``(step, value, time)`` points it recorded in
        that series (any context), steps trained again later included."""
        result: list[dict[str, list]] = [{key: [] for key in names} for _ in self.segments]
        for series in self._series.values():
            keys = [key for key, name in names.items() if name == series.name]
            for index, value in zip(series.moments, series.values, strict=True):
                step = self._steps[index]
                point = (None if step < 0 else step, None if value != value else value, self._times[index])
                for key in keys:
                    result[self._segment_of[index]][key].append(point)
        return result

    def last_steps(self) -> list[float]:
        """Per segment, the last step whose points survive: the step the next segment that trained began at (its
        later steps were trained again), infinity for the last one."""
        last, later = [], math.inf
        for segment in reversed(self.segments):
            last.append(later)
            if segment.first_step is not None:
                later = min(later, segment.first_step)
        return last[::-1]

    def metrics(self) -> list[dict[str, Any]]:
        """The dump's ``metrics``, in order of first appearance: per step, the points of the segment that trained it
        last."""
        times, steps, segment_of = self._times, self._steps, self._segment_of
        last_steps = self.last_steps()
        result = []
        for series in self._series.values():
            kept = [
                (index, value)
                for index, value in zip(series.moments, series.values, strict=True)
                if steps[index] <= last_steps[segment_of[index]]
            ]
            result.append(
                {
                    "name": series.name,
                    "context": series.context,
                    "steps": [None if steps[index] < 0 else steps[index] for index, _ in kept],
                    "values": [None if value != value else value for _, value in kept],  # NaN → null
                    "timestamps": [times[index] for index, _ in kept],
                }
            )
        return result


def _per_step(series: list[dict[str, Any]], name: str) -> dict[int, float]:
    """``{step: value}`` of the series ``name`` without a context, nulls left out."""
    found = next((one for one in series if one["name"] == name and not one["context"]), {"steps": [], "values": []})
    pairs = zip(found["steps"], found["values"], strict=True)
    return {step: value for step, value in pairs if step is not None and value is not None}


def _values(series: list[dict[str, Any]], name: str) -> list[float]:
    """The non-null values of every series called ``name``, whatever its context."""
    return [value for one in series if one["name"] == name for value in one["values"] if value is not None]


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    return numerator / denominator if numerator is not None and denominator else None


def _integrated_power(series: list[dict[str, Any]], gpu: int, start: float, end: float) -> float | None:
    """Joules of one GPU from ``start`` to ``end``: its sampled power, linear between samples and held at the first
    and last sample before and after them; None without a sample in the window."""
    found = next((one for one in series if one["name"] == GPU_POWER and one["context"] == {"gpu": gpu}), None)
    samples = [
        (at, watts)
        for at, watts in zip(found["timestamps"], found["values"], strict=True)
        if watts is not None and start <= at <= end
    ]
    if not samples:
        return None
    joules = samples[0][1] * (samples[0][0] - start) + samples[-1][1] * (end - samples[-1][0])
    for (before, first), (after, second) in zip(samples, samples[1:], strict=False):
        joules += (first + second) / 2 * (after - before)
    return joules


def _energy(
    series: list[dict[str, Any]], notes: dict[str, Any], measured: bool, start: float | None, end: float
) -> tuple[list[float | None] | None, str | None]:
    """(joules per GPU from ``start`` to ``end``, how they were measured): the difference of NVML's energy counters
    read at the warmup's end (train begin when nothing was measured after it) and at train end, else the sampled power
    integrated over that time; (None, None) without NVML."""
    first = notes.get("energy_mj_at_warmup_end" if measured else "energy_mj_at_train_start")
    last = notes.get("energy_mj_at_train_end")
    if first and last and len(first) == len(last) and None not in first + last:
        return [(after - before) / 1000.0 for before, after in zip(first, last, strict=True)], "nvml_energy_counter"
    gpus = sorted({one["context"]["gpu"] for one in series if one["name"] == GPU_POWER})
    if not gpus or start is None:
        return None, None
    return [_integrated_power(series, gpu, start, end) for gpu in gpus], "integrated_power"


class _Measured(NamedTuple):
    """What the summary's efficiency keys start from: the steps it covers and their throughput."""

    steps: list[int]
    after_warmup: bool  # the steps are those after the warmup (else every step)
    tokens_per_second: float | None
    segments: list[tuple[dict[str, Any], float]]  # per segment that trained: its notes and its train end
    world_size: int


def _efficiency(series: list[dict[str, Any]], notes: dict[str, Any], measured: _Measured) -> dict[str, Any]:
    """MFU, energy and rank skew: the summary keys from notes the callback made (docs/benchmarking.md has the
    formulas)."""
    tokens, samples = _per_step(series, STEP_TOKENS), _per_step(series, STEP_SAMPLES)
    token_count = sum(tokens.get(step, 0.0) for step in measured.steps) if tokens else None
    sequence_length = _ratio(token_count, sum(samples.get(step, 0.0) for step in measured.steps))
    counts = notes.get("flops_counts")
    language_flops = flops_per_token(counts, sequence_length) if counts and sequence_length else None
    model_flops, vision_flops, vision_fraction = language_flops, None, None
    if language_flops is not None and (vision_flops := vision_flops_per_image_token(counts)) is not None:
        images = _per_step(series, STEP_IMAGE_TOKENS)
        image_share = sum(images.get(step, 0.0) for step in measured.steps) / token_count  # image tokens per token
        model_flops = language_flops + vision_flops * image_share
        vision_fraction = vision_flops * image_share / model_flops
    achieved = None
    if model_flops is not None and measured.tokens_per_second is not None:
        achieved = measured.tokens_per_second * model_flops / measured.world_size / 1e12
    per_gpu, source = None, None
    for segment_notes, train_end in measured.segments:  # a resumed run's energy: its segments', gaps excluded
        start = segment_notes.get("train_start")
        if start is not None and measured.after_warmup:
            start += segment_notes.get("warmup_seconds", 0.0)
        joules, source = _energy(series, segment_notes, measured.after_warmup, start, train_end)
        if joules is None or (per_gpu is not None and len(per_gpu) != len(joules)):
            per_gpu, source = None, None
            break
        per_gpu = joules if per_gpu is None else [_sum(a, b) for a, b in zip(per_gpu, joules, strict=True)]
    total = sum(per_gpu) if per_gpu and None not in per_gpu else None
    return {
        "model_flops_per_token": model_flops,
        "language_flops_per_token": language_flops if vision_flops is not None else None,
        "vision_flops_per_image_token": vision_flops,
        "vision_flops_fraction": vision_fraction,
        "achieved_tflops_per_device": achieved,
        "peak_tflops_per_device": notes.get("peak_tflops"),
        "mfu": _ratio(achieved, notes.get("peak_tflops")),
        "energy_joules": total,
        "energy_joules_per_gpu": per_gpu,
        "joules_per_token": _ratio(total, token_count),
        "energy_source": source,
        **_rank_figures(notes),
    }


def _sum(first: float | None, second: float | None) -> float | None:
    return None if first is None or second is None else first + second


def _rank_figures(notes: dict[str, Any]) -> dict[str, Any]:
    """The per-rank keys of the summary: the medians the callback gathered, the forward-time skew, the straggler and,
    across nodes, each node's figures and the slowest node."""
    forward, fetch = notes.get("rank_forward_time_p50"), notes.get("rank_data_fetch_p50")
    nodes = node_figures(notes.get("rank_nodes"), notes)
    known = [seconds for seconds in forward or [] if seconds is not None]
    rank, cause = straggler(forward, fetch)
    return {
        "rank_forward_time_p50": forward,
        "rank_data_wait_p50": notes.get("rank_data_wait_p50"),
        "rank_data_fetch_p50": fetch,
        "rank_data_fetch_share_p50": notes.get("rank_data_fetch_share_p50"),
        "rank_goodput": notes.get("rank_goodput"),
        "data_fetch_unmeasurable": notes.get("data_fetch_unmeasurable"),
        "rank_skew": max(known) / min(known) if known and len(known) == len(forward) and min(known) > 0 else None,
        "straggler_rank": rank,
        "straggler_cause": cause,
        "straggler_node": straggler_node(rank, notes.get("rank_nodes")),
        "rank_nodes": notes.get("rank_nodes"),
        "rank_collective_wait_p50": notes.get("rank_collective_wait_p50"),
        "rank_tokens_per_second": notes.get("rank_tokens_per_second"),
        "nodes": nodes,
        "slowest_node": slowest_node(nodes),
    }


def _per_rank(notes: dict[str, Any], key: str, size: int) -> list[float | None]:
    """The note ``key``: one value per rank; a None per rank where the run noted no such list of ``size``."""
    values = notes.get(key)
    return values if isinstance(values, list) and len(values) == size else [None] * size


def _known_sum(values: list[float | None]) -> float | None:
    return sum(values) if values and None not in values else None


def node_figures(rank_nodes: list[dict[str, Any]] | None, notes: dict[str, Any]) -> list[dict[str, Any]] | None:
    """Per node of a run across nodes (by ``node_rank``, in order): where it ran, its ranks, its throughput (the sum
    of its ranks' ``rank_tokens_per_second``), its own time per step (its slowest rank's forward + data fetch, as
    ``straggler`` counts it) and its collective wait per step (the median of its ranks'); a figure is None unless
    every rank of the node has it. None on one node or without the ranks' places."""
    if not rank_nodes or len({place["node_rank"] for place in rank_nodes}) < 2:
        return None
    size = len(rank_nodes)
    forward, fetch = _per_rank(notes, "rank_forward_time_p50", size), _per_rank(notes, "rank_data_fetch_p50", size)
    if None not in forward and None in fetch:  # fetch not measurable: the forward time alone, as straggler does
        fetch = [0.0] * size
    own = [_known_sum([compute, data]) for compute, data in zip(forward, fetch, strict=True)]
    tokens = _per_rank(notes, "rank_tokens_per_second", size)
    waits = _per_rank(notes, "rank_collective_wait_p50", size)
    nodes = []
    for node_rank in sorted({place["node_rank"] for place in rank_nodes}):
        ranks = [rank for rank, place in enumerate(rank_nodes) if place["node_rank"] == node_rank]
        own_times, node_waits = [own[rank] for rank in ranks], [waits[rank] for rank in ranks]
        nodes.append(
            {
                "node_rank": node_rank,
                "host": rank_nodes[ranks[0]]["host"],
                "ray_node_id": rank_nodes[ranks[0]].get("ray_node_id"),
                "ranks": ranks,
                "tokens_per_second": _known_sum([tokens[rank] for rank in ranks]),
                "own_time_p50": max(own_times) if None not in own_times else None,
                "collective_wait_p50": statistics.median(node_waits) if None not in node_waits else None,
            }
        )
    return nodes


def slowest_node(nodes: list[dict[str, Any]] | None) -> int | None:
    """The ``node_rank`` of the node with the longest own time per step (the one the others wait for); None on one
    node or unless every node's own time is known."""
    if not nodes or any(node["own_time_p50"] is None for node in nodes):
        return None
    return max(nodes, key=lambda node: node["own_time_p50"])["node_rank"]


def straggler_node(rank: int | None, rank_nodes: list[dict[str, Any]] | None) -> int | None:
    """The node (its rank in the job) of the straggler, in a run across nodes: the slowest node; None on one node,
    without a straggler, or without the ranks' places."""
    if rank is None or not rank_nodes or rank >= len(rank_nodes):
        return None
    if len({place["node_rank"] for place in rank_nodes}) < 2:
        return None
    return rank_nodes[rank]["node_rank"]


def straggler(forward: list[float | None] | None, fetch: list[float | None] | None) -> tuple[int | None, str | None]:
    """(the rank that holds the others back, "data" or "compute"), or (None, None). Each rank's own time per step is
    its median forward time plus its median data fetch (0 where fetch is not measured); the straggler is the rank
    whose own time exceeds the median of the other ranks' by more than ``STRAGGLER_MIN_EXCESS`` of it, and its cause
    is whichever of its fetch and its forward time exceeds the other ranks' median by more. None on one process or
    without every rank's forward time."""
    if not forward or len(forward) < 2 or None in forward:
        return None, None
    data = fetch if fetch and len(fetch) == len(forward) and None not in fetch else [0.0] * len(forward)
    own = [compute + wait for compute, wait in zip(forward, data, strict=True)]
    rank = max(range(len(own)), key=own.__getitem__)
    others = [other for other in range(len(own)) if other != rank]
    if own[rank] <= (1 + STRAGGLER_MIN_EXCESS) * statistics.median(own[other] for other in others):
        return None, None
    data_excess = data[rank] - statistics.median(data[other] for other in others)
    compute_excess = forward[rank] - statistics.median(forward[other] for other in others)
    return rank, "data" if data_excess > compute_excess else "compute"


class _Span(NamedTuple):
    """The steps one segment contributes: after ``first`` up to ``last``, warm-up up to ``warmup_end``."""

    first: float  # -inf for the first segment: every step up to its last is its own
    last: float
    warmup_end: float

    def covers(self, step: int) -> bool:
        return self.first < step <= self.last

    def in_warmup(self, step: int) -> bool:
        return self.first < step <= min(self.warmup_end, self.last)


def _spans(run: RunData, training_steps: list[int]) -> list[_Span | None]:
    """Per segment, its span (None for a segment that never began training); ``training_steps``: each one's last."""
    spans: list[_Span | None] = []
    for index, (segment, last, steps) in enumerate(zip(run.segments, run.last_steps(), training_steps, strict=True)):
        first = segment.first_step
        if first is None and index > 0:
            spans.append(None)
            continue
        first = -math.inf if index == 0 else first
        warmup_end = segment.notes.get("warmup_steps", steps)
        spans.append(_Span(first, last, min(warmup_end, steps)))
    return spans


def _is_warmup(spans: list[_Span | None], step: int | None) -> bool:
    return step is not None and any(span is not None and span.in_warmup(step) for span in spans)


def aggregate(series: list[dict[str, Any]], spans: list[_Span | None]) -> list[dict[str, Any]]:
    """min/avg/max/count of every series, each segment's warmup excluded (all null with count 0 when nothing is
    left)."""
    result = []
    for one in series:
        pairs = zip(one["steps"], one["values"], strict=True)
        values = [value for step, value in pairs if value is not None and not _is_warmup(spans, step)]
        result.append(
            {
                "name": one["name"],
                "context": one["context"],
                "min": min(values) if values else None,
                "avg": sum(values) / len(values) if values else None,
                "max": max(values) if values else None,
                "count": len(values),
            }
        )
    return result


def _rate(counts: dict[int, float], step_times: dict[int, float], steps: list[int]) -> float | None:
    """Sum of ``counts`` over sum of step times of ``steps``: per second of training, gaps between segments out."""
    busy = sum(step_times[step] for step in steps)
    if busy <= 0 or not counts:
        return None
    return sum(counts.get(step, 0.0) for step in steps) / busy


def _shares(series: list[dict[str, Any]], steps: list[int]) -> list[float]:
    """Rank 0's data-fetch share of each of ``steps`` that has one."""
    per_step = _per_step(series, DATA_FETCH_SHARE)
    return [per_step[step] for step in steps if step in per_step]


def _step_anatomy(series: list[dict[str, Any]], step_times: dict[int, float], steps: list[int]) -> dict[str, Any]:
    """``step_parts`` (each part's median share of the step time over ``steps``), ``bound_by`` and
    ``bound_by_shares`` (tuning.benchmarking.anatomy); null without the parts' series."""
    shares = {}
    for part, name in STEP_PART_SERIES.items():
        seconds = _per_step(series, name)
        values = [seconds[step] / step_times[step] for step in steps if step in seconds and step_times[step] > 0]
        if values:
            shares[part] = statistics.median(values)
    measured = set(steps)
    utilization = [
        value
        for one in series
        if one["name"] == GPU_UTILIZATION
        for step, value in zip(one["steps"], one["values"], strict=True)
        if value is not None and step in measured
    ]
    bound, figures = bound_by(shares, statistics.median(utilization) if utilization else None)
    return {"step_parts": shares or None, "bound_by": bound, "bound_by_shares": figures or None}


def _difference(total: float | None, part: float | None) -> float | None:
    """``total`` less ``part``; None unless both are known."""
    return None if total is None or part is None else total - part


def _summary(
    series: list[dict[str, Any]],
    notes: dict[str, Any],
    end: dict[str, Any],
    spans: list[_Span | None],
    segments: list[tuple[dict[str, Any], float]],
    world_size: int,
    resumed_from_step: int | None,
) -> dict:
    step_times = _per_step(series, STEP_TIME)
    measured = [step for step in step_times if not _is_warmup(spans, step)]
    steps = measured or list(step_times)
    tokens_per_second = _rate(_per_step(series, STEP_TOKENS), step_times, steps)
    image_tokens_per_second = _rate(_per_step(series, STEP_IMAGE_TOKENS), step_times, steps)
    spans_run = [
        segment_end - segment_notes["train_start"]
        for segment_notes, segment_end in segments
        if segment_notes.get("train_start") is not None
    ]
    load_times, rss = _values(series, MODEL_LOAD_TIME), _values(series, PROCESS_RSS)
    anon_rss = _values(series, PROCESS_ANON_RSS)
    durations = [step_times[step] for step in steps]
    # Deciles interpolated between closest ranks, as numpy's default.
    step_deciles = statistics.quantiles(durations, n=10, method="inclusive") if len(durations) > 1 else durations * 9
    measured_by = _Measured(steps, bool(measured), tokens_per_second, segments, world_size)
    return {
        "train_runtime": sum(spans_run) if spans_run else None,
        "model_load_time": load_times[-1] if load_times else None,
        "data_preparation_time": _last(_values(series, DATA_PREPARATION_TIME)),
        "tokens_per_second": tokens_per_second,
        "text_tokens_per_second": _difference(tokens_per_second, image_tokens_per_second),
        "image_tokens_per_second": image_tokens_per_second,
        "samples_per_second": _rate(_per_step(series, STEP_SAMPLES), step_times, steps),
        "step_time_p50": step_deciles[4] if step_deciles else None,
        "step_time_p90": step_deciles[8] if step_deciles else None,
        "measured_steps": len(measured),
        "label_tokens": int(sum(labels.values())) if (labels := _per_step(series, STEP_LABEL_TOKENS)) else None,
        "peak_rss_bytes": end.get("peak_rss_bytes") or (int(max(rss)) if rss else None),
        "peak_anon_rss_bytes": int(max(anon_rss)) if anon_rss else None,
        "cuda": end.get("cuda"),
        "peak_tensor_bytes": notes.get(PEAK_TENSOR_BYTES),
        "memory_estimate_ratio": memory_ratio(notes.get(MEMORY_ESTIMATE), notes.get(PEAK_TENSOR_BYTES)),
        "resumed_from_step": resumed_from_step,
        "data_fetch_share": statistics.median(shares) if (shares := _shares(series, steps)) else None,
        **_step_anatomy(series, step_times, steps),
        **_efficiency(series, notes, measured_by),
    }


# Notes of a time-to-train run (tuning.benchmarking.mlperf writes them; this module stays torch-free).
TARGET_NOTE, RUN_START_NOTE, EVALUATIONS_NOTE = "target_eval_loss", "run_start", "evaluations"
TIME_TO_TRAIN_KEYS = (
    "target_eval_loss",
    "converged",
    "time_to_train",
    "time_to_train_note",
    "evaluations",
    "init_seconds",
)
RESUMED_NOT_ONE_RUN = "resumed from a checkpoint: its segments are not one MLPerf run (its clock was paused)"


def _time_to_train(notes: dict[str, Any], process_start: float, resumed: bool) -> dict[str, Any]:
    """``summary``'s time-to-train keys (docs/benchmarking.md, "Time to train"): the target, whether an evaluation
    reached it, seconds from ``run_start`` to that evaluation's end (null when not reached, or for a resumed run), the
    evaluations and the seconds from the process's start to ``run_start``; all null without --target_eval_loss."""
    target = notes.get(TARGET_NOTE)
    if target is None:
        return dict.fromkeys(TIME_TO_TRAIN_KEYS)
    evaluations = notes.get(EVALUATIONS_NOTE, [])
    reached = next((one for one in evaluations if one["eval_loss"] is not None and one["eval_loss"] <= target), None)
    run_start = notes.get(RUN_START_NOTE)
    return {
        "target_eval_loss": target,
        "converged": reached is not None,
        "time_to_train": reached["seconds"] if reached is not None and not resumed else None,
        "time_to_train_note": RESUMED_NOT_ONE_RUN if resumed else None,
        "evaluations": evaluations,
        "init_seconds": run_start - process_start if run_start is not None else None,
    }


def memory_ratio(estimate: dict[str, Any] | None, measured: int | None) -> float | None:
    """The estimate's peak over the measured one; None when either is missing."""
    predicted = (estimate or {}).get("peak_bytes_per_device")
    return predicted / measured if predicted and measured else None


def build_dump(records: list[dict[str, Any]], rebuilt_from_journal: bool = False) -> dict[str, Any]:
    """The dump a run's journal records describe."""
    run = RunData(records[0])
    for record in records[1:]:
        run.add(record)
    return dump_of(run, rebuilt_from_journal)


def _ending(segment: Segment, steps: dict[int, float], last: float) -> dict[str, Any]:
    """The segment's ``end`` record, or for a process that died without one what its points say."""
    if segment.end is not None:
        return segment.end
    trained = max((step for step in steps if step <= last), default=segment.first_step or 0)
    error = {"category": None, "message": INCOMPLETE_RUN_MESSAGE, "global_step": trained}
    return {"time": segment.latest, "status": "error", "training_steps": trained, "error": error}


def _segment_entry(
    segment: Segment,
    ending: dict[str, Any],
    span: _Span | None,
    step_times: dict,
    tokens: dict,
    previous_stop: float | None,
) -> dict[str, Any]:
    """The dump's ``segments`` item of one process's part of the run."""
    own = [step for step in step_times if span is not None and span.covers(step)]
    measured = [step for step in own if not span.in_warmup(step)]
    train_start, train_end = segment.notes.get("train_start"), segment.notes.get("train_end", ending["time"])
    first = segment.first_step
    start = segment.header["time"]
    gap = None if previous_stop is None else segment_gap(previous_stop, start, start_precision(segment.header))
    return {
        "start_time": utc_iso(start),
        "start_clock": segment.header.get("start_clock"),
        "stop_time": utc_iso(ending["time"] or start),
        "gap_seconds": gap.seconds if gap is not None else None,
        "gap_note": gap.note if gap is not None else None,
        "train_runtime": train_end - train_start if train_start is not None else None,
        "resumed_from_step": first or None,
        "training_steps": ending["training_steps"],
        "steps": len(own),
        "warmup_steps": int(span.warmup_end) if span is not None else None,
        "measured_steps": len(measured),
        "tokens_per_second": _rate(tokens, step_times, measured or own),
        "status": ending["status"],
        "stop_reason": ending.get("stop_reason"),
        "error": ending.get("error"),
    }


def _last(values: list[float]) -> float | None:
    return values[-1] if values else None


def _data(notes: dict[str, Any]) -> dict[str, Any] | None:
    """The ``data`` description, with ``cache``: how the last segment's rows were prepared."""
    data = notes.get("data")
    if data is None or DATA_CACHE not in notes:
        return data
    return {**data, "cache": notes[DATA_CACHE]}


def _config(config: dict[str, Any] | None, notes: dict[str, Any]) -> dict[str, Any] | None:
    """The run's ``config``, its ``experts_implementation`` the loaded model's once it loaded (the flags' before)."""
    if not isinstance(config, dict) or LOADED_MODEL not in notes:
        return config
    return {**config, "experts_implementation": notes[LOADED_MODEL]["experts_implementation"]}


def dump_of(run: RunData, rebuilt_from_journal: bool = False) -> dict[str, Any]:
    header, notes, series = run.header, run.notes, run.metrics()
    step_times, tokens = _per_step(series, STEP_TIME), _per_step(series, STEP_TOKENS)
    endings = [_ending(segment, step_times, last) for segment, last in zip(run.segments, run.last_steps(), strict=True)]
    end = endings[-1]
    spans = _spans(run, [ending["training_steps"] for ending in endings])
    segments, previous_stop = [], None
    for segment, ending, span in zip(run.segments, endings, spans, strict=True):
        segments.append(_segment_entry(segment, ending, span, step_times, tokens, previous_stop))
        previous_stop = ending["time"] or segment.header["time"]
    trained = [
        (segment.notes, segment.notes.get("train_end", ending["time"]))
        for segment, ending in zip(run.segments, endings, strict=True)
        if segment.notes.get("train_start") is not None
    ]
    resumed = [segment.first_step for segment in run.segments if segment.first_step]
    first_warmup = spans[0].warmup_end if spans[0] is not None else end["training_steps"]
    summary = _summary(series, notes, end, spans, trained, header["world_size"], resumed[-1] if resumed else None)
    summary["goodput"] = _goodput(run, endings, spans)
    summary.update(_time_to_train(notes, run.segments[-1].header["time"], bool(resumed)))
    return {
        "schema_version": SCHEMA_VERSION,
        "status": end["status"],
        "stop_reason": end.get("stop_reason"),
        "run_hash": notes.get("run_hash"),
        "experiment": header.get("experiment"),
        "metadata": notes.get("metadata", {}),
        "config": _config(header.get("config"), notes),
        "seed": header.get("seed"),
        "data": _data(notes),
        "host": header["host"],
        "rank": header["rank"],
        "world_size": header["world_size"],
        "start_time": utc_iso(header["time"]),
        "start_clock": header.get("start_clock"),
        "stop_time": utc_iso(end["time"] or header["time"]),
        "training_steps": end["training_steps"],
        "warmup_steps": int(min(first_warmup, end["training_steps"])),
        "summary": summary,
        "metrics": series,
        "aggregates": aggregate(series, spans),
        "environment": header["environment"],
        "error": end.get("error"),
        "aim_degraded_reason": notes.get("aim_degraded_reason"),
        "mlflow_run_id": notes.get("mlflow_run_id"),
        "mlflow_degraded_reason": notes.get("mlflow_degraded_reason"),
        "rebuilt_from_journal": rebuilt_from_journal,
        "segments": segments,
        "estimate": notes.get(MEMORY_ESTIMATE),
        "profile": notes.get("profile"),
        "oom_snapshot": notes.get("oom_snapshot"),
    }


def _goodput(run: RunData, endings: list[dict[str, Any]], spans: list[_Span | None]) -> dict[str, Any]:
    """``summary.goodput`` of the run's segments (``tuning.benchmarking.goodput``)."""
    names = {STEPS: STEP_TIME, **{name: name for name in (MODEL_LOAD_TIME, DATA_PREPARATION_TIME)}}
    names.update({name: name for name in (EVALUATION_TIME, CHECKPOINT_SAVE_TIME)})
    segments = []
    for segment, ending, points in zip(run.segments, endings, run.segment_points(names), strict=True):
        first = segment.first_step
        if first is None and "train_start" in segment.notes:  # a journal from before segments noted first steps
            first = 0
        start = segment.header["time"]
        end = ending["time"] or start
        segments.append(
            SegmentTimes(start, end, segment.notes, first, points, ending["status"], start_precision(segment.header))
        )
    in_warmup = [lambda step, span=span: span is not None and span.in_warmup(step) for span in spans]
    return goodput(segments, run.last_steps(), in_warmup)


def measured_step(dump: dict[str, Any], step: int | None) -> bool:
    """Whether a dump's point at ``step`` is measured (after its segment's warm-up): by ``segments`` where the dump
    has them, else (a dump written before them) after its ``warmup_steps``."""
    if step is None:
        return False
    segments = dump.get("segments") or [{"warmup_steps": dump["warmup_steps"]}]
    trained = [segment for segment in segments if segment.get("steps", 1)] or segments
    own = trained[0]
    for segment in trained:  # the last segment that began before the step trained it
        if (segment.get("resumed_from_step") or 0) < step:
            own = segment
    return own.get("warmup_steps") is not None and step > own["warmup_steps"]


write_dump = write_json_atomic  # atomically: a reader sees the previous file or the complete new one, never half of it
