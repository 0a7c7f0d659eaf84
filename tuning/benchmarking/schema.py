"""The benchmark dump's schema as typed models, for ``validate_dump``, readers and docs/dump-schema.md's JSON Schema.
Every object allows more keys than it declares (keys may be added); renaming or dropping one bumps
``SCHEMA_VERSION``. The training process never imports it: the series names and ``SCHEMA_VERSION`` live in
``dump``, which writes them.

    python -m tuning.benchmarking.schema                    # print the JSON Schema
    python -m tuning.benchmarking.schema --markdown docs/dump-schema.md  # rewrite the page's schema block
"""

import argparse
import json
import pathlib
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator
from pydantic.json_schema import GenerateJsonSchema
from pydantic_core import PydanticCustomError

from tuning.benchmarking.clocks import PROC_STAT_STARTTIME, PSUTIL_CREATE_TIME, RECORD_OPENED
from tuning.benchmarking.dump import SCHEMA_VERSION
from tuning.benchmarking.stopping import STOP_REASONS

Status = Literal["ok", "error", "stopped", "interrupted", "already_complete", "converged", "not_converged"]
# interrupted: ended by SIGTERM/SIGINT, with its report; already_complete: a rerun of a job that had trained to its
# end, which trained nothing (its earlier segments, when its journal holds them, are the measurement); converged /
# not_converged: a --target_eval_loss run that reached its target at an evaluation / ended without reaching it
StopReason = Literal[STOP_REASONS]

Number = float | None  # null stands for a value that was NaN or infinite


class _Model(BaseModel):
    # strict: no coercion ("6" is not an integer, true is not a number); extra keys are allowed (added later).
    model_config = ConfigDict(strict=True, extra="allow", use_attribute_docstrings=True)


class Metric(_Model):
    """One series: its points in order, NaN/inf values as null."""

    name: str
    context: dict[str, Any]
    steps: list[int | None]
    values: list[Number]
    timestamps: list[float]

    @model_validator(mode="after")
    def _same_lengths(self) -> "Metric":
        if not len(self.steps) == len(self.values) == len(self.timestamps):
            raise PydanticCustomError("lengths", "steps, values and timestamps differ in length")
        return self


class Aggregate(_Model):
    """A series' minimum, mean, maximum and count, warmup excluded (null, null, null, 0 when nothing is left)."""

    name: str
    context: dict[str, Any]
    min: Number
    avg: Number
    max: Number
    count: int


class CudaDevice(_Model):
    device: int
    max_memory_allocated_bytes: int
    max_memory_reserved_bytes: int


class GoodputParts(_Model):
    """Seconds of the wall time in each part (docs/benchmarking.md, "Goodput", says where each is measured); null: not
    measured (``not_measured`` says why; its time is in leftover)."""

    startup: Number
    """process start to the recipe's first line: the interpreter and imports"""
    model_load: Number
    """train()'s model_load_time: the weights loaded (and embeddings resized)"""
    data_preparation: Number
    """train()'s data_preparation_time: the tokenizer and the datasets loaded, formatted and tokenized"""
    trackers_start: Number
    """the trackers built and their runs opened (BenchmarkJob.build_trackers)"""
    checkpoint_restore: Number
    """in a resumed segment, Trainer.train()'s entry to train begin: weights, optimizer, scheduler and RNG loaded"""
    warmup_steps: Number
    """step times of the warm-up steps (evaluation and checkpoint saves inside them taken out)"""
    productive_steps: Number
    """step times of the measured steps no later segment trained again (evaluation and saves taken out)"""
    evaluation: Number
    checkpoint_save: Number
    repeated_steps: Number
    """step times of the steps a later segment trained again (after the preempted process's last checkpoint)"""
    gaps: Number
    """between a segment's stop (its last journal record) and the next segment's process start; never negative (a
    start dated before the stop before it counts 0: segments[].gap_note)"""
    leftover: Number
    """the wall time less every other part: argument checks, the trainer's setup, the final save, the dump"""


