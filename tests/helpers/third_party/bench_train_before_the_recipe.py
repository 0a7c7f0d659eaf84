# An earlier bench_train.py, kept as third parties copied it: tests/benchmarking/test_public_surface.py runs it.
"""bench_train.py: fine-tune exactly like sft_trainer, and leave a benchmark record that needs no Aim server.

    python wrappers/bench_train.py <every tuning/sft_trainer.py flag> [--metrics_path run.json] [--auto_stop] ...
    torchrun --nproc_per_node=8 wrappers/bench_train.py ...   # the same; --help lists both flag sets

What a run leaves (dump, journal, Aim/MLflow run, error reports, exit codes): docs/benchmarking.md, "What a run leaves".
This file is a template to copy: it reads top to bottom (1. flags, 2. metadata, 3. Aim and MLflow, 4. the job) and
takes everything from ``tuning.benchmarking.api``. Add a flag as a parameter (and docstring line) of
``wrapper_flags``; add measurements with ``--callbacks`` or in ``BenchmarkJob.run``.
"""

import sys

if __name__ == "__main__":
    # First of all: a SIGTERM (preemption) or Ctrl-C while the imports below load, or before training, still ends the
    # run as `interrupted`; once the journal exists, with a dump of status "interrupted" and the journal's end record.
    # (from error_logging itself: the api module loads torch, which is what these handlers must come before)
    from tuning.utils.error_logging import install_early_signal_handlers

    install_early_signal_handlers()
    # Then the helper processes of the trackers asked for (Aim, MLflow): they import their libraries while this
    # process imports torch, not beside the first training steps.
    from tuning.trackers import start_helpers

    start_helpers(sys.argv[1:])

import argparse
import faulthandler
import fcntl
import functools
import importlib
import json
import logging
import os
import socket
import tempfile
import typing
from types import SimpleNamespace
from typing import Any

import fire
import fire.helptext
import fire.trace
import psutil
import yaml
from transformers import TrainerCallback

# Everything from this project comes from one documented surface: tuning.benchmarking.api (its __all__).
from tuning.benchmarking import api as benchmarking

PROG = "bench_train.py"
logger = logging.getLogger(PROG)
RANK = int(os.environ.get("RANK", "0"))
LOCAL_RANK = int(os.environ.get("LOCAL_RANK", "0"))
WORLD_SIZE = int(os.environ.get("WORLD_SIZE", "1"))
# Room the dump and journal need at least: a filesystem with less is refused before training.
MIN_FREE_BYTES = 16 * 2**20

# ---------------------------------------------------------------------------------------------------------------------
# 1. Flags. fire reads the wrapper's flags; everything else goes, as typed, to sft_trainer's own parser, so every
#    trainer flag keeps its spelling and its parser's types (`--experiment 123` stays a string).


def wrapper_flags(
    metrics_path: str | None = None,
    metadata_path: str | None = None,
    metadata: str | None = None,
    system_metrics_interval: float = 5.0,
    stop_after_seconds: float | None = None,
    auto_stop: bool = False,
    auto_stop_min_steps: int = 10,
    auto_stop_min_seconds: float = 60.0,
    auto_stop_tolerance: float = 0.1,
    skip_warmup_steps: int = 5,
    skip_warmup_seconds: float = 0.0,
    stall_timeout: float | None = None,
    callbacks: str | None = None,
    peak_tflops: float | None = None,
) -> dict[str, Any]:
    """Benchmark flags of bench_train.py. Every flag of tuning/sft_trainer.py is accepted too (listed below).

    Args:
        metrics_path: The dump (JSON) written when the run ends; default <output_dir>/benchmark.json; one run at a time.
        metadata_path: JSON or YAML file holding an object of run metadata (nested objects allowed).
        metadata: Inline JSON object of run metadata; its keys override the file's, which override --exp_metadata's.
        system_metrics_interval: Seconds between system-metric samples (CPU, memory, GPUs); 0 turns sampling off.
        stop_after_seconds: Stop after this many seconds of training (model loading excluded); status "stopped".
        auto_stop: Stop once step times have settled after the warmup (see the auto_stop_* flags); status "stopped".
        auto_stop_min_steps: Auto-stop needs at least this many steps after the warmup, and judges the last ones.
        auto_stop_min_seconds: Auto-stop needs at least this many seconds of steps after the warmup.
        auto_stop_tolerance: Auto-stop when the last steps' time varies by at most this (standard deviation / mean).
        skip_warmup_steps: Steps left out of aggregates, summary and auto-stop, at least.
        skip_warmup_seconds: Seconds of training left out likewise, at least (the warmup ends when both are over).
        stall_timeout: Seconds without training progress after which the run is reported as "hang" and ended; 0: off.
        callbacks: Extra transformers callbacks, "module:Name[,module:Name]", each a class or a no-argument factory.
        peak_tflops: The device's dense peak TFLOP/s for the dump's MFU; default: the datasheet table's, by device name.
    """
    return dict(locals())


