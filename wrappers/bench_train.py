"""bench_train.py: fine-tune exactly like sft_trainer, and leave a benchmark record that needs no Aim server.

    python wrappers/bench_train.py <every tuning/sft_trainer.py flag> [--metrics_path run.json] \\
        [--metadata_path meta.yaml] [--metadata '{"batch": 8}'] [--system_metrics_interval 5] \\
        [--stop_after_seconds 600 | --auto_stop] [--stall_timeout 900] [--callbacks my.module:MyCallback]

(also under ``torchrun``; ``--help`` lists both flag sets). A run leaves:

- the dump at ``--metrics_path`` (default ``<output_dir>/benchmark.json``), written atomically by rank 0 when the
  run ends, however it ends; schema in ``tuning.benchmarking.schema``
- its journal ``<metrics_path stem>.journal.jsonl``, one line per point as it is measured; after a SIGKILL,
  ``python -m tuning.benchmarking.rebuild <journal>`` turns it into a dump
- with ``--tracker aim``: an Aim run with the metadata as ``run.experiment_metadata.*`` params and the step time,
  token throughput and system metrics series; with ``--tracker mlflow`` the same in an MLflow run (metadata as
  ``params.<key>``)
- on failure: the ``TUNING_ERROR`` stderr line, the termination log, the category's exit code, the report in the
  dump (rank 0) or in ``<metrics_path>.rank<N>.error.json`` (rank N)

Adapting it: this file is a template. Read it top to bottom: 1. flags, 2. metadata, 3. Aim and MLflow, 4. the job.
Add a flag by adding a parameter (and its line in the docstring) to ``wrapper_flags``; add measurements with
``--callbacks`` or a callback in ``BenchmarkJob.run``; the dump format itself lives in ``tuning.benchmarking`` so that
every reader agrees on it.
"""

import faulthandler
import functools
import gc
import importlib
import json
import os
import socket
import sys
import typing
from types import SimpleNamespace
from typing import Any

import fire
import fire.helptext
import fire.trace
import psutil
import yaml
from transformers import TrainerCallback

from tuning.benchmarking.callback import BenchmarkCallback
from tuning.benchmarking.dump import rank_report_path, write_dump
from tuning.benchmarking.journal import Journal, journal_path
from tuning.benchmarking.record import RunRecord
from tuning.benchmarking.stopping import StopRule
from tuning.benchmarking.system_metrics import cuda_peak_memory, environment_info, peak_rss_bytes
from tuning.benchmarking.watchdog import StallWatchdog, thread_stacks
from tuning.config.tracker_configs import TrackerConfigFactory
from tuning.sft_trainer import ParsedArguments, get_parser, parse_arguments, train, validate_arguments
from tuning.trackers import Tracker, build_trackers, validate_tracker_names
from tuning.utils.config_utils import read_job_config
from tuning.utils.error_logging import (
    GracefulStopCallback,
    TrainingInterrupted,
    TrainingStalled,
    UserInputError,
    build_error_report,
    print_error_marker,
    run_with_error_reporting,
    termination_line,
    write_json_atomic,
    write_termination_log,
)

PROG = "bench_train.py"
RANK = int(os.environ.get("RANK", "0"))
LOCAL_RANK = int(os.environ.get("LOCAL_RANK", "0"))
WORLD_SIZE = int(os.environ.get("WORLD_SIZE", "1"))

# ---------------------------------------------------------------------------------------------------------------------
# 1. Flags. fire reads the wrapper's flags; everything else goes, as typed, to sft_trainer's own parser, so every
#    trainer flag keeps its spelling and its parser's types (`--experiment 123` stays a string).
# ---------------------------------------------------------------------------------------------------------------------


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
) -> dict[str, Any]:
    """Benchmark flags of bench_train.py. Every flag of tuning/sft_trainer.py is accepted too (listed below).

    Args:
        metrics_path: The dump (JSON), written atomically when the run ends; default <output_dir>/benchmark.json.
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
        stall_timeout: Seconds without training progress after which the run is reported as "hang" and ended.
        callbacks: Extra transformers callbacks, "module:Name[,module:Name]"; Name is a class or factory taking no
            arguments.
    """
    return dict(locals())