class Goodput(_Model):
    wall_seconds: float
    """the first process's start to the last segment's end record (a killed last segment: its last record)"""
    productive_fraction: Number
    """productive_steps over wall_seconds: the goodput"""
    parts: GoodputParts
    not_measured: dict[str, str]
    """part name: why it is null"""
    clock_notes: list[str] | None = None
    """where clocks disagreed (a restart dated before its previous segment's stop beyond its start's precision, a
    part measured below 0, parts exceeding the wall time) and what was counted instead: empty when they agreed
    (dumps before it lack the key)"""


class RankGoodput(_Model):
    wall_seconds: float
    productive_fraction: Number
    parts: GoodputParts
    clock_notes: list[str] | None = None
    """as summary.goodput's, for this rank's own clocks"""


class RankNode(_Model):
    host: str
    """the rank's host name"""
    node_rank: int
    """its node's rank in the job (torchrun's GROUP_RANK; 0 on one node)"""
    ray_node_id: str | None = None
    """the Ray node it ran on, in a Ray sweep; null elsewhere"""


class NodeFigures(_Model):
    """One node of a run across nodes: where it ran, its ranks and their figures together (a figure is null unless
    every rank of the node has it: a run that ended before training's end gathered none)."""

    node_rank: int
    """its rank in the job (rank_nodes' node_rank)"""
    host: str
    """its host name"""
    ray_node_id: str | None = None
    """its Ray node, in a Ray sweep; null elsewhere"""
    ranks: list[int]
    """the global ranks that ran on it"""
    tokens_per_second: Number = None
    """its ranks' rank_tokens_per_second summed: the non-padding tokens the node trained per second"""
    own_time_p50: Number = None
    """its slowest rank's own time per step: rank_forward_time_p50 + rank_data_fetch_p50 (the forward time alone
    where fetch is not measurable), as the straggler rule counts it"""
    collective_wait_p50: Number = None
    """the median of its ranks' rank_collective_wait_p50: seconds per step blocked in collectives outside the
    backward pass"""


class StepParts(_Model):
    """Median share of the step time (0 to 1) of each part of a step (rank 0's, tuning.benchmarking.anatomy)."""

    data: Number = None
    """the rank's own fetch of the step's batches"""
    forward: Number = None
    """the model's training forward passes (CUDA events on a GPU)"""
    backward: Number = None
    """each forward's end to its micro-batch's end: the backward pass (under DDP with its gradient all-reduce)"""
    optimizer: Number = None
    """the last micro-batch's end to the step's end: clipping, optimizer and scheduler steps, zeroing the gradients"""
    communication: Number = None
    """under torchrun: blocked in the step's collectives outside the backward pass; absent on one process"""
    rest: Number = None
    """the step less the other parts: callbacks, logging, checkpoints, evaluations, inputs to the device"""


class BoundByShares(_Model):
    """The grouped median shares bound_by compares."""

    data: float
    compute: float
    """forward + backward + optimizer; on a GPU times its sampled utilisation"""
    communication: float
    host: float
    """the rest; on a GPU also the compute share the device sat idle"""


class Evaluation(_Model):
    """One evaluation of a --target_eval_loss run."""

    samples: int
    """training samples seen before it (optimizer steps x global batch)"""
    eval_loss: Number
    """the mean loss over the validation data"""
    seconds: float
    """from run_start (MLPerf's clock) to its end"""