_FLAG_TYPES = typing.get_type_hints(wrapper_flags)
_FLAG_NAMES = set(_FLAG_TYPES) - {"return"}


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """(wrapper tokens, trainer tokens), keeping each flag's value with it and every token exactly as typed."""
    wrapper, trainer = [], []
    index = 0
    while index < len(argv):
        token = argv[index]
        key = token[2:].split("=", 1)[0].replace("-", "_") if token.startswith("--") else None
        if key not in _FLAG_NAMES:
            trainer.append(token)
        else:
            wrapper.append(token)
            value = argv[index + 1] if "=" not in token and index + 1 < len(argv) else None
            if value is not None and (_FLAG_TYPES[key] is not bool or value.lower() in ("true", "false")):
                wrapper.append(value)
                index += 1
        index += 1
    return wrapper, trainer


def _typed(name: str, value: Any) -> Any:
    """A raw flag string converted to the flag's annotated type; defaults pass through."""
    if not isinstance(value, str):
        return value
    kind = next(t for t in typing.get_args(_FLAG_TYPES[name]) or (_FLAG_TYPES[name],) if t is not type(None))
    try:
        if kind is bool:
            return {"true": True, "false": False}[value.lower()]
        return kind(value)
    except (KeyError, ValueError) as exc:
        raise benchmarking.UserInputError(f"--{name} {value!r} is not a valid {kind.__name__}") from exc


def parse_command_line(argv: list[str]) -> tuple[SimpleNamespace, benchmarking.ParsedArguments]:
    wrapper_argv, trainer_argv = split_argv(argv)
    # Every value reaches us as typed (fire would read '{"a": true}' as a Python literal); _typed converts them.
    raw = fire.decorators.SetParseFn(str)(functools.partial(wrapper_flags))
    values = fire.Fire(raw, command=wrapper_argv, name=PROG, serialize=lambda _: None)
    flags = SimpleNamespace(**{name: _typed(name, value) for name, value in values.items()})
    parser, job_config = benchmarking.get_parser(), benchmarking.get_json_config()
    if not job_config:
        check_trainer_flags(parser, trainer_argv)
    return flags, benchmarking.parse_arguments(parser, job_config, args=trainer_argv)


def check_trainer_flags(parser: argparse.ArgumentParser, trainer_argv: list[str]) -> None:
    """A flag that is neither ours nor the trainer's is a user error naming the closest valid one, before any work:
    the trainer's parser would only warn (as fms-hf-tuning ignores it) and a benchmark would run without it."""
    known, leftovers = parser.parse_known_args(trainer_argv)
    if leftovers:
        names = sorted({*vars(known), *_FLAG_NAMES})
        flag = next((token for token in leftovers if token.startswith("-")), None)
        if flag is None:
            raise benchmarking.UserInputError(f"unexpected argument {leftovers[0]!r}: flags are written --name value")
        raise benchmarking.UserInputError(benchmarking.unknown_flag_message(flag, names))