_FLAG_TYPES = typing.get_type_hints(wrapper_flags)
_FLAG_NAMES = set(_FLAG_TYPES) - {"return"}
# fire's own one-letter aliases: the first letter of a flag no other flag starts with.
_SHORT_FLAGS = {name[0]: name for name in _FLAG_NAMES if sum(other[0] == name[0] for other in _FLAG_NAMES) == 1}


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """(wrapper tokens, trainer tokens), keeping each flag's value with it and every token exactly as typed."""
    wrapper, trainer = [], []
    index = 0
    while index < len(argv):
        token = argv[index]
        key = token[2:].split("=", 1)[0].replace("-", "_") if token.startswith("--") else None
        if token.startswith("-") and len(token) == 2 and token[1] in _SHORT_FLAGS:
            key = _SHORT_FLAGS[token[1]]
        if key is not None and key.startswith("no") and key[2:] in _FLAG_NAMES and _FLAG_TYPES[key[2:]] is bool:
            wrapper.append(token)  # fire's --noauto_stop
        elif key in _FLAG_NAMES:
            wrapper.append(token)
            takes_value = "=" not in token and index + 1 < len(argv)
            if takes_value and _FLAG_TYPES[key] is bool:
                takes_value = argv[index + 1].lower() in ("true", "false")
            if takes_value:
                index += 1
                wrapper.append(argv[index])
        else:
            trainer.append(token)
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
        raise UserInputError(f"--{name} {value!r} is not a valid {kind.__name__}") from exc


def parse_command_line(argv: list[str]) -> tuple[SimpleNamespace, ParsedArguments]:
    wrapper_argv, trainer_argv = split_argv(argv)
    # Every value reaches us as typed (fire would read '{"a": true}' as a Python literal); _typed converts them.
    raw = fire.decorators.SetParseFn(str)(functools.partial(wrapper_flags))
    values = fire.Fire(raw, command=wrapper_argv, name=PROG, serialize=lambda _: None)
    flags = SimpleNamespace(**{name: _typed(name, value) for name, value in values.items()})
    saved_argv, sys.argv = sys.argv, [sys.argv[0], *trainer_argv]  # parse_arguments reads sys.argv
    try:
        args = parse_arguments(get_parser(), read_job_config())
    finally:
        sys.argv = saved_argv
    return flags, args


def print_help() -> None:
    print(fire.helptext.HelpText(wrapper_flags, trace=fire.trace.FireTrace(wrapper_flags, name=PROG)))
    print("\nTRAINER FLAGS (tuning/sft_trainer.py)\n")
    print(get_parser().format_help())


# ---------------------------------------------------------------------------------------------------------------------
# 2. Metadata: searchable labels of the run (model, batch size, hardware, benchmark id), from a file and/or inline.
# ---------------------------------------------------------------------------------------------------------------------


def load_metadata(path: str | None, inline: str | None, exp_metadata: dict | None) -> dict[str, Any]:
    metadata = dict(exp_metadata or {})
    sources: list[tuple[str, Any]] = []
    if path is not None:
        try:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
            sources.append(
                (f"--metadata_path {path}", json.loads(text) if path.endswith(".json") else yaml.safe_load(text))
            )
        except OSError as exc:
            raise UserInputError(f"cannot read --metadata_path {path}: {exc.strerror or exc}") from exc
        except (json.JSONDecodeError, yaml.YAMLError) as exc:
            raise UserInputError(
                f"--metadata_path {path} is not valid JSON/YAML: {' '.join(str(exc).split())}"
            ) from exc
    if inline is not None:
        try:
            sources.append(("--metadata", json.loads(inline)))
        except json.JSONDecodeError as exc:
            raise UserInputError(f"--metadata is not valid JSON: {exc}") from exc
    for source, value in sources:
        if not isinstance(value, dict):
            raise UserInputError(f"{source} must hold an object (key: value pairs), got {type(value).__name__}")
        metadata.update(value)
    # YAML dates and the like become strings: the dump is JSON and Aim params take JSON types.
    return json.loads(json.dumps(metadata, default=str))


# ---------------------------------------------------------------------------------------------------------------------
# 3. Aim and MLflow: the trackers' failure-isolated callbacks, plus the benchmark's series; the metadata arrives
#    through train().
# ---------------------------------------------------------------------------------------------------------------------

# Trackers that also receive the benchmark's series, and what the dump notes about their runs.
MIRRORED_TRACKERS = {
    "aim": lambda tracker: {"run_hash": tracker.run_hash, "aim_degraded_reason": tracker.degraded_reason},
    "mlflow": lambda tracker: {"mlflow_run_id": tracker.run_id, "mlflow_degraded_reason": tracker.degraded_reason},
}