class Summary(_Model):
    train_runtime: Number
    """seconds from train begin to train end"""
    model_load_time: Number
    data_preparation_time: Number = None
    """seconds train() took to prepare the training rows (from the processed-data cache on a hit)"""
    tokens_per_second: Number
    """non-padding tokens of all ranks per second of step time"""
    text_tokens_per_second: Number = None
    """tokens_per_second less image_tokens_per_second; null for a text-only model (dumps before it lack the key)"""
    image_tokens_per_second: Number = None
    """a vision-language model's image tokens (among tokens_per_second) per second; null for a text-only model"""
    samples_per_second: Number
    step_time_p50: Number
    step_time_p90: Number
    measured_steps: int
    """post-warmup steps the step figures cover; 0 = never left warmup, the figures then cover all steps"""
    label_tokens: int | None = None
    """the label tokens the loss trained on, every step (warmup included) and rank: 0 means nothing was learned;
    null when no step reported them (dumps before it lack the key)"""
    peak_rss_bytes: int | None
    """rank 0's peak resident memory"""
    peak_anon_rss_bytes: int | None = None
    """rank 0's largest sampled resident anonymous memory (RSS less file-backed pages); null without samples"""
    cuda: list[CudaDevice] | None
    """peak memory per device; null without CUDA"""
    peak_tensor_bytes: int | None = None
    """rank 0's measured peak of live tensor bytes: torch.cuda.max_memory_allocated on a GPU; on a CPU torch's
    MemTracker over the first two optimizer steps; null with --memory_estimate False (dumps before it lack the key)"""
    memory_estimate_ratio: Number = None
    """estimate.peak_bytes_per_device / peak_tensor_bytes; null when either is missing"""
    model_flops_per_token: Number = None
    """training FLOPs per token: 4 x frozen + 6 x trained matmul weights + 12 x layers x attention width x mean
    sequence length (PaLM/Chinchilla), a vision-language model's image path added at its share per token; null for a
    model without a transformers config (dumps before it lack the key)"""
    language_flops_per_token: Number = None
    """a vision-language model's language model alone per token (text or image); null for a text-only model"""
    vision_flops_per_image_token: Number = None
    """a vision-language model's vision tower and projector per image token; null for a text-only model"""
    vision_flops_fraction: Number = None
    """the image path's share of model_flops_per_token (0 to 1); null for a text-only model"""
    achieved_tflops_per_device: Number = None
    """tokens_per_second x model_flops_per_token / world_size, in TFLOP/s"""
    peak_tflops_per_device: Number = None
    """the device's dense bf16/fp16 peak: --peak_tflops, else the datasheet table's row for the CUDA device name"""
    mfu: Number = None
    """achieved over peak TFLOP/s; null without a known peak (CPU, a device the table lacks)"""
    energy_joules: Number = None
    """energy of all sampled GPUs after the warmup"""
    energy_joules_per_gpu: list[Number] | None = None
    """the same per GPU, in CUDA's order; null without NVML"""
    joules_per_token: Number = None
    """energy_joules over the non-padding tokens of the steps after the warmup"""
    energy_source: Literal["nvml_energy_counter", "integrated_power"] | None = None
    """NVML's total energy counter, or the sampled power integrated where a GPU has no counter"""
    rank_forward_time_p50: list[Number] | None = None
    """per rank: median seconds per step in its model's forward passes"""
    rank_data_wait_p50: list[Number] | None = None
    """per rank: median seconds per step from the previous step's end to this one's begin: its batches' fetch and the
    wait for the slowest rank in the count of the batch's items"""
    rank_data_fetch_p50: list[Number] | None = None
    """per rank: median seconds per step that the rank itself spent fetching the step's batches from its data loader;
    null where not measurable (data_fetch_unmeasurable says why)"""
    data_fetch_unmeasurable: str | None = None
    """why rank_data_fetch_p50 is null: batches dispatched from rank 0, or a trainer that reports no fetches"""
    rank_skew: Number = None
    """slowest over fastest rank's rank_forward_time_p50; 1.0 on one process"""
    straggler_rank: int | None = None
    """the rank whose own time per step (forward + data fetch) exceeds the other ranks' median by more than 10 %"""
    straggler_cause: Literal["data", "compute"] | None = None
    """where the straggler's extra time goes: its data fetch or its forward passes"""
    straggler_node: int | None = None
    """in a run across nodes, the straggler's node (its rank in the job, rank_nodes' node_rank): the slowest node;
    null on one node or without a straggler (dumps before it lack the key)"""
    resumed_from_step: int | None = None
    """the global step of the checkpoint the run's last segment resumed from; null for a run trained in one go
    (dumps before it lack the key)"""
    data_fetch_share: Number = None
    """rank 0's median over the measured steps of its data-loader fetch time over the step's time (the
    data_fetch_share series per step); null where fetch is not measurable (dumps before it lack the key)"""
    rank_data_fetch_share_p50: list[Number] | None = None
    """per rank: the median of its own fetch time over its own step time, over the steps after the warmup"""
    step_parts: StepParts | None = None
    """each part's median share of the step time over the measured steps (step anatomy, docs/benchmarking.md "Why is
    it slow"); null without the parts' series (dumps before it lack the key)"""
    bound_by: Literal["data", "compute", "communication", "host"] | None = None
    """what the steps wait on most: the largest of bound_by_shares"""
    bound_by_shares: BoundByShares | None = None
    """the figures that decided bound_by"""
    goodput: Goodput | None = None
    rank_goodput: list[RankGoodput] | None = None
    """per rank, in rank order: its own process's goodput from its start to its train end, from its own clocks (its
    last segment's; no gaps nor repeated steps); null from a recipe that does not time it"""
    """where the wall time went, from the first process's start to the dump (dumps before it lack the key)"""
    rank_nodes: list[RankNode] | None = None
    """per rank, in rank order: where it ran (host, its node's rank, its Ray node), gathered as training begins; null
    for a run that did not reach it (dumps before it lack the key)"""
    rank_collective_wait_p50: list[Number] | None = None
    """per rank: median seconds per step blocked in the collectives the step runs outside the backward pass (the
    cross-rank count of the batch's items, the stop agreement): where a rank waits for slower ones; null on one
    process (dumps before it lack the key)"""
    rank_tokens_per_second: list[Number] | None = None
    """per rank: its own non-padding tokens over its step time, warmup excluded (dumps before it lack the key)"""
    nodes: list[NodeFigures] | None = None
    """in a run across nodes, per node in node_rank order: its ranks, throughput, own time and collective wait; null
    on one node (dumps before it lack the key)"""
    slowest_node: int | None = None
    """in a run across nodes, the node_rank of the node with the longest own_time_p50, whether or not one rank is a
    straggler; null on one node or without every node's own time (dumps before it lack the key)"""
    target_eval_loss: Number = None
    """--target_eval_loss; null (and the keys below) for a run without it (dumps before it lack these keys)"""
    converged: bool | None = None
    """an evaluation's loss was at or below the target (status converged); false: status not_converged"""
    time_to_train: Number = None
    """seconds from run_start (MLPerf's clock: before train() reads data) to the end of the evaluation that reached
    the target; null when none did, and for a run resumed from a checkpoint (time_to_train_note)"""
    time_to_train_note: str | None = None
    """why time_to_train is null for a run that converged"""
    evaluations: list[Evaluation] | None = None
    """every evaluation made, in order (the last segment's for a resumed run)"""
    init_seconds: Number = None
    """seconds from the process's start to run_start: MLPerf's initialisation, off the clock"""