# ---------------------------------------------------------------------------------------------------------------------
# 2. Metadata: searchable labels of the run (model, batch size, hardware, benchmark id), from a file and/or inline.


def load_metadata(path: str | None, inline: str | None, exp_metadata: dict | None) -> dict[str, Any]:
    metadata = dict(exp_metadata or {})
    sources = []  # (flag, its text, its parser, what the text must be)
    if path is not None:
        try:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
        except OSError as exc:
            raise benchmarking.UserInputError(f"cannot read --metadata_path {path}: {exc.strerror or exc}") from exc
        parse = json.loads if path.endswith(".json") else yaml.safe_load
        sources.append((f"--metadata_path {path}", text, parse, "JSON/YAML"))
    if inline is not None:
        sources.append(("--metadata", inline, json.loads, "JSON"))
    for source, text, parse, kind in sources:
        try:
            value = parse(text)
        except (json.JSONDecodeError, yaml.YAMLError) as exc:
            raise benchmarking.UserInputError(f"{source} is not valid {kind}: {' '.join(str(exc).split())}") from exc
        if not isinstance(value, dict):
            raise benchmarking.UserInputError(
                f"{source} must hold an object (key: value pairs), got {type(value).__name__}"
            )
        metadata.update(value)
    # YAML dates and the like become strings: the dump is JSON and Aim params take JSON types.
    return json.loads(json.dumps(metadata, default=str))


# ---------------------------------------------------------------------------------------------------------------------
# 3. Aim and MLflow: failure-isolated trackers that also receive the benchmark's series.

MIRRORED_TRACKERS = (benchmarking.AIMSTACK_TRACKER, benchmarking.MLFLOW_TRACKER)  # they get the series too


def tracked_experiment(configs: Any, names: list[str]) -> str | None:
    """The experiment the run is tracked under, Aim's or else MLflow's; None when no tracker keeps experiments."""
    if benchmarking.AIMSTACK_TRACKER in names:
        return configs.aim_experiment
    return configs.mlflow_experiment if benchmarking.MLFLOW_TRACKER in names else None


def benchmark_trackers(
    names: list[str], configs: Any, params: dict[str, Any]
) -> tuple[list[benchmarking.Tracker], list[benchmarking.Tracker]]:
    """(the other trackers, Aim and MLflow). Aim's and MLflow's callbacks isolate every call (a dead server costs a
    warning, never the job) and also receive the benchmark's series; each library is imported only when asked for."""
    trackers: list[benchmarking.Tracker] = []
    with benchmarking.closed_on_failure(trackers):  # a bad config: the runs opened before it end as failed
        for name in names:
            trackers.append(tracker := benchmarking.get_tracker(name, configs))
            if tracker.name in MIRRORED_TRACKERS:
                # The flags as "benchmark" params now: the run opens while the job loads its model.
                tracker.set_params(params, "benchmark")
    mirrored = [tracker for tracker in trackers if tracker.name in MIRRORED_TRACKERS]
    return [tracker for tracker in trackers if tracker not in mirrored], mirrored


# ---------------------------------------------------------------------------------------------------------------------
# 4. The job: check everything cheap first, train with the benchmark's callbacks, leave a dump however it ends.


def check_flags(flags: SimpleNamespace) -> None:
    for name in ("system_metrics_interval", "skip_warmup_steps", "skip_warmup_seconds", "stall_timeout"):
        if (getattr(flags, name) or 0) < 0:
            raise benchmarking.UserInputError(f"--{name} must not be negative, got {getattr(flags, name)}")
    if flags.peak_tflops is not None and not flags.peak_tflops > 0:
        raise benchmarking.UserInputError(f"--peak_tflops must be positive, got {flags.peak_tflops}")


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
        raise benchmarking.UserInputError(f"cannot write --metrics_path {path}: {exc.strerror or exc}") from exc
    free = room.f_bavail * room.f_frsize
    if room.f_blocks and free < MIN_FREE_BYTES:  # f_blocks 0: a filesystem that does not report its size
        raise benchmarking.StorageError(
            f"--metrics_path {path}: only {free / 2**20:.1f} MiB free on its filesystem, "
            f"the dump and journal need at least {MIN_FREE_BYTES // 2**20} MiB"
        )