def benchmark_trackers(
    names: list[str], configs: TrackerConfigFactory, output_dir: str, params: dict[str, Any]
) -> list[Tracker]:
    """The Aim and MLflow trackers of a benchmark: their callbacks isolate every call (a dead server costs a warning,
    never the job) and their ``track_many`` receives the step-time, throughput and system series; train() hands them
    model_load_time and the metadata (``run.experiment_metadata.<key>`` in Aim, ``params.<key>`` in MLflow). Each
    library is imported only when its tracker is asked for."""
    trackers = build_trackers([name for name in names if name in MIRRORED_TRACKERS], configs, output_dir)
    for tracker in trackers:
        # The benchmark flags as the run's "benchmark" params, now: the first call opens the run while the job loads
        # its data and model, not beside the first training steps.
        tracker.set_params(params, "benchmark")
    return trackers


# ---------------------------------------------------------------------------------------------------------------------
# 4. The job: check everything cheap first, train with the benchmark's callbacks, leave a dump however it ends.
# ---------------------------------------------------------------------------------------------------------------------


def check_flags(flags: SimpleNamespace) -> None:
    if flags.system_metrics_interval < 0 or flags.skip_warmup_steps < 0 or flags.skip_warmup_seconds < 0:
        raise UserInputError("--system_metrics_interval, --skip_warmup_steps and --skip_warmup_seconds must be >= 0")
    if flags.stall_timeout is not None and flags.stall_timeout <= 0:
        raise UserInputError(f"--stall_timeout must be a positive number of seconds, got {flags.stall_timeout}")


def check_writable(path: str) -> None:
    """Fail now, not after hours of training, when the dump could not be written."""
    try:
        if os.path.isdir(path):
            raise IsADirectoryError(21, "Is a directory")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        probe = f"{path}.{os.getpid()}.probe"
        with open(probe, "w", encoding="utf-8"):
            pass
        os.remove(probe)
    except OSError as exc:
        raise UserInputError(f"cannot write --metrics_path {path}: {exc.strerror or exc}") from exc


def load_callbacks(spec: str | None) -> list[TrainerCallback]:
    """``module:Name`` entries, each a callback class or a factory returning one: the extension point for third
    parties' measurements (and for the tests' fault injection)."""
    callbacks = []
    for entry in filter(None, (part.strip() for part in (spec or "").split(","))):
        module_name, _, name = entry.partition(":")
        try:
            factory = getattr(importlib.import_module(module_name), name)
        except (ImportError, AttributeError, ValueError) as exc:
            raise UserInputError(f"--callbacks {entry}: cannot load it ({exc})") from exc
        callback = factory()
        if not isinstance(callback, TrainerCallback):
            raise UserInputError(f"--callbacks {entry} gave a {type(callback).__name__}, not a TrainerCallback")
        callbacks.append(callback)
    return callbacks