class Environment(_Model):
    python: str | None
    torch: str | None
    transformers: str | None
    trl: str | None
    peft: str | None
    aim: str | None
    cuda: str | None
    cuda_driver: str | None
    gpus: list[str]


class ErrorReport(_Model):
    """The error report of ``tuning.utils.error_logging`` (a hang adds ``thread_stacks``), or the note of a rebuild
    whose run died without one: then only these keys are known."""

    category: str | None
    message: str
    global_step: int | None


class StartClock(_Model):
    """Which clock dated a process's start (docs/benchmarking.md, "Clocks")."""

    source: Literal[PROC_STAT_STARTTIME, PSUTIL_CREATE_TIME, RECORD_OPENED]
    """proc_stat_starttime: the kernel's start time of the process (/proc/self/stat, clock ticks since boot) on the
    wall clock through CLOCK_BOOTTIME (Linux); psutil_create_time: psutil's create_time() (elsewhere); record_opened:
    no process start given, the moment the run record opened its journal"""
    precision_seconds: float
    """the start is dated at most this much before the process began, never after: one clock tick on Linux"""


class Segment(_Model):
    """One process's part of a run: a run resumed from a checkpoint has one per start, in order."""

    start_time: str
    """UTC ISO-8601 of its process start"""
    start_clock: StartClock | None = None
    """which clock dated start_time; null for a journal written before the key (psutil_create_time, 1 s) (dumps
    before it lack the key)"""
    stop_time: str
    gap_seconds: Number
    """from the previous segment's stop to this one's start (the restart), never negative; null for the first"""
    gap_note: str | None = None
    """why gap_seconds is 0 although the start is dated before the previous stop: within start_clock's precision,
    or beyond it (then the note begins "clocks disagree"); null otherwise (dumps before it lack the key)"""
    train_runtime: Number
    """seconds from its train begin to its train end"""
    resumed_from_step: int | None
    """the checkpoint's global step it resumed from; null when it trained from the start"""
    training_steps: int
    """the global step it ended at"""
    steps: int
    """steps whose points in the series are its own (a later segment's replace those it trained again)"""
    warmup_steps: int | None
    """its last warm-up step (global); null when it never began training"""
    measured_steps: int
    tokens_per_second: Number
    """its own steps' tokens over their step time, post-warmup (all its steps when none came after the warm-up)"""
    status: Status
    stop_reason: StopReason | None
    error: ErrorReport | None
    """its error report: a preempted segment's is the interruption"""