def claim_metrics_path(path: str) -> int:
    """Own ``path`` for the run's lifetime: an exclusive ``flock`` on ``<path>.lock`` (which names its holder), held by
    the returned descriptor and released by the kernel when the process ends, however it ends."""
    lock_path = f"{path}.lock"
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
        raise benchmarking.UserInputError(
            f"--metrics_path {path} is in use by another run ({who}, lock {lock_path}): give each run its own"
        ) from None
    except OSError as exc:  # ENOLCK, EOPNOTSUPP: a filesystem that does not do locks
        logger.warning("cannot lock %s (%s): a second run on this --metrics_path would go unnoticed", lock_path, exc)
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname()}).encode(), 0)
    return fd


def load_callbacks(spec: str | None) -> list[TrainerCallback]:
    """``module:Name`` entries, each a callback class or a factory returning one."""
    callbacks = []
    for entry in filter(None, (part.strip() for part in (spec or "").split(","))):
        module_name, _, name = entry.partition(":")
        try:
            factory = getattr(importlib.import_module(module_name), name)
        except (ImportError, AttributeError, ValueError) as exc:
            raise benchmarking.UserInputError(f"--callbacks {entry}: cannot load it ({exc})") from exc
        callback = factory()
        if not isinstance(callback, TrainerCallback):
            raise benchmarking.UserInputError(
                f"--callbacks {entry} gave a {type(callback).__name__}, not a TrainerCallback"
            )
        callbacks.append(callback)
    return callbacks


