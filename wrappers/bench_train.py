"""bench_train.py: fine-tune exactly like sft_trainer, and leave a benchmark record that needs no Aim server.

    python wrappers/bench_train.py <every tuning/sft_trainer.py flag> [--metrics_path run.json] [--auto_stop] ...
    torchrun --nproc_per_node=8 wrappers/bench_train.py ...   # the same; --help lists both flag sets

What a run leaves (dump, journal, Aim/MLflow run, error reports, exit codes): docs/benchmarking.md, "What a run leaves".
This file is the recipe to copy and adapt (docs/benchmarking.md, "Adapt the wrapper"): its flags are the dataclass
below, and ``main`` reads top to bottom, each step one call into ``tuning.benchmarking.api``. Add a flag as a field
of ``BenchmarkFlags``; add measurements with ``--callbacks`` or in step 5.
"""

import dataclasses
import functools
import sys

if __name__ == "__main__":
    # First of all, before torch loads: SIGTERM/Ctrl-C handlers (a preempted run still ends as `interrupted`) and the
    # helper processes of the trackers asked for (Aim and MLflow load while this process imports torch).
    from tuning.prologue import prologue

    early_helpers = prologue(sys.argv[1:])

import fire

from tuning.benchmarking import api as benchmarking  # the one surface this script takes from the project
from tuning.benchmarking.api import flag


@dataclasses.dataclass
class BenchmarkFlags:
    """Benchmark flags of bench_train.py, parsed with every flag of tuning/sft_trainer.py by one parser."""

    _argument_group_name = "bench_train.py flags"  # their own section of --help

    metrics_path: str | None = flag(None, "The dump (JSON) written at the end; default <output_dir>/benchmark.json.")
    metadata_path: str | None = flag(None, "JSON or YAML file holding an object of run metadata (nested allowed).")
    metadata: str | None = flag(None, "Inline JSON object of metadata; over the file's, over --exp_metadata's.")
    system_metrics_interval: float = flag(5.0, "Seconds between system-metric samples (CPU, memory, GPUs); 0: off.")
    stop_after_seconds: float | None = flag(None, "Stop after this many seconds of training; status 'stopped'.")
    auto_stop: bool = flag(False, "Stop once step times have settled after the warmup; status 'stopped'.")
    auto_stop_min_steps: int = flag(10, "Auto-stop needs at least this many steps after the warmup.")
    auto_stop_min_seconds: float = flag(60.0, "Auto-stop needs at least this many seconds of steps after the warmup.")
    auto_stop_tolerance: float = flag(0.1, "Auto-stop when the last steps' standard deviation / mean is at most this.")
    skip_warmup_steps: int = flag(5, "Steps left out of aggregates, summary and auto-stop, at least.")
    skip_warmup_seconds: float = flag(0.0, "Seconds of training left out likewise, at least.")
    stall_timeout: float | None = flag(None, "Seconds without training progress before the run ends as 'hang'; 0: off.")
    callbacks: str | None = flag(None, "Extra transformers callbacks, 'module:Name[,module:Name]', class or factory.")
    peak_tflops: float | None = flag(None, "The device's dense peak TFLOP/s for MFU; default: the datasheet table's.")
    estimate_memory: bool = flag(False, "Only predict the job's peak memory per device from its config; train nothing.")
    suggest_devices: float | None = flag(None, "Only print the fewest devices of this many GB the job fits on.")
    memory_estimate: bool = flag(True, "Predict the peak memory before training and measure the real one beside it.")
    profile_steps: str | None = flag(None, "Profile optimizer steps A-B (torch.profiler, every rank): traces, top ops.")
    profile_memory: bool = flag(False, "With --profile_steps: the memory timeline of the window too.")
    oom_snapshot: bool = flag(False, "On a GPU: record the allocator's last events; an OOM's dump links a snapshot.")
    target_eval_loss: float | None = flag(None, "Time to train: stop at the first evaluation with this eval loss.")
    eval_every_samples: int | None = flag(None, "Training samples between evaluations; default 384, per global batch.")
    eval_skip: int | None = flag(None, "First evaluations not run; default MLPerf's FLOOR(0.125 x global batch + 2).")
    mlperf_log: str | None = flag(None, "With --target_eval_loss: write the MLPerf result log (:::MLLOG lines) here.")
    mlperf_benchmark: str = flag("llama2_70b_lora", "The log's submission_benchmark.")
    mlperf_division: str = flag("open", "The log's submission_division: open or closed.")
    mlperf_org: str = flag("unspecified", "The log's submission_org.")
    mlperf_platform: str | None = flag(None, "The log's submission_platform; default <devices>x<device name>.")