class ChatTemplate(_Model):
    """The chat template the run applied instead of the tokenizer's own."""

    source: Literal["data_config", "chat_template_path", "--chat_template"]
    """the data config's chat_template or chat_template_base64, its chat_template_path, or the flag"""
    path: str | None
    """the template file, for chat_template_path"""
    sha256: str
    """of the template's text (UTF-8)"""


class DataSet(_Model):
    """One dataset of the data config."""

    name: str
    data_paths: list[str]
    """files, folders, globs or Hub dataset ids"""
    builder: str | None
    """the datasets builder (json, parquet, arrow, csv...); null: by the files' extension"""
    sampling: Number
    """its sampling ratio in the mix; null: not sampled (datasets are concatenated)"""
    split: dict[str, float] | None
    """the fractions of its rows in the train and validation sets"""
    handlers: list[str]
    """its data handlers' names, in the order they run"""


class DataCache(_Model):
    """How the run's rows were prepared: the processed-data cache (--data_cache_dir)."""

    status: Literal["hit", "miss", "off", "bypass", "uncached"]
    """hit: read from the cache; miss: built and stored; off: --data_cache_dir none; bypass: not cacheable (a Hub
    dataset id, streaming, --do_dataprocessing_only); uncached: the cache could not serve (its directory unwritable or
    full, a damaged entry that could not be removed, a bad $TUNING_DATA_CACHE_MAX_GB), the rows were prepared without
    it"""
    key: str | None
    """the entry's key: the sha256 of its parts (data files, arguments, tokenizer, code...)"""
    cache_dir: str | None
    seconds: Number
    """the data preparation time"""


class DataDescription(_Model):
    """The data a run trained on: its data config, or the one the plain flags make."""

    data_config_path: str | None
    """--data_config_path; null for a run from the plain flags (--training_data_path...)"""
    data_config_sha256: str | None
    """the sha256 of the data config file's bytes; null without one"""
    type: str | None
    streaming: bool
    seed: int | None
    sampling_stopping_strategy: str | None
    chat_template: ChatTemplate | None
    """null: the tokenizer's own template, if any"""
    datasets: list[DataSet]
    tokenised_by: Literal["data_preparation", "vision_collator"] | None = None
    """what tokenised the rows: the data preparation before training (data handlers, loss masking), or for vision
    data the vision collator, each batch (chat template, processor); dumps before it lack the key"""
    cache: DataCache | None = None
    """how the rows were prepared; absent in a dump of a run that failed before"""


class MemoryEstimate(_Model):
    """The job's peak tensor memory per device predicted from its model's config (tuning.benchmarking.memory):
    torch's MemTracker over two training steps of the model on fake tensors."""

    peak_bytes_per_device: int | None
    """null exactly when not_estimated says why"""
    parts: dict[str, int] | None
    """the tracker's categories at the peak: parameters, buffers, gradients, optimizer_state, activations,
    temporaries, other (bytes)"""
    peak_module: str | None
    """the innermost module running at the peak (the optimizer's class in the optimizer phase)"""
    peak_phase: Literal["forward", "backward", "optimizer"] | None
    devices: int
    """the device count assumed"""
    batch_size: int
    sequence_length: int
    seconds: float
    """how long the estimate took"""
    not_estimated: str | None
    """why no figure: what could not be traced"""
    estimate_only: bool = False
    """the run was --estimate_memory: nothing trained"""
    traced_layers: list[int] | None = None
    """a deep stack of alike decoder layers was traced cut to these depths and extended to the whole stack by the
    difference between them; absent where the whole model was traced"""


