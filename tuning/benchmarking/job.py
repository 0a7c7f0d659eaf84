"""One benchmark run's lifecycle, for ``wrappers/bench_train.py`` (the recipe) and copies of it: the command line
read by one parser, the metrics path claimed and its journal opened, the benchmark's trackers and callbacks, and
however the run ends a dump (at a fallback when the metrics path cannot take it), per-rank error reports and the
stall exit. Rank 0 owns the record (dump + journal) and the Aim/MLflow runs; other ranks report only their own
failure; each node's local rank 0 samples system metrics (other nodes into their own journal).
"""

import contextlib
import dataclasses
import faulthandler
import fcntl
import importlib
import inspect
import json
import logging
import math
import os
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import yaml
from transformers import TrainerCallback

from tuning.benchmarking.callback import BenchmarkCallback
from tuning.benchmarking.clocks import process_start
from tuning.benchmarking.configuration import run_configuration
from tuning.benchmarking.data_description import describe_data
from tuning.benchmarking.dump import ALREADY_COMPLETE, MEMORY_ESTIMATE, PEAK_TENSOR_BYTES, write_dump
from tuning.benchmarking.goodput import DATA_PREPARATION_TIME, MODEL_LOAD_TIME, STARTUP_END, TRACKERS_START
from tuning.benchmarking.journal import Journal, read_journal
from tuning.benchmarking.mlperf import (
    ABORTED,
    CONVERGED,
    DIVISIONS,
    NOT_CONVERGED,
    RESUMED,
    RUN_START,
    TARGET,
    MlperfLog,
    TimeToTrain,
    platform_name,
)
from tuning.benchmarking.paths import RunPaths
from tuning.benchmarking.profiling import OomSnapshot, ProfileCallback, parse_window, relative_paths
from tuning.benchmarking.record import RunRecord
from tuning.benchmarking.stopping import StopRule
from tuning.benchmarking.system_metrics import cuda_peak_memory, environment_info, peak_rss_bytes
from tuning.benchmarking.watchdog import StallWatchdog, thread_stacks
from tuning.sft_trainer import (
    FinishedRun,
    ParsedArguments,
    check_output_dir,
    finished_run,
    get_parser,
    parse_arguments_by_type,
    resume_checkpoint,
    validate_arguments,
)
from tuning.trackers import (
    AIMSTACK_TRACKER,
    FAILED,
    KILLED,
    MLFLOW_TRACKER,
    Tracker,
    build_tracker,
    closed_on_failure,
    hf_callbacks,
    run_status,
    validate_tracker_names,
)
from tuning.trackers.helper_transport import EarlyHelpers
from tuning.utils.cli_flags import unknown_flag_message
from tuning.utils.config_utils import get_json_config
from tuning.utils.error_logging import (
    ErrorCategory,
    StorageError,
    TrainingInterrupted,
    TrainingStalled,
    UserInputError,
    build_error_report,
    print_error_marker,
    print_own_line,
    run_with_error_reporting,
    termination_line,
    write_termination_log,
)
from tuning.utils.file_utils import write_json_atomic
from tuning.utils.graceful_stop import GracefulStopCallback, StopAgreement

logger = logging.getLogger(__name__)
# Room the dump and journal need at least: a filesystem with less is refused before training.
MIN_FREE_BYTES = 16 * 2**20
MIRRORED_TRACKERS = (AIMSTACK_TRACKER, MLFLOW_TRACKER)  # they receive the benchmark's series too


def flag(default: Any, help: str) -> Any:
    """A wrapper flag: a dataclass field with its default and the help line ``--help`` shows."""
    return dataclasses.field(default=default, metadata={"help": help})