def main(argv: list[str] | None = None, early_helpers: "benchmarking.EarlyHelpers | None" = None) -> int:
    """The recipe: one benchmark run, from the command line to its dump and exit status. ``early_helpers``: the
    tracker helpers the prologue started, for the trackers to adopt."""
    job = benchmarking.BenchmarkJob()  # the run's lifecycle: lock, journal, stall exit, dump, failure reports

    def run() -> None:
        # 1. Read the flags: the trainer's and ours, one parser (a JSON job config works as for sft_trainer). Then
        #    claim --metrics_path and open the journal: from here on every failure ends in the dump.
        flags, args = benchmarking.parse_command_line(BenchmarkFlags, argv)
        job.start(flags, args)
        # 2. Annotate the run: searchable metadata, from a file and/or inline, over --exp_metadata's.
        metadata = job.annotate(
            benchmarking.load_metadata(flags.metadata_path, flags.metadata, args.experiment_metadata)
        )
        extra_callbacks = benchmarking.load_callbacks(flags.callbacks)  # now: a bad one fails before any tracker
        # 3. Will it fit: the peak memory per device predicted from the model's config (no weights read), into the
        #    dump's ``estimate``. With --estimate_memory or --suggest_devices that is the whole run.
        job.estimate_memory(args)
        if flags.estimate_memory or flags.suggest_devices is not None:
            return job.finish()
        # 4. Trackers: --trackers' (Aim and MLflow failure-isolated, also receiving the benchmark's series).
        trackers = job.build_trackers(args.training_args.trackers, args.tracker_configs, early_helpers)
        # 5. The benchmark's callbacks: step times, tokens, system metrics, stop rules, stall watchdog; yours beside.
        callbacks = job.callbacks(extra_callbacks)
        # 6. Train: tuning.train() with every parsed config, so that it refuses what it does not support.
        with job.training():
            trainer, *_ = benchmarking.train(
                model_args=args.model_args,
                data_args=args.data_args,
                train_args=args.training_args,
                peft_config=args.tune_config,
                quantization_config=args.quantization_config,
                trainer_controller_args=args.trainer_controller_args,
                tracker_configs=args.tracker_configs,
                additional_callbacks=callbacks,
                exp_metadata=metadata,
                quantized_lora_config=args.quantized_lora_config,
                fusedops_kernels_config=args.fusedops_kernels_config,
                attention_and_distributed_packing_config=args.attention_and_distributed_packing_config,
                fast_moe_config=args.fast_moe_config,
                trackers=trackers,
            )
        # With --do_dataprocessing_only train() writes the processed data and trains nothing: no trainer, no model.
        if args.training_args.save_model_dir and trainer is not None:
            benchmarking.save(args.training_args.save_model_dir, trainer)
        # 7. Dump the metrics: at --metrics_path (or a fallback when it cannot take it).
        job.finish()

    # 8. Report failures: any failure becomes the dump (or this rank's report file), the termination-log line, the
    #    stderr marker and its category's exit code.
    return job.report_failures(run)


if __name__ == "__main__":
    # fire is the entry point; the command line goes whole to main's one parser (which keeps every value as typed).
    run = functools.partial(main, sys.argv[1:], early_helpers)
    sys.exit(fire.Fire(run, command=[], name="bench_train.py", serialize=lambda _: None))