class ProfileOp(_Model):
    """One operator of the profiled window, as the profiler's key_averages() has it (microseconds)."""

    name: str
    calls: int
    self_cpu_us: float
    cpu_total_us: float
    self_device_us: float


class TopOps(_Model):
    cpu: list[ProfileOp]
    """the operators with the most self CPU time, at most 20"""
    cuda: list[ProfileOp] | None = None
    """the operators with the most self CUDA time, at most 20; absent without a GPU"""


class ProfileFiles(_Model):
    """One rank's files of the profiled window, relative to the dump's folder; null: not written (missing says why)."""

    rank: int
    trace: str | None
    """the gzipped Chrome/Perfetto trace (chrome://tracing, ui.perfetto.dev); ProfilerStep#N is optimizer step N"""
    table: str | None
    """the operators' table as text (by self CPU time, then by self CUDA time on a GPU)"""
    missing: str | None
    """why a file is missing (no room to write it, the run ended before the window), or null"""
    steps: list[int] | None = None
    """the first and last step traced; absent when none was"""
    memory_timeline: str | None = None
    """with --profile_memory: the profiler's memory timeline (HTML)"""
    memory_snapshot: str | None = None
    """on a GPU: the CUDA memory snapshot of the window (pickle, for pytorch.org/memory_viz)"""
    memory_snapshot_html: str | None = None
    """the same drawn by torch.cuda._memory_viz"""


class Profile(_Model):
    """--profile_steps A-B: torch.profiler on exactly those optimizer steps, on every rank."""

    steps: list[int]
    """the window asked for: [A, B]"""
    profiled_steps: list[int] | None
    """the steps rank 0 traced: the window, or its part before the run ended; null when none"""
    top_ops: TopOps | None
    """rank 0's operators with the most self time in the window"""
    traces: list[ProfileFiles]
    """per rank, in rank order (only rank 0's when the run failed)"""
    missing: str | None
    """why rank 0's profile is incomplete, or null"""


class OomMemorySnapshot(_Model):
    """--oom_snapshot: the CUDA memory snapshot taken at the out-of-memory failure, relative to the dump's folder."""

    memory_snapshot: str | None
    memory_snapshot_html: str | None
    missing: str | None
    """why there is none (no CUDA device recording, no room to write it), or null"""


class Dump(_Model):
    """A benchmark run's dump, written by rank 0 of ``wrappers/bench_train.py`` however the run ends."""

    schema_version: Literal[SCHEMA_VERSION]
    """keys may be added; a rename or removal bumps it"""
    status: Status
    """how the run ended"""
    stop_reason: StopReason | None
    """set when status is stopped; also for not_converged when a stop rule (--stop_after_seconds) ended the run"""
    run_hash: str | None
    """the Aim run"""
    experiment: str | None
    metadata: dict[str, Any]
    """the merged metadata"""
    config: dict[str, Any] | None = None
    """the arguments that define the run's work, flat (tuning.benchmarking.configuration.CONFIG_ARGUMENTS): equal
    objects, the same configuration (dumps before it lack the key)"""
    seed: int | None = None
    """--seed the run trained with (a sweep's repeats each their own); null in a dump written before the key"""
    data: DataDescription | None = None
    """which data the run trained on: its data config and datasets with their sampling ratios; null when the run
    failed before its arguments were checked (dumps before it lack the key)"""
    host: str
    rank: int
    world_size: int
    start_time: str
    """UTC ISO-8601 of the process start"""
    start_clock: StartClock | None = None
    """which clock dated start_time, and how early it may be; null for a journal written before the key (dumps before
    it lack the key)"""
    stop_time: str
    training_steps: int
    """optimizer steps completed"""
    warmup_steps: int
    """the last warmup step (of the first segment; segments[].warmup_steps has each segment's)"""
    summary: Summary
    metrics: list[Metric]
    aggregates: list[Aggregate]
    environment: Environment
    error: ErrorReport | None
    """set exactly when status is error or interrupted"""
    aim_degraded_reason: str | None
    """why Aim tracking stopped, if it did"""
    mlflow_run_id: str | None = None
    """the MLflow run (dumps written before MLflow support lack the key)"""
    mlflow_degraded_reason: str | None = None
    """why MLflow tracking stopped, if it did"""
    rebuilt_from_journal: bool
    segments: list[Segment] | None = None
    """the processes the run took, one unless resumed from a checkpoint; status, error and training_steps above are
    the last one's (dumps before it lack the key)"""
    estimate: MemoryEstimate | None = None
    """the memory estimate made before training; null with --memory_estimate False (dumps before it lack the key)"""
    profile: Profile | None = None
    """--profile_steps' window: traces per rank and the top operators; null without the flag"""
    oom_snapshot: OomMemorySnapshot | None = None
    """--oom_snapshot: the memory snapshot at a GPU out-of-memory failure; null without one"""

    @model_validator(mode="after")
    def _status_agrees(self) -> "Dump":
        if (self.status in ("error", "interrupted")) != (self.error is not None):
            raise PydanticCustomError("status", "error must be set exactly when status is 'error' or 'interrupted'")
        if (self.status == "stopped") > (self.stop_reason is not None):
            raise PydanticCustomError("status", "stop_reason must be set when status is 'stopped'")
        if self.stop_reason is not None and self.status not in ("stopped", "not_converged"):
            raise PydanticCustomError("status", "stop_reason is set only when status is 'stopped' or 'not_converged'")
        return self