def parse_command_line(flags_class: type, argv: list[str] | None = None) -> tuple[Any, ParsedArguments]:
    """(the wrapper's flags as a ``flags_class``, the trainer's arguments), from one parser holding both flag sets:
    ``--help`` lists both; each value keeps its field's type. Without a job config, a flag that is neither ours nor
    the trainer's is a user error naming the closest valid one (the trainer's parser alone only warns, as
    fms-hf-tuning ignores it, and a benchmark would run without it). With a job config (``SFT_TRAINER_CONFIG_JSON_*``)
    the trainer's arguments come from it, the wrapper's flags from its keys and, over those, the command line."""
    argv = sys.argv[1:] if argv is None else argv
    parser = get_parser(flags_class)
    parser.allow_abbrev = False  # a misspelt flag is refused, never read as another one it is a prefix of
    job_config = get_json_config()
    if job_config:
        args, parsed = parse_arguments_by_type(parser, job_config)
        parser.set_defaults(**dataclasses.asdict(parsed[flags_class]))
        *from_command_line, _ = parser.parse_args_into_dataclasses(args=argv, return_remaining_strings=True)
        flags = next(value for value in from_command_line if isinstance(value, flags_class))
        return flags, args
    known, leftovers = parser.parse_known_args(argv)
    if leftovers:
        flag = next((token for token in leftovers if token.startswith("-")), None)
        if flag is None:
            raise UserInputError(f"unexpected argument {leftovers[0]!r}: flags are written --name value")
        raise UserInputError(unknown_flag_message(flag, sorted(vars(known))))
    args, parsed = parse_arguments_by_type(parser, args=argv)
    return parsed[flags_class], args


def load_metadata(path: str | None, inline: str | None, exp_metadata: dict | None) -> dict[str, Any]:
    """The run's searchable labels: ``exp_metadata``, then the JSON/YAML object in the file at ``path``, then the
    inline JSON object, each overriding the keys before it; JSON types only (a YAML date becomes a string)."""
    metadata = dict(exp_metadata or {})
    sources = []  # (flag, its text, its parser, what the text must be)
    if path is not None:
        try:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
        except OSError as exc:
            raise UserInputError(f"cannot read --metadata_path {path}: {exc.strerror or exc}") from exc
        parse = json.loads if path.endswith(".json") else yaml.safe_load
        sources.append((f"--metadata_path {path}", text, parse, "JSON/YAML"))
    if inline is not None:
        sources.append(("--metadata", inline, json.loads, "JSON"))
    for source, text, parse, kind in sources:
        try:
            value = parse(text)
        except (json.JSONDecodeError, yaml.YAMLError) as exc:
            raise UserInputError(f"{source} is not valid {kind}: {' '.join(str(exc).split())}") from exc
        if not isinstance(value, dict):
            raise UserInputError(f"{source} must hold an object (key: value pairs), got {type(value).__name__}")
        metadata.update(value)
    return json.loads(json.dumps(metadata, default=str))


def load_callbacks(spec: str | None) -> list[TrainerCallback]:
    """``module:Name[,module:Name]`` entries, each a callback class or a factory returning one."""
    callbacks = []
    for entry in filter(None, (part.strip() for part in (spec or "").split(","))):
        module_name, _, name = entry.partition(":")
        try:
            factory = getattr(importlib.import_module(module_name), name)
        except (ImportError, AttributeError, ValueError) as exc:
            raise UserInputError(f"--callbacks {entry}: cannot load it ({exc})") from exc
        try:
            inspect.signature(factory).bind()
        except TypeError as exc:  # not callable, or it needs arguments: the entry is wrong, not the callback
            raise UserInputError(f"--callbacks {entry} cannot be called without arguments ({exc})") from exc
        except ValueError:  # a builtin without a signature: its call says what is wrong
            pass
        callback = factory()
        if not isinstance(callback, TrainerCallback):
            raise UserInputError(f"--callbacks {entry} gave a {type(callback).__name__}, not a TrainerCallback")
        callbacks.append(callback)
    return callbacks


def tracked_experiment(configs: Any, names: list[str]) -> str | None:
    """The experiment the run is tracked under, Aim's or else MLflow's; None when no tracker keeps experiments."""
    if AIMSTACK_TRACKER in names:
        return configs.aim_experiment
    return configs.mlflow_experiment if MLFLOW_TRACKER in names else None


def check_flags(flags: Any) -> None:
    for name in ("system_metrics_interval", "skip_warmup_steps", "skip_warmup_seconds", "stall_timeout"):
        if (getattr(flags, name) or 0) < 0:
            raise UserInputError(f"--{name} must not be negative, got {getattr(flags, name)}")
    if flags.peak_tflops is not None and not flags.peak_tflops > 0:
        raise UserInputError(f"--peak_tflops must be positive, got {flags.peak_tflops}")
    suggest = getattr(flags, "suggest_devices", None)
    if suggest is not None and not suggest > 0:
        raise UserInputError(f"--suggest_devices must be a positive device memory in GB, got {suggest}")
    if getattr(flags, "profile_memory", False) and not getattr(flags, "profile_steps", None):
        raise UserInputError("--profile_memory needs --profile_steps: the memory timeline is of a profiled window")