class BenchmarkJob:
    """One run. Rank 0 owns the record (dump + journal) and the Aim/MLflow runs; other ranks report only their own
    failure; each node's local rank 0 samples system metrics (other nodes into their own journal)."""

    def __init__(self):
        self.started = psutil.Process().create_time()  # the dump's start_time: process start, imports included
        self.metrics_path: str | None = None  # set once known to be writable
        self.stall_timeout: float | None = None
        self.record: RunRecord | None = None
        self.mirrored: list[Tracker] = []  # Aim and MLflow
        self.bench: BenchmarkCallback | None = None

    def global_step(self) -> int | None:
        return self.bench.global_step if self.bench is not None else None

    def run(self, argv: list[str]) -> None:
        flags, args = parse_command_line(argv)
        train_args = args.training_args
        check_flags(flags)
        metrics_path = os.path.abspath(flags.metrics_path or os.path.join(train_args.output_dir, "benchmark.json"))
        check_writable(metrics_path)
        self.metrics_path, self.stall_timeout = metrics_path, flags.stall_timeout
        sampling = flags.system_metrics_interval > 0 and LOCAL_RANK == 0
        if RANK == 0 or sampling:
            header = {
                "time": self.started,
                "experiment": args.tracker_configs.aim_config.experiment,
                "host": socket.gethostname(),
                "rank": RANK,
                "world_size": WORLD_SIZE,
                "environment": environment_info(),
                "flags": vars(flags),
            }
            self.record = RunRecord(Journal(journal_path(metrics_path, RANK)), header)
        # From here on every failure ends in the dump too.
        validate_arguments(args.model_args, args.data_args, train_args)
        metadata = load_metadata(flags.metadata_path, flags.metadata, args.exp_metadata)
        if self.record is not None:
            self.record.note(metadata=metadata)
        stop_rule = StopRule(
            flags.stop_after_seconds,
            flags.auto_stop,
            flags.auto_stop_min_steps,
            flags.auto_stop_min_seconds,
            flags.auto_stop_tolerance,
        )
        extra_callbacks = load_callbacks(flags.callbacks)
        tracker_names = validate_tracker_names(train_args.trackers)
        trackers = build_trackers(
            [name for name in tracker_names if name not in MIRRORED_TRACKERS],
            args.tracker_configs,
            train_args.output_dir,
        )
        if RANK == 0:
            trackers.append(self.record)  # receives model_load_time
        self.mirrored = benchmark_trackers(
            tracker_names, args.tracker_configs, train_args.output_dir, {"metrics_path": metrics_path, **vars(flags)}
        )
        mirrors = [tracker.get_hf_callback() for tracker in self.mirrored]

        def mirror(points: list) -> None:
            for callback in mirrors:
                callback.track_many(points)

        watchdog = StallWatchdog(flags.stall_timeout, self.on_stall) if flags.stall_timeout else None
        self.bench = BenchmarkCallback(
            self.record,
            stop_rule,
            warmup_steps=flags.skip_warmup_steps,
            warmup_seconds=flags.skip_warmup_seconds,
            system_metrics_interval=flags.system_metrics_interval if sampling else None,
            watchdog=watchdog,
            mirror=mirror if mirrors else None,
        )
        graceful_stop = GracefulStopCallback()
        # The benchmark callback before Aim's and MLflow's, so that its last samples reach their runs before they close.
        callbacks = [callback for tracker in trackers if (callback := tracker.get_hf_callback()) is not None]
        callbacks = [*callbacks, self.bench, *mirrors, graceful_stop, *extra_callbacks]
        trackers += self.mirrored
        try:
            train(
                args.model_args,
                args.data_args,
                train_args,
                peft_config=args.peft_config,
                callbacks=callbacks,
                trackers=trackers,
                exp_metadata=metadata,
            )
        finally:
            self.close_helpers()
        if graceful_stop.received_signal is not None:
            raise TrainingInterrupted(graceful_stop.received_signal)
        self.finish("stopped" if self.bench.stop_reason else "ok")

    def close_helpers(self) -> None:
        """Sampler and watchdog stopped, Aim and MLflow closed (bounded by their close timeouts): on every way out."""
        if self.bench is not None:
            self.bench.close()
        for tracker in self.mirrored:
            tracker.get_hf_callback().close()

    def finish(self, status: str, error: dict[str, Any] | None = None) -> None:
        if self.record is None:
            return
        for tracker in self.mirrored:
            self.record.note(**MIRRORED_TRACKERS[tracker.name](tracker))
        dump = self.record.finish(
            status,
            training_steps=self.global_step() or 0,
            stop_reason=self.bench.stop_reason if status == "stopped" else None,
            error=error,
            peak_rss_bytes=peak_rss_bytes(),
            cuda=cuda_peak_memory(),
        )
        if dump is not None and RANK == 0:
            write_dump(self.metrics_path, dump)

    def report_failure(self, report: dict[str, Any]) -> None:
        """The failing rank's report: in the dump on rank 0, in its own file on any other rank."""
        self.close_helpers()
        self.finish("error", error=report)
        if RANK != 0 and self.metrics_path is not None:
            write_json_atomic(rank_report_path(self.metrics_path, RANK), report)

    def on_stall(self, idle: float) -> None:
        """Called by the watchdog thread while the main thread is stuck: report ``hang``, then end the process."""
        faulthandler.dump_traceback(all_threads=True)  # the stacks on stderr as well, for whoever reads the log
        stalled = TrainingStalled(
            f"no training progress for {idle:.0f}s (--stall_timeout {self.stall_timeout:g}), "
            f"last completed step {self.global_step()}"
        )
        report = build_error_report(stalled, global_step=self.global_step(), extra={"thread_stacks": thread_stacks()})
        write_termination_log(termination_line(report))
        print_error_marker(report)
        self.report_failure(report)
        os._exit(report["exit_code"])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "-h" in argv or "--help" in argv:
        print_help()
        return 0
    gc.freeze()  # the imports' objects live as long as the job: spare the garbage collector rescanning them
    job = BenchmarkJob()
    return run_with_error_reporting(lambda: job.run(argv), on_error=job.report_failure, global_step=job.global_step)


if __name__ == "__main__":
    sys.exit(main())