def validate_dump(dump: Any) -> list[str]:
    """Every way ``dump`` departs from the schema, as ``$.path: problem`` lines."""
    try:
        Dump.model_validate(dump)
    except ValidationError as exc:
        return [_problem(error) for error in exc.errors()]
    return []


def _problem(error: Any) -> str:
    location, message = error["loc"], error["msg"]
    if error["type"] == "missing":
        location, message = location[:-1], f"missing key {location[-1]!r}"
    elif error["type"] not in ("lengths", "status"):  # not a rule of the models' own validators
        message += f", got {type(error['input']).__name__}"
    return "$" + "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in location) + f": {message}"


class _CompactSchema(GenerateJsonSchema):
    """No per-field titles (the key says it) and ``{"type": [T, "null"]}`` for a nullable simple type."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False

    def nullable_schema(self, schema: Any) -> dict[str, Any]:
        inner = self.generate_inner(schema["schema"])
        if list(inner) == ["type"] and isinstance(inner["type"], str):
            return {"type": [inner["type"], "null"]}
        return super().nullable_schema(schema)


def json_schema() -> dict[str, Any]:
    return Dump.model_json_schema(schema_generator=_CompactSchema)


def schema_text() -> str:
    """The JSON Schema as docs/dump-schema.md shows it: one line per property."""

    def text(schema: dict[str, Any], depth: int, inline_children: bool) -> str:
        lines = []
        for key, value in schema.items():
            if inline_children or not isinstance(value, dict) or not value:
                item = json.dumps(value, ensure_ascii=False)
            else:
                item = text(value, depth + 1, key == "properties")
            lines.append("  " * (depth + 1) + f"{json.dumps(key)}: {item}")
        return "{\n" + ",\n".join(lines) + "\n" + "  " * depth + "}"

    return text(json_schema(), 0, False)


_SCHEMA_BLOCK = re.compile(r"(<!-- dump-schema -->\n```json\n).*?^```$", re.DOTALL | re.MULTILINE)


def markdown_with_schema(markdown: str) -> str:
    """``markdown`` with the JSON Schema in its ``<!-- dump-schema -->`` block."""
    updated, found = _SCHEMA_BLOCK.subn(lambda match: f"{match.group(1)}{schema_text()}\n```", markdown)
    if not found:
        raise ValueError("no <!-- dump-schema --> block followed by a ```json fence")
    return updated


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m tuning.benchmarking.schema", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--markdown", "--readme", help="rewrite the schema block of this Markdown file instead of printing"
    )
    markdown = parser.parse_args().markdown
    if markdown is None:
        print(schema_text())
    else:
        path = pathlib.Path(markdown)
        path.write_text(markdown_with_schema(path.read_text(encoding="utf-8")), encoding="utf-8")