def check_time_to_train(flags: Any, args: ParsedArguments) -> None:
    """--target_eval_loss and the flags that go with it (a copy of bench_train may lack them all)."""
    target = getattr(flags, "target_eval_loss", None)
    if target is None:
        given = [name for name in ("eval_every_samples", "eval_skip", "mlperf_log") if getattr(flags, name, None)]
        if given:
            raise UserInputError(f"--{given[0]} needs --target_eval_loss: it belongs to a time-to-train run")
        return
    if not math.isfinite(target) or target < 0:
        raise UserInputError(f"--target_eval_loss must be a finite loss of at least 0, got {target}")
    if (every := flags.eval_every_samples) is not None and every < 1:
        raise UserInputError(f"--eval_every_samples must be at least 1, got {every}")
    if (skip := flags.eval_skip) is not None and skip < 0:
        raise UserInputError(f"--eval_skip must not be negative, got {skip}")
    if flags.auto_stop:
        raise UserInputError("--auto_stop with --target_eval_loss: a time-to-train run ends at its target or its end")
    if flags.mlperf_division not in DIVISIONS:
        raise UserInputError(f"--mlperf_division {flags.mlperf_division!r}: choose {' or '.join(DIVISIONS)}")
    if str(args.training_args.eval_strategy) not in ("no", "IntervalStrategy.NO"):
        raise UserInputError(
            "--target_eval_loss evaluates every --eval_every_samples training samples: leave --eval_strategy no"
        )
    if not (args.data_args.validation_data_path or args.data_args.data_config_path):
        raise UserInputError("--target_eval_loss needs validation data to evaluate on: give --validation_data_path")


def check_writable(path: str) -> None:
    """Fail now, not after hours of training, when the dump could not be written: not writable (a user error) or a
    filesystem with almost no room left (``storage``)."""
    try:
        if os.path.isdir(path):
            raise IsADirectoryError(21, "Is a directory")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with tempfile.TemporaryFile(dir=os.path.dirname(path)):
            pass
        room = os.statvfs(os.path.dirname(path))
    except OSError as exc:
        raise UserInputError(f"cannot write --metrics_path {path}: {exc.strerror or exc}") from exc
    free = room.f_bavail * room.f_frsize
    if room.f_blocks and free < MIN_FREE_BYTES:  # f_blocks 0: a filesystem that does not report its size
        raise StorageError(
            f"--metrics_path {path}: only {free / 2**20:.1f} MiB free on its filesystem, "
            f"the dump and journal need at least {MIN_FREE_BYTES // 2**20} MiB"
        )


def claim_metrics_path(paths: RunPaths, rank: int) -> int:
    """Own the run's files for its lifetime: an exclusive ``flock`` on the rank's lock file (which names its holder),
    held by the returned descriptor and released by the kernel when the process ends, however it ends."""
    lock_path = paths.lock(rank)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)  # its directory is known to be writable
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            holder = json.loads(os.pread(fd, 4096, 0))
            who = f"pid {holder['pid']} on host {holder['host']}"
        except ValueError:  # the holder has not written its name yet
            who = "a process that is starting"
        os.close(fd)
        raise UserInputError(
            f"--metrics_path {lock_path.removesuffix('.lock')} is in use by another run ({who}, lock {lock_path}): "
            "give each run its own"
        ) from None
    except OSError as exc:  # ENOLCK, EOPNOTSUPP: a filesystem that does not do locks
        logger.warning("cannot lock %s (%s): a second run on this --metrics_path would go unnoticed", lock_path, exc)
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname()}).encode(), 0)
    return fd


class ProcessTimes(Tracker):
    """Receives ``train()``'s ``model_load_time`` and ``data_preparation_time`` on every rank, into ``times`` (as
    goodput's ``model_load`` and ``data_preparation``), for the rank's own goodput."""

    name = "process_times"
    PARTS = {MODEL_LOAD_TIME: "model_load", DATA_PREPARATION_TIME: "data_preparation"}

    def __init__(self, times: dict[str, float]):
        super().__init__()
        self.times = times

    def track(self, metric: float, name: str, stage: str = "additional_metrics") -> None:
        if name in self.PARTS:
            self.times[self.PARTS[name]] = self.times.get(self.PARTS[name], 0.0) + metric