class BenchmarkJob:
    """One run. Rank 0 owns the record (dump + journal) and the Aim/MLflow runs; other ranks report only their own
    failure; each node's local rank 0 samples system metrics (other nodes into their own journal)."""

    def __init__(self):
        self.started = psutil.Process().create_time()  # the dump's start_time: process start, imports included
        self.metrics_path: str | None = None  # set once known to be writable and owned by this run
        self.output_dir: str | None = None
        self.metrics_path_lock: int | None = None
        self.record: benchmarking.RunRecord | None = None
        self.mirrored: list[benchmarking.Tracker] = []  # Aim and MLflow
        self.bench: benchmarking.BenchmarkCallback | None = None

    def global_step(self) -> int | None:
        return self.bench.global_step if self.bench is not None else None

    def run(self, argv: list[str]) -> None:
        flags, args = parse_command_line(argv)
        train_args = args.training_args
        if train_args.resume_from_checkpoint is None:  # a benchmark measures whole runs: resume only when told to
            train_args.resume_from_checkpoint = "false"
        check_flags(flags)
        benchmarking.check_output_dir(train_args.output_dir)
        metrics_path = os.path.abspath(flags.metrics_path or os.path.join(train_args.output_dir, "benchmark.json"))
        check_writable(metrics_path)
        sampling = flags.system_metrics_interval > 0 and LOCAL_RANK == 0
        writes_files = RANK == 0 or sampling  # at the metrics path: the dump, or a journal of its own
        if writes_files:
            self.metrics_path_lock = claim_metrics_path(metrics_path if RANK == 0 else f"{metrics_path}.rank{RANK}")
        self.metrics_path, self.output_dir = metrics_path, os.path.abspath(train_args.output_dir)
        if writes_files:
            header = {
                "time": self.started,
                "experiment": tracked_experiment(args.tracker_configs, train_args.trackers),
                "host": socket.gethostname(),
                "rank": RANK,
                "world_size": WORLD_SIZE,
                "environment": benchmarking.environment_info(),
                "flags": vars(flags),
            }
            self.record = benchmarking.RunRecord(
                benchmarking.Journal(benchmarking.journal_path(metrics_path, RANK)), header
            )
        # From here on every failure ends in the dump too.
        benchmarking.validate_arguments(args.model_args, args.data_args, train_args)
        metadata = load_metadata(flags.metadata_path, flags.metadata, args.experiment_metadata)
        if self.record is not None:
            self.record.note(metadata=metadata)
        stop_rule = benchmarking.StopRule(
            flags.stop_after_seconds,
            flags.auto_stop,
            flags.auto_stop_min_steps,
            flags.auto_stop_min_seconds,
            flags.auto_stop_tolerance,
        )
        extra_callbacks = load_callbacks(flags.callbacks)
        trackers, self.mirrored = benchmark_trackers(
            benchmarking.validate_tracker_names(train_args.trackers),
            args.tracker_configs,
            {"metrics_path": metrics_path, **vars(flags)},
        )
        if RANK == 0:
            trackers.append(self.record)  # receives model_load_time
        mirrors = benchmarking.hf_callbacks(self.mirrored)
        if self.record is not None:  # journaled as soon as each run exists: a killed run's dump still links it
            for tracker in self.mirrored:
                tracker.get_hf_callback().when_run_info_known(functools.partial(self.note_mirrored, tracker))

        def mirror(points: list) -> None:
            for callback in mirrors:
                callback.track_many(points)

        watchdog = benchmarking.StallWatchdog(flags.stall_timeout, self.on_stall) if flags.stall_timeout else None
        # One collective per step decides both callbacks' stops on every rank.
        stop_agreement = benchmarking.StopAgreement()
        graceful_stop = benchmarking.GracefulStopCallback(stop_agreement)
        self.bench = benchmarking.BenchmarkCallback(
            self.record,
            stop_rule,
            warmup_steps=flags.skip_warmup_steps,
            warmup_seconds=flags.skip_warmup_seconds,
            system_metrics_interval=flags.system_metrics_interval if sampling else None,
            watchdog=watchdog,
            mirror=mirror if mirrors else None,
            stop_agreement=stop_agreement,
            peak_tflops=flags.peak_tflops,
        )
        # The trainer calls callbacks in this order, each hook with the same logs dict. First the benchmark's step
        # hooks (a step's time and number before any extension's work on it), then the extensions, then every
        # reader of trainer logs, so that a number an extension adds to the logs reaches the dump and each tracker:
        # the dump's, then the trackers' (train() installs them after these, in this order), Aim and MLflow last,
        # so that the benchmark's last samples reach their runs before they close.
        callbacks = [self.bench, graceful_stop, *extra_callbacks, self.bench.log_recorder]
        trackers += self.mirrored
        try:
            trainer, *_ = benchmarking.train(
                args.model_args,
                args.data_args,
                train_args,
                args.tune_config,
                tracker_configs=args.tracker_configs,
                additional_callbacks=callbacks,
                exp_metadata=metadata,
                trackers=trackers,
            )
        finally:  # the runs end with the job's outcome so far
            self.close_helpers(benchmarking.run_status(sys.exception()))
        if graceful_stop.received_signal is not None:
            raise benchmarking.TrainingInterrupted(graceful_stop.received_signal)
        if train_args.save_model_dir:
            benchmarking.save(train_args.save_model_dir, trainer)
        misplaced = self.finish("stopped" if self.bench.stop_reason else "ok")
        if misplaced is not None:
            raise benchmarking.StorageError(misplaced)

    def note_mirrored(self, tracker: benchmarking.Tracker, *_: Any) -> None:
        """Journal which Aim/MLflow run this is and whether tracking to it stopped."""
        if tracker.name == benchmarking.AIMSTACK_TRACKER:
            self.record.note(run_hash=tracker.run_hash, aim_degraded_reason=tracker.degraded_reason)
        else:
            self.record.note(mlflow_run_id=tracker.run_id, mlflow_degraded_reason=tracker.degraded_reason)

    def close_helpers(self, status: str) -> None:
        """Sampler and watchdog stopped, Aim and MLflow runs ended with ``status`` (bounded by their close timeouts):
        on every way out."""
        if self.bench is not None:
            self.bench.close()
        for tracker in self.mirrored:
            tracker.close(status)

    def finish(self, status: str, error: dict[str, Any] | None = None) -> str | None:
        """End the record and write the dump at --metrics_path or, when it cannot be written there (disk full), whole
        at a fallback: the output directory, else the system's temporary directory. Returns None, or the line saying
        where it went, also printed on stderr."""
        if self.record is None:
            return None
        for tracker in self.mirrored:
            self.note_mirrored(tracker)
        dump = self.record.finish(
            status,
            training_steps=self.global_step() or 0,
            stop_reason=self.bench.stop_reason if status == "stopped" else None,
            error=error,
            peak_rss_bytes=benchmarking.peak_rss_bytes(),
            cuda=benchmarking.cuda_peak_memory(),
        )
        if dump is None or RANK != 0:
            return None
        name = os.path.basename(self.metrics_path)
        fallbacks = [os.path.join(self.output_dir, name), os.path.join(tempfile.gettempdir(), f"{os.getpid()}-{name}")]
        failures = []  # "path: reason", --metrics_path first
        for path in dict.fromkeys([self.metrics_path, *fallbacks]):  # in order, each once
            try:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                benchmarking.write_dump(path, dump)
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
        benchmarking.print_own_line(problem)
        return problem

    def report_failure(self, report: dict[str, Any]) -> None:
        """The failing rank's report: in the dump on rank 0, in its own file on any other rank."""
        interrupted = report["category"] == benchmarking.ErrorCategory.INTERRUPTED
        self.close_helpers(benchmarking.KILLED if interrupted else benchmarking.FAILED)
        status = "interrupted" if interrupted else "error"
        misplaced = self.finish(status, error=report)
        if misplaced is not None:  # the failure's own line is in the termination log already
            benchmarking.write_termination_log(f"{benchmarking.ErrorCategory.STORAGE}: {misplaced}")
        if RANK != 0 and self.metrics_path is not None:
            benchmarking.write_json_atomic(benchmarking.rank_report_path(self.metrics_path, RANK), report)

    def on_stall(self, idle: float) -> None:
        """Called by the watchdog thread while the main thread is stuck: report ``hang``, then end the process."""
        faulthandler.dump_traceback(all_threads=True)  # the stacks on stderr as well, for whoever reads the log
        stalled = benchmarking.TrainingStalled(
            f"no training progress for {idle:.0f}s (--stall_timeout {self.bench.watchdog.timeout:g}), "
            f"last completed step {self.global_step()}"
        )
        report = benchmarking.build_error_report(
            stalled, global_step=self.global_step(), extra={"thread_stacks": benchmarking.thread_stacks()}
        )
        benchmarking.write_termination_log(benchmarking.termination_line(report))
        benchmarking.print_error_marker(report)
        self.report_failure(report)
        os._exit(report["exit_code"])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "-h" in argv or "--help" in argv:
        print(fire.helptext.HelpText(wrapper_flags, trace=fire.trace.FireTrace(wrapper_flags, name=PROG)))
        print("\nTRAINER FLAGS (tuning/sft_trainer.py)\n")
        print(benchmarking.get_parser().format_help())
        return 0
    job = BenchmarkJob()
    try:
        return benchmarking.run_with_error_reporting(
            lambda: job.run(argv), on_error=job.report_failure, global_step=job.global_step
        )
    finally:
        if job.metrics_path_lock is not None:
            os.close(job.metrics_path_lock)


if __name__ == "__main__":
    sys.exit(main())