def earlier_segments(journal: str) -> list[dict[str, Any]]:
    """The records of the journal a resumed run continues, so that its dump keeps every segment; none (a new journal)
    when there is none or it cannot be read (said in a warning)."""
    if not os.path.exists(journal):
        return []
    try:
        return read_journal(journal)
    except (OSError, ValueError) as exc:
        logger.warning("resuming: cannot read the journal %s (%s); starting a new one", journal, exc)
        return []


def configuration_changes(previous: list[dict[str, Any]], config: dict[str, Any]) -> list[str]:
    """How ``config`` differs from the configuration the journal's last segment ran with (``name was → now``, by
    name), over the keys both know (a journal written by an older version may lack newer keys); none without one."""
    starts = [record["config"] for record in previous if record.get("type") == "start" and "config" in record]
    if not starts:
        return []
    earlier = starts[-1]
    return [
        f"{name} {json.dumps(earlier[name])} → {json.dumps(config[name])}"
        for name in sorted(earlier.keys() & config.keys())
        if earlier[name] != config[name]
    ]


class BenchmarkJob:
    """One run, in the recipe's steps: ``start`` (cheap checks, the metrics path claimed, the journal opened),
    ``annotate``, ``build_trackers``, ``callbacks``, ``training`` (around ``train()``), ``finish`` (the dump), all
    inside ``report_failures``, which turns any failure into the dump, a rank's report file and an exit code."""

    def __init__(self) -> None:
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.process_start = process_start()  # the dump's start_time and start_clock: process start, imports included
        self.started = self.process_start.time
        self.constructed = time.time()  # the recipe's first line: the interpreter's start and imports end here
        # This process's own times, for its rank's goodput (every rank: summary.rank_goodput).
        self.process_times: dict[str, float] = {"start": self.started, "startup_end": self.constructed}
        self.flags: Any = None
        self.paths: RunPaths | None = None  # set once the metrics path is known to be writable and owned by this run
        self.output_dir: str | None = None
        self.metrics_path_lock: int | None = None
        self.record: RunRecord | None = None
        self.mirrored: list[Tracker] = []  # Aim and MLflow
        self.bench: BenchmarkCallback | None = None
        self.profile: ProfileCallback | None = None
        self.oom_snapshot: OomSnapshot | None = None
        self.graceful_stop: GracefulStopCallback | None = None
        self.sampling = False
        self.data: dict[str, Any] | None = None  # the dump's ``data``, known on rank 0 once the arguments are checked
        self.already_complete: FinishedRun | None = None  # a rerun of a finished job: it trains nothing
        self.memory_meter: Any = None  # the real peak's meter (--memory_estimate)
        self.args: ParsedArguments | None = None
        self.time_to_train: TimeToTrain | None = None  # --target_eval_loss
        self.mlperf_log: MlperfLog | None = None  # --mlperf_log, rank 0

    @property
    def metrics_path(self) -> str | None:
        return self.paths.dump if self.paths is not None else None

    def global_step(self) -> int | None:
        return self.bench.global_step if self.bench is not None else None

    def report_failures(self, run: Callable[[], Any]) -> int:
        """``run()``'s exit status: 0, or any failure's category's code after its report (termination log, stderr
        marker, the dump or this rank's report file); the metrics path is released whatever happens."""
        try:
            return run_with_error_reporting(run, on_error=self.report_failure, global_step=self.global_step)
        finally:
            if self.metrics_path_lock is not None:
                os.close(self.metrics_path_lock)

    def start(self, flags: Any, args: ParsedArguments) -> None:
        """Check what is cheap to check, claim the metrics path and open the journal (rank 0, and each node's sampling
        rank): from here on every failure ends in the dump too. Then the trainer's own checks (``validate_arguments``,
        once: ``train()`` finds these arguments checked)."""
        self.flags, self.args = flags, args
        train_args = args.training_args
        if train_args.resume_from_checkpoint is None:  # a benchmark measures whole runs: resume only when told to
            train_args.resume_from_checkpoint = "false"
        check_flags(flags)
        check_time_to_train(flags, args)
        if getattr(flags, "profile_steps", None):
            parse_window(flags.profile_steps, train_args.max_steps)
        check_output_dir(train_args.output_dir)
        default = RunPaths.in_output_dir(train_args.output_dir).dump
        metrics_path = os.path.abspath(flags.metrics_path or default)
        check_writable(metrics_path)
        paths = RunPaths(metrics_path)
        self.sampling = flags.system_metrics_interval > 0 and self.local_rank == 0
        writes_files = self.rank == 0 or self.sampling  # at the metrics path: the dump, or a journal of its own
        if writes_files:
            self.metrics_path_lock = claim_metrics_path(paths, self.rank)
        self.paths, self.output_dir = paths, os.path.abspath(train_args.output_dir)
        if writes_files:
            header = {
                "time": self.started,
                "start_clock": self.process_start.clock(),
                "experiment": tracked_experiment(args.tracker_configs, train_args.trackers),
                "host": socket.gethostname(),
                "rank": self.rank,
                "world_size": self.world_size,
                "config": run_configuration(args, self.world_size),
                "environment": environment_info(),
                "flags": dataclasses.asdict(flags),
                "seed": train_args.seed,
            }
            journal = paths.journal(self.rank)
            try:
                self.already_complete = finished_run(train_args)
                resumes = self.already_complete is not None or resume_checkpoint(train_args) is not None
            except UserInputError:  # validate_arguments reports it below, into the dump
                resumes = False
            previous = earlier_segments(journal) if resumes else []
            if changes := configuration_changes(previous, header["config"]):
                raise UserInputError(
                    f"resuming the run journaled in {journal} with another configuration ({'; '.join(changes)}): its "
                    "segments would mix two runs' work; resume with the flags it ran with, or start a new run (another "
                    "--output_dir, or --resume_from_checkpoint false)"
                )
            self.record = RunRecord(Journal(journal, append=bool(previous)), header, previous)
            self.record.note(**{STARTUP_END: self.constructed})
            if getattr(flags, "target_eval_loss", None) is not None:
                self.record.note(**{TARGET: flags.target_eval_loss})
        if self.rank == 0 and getattr(flags, "mlperf_log", None) and self.already_complete is None:
            self.open_mlperf_log(flags, resumed=bool(writes_files and previous))
        validate_arguments(args.model_args, args.data_args, train_args)
        if self.rank == 0:  # the dump's and the trackers' description of the data, once the data config is known good
            self.data = describe_data(args.data_args, train_args.max_seq_length)
            if self.record is not None:
                self.record.note(data=self.data)

    def estimate_memory(self, args: ParsedArguments) -> dict[str, Any] | None:
        """Rank 0: the job's peak memory per device predicted from its config (``tuning.benchmarking.memory``),
        printed as a table and journaled (the dump's ``estimate``); with ``--suggest_devices GB`` also the fewest
        devices of that memory it fits on. None with ``--memory_estimate False`` (and on other ranks). Never fails
        the run: what it cannot trace is its ``not_estimated`` reason."""
        only, suggest = getattr(self.flags, "estimate_memory", False), getattr(self.flags, "suggest_devices", None)
        if self.rank != 0 or not (getattr(self.flags, "memory_estimate", False) or only or suggest is not None):
            return None
        from tuning.benchmarking import memory

        try:
            if suggest is not None:
                answer = memory.suggest_devices(args, memory.gib_to_bytes(suggest))
                estimate = answer["estimate"]
                print_own_line(memory.format_suggestion(answer))
            else:
                estimate = memory.estimate_memory(args, devices=self.world_size)
        except Exception as exc:  # a real run never fails because its estimate did
            estimate = memory.failed_estimate(args, self.world_size, exc)
        estimate["estimate_only"] = bool(only or suggest is not None)
        print(memory.format_estimate(estimate), flush=True)
        if self.record is not None:
            self.record.note(**{MEMORY_ESTIMATE: estimate})
        return estimate

    def open_mlperf_log(self, flags: Any, resumed: bool) -> None:
        """--mlperf_log: the submission lines and ``init_start`` at the process's start; a resumed run first says so
        (its log then holds two runs, which no checker takes for one)."""
        log = self.mlperf_log = MlperfLog(flags.mlperf_log, append=resumed)
        if resumed:
            log.event(RESUMED, True, reason="interrupted and resumed from a checkpoint: not one MLPerf run")
        log.event("submission_benchmark", flags.mlperf_benchmark)
        log.event("submission_division", flags.mlperf_division)
        log.event("submission_org", flags.mlperf_org)
        log.event("submission_platform", flags.mlperf_platform or platform_name(self.world_size))
        log.start("init_start", at=self.started)

    def start_the_clock(self) -> None:
        """MLPerf's clock starts here, before ``train()`` reads any data: ``run_start`` journaled (the dump's
        ``init_seconds`` and ``time_to_train`` count from it) and, with --mlperf_log, the run's hyperparameters,
        ``init_stop`` and ``run_start`` logged, all dated that instant (the log's times never go back)."""
        now = self.time_to_train.run_start = time.time()
        if self.record is not None:
            self.record.note(**{RUN_START: now})
        if (log := self.mlperf_log) is None:
            return
        train_args, peft = self.args.training_args, self.args.tune_config
        accumulation = train_args.gradient_accumulation_steps
        log.event("global_batch_size", train_args.per_device_train_batch_size * accumulation * self.world_size, at=now)
        log.event("gradient_accumulation_steps", accumulation, at=now)
        log.event("seed", train_args.seed, at=now)
        optimizer = str(getattr(train_args.optim, "value", train_args.optim))
        log.event("opt_name", optimizer, at=now)
        log.event("opt_base_learning_rate", train_args.learning_rate, at=now)
        log.event("opt_gradient_clip_norm", train_args.max_grad_norm, at=now)
        decay = "opt_adamw_weight_decay" if optimizer.startswith("adamw") else "opt_weight_decay"
        log.event(decay, train_args.weight_decay, at=now)
        if hasattr(peft, "lora_alpha"):  # LoRA's config (aLoRA's too)
            log.event("lora_rank", peft.r, at=now)
            log.event("lora_alpha", peft.lora_alpha, at=now)
        log.end("init_stop", at=now)
        log.start("run_start", at=now)

    def annotate(self, metadata: dict[str, Any]) -> dict[str, Any]:
        """Journal the run's metadata (the dump's ``metadata``); returns it for ``train(exp_metadata=...)``."""
        if self.record is not None:
            self.record.note(metadata=metadata)
        return metadata

    def build_trackers(
        self, names: list[str], configs: Any, early_helpers: EarlyHelpers | None = None
    ) -> list[Tracker]:
        """``train(trackers=...)``: one per name, Aim's and MLflow's last (they also receive the benchmark's series,
        this wrapper's flags as "benchmark" params and the dump's ``data`` as "data" params; each run is journaled as
        soon as it exists, so that a killed run's dump still links it), and on rank 0 the record, which receives
        ``model_load_time``. Each tracker isolates its library (a dead server costs a warning, never the job) and is
        imported only when asked for; a bad config ends the runs opened before it as failed. ``early_helpers``: the
        helpers the prologue started, to adopt."""
        began = time.time()
        trackers: list[Tracker] = []
        params = {"metrics_path": self.metrics_path, **dataclasses.asdict(self.flags)}
        with closed_on_failure(trackers):
            for name in validate_tracker_names(names):
                trackers.append(tracker := build_tracker(name, configs, early_helpers))
                if tracker.name in MIRRORED_TRACKERS:
                    tracker.set_params(params, "benchmark")  # now: the run opens while the job loads its model
                    if self.data is not None:
                        tracker.set_params(self.data, "data")  # searchable: run.data.datasets, data_config_sha256
        self.mirrored = [tracker for tracker in trackers if tracker.name in MIRRORED_TRACKERS]
        if self.record is not None:
            for tracker in self.mirrored:
                tracker.get_hf_callback().when_run_info_known(lambda *_, tracker=tracker: self.note_mirrored(tracker))
            self.record.note(**{TRACKERS_START: time.time() - began})
        self.process_times["trackers_start"] = time.time() - began
        others = [tracker for tracker in trackers if tracker not in self.mirrored]
        own_times = ProcessTimes(self.process_times)
        mlperf = [self.mlperf_log] if self.mlperf_log is not None else []
        return [*others, own_times, *([self.record] if self.rank == 0 else []), *mlperf, *self.mirrored]

    def callbacks(self, extra: list[TrainerCallback] = ()) -> list[TrainerCallback]:
        """``train(additional_callbacks=...)``: the benchmark's step hooks first (a step's time and number before any
        extension's work on it), the graceful stop, ``extra``, then the reader of trainer logs, so that a number an
        extension adds to the logs reaches the dump and each tracker (``train()`` installs the trackers' callbacks
        after these, Aim and MLflow last, so that the benchmark's last samples reach their runs before they close).
        One collective per step decides the stops of the benchmark and of the graceful stop on every rank."""
        flags = self.flags
        mirrors = hf_callbacks(self.mirrored)

        def mirror(points: list) -> None:
            for callback in mirrors:
                callback.track_many(points)

        stop_agreement = StopAgreement()
        self.graceful_stop = GracefulStopCallback(stop_agreement)
        self.bench = BenchmarkCallback(
            self.record,
            StopRule(
                flags.stop_after_seconds,
                flags.auto_stop,
                flags.auto_stop_min_steps,
                flags.auto_stop_min_seconds,
                flags.auto_stop_tolerance,
            ),
            warmup_steps=flags.skip_warmup_steps,
            warmup_seconds=flags.skip_warmup_seconds,
            system_metrics_interval=flags.system_metrics_interval if self.sampling else None,
            watchdog=StallWatchdog(flags.stall_timeout, self.on_stall) if flags.stall_timeout else None,
            mirror=mirror if mirrors else None,
            stop_agreement=stop_agreement,
            peak_tflops=flags.peak_tflops,
            process_times=self.process_times,
        )
        measuring: list[TrainerCallback] = []
        if getattr(flags, "memory_estimate", False) and self.rank == 0:  # a copy of bench_train may lack the flag
            from tuning.benchmarking.memory import PeakTensorMeter

            self.memory_meter = PeakTensorMeter(on_measured=self.note_peak_tensor_bytes)
            measuring.append(self.memory_meter)
        if getattr(flags, "profile_steps", None):  # right after the step's end is measured: the same step boundaries
            self.profile = ProfileCallback(
                flags.profile_steps, self.paths.profile_dir, flags.profile_memory, on_result=self.note_profile
            )
            measuring.append(self.profile)
        if getattr(flags, "oom_snapshot", False):
            self.oom_snapshot = OomSnapshot(self.paths.oom_snapshot)
            measuring.append(self.oom_snapshot)
        if getattr(flags, "target_eval_loss", None) is not None:
            self.time_to_train = TimeToTrain(
                flags.target_eval_loss,
                time.time(),  # until training() starts the clock
                flags.eval_every_samples,
                flags.eval_skip,
                note=self.record.note if self.record is not None and self.rank == 0 else None,
                log=self.mlperf_log,
            )
            measuring.append(self.time_to_train)
        return [self.bench, *measuring, self.graceful_stop, *extra, self.bench.log_recorder]

    def note_peak_tensor_bytes(self, peak: int) -> None:
        """Journal the real peak of live tensor bytes (the dump's summary.peak_tensor_bytes)."""
        if self.record is not None:
            self.record.note(**{PEAK_TENSOR_BYTES: int(peak)})

    def note_profile(self, result: dict[str, Any]) -> None:
        """Journal the profile's result (the dump's ``profile``), its files relative to the dump's folder."""
        if self.record is not None:
            self.record.note(profile=relative_paths(result, os.path.dirname(self.paths.dump)))

    @contextlib.contextmanager
    def training(self) -> Iterator[None]:
        """Around ``train()``: the sampler and watchdog stopped and the Aim/MLflow runs ended with the outcome so far,
        however it ends; a SIGTERM that stopped training gracefully ends the run as interrupted. With
        --target_eval_loss, MLPerf's clock starts on entry."""
        if self.time_to_train is not None:
            self.start_the_clock()
        try:
            yield
        except BaseException as exc:
            self.close_helpers(run_status(exc))
            raise
        self.close_helpers(run_status(None))
        if self.graceful_stop is not None and self.graceful_stop.received_signal is not None:
            raise TrainingInterrupted(self.graceful_stop.received_signal)

    def finish(self) -> None:
        """The dump of a run that trained to its end (``ok``), to a stop rule (``stopped``), to its eval-loss target
        or not (``converged``, ``not_converged``: --target_eval_loss) or nothing, its job finished already
        (``already_complete``: the journal it continues keeps the earlier segments' measurement); a dump that had to
        go to a fallback place is a storage error."""
        if self.already_complete is not None:
            status = ALREADY_COMPLETE
        elif self.time_to_train is not None:
            status = CONVERGED if self.time_to_train.converged_at is not None else NOT_CONVERGED
        else:
            status = "stopped" if self.bench is not None and self.bench.stop_reason else "ok"
        self.close_mlperf_log(status)  # --estimate_memory with it: a log that never reached run_start says why
        misplaced = self._finish(status)
        if misplaced is not None:
            raise StorageError(misplaced)

    def close_mlperf_log(self, outcome: str) -> None:
        """``run_stop`` (``aborted`` with ``outcome`` as its reason, unless the target was reached) and the log
        closed."""
        if self.mlperf_log is not None:
            self.mlperf_log.run_stop(ABORTED, reason=outcome)
            self.mlperf_log.close()

    def note_mirrored(self, tracker: Tracker) -> None:
        """Journal which Aim/MLflow run this is and whether tracking to it stopped."""
        if tracker.name == AIMSTACK_TRACKER:
            self.record.note(run_hash=tracker.run_hash, aim_degraded_reason=tracker.degraded_reason)
        else:
            self.record.note(mlflow_run_id=tracker.run_id, mlflow_degraded_reason=tracker.degraded_reason)

    def close_helpers(self, status: str) -> None:
        """Sampler and watchdog stopped, Aim and MLflow runs ended with ``status`` (bounded by their close timeouts):
        on every way out."""
        if self.bench is not None:
            self.bench.close()
        if self.profile is not None:
            self.profile.close()
        for tracker in self.mirrored:
            tracker.close(status)

    def _finish(self, status: str, error: dict[str, Any] | None = None) -> str | None:
        """End the record and write the dump at --metrics_path or, when it cannot be written there (disk full), whole
        at a fallback: the output directory, else the system's temporary directory. Returns None, or the line saying
        where it went, also printed on stderr."""
        if self.record is None:
            return None
        for tracker in self.mirrored:
            self.note_mirrored(tracker)
        dump = self.record.finish(
            status,
            training_steps=self.already_complete.global_step if status == ALREADY_COMPLETE else self.global_step() or 0,
            stop_reason=self.bench.stop_reason if status in ("stopped", NOT_CONVERGED) else None,
            error=error,
            peak_rss_bytes=peak_rss_bytes(),
            cuda=cuda_peak_memory(),
        )
        if dump is None or self.rank != 0:
            return None
        measured = (dump.get("summary") or {}).get("measured_steps")
        if dump["training_steps"] and not measured and status != ALREADY_COMPLETE:
            logger.warning(
                "the run never left its warmup (--skip_warmup_steps, --skip_warmup_seconds): its step figures cover "
                "all %d steps, warmup included, and goodput has no productive part; train longer or warm up less",
                dump["training_steps"],
            )
        failures = []  # "path: reason", --metrics_path first
        candidates = [self.paths.dump, *self.paths.dump_fallbacks(self.output_dir, os.getpid())]
        for path in dict.fromkeys(candidates):  # in order, each once
            try:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                write_dump(path, dump)
            except OSError as exc:
                failures.append(f"{path}: {exc.strerror or exc}")
                continue
            if not failures:
                return None
            outcome = f"wrote it to {path} instead"
            break
        else:
            outcome = "the journal holds what it had written"
        problem = f"cannot write the dump to --metrics_path {'; nor to '.join(failures)}; {outcome}"
        print_own_line(problem)
        return problem

    def report_failure(self, report: dict[str, Any]) -> None:
        """The failing rank's report: in the dump on rank 0, in its own file on any other rank."""
        interrupted = report["category"] == ErrorCategory.INTERRUPTED
        if self.oom_snapshot is not None and report["category"] == ErrorCategory.GPU_OOM and self.record is not None:
            taken = self.oom_snapshot.take()
            self.record.note(oom_snapshot=relative_paths(taken, os.path.dirname(self.paths.dump)))
        self.close_helpers(KILLED if interrupted else FAILED)
        self.close_mlperf_log(f"{report['category']}: {report.get('message', '')}")
        if self.profile is not None and self.profile.result is None and (result := self.profile.own_result()):
            self.note_profile(result)
        misplaced = self._finish("interrupted" if interrupted else "error", error=report)
        if misplaced is not None:  # the failure's own line is in the termination log already
            write_termination_log(f"{ErrorCategory.STORAGE}: {misplaced}")
        if self.rank != 0 and self.paths is not None:
            write_json_atomic(self.paths.rank_report(self.rank), report)

    def on_stall(self, idle: float) -> None:
        """Called by the watchdog thread while the main thread is stuck: report ``hang``, then end the process."""
        faulthandler.dump_traceback(all_threads=True)  # the stacks on stderr as well, for whoever reads the log
        stalled = TrainingStalled(
            f"no training progress for {idle:.0f}s (--stall_timeout {self.bench.watchdog.timeout:g}), "
            f"last completed step {self.global_step()}"
        )
        report = build_error_report(stalled, global_step=self.global_step(), extra={"thread_stacks": thread_stacks()})
        write_termination_log(termination_line(report))
        print_error_marker(report)
        self.report_failure(report)
        os._exit(report["exit_code"])
