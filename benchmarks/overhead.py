"""Does the tool distort what it measures? The same training as bare TRL, as sft_trainer and as bench_train.

Each arm runs the identical work (the tiny Llama of ``tuning.utils.tiny_model``, the shipped sample data, fixed
steps, batch size, sequence length and seed; float32, bf16 and gradient checkpointing off, one logged loss per step)
as a separate process, alternating arms run by run, each round starting one arm later than the last (trl,
sft_trainer, bench_train; sft_trainer, bench_train, trl; …), so that no arm owes its numbers to its position:

  trl          ``benchmarks/bare_trl.py``: TRL's SFTTrainer with no callbacks, the baseline; it freezes the import
               heap out of the garbage collector's reach (``gc.freeze()``) as our CLIs do, so that the ratios
               measure what we add to training
  trl_plain    the same without the freeze, as a plain TRL script runs: what the freeze itself is worth (run it
               with ``--arms trl_plain``; not in ``all``)
  sft_trainer  ``tuning/sft_trainer.py`` with the default file logger
  bench_train  ``wrappers/bench_train.py`` with a local Aim repo (and the file logger, on with any tracker), its
               journal and system metrics
  bench_train_no_aim
               the same without Aim (``--trackers none``): what bench_train's own measuring costs, apart from Aim's
               writer process

Every arm is timed the same way, from outside and by the trainer itself:
  process  spawn to exit (imports, data, model load, training, saving)
  CPU      the process's user + system CPU time (from wait4): a proxy for process that load on a shared machine
           hardly disturbs
  startup  spawn to the first step's log line on stdout (everything before training, plus one step)
  loop     the trainer's own ``train_runtime`` from its final log line (the training loop, callbacks included)
  step     the median time between consecutive steps' log lines on stdout: the per-step cost of the loop, robust to
           the bursts of other load that make loop totals of identical runs differ by 10-20 % on a shared machine
Ratios are medians of per-round ratios against the trl run of the same round, so slow drift of a shared machine
cancels out. The per-step losses must agree across arms (the ``same work`` column): proof the work was identical.

Whole-run ratios cannot resolve 1 % where identical runs differ by 10 %, so each run also accounts for its loop from
inside (``benchmarks/attribution/sitecustomize.py``): time in our callback hooks, CPU of our other threads, and the
slowing of training by our child processes (the Aim writer, the journal's writer), which work on the other CPU: the
steps a child's spell of work overlapped, against the steps around them, give how much slower a step runs
beside such work (pooled over all runs, with placebos: the same spells moved to where there was none), and that
times the children's CPU time is what they cost the loop. The sum is checked against the loop target.

Then it times bench_train's record path on a 100 000-point run: recording each step's points (paid in the loop), the
journal's writer catching up, and the end-of-run aggregation into the dump plus writing it (target < 1 s).

    python benchmarks/overhead.py                      # the full measurement (about 8 min on 2 quiet cores)
    python benchmarks/overhead.py --pairs 1 --max_steps 20 --arms trl,sft_trainer   # a quick check
"""

import argparse
import ast
import itertools
import json
import operator
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
ATTRIBUTION_DIR = REPO_ROOT / "benchmarks" / "attribution"  # its sitecustomize.py times each run's loop from inside
SAMPLE_TRAIN_PATH = REPO_ROOT / "tuning" / "data" / "samples" / "train.jsonl"
RESPONSE_TEMPLATE = "\n### Response:"
BASELINE = "trl"
TARGETS = {"process": 1.05, "loop": 1.01, "step": 1.01}
DUMP_TARGET_S = 1.0


@dataclass
class Settings:
    """The training every arm repeats; flags of the same names on the command line."""

    max_steps: int = 300
    batch_size: int = 4
    gradient_accumulation_steps: int = 1
    max_seq_length: int = 128
    seed: int = 42
    learning_rate: float = 5e-5
    threads: int = 1
    hidden_size: int = 64
    num_layers: int = 2
    system_metrics_interval: float = 5.0


@dataclass
class Run:
    """One process of one arm, timed from outside (process, CPU, startup) and by the trainer (loop)."""

    arm: str
    round: int
    process_s: float
    cpu_s: float
    startup_s: float
    loop_s: float
    step_s: float
    losses: list[str] = field(repr=False)
    attribution: dict = field(repr=False)


def training_flags(settings: Settings, model_dir: str, output_dir: str) -> list[str]:
    """Flags every arm understands with the same meaning (bare TRL's SFTConfig and our TrainingArguments)."""
    flags = {
        "model_name_or_path": model_dir,
        "training_data_path": str(SAMPLE_TRAIN_PATH),
        "dataset_text_field": "output",
        "response_template": RESPONSE_TEMPLATE,
        "torch_dtype": "float32",
        "output_dir": output_dir,
        "max_steps": settings.max_steps,
        "per_device_train_batch_size": settings.batch_size,
        "gradient_accumulation_steps": settings.gradient_accumulation_steps,
        "learning_rate": settings.learning_rate,
        "seed": settings.seed,
        "bf16": False,
        "gradient_checkpointing": False,
        "logging_strategy": "steps",
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
    }
    return [item for key, value in flags.items() for item in (f"--{key}", str(value))]


def trl_command(settings: Settings, model_dir: str, run_dir: Path) -> list[str]:
    return [
        sys.executable,
        str(REPO_ROOT / "benchmarks" / "bare_trl.py"),
        *training_flags(settings, model_dir, str(run_dir / "out")),
        "--max_length",
        str(settings.max_seq_length),
    ]


def our_command(script: str, settings: Settings, model_dir: str, run_dir: Path, *extra: str) -> list[str]:
    """A run of one of our scripts: the shared flags under our names, plus the arm's own."""
    return [
        sys.executable,
        str(REPO_ROOT / script),
        *training_flags(settings, model_dir, str(run_dir / "out")),
        "--max_seq_length",
        str(settings.max_seq_length),
        "--use_flash_attn",
        "False",
        *extra,
    ]


def sft_trainer_command(settings: Settings, model_dir: str, run_dir: Path) -> list[str]:
    return our_command("tuning/sft_trainer.py", settings, model_dir, run_dir, "--trackers", "file_logger")


def bench_train_command(settings: Settings, model_dir: str, run_dir: Path, *trackers: str) -> list[str]:
    # One Aim repo for all runs, as a benchmarking team keeps one.
    return our_command(
        "wrappers/bench_train.py",
        settings,
        model_dir,
        run_dir,
        "--trackers",
        *(trackers or ("aim", "--aim_repo", str(run_dir.parent / "aim"))),
        "--experiment",
        "overhead",
        "--metrics_path",
        str(run_dir / "metrics.json"),
        "--system_metrics_interval",
        str(settings.system_metrics_interval),
    )


def bench_train_no_aim_command(settings: Settings, model_dir: str, run_dir: Path) -> list[str]:
    return bench_train_command(settings, model_dir, run_dir, "none")


def trl_plain_command(settings: Settings, model_dir: str, run_dir: Path) -> list[str]:
    return [*trl_command(settings, model_dir, run_dir), "--gc_freeze", "False"]


ARMS = {
    "trl": trl_command,
    "sft_trainer": sft_trainer_command,
    "bench_train": bench_train_command,
    "bench_train_no_aim": bench_train_no_aim_command,
    "trl_plain": trl_plain_command,
}
DEFAULT_ARMS = ("trl", "sft_trainer", "bench_train", "bench_train_no_aim")


def child_env(settings: Settings) -> dict[str, str]:
    """The same environment for every arm: offline, unbuffered stdout (line arrival = log time), fixed threads."""
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONUNBUFFERED="1",
        OMP_NUM_THREADS=str(settings.threads),
        PYTHONPATH=os.pathsep.join(filter(None, [str(ATTRIBUTION_DIR), str(REPO_ROOT), env.get("PYTHONPATH")])),
    )
    return env


def parse_log_line(line: str) -> dict | None:
    """The dict transformers' progress callback prints for each log event, or None for any other line."""
    line = line.strip()
    if not line.startswith("{'"):
        return None
    try:
        logs = ast.literal_eval(line)
    except (ValueError, SyntaxError):
        return None
    return logs if isinstance(logs, dict) else None


def run_once(arm: str, round_index: int, command: list[str], run_dir: Path, env: dict[str, str]) -> Run:
    """Run one process, timestamping its stdout lines as they arrive; stderr goes to a file beside it."""
    run_dir.mkdir(parents=True)
    stderr_path = run_dir / "stderr.log"
    losses, step_times, runtime = [], [], None
    attribution_path, spells_dir = run_dir / "attribution.json", run_dir / "helper_spells"
    spells_dir.mkdir()
    env = {**env, "OVERHEAD_ATTRIBUTION_PATH": str(attribution_path), "OVERHEAD_HELPER_SPELLS_DIR": str(spells_dir)}
    with stderr_path.open("w") as stderr:
        start = time.perf_counter()
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env, cwd=REPO_ROOT)
        for line in process.stdout:
            logs = parse_log_line(line)
            if logs is None:
                continue
            if "loss" in logs:
                step_times.append(time.perf_counter())
                losses.append(logs["loss"])
            if "train_loss" in logs:  # the final log; with token counting on, every log has a train_runtime so far
                runtime = float(logs["train_runtime"])
        # wait4 rather than wait: the child's CPU time, which other load on a shared machine hardly changes.
        _, wait_status, usage = os.wait4(process.pid, 0)
        process_s = time.perf_counter() - start
        returncode = process.returncode = os.waitstatus_to_exitcode(wait_status)
    if returncode != 0 or len(step_times) < 2 or runtime is None:
        tail = stderr_path.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{arm} run {round_index} failed (exit {returncode}); stderr ends with:\n{tail}")
    step_s = statistics.median(map(operator.sub, step_times[1:], step_times[:-1]))
    cpu_s = usage.ru_utime + usage.ru_stime
    attribution = json.loads(attribution_path.read_text())
    spell_files = list(spells_dir.iterdir())  # one per helper process that read messages
    attribution["helper_processes"] = len(spell_files)
    attribution["helper_spells"] = sorted(
        json.loads(line) for path in spell_files for line in path.read_text().splitlines()
    )
    return Run(arm, round_index, process_s, cpu_s, step_times[0] - start, runtime, step_s, losses, attribution)


def summarise(runs: list[Run], arms: list[str], helper_slowdown: float | None) -> dict[str, dict]:
    """Per arm: medians and spreads of each timing, median per-round ratios against the baseline arm, and the
    in-run attribution (``helper_slowdown``: see ``interference``)."""
    baseline = {run.round: run for run in runs if run.arm == BASELINE}
    summary = {}
    for arm in arms:
        own = [run for run in runs if run.arm == arm]
        row = {"runs": len(own), "same_work": all(run.losses == baseline[run.round].losses for run in own)}
        for metric in ("process", "cpu", "startup", "loop", "step"):
            values = [getattr(run, f"{metric}_s") for run in own]
            ratios = [getattr(run, f"{metric}_s") / getattr(baseline[run.round], f"{metric}_s") for run in own]
            row[metric] = {
                "median_s": statistics.median(values),
                "min_s": min(values),
                "max_s": max(values),
                "ratio": statistics.median(ratios),
            }
        per_step = [per_step_attribution(run.attribution, helper_slowdown) for run in own]
        row["attribution"] = {key: median_of_known([values[key] for values in per_step]) for key in ATTRIBUTION_COLUMNS}
        summary[arm] = row
    return summary


# Per step of the training loop, from inside each run (benchmarks/attribution/sitecustomize.py).
ATTRIBUTION_COLUMNS = {
    "step_ms": "loop ms/step",
    "training_thread_cpu_ms": "training thread CPU ms/step",
    "trainer_hooks_us": "transformers/TRL hooks µs/step",
    "our_hooks_us": "our hooks µs/step",
    "our_hooks_percent": "our hooks %",
    "other_threads_cpu_us": "other threads CPU µs/step",
    "other_threads_percent": "other threads %",
    "child_processes_cpu_us": "child processes CPU µs/step",
    "helpers_percent": "child processes' slowing of training %",
    "total_percent": f"all ours, % of loop (≤ {(TARGETS['loop'] - 1) * 100:g})",
}
_TRAINER_MODULES = ("transformers.", "trl.")
PLACEBO_SHIFTS_S = (0.25, 0.5, 0.75)
MIN_STEPS = 10
NEIGHBOURS = 10


def steps_beside_helpers(attribution: dict, shift: float = 0.0) -> list[float]:
    """The steps of one run that helper work (a spell of the Aim writer or the journal's writer, on the other CPU)
    overlapped for at least half their time, each divided by the median of the steps around it that no spell covers
    (up to ``NEIGHBOURS`` on each side), so that the machine's drift and the first steps' warm-up cancel. ``shift``
    moves the spells: a placebo, whose steps should come out no slower than those around them."""
    spells = [(start + shift, end + shift) for start, end in attribution["helper_spells"]]
    durations, covered = [], []
    for begin, end in itertools.pairwise(attribution["step_ends"]):
        overlap = sum(max(0.0, min(end, stop) - max(begin, start)) for start, stop in spells)
        durations.append(end - begin)
        covered.append(overlap >= (end - begin) / 2)
    relative = []
    for index, duration in enumerate(durations):
        if not covered[index]:
            continue
        around = range(max(0, index - NEIGHBOURS), min(len(durations), index + NEIGHBOURS + 1))
        baseline = [durations[other] for other in around if not covered[other]]
        if len(baseline) >= NEIGHBOURS // 2:
            relative.append(duration / statistics.median(baseline))
    return relative


def interference(runs: list[Run]) -> dict[str, Any]:
    """How much slower a training step runs while a helper process works beside it on this machine (the other vCPU
    may share a core, and they share caches and memory bandwidth), in %: the median over the overlapped steps of all
    runs, each relative to the steps around it; and the same with the spells moved by each of
    ``PLACEBO_SHIFTS_S``, to where there was no such work (the noise). None with fewer than ``MIN_STEPS`` such steps
    (in practice only the Aim writer's spells last long enough to cover a step)."""

    def slowdown(shift: float) -> tuple[float | None, int]:
        relative = [ratio for run in runs for ratio in steps_beside_helpers(run.attribution, shift)]
        return ((statistics.median(relative) - 1) * 100 if len(relative) >= MIN_STEPS else None), len(relative)

    measured, steps = slowdown(0.0)
    return {"slowdown_percent": measured, "steps": steps, "placebo_percent": [slowdown(s)[0] for s in PLACEBO_SHIFTS_S]}


def per_step_attribution(attribution: dict, helper_slowdown: float | None) -> dict[str, float | None]:
    """One run's loop, per step: wall time, CPU of the training thread, time in the trainer's own callback hooks and
    in ours (every other callback: tuning's, the wrappers'), CPU of other threads and of child processes; and, in %
    of the loop, all that we add: our hooks, the other threads' CPU (counted as if it all stopped the training
    thread, which it does only while it holds the GIL) and the child processes' slowing of training (their CPU time
    times ``helper_slowdown``, at least zero; None where that is unknown)."""
    steps = max(attribution["steps"], 1)
    hooks = attribution["hook_seconds"]
    ours = sum(seconds for name, seconds in hooks.items() if not name.startswith(_TRAINER_MODULES))
    loop_s, children_s = attribution["time"], attribution["children_cpu"]
    if children_s == 0:
        helpers = 0.0
    else:
        helpers = None if helper_slowdown is None else max(helper_slowdown, 0.0) * children_s / loop_s
    row = {
        "step_ms": loop_s / steps * 1e3,
        "training_thread_cpu_ms": attribution["training_thread_cpu"] / steps * 1e3,
        "trainer_hooks_us": (sum(hooks.values()) - ours) / steps * 1e6,
        "our_hooks_us": ours / steps * 1e6,
        "our_hooks_percent": ours / loop_s * 100,
        "other_threads_cpu_us": attribution["other_threads_cpu"] / steps * 1e6,
        "other_threads_percent": attribution["other_threads_cpu"] / loop_s * 100,
        "child_processes_cpu_us": children_s / steps * 1e6,
        "helpers_percent": helpers,
    }
    ours_percent = row["our_hooks_percent"] + row["other_threads_percent"]
    row["total_percent"] = None if helpers is None else ours_percent + helpers
    return row


def median_of_known(values: list[float | None]) -> float | None:
    known = [value for value in values if value is not None]
    return statistics.median(known) if known else None


def attribution_cell(key: str, value: float | None) -> str:
    if value is None:
        return "—"
    cell = f"{value:.{2 if key.endswith(('ms', 'percent')) else 0}f}"
    if key == "total_percent":
        cell += " ✓" if value <= (TARGETS["loop"] - 1) * 100 else " ✗"
    return cell


def verdict(ratio: float, target: float | None) -> str:
    if target is None:
        return f"{ratio:.3f}×"
    return f"{ratio:.3f}× {'✓' if ratio <= target else '✗'}"


# metric, column title, unit scale, digits
COLUMNS = (
    ("process", "process s", 1, 2),
    ("cpu", "CPU s", 1, 2),
    ("loop", "loop s", 1, 3),
    ("step", "step ms", 1000, 2),
    ("startup", "startup s", 1, 2),
)


def markdown_table(summary: dict[str, dict], helpers: dict, dump: dict | None) -> str:
    """Medians per arm with their ratio to trl (✓/✗ against the target where there is one)."""
    header = ["arm", "runs"]
    for metric, title, _, _ in COLUMNS:
        target = TARGETS.get(metric)
        header += [title, f"× trl (≤ {target:g})" if target else "× trl"]
    header.append("same work")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for arm, row in summary.items():
        cells = [arm, str(row["runs"])]
        for metric, _, scale, digits in COLUMNS:
            value = row[metric]["median_s"] * scale
            cells += [f"{value:.{digits}f}", verdict(row[metric]["ratio"], TARGETS.get(metric))]
        cells.append("yes" if row["same_work"] else "NO")
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Where each arm's loop time goes, per step (medians over its runs, measured inside each run):", ""]
    lines += [
        "| arm | " + " | ".join(ATTRIBUTION_COLUMNS.values()) + " |",
        "|" + "---|" * (len(ATTRIBUTION_COLUMNS) + 1),
    ]
    for arm, row in summary.items():
        cells = [arm] + [attribution_cell(key, row["attribution"][key]) for key in ATTRIBUTION_COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    if helpers["slowdown_percent"] is None:
        lines += ["", "Too few steps overlapped helper work to measure how much it slows training."]
    else:
        placebos = ", ".join(
            f"{shift:g} s: " + ("—" if percent is None else f"{percent:+.1f} %")
            for shift, percent in zip(PLACEBO_SHIFTS_S, helpers["placebo_percent"], strict=True)
        )
        lines += [
            "",
            f"Steps that a child process's work overlapped (the other vCPU busy) took "
            f"{helpers['slowdown_percent']:+.1f} % longer than the steps around them (median of "
            f"{helpers['steps']}); the same with that work moved {placebos} (to where it was not: the noise)",
        ]
    if dump is not None:
        lines += [
            "",
            f"Dump of {dump['points']:,} points: aggregate {dump['aggregate_s']:.3f} s + write {dump['write_s']:.3f} s "
            f"= {dump['total_s']:.3f} s ({'✓' if dump['total_s'] < DUMP_TARGET_S else '✗'} < {DUMP_TARGET_S:g} s), "
            f"{dump['bytes'] / 1e6:.1f} MB. While training: recording costs the training thread "
            f"{dump['record_us_per_step']:.0f} µs per step of {len(DUMP_SERIES)} points; the journal's writer "
            f"wrote all {dump['points']:,} in {dump['journal_catch_up_s']:.2f} s more",
        ]
    return "\n".join(lines)


def measure(settings: Settings, arms: list[str], pairs: int, warmup: bool, workdir: Path) -> list[Run]:
    """Build the model once, warm caches with one short untimed round, then alternate the arms ``pairs`` times."""
    from tuning.utils.tiny_model import build_tiny_model

    model_dir = build_tiny_model(
        str(workdir / "model"), hidden_size=settings.hidden_size, num_layers=settings.num_layers
    )
    env = child_env(settings)
    if warmup:
        short = Settings(**{**asdict(settings), "max_steps": 2})
        for arm in arms:
            print(f"warm-up: {arm}", flush=True)
            run_once(arm, -1, ARMS[arm](short, model_dir, workdir / f"warmup-{arm}"), workdir / f"warmup-{arm}", env)
    runs = []
    for round_index in range(pairs):
        # Each round starts one arm later, so no arm always runs right after the same other one (or first).
        shift = round_index % len(arms)
        for arm in arms[shift:] + arms[:shift]:
            run_dir = workdir / f"{round_index}-{arm}"
            run = run_once(arm, round_index, ARMS[arm](settings, model_dir, run_dir), run_dir, env)
            print(
                f"round {round_index + 1}/{pairs} {arm}: process {run.process_s:.2f} s (CPU {run.cpu_s:.2f} s), "
                f"startup {run.startup_s:.2f} s, loop {run.loop_s:.3f} s",
                flush=True,
            )
            runs.append(run)
    return runs


SETTING_HELP = {
    "max_steps": "optimizer steps per run",
    "batch_size": "per-device train batch size",
    "gradient_accumulation_steps": "micro-batches per optimizer step (and per logged step)",
    "max_seq_length": "truncation length of each example",
    "seed": "training seed (data order)",
    "learning_rate": "learning rate",
    "threads": "OMP_NUM_THREADS of every run; 1 keeps runs comparable on a shared machine",
    "hidden_size": "hidden size of the tiny Llama",
    "num_layers": "layers of the tiny Llama",
    "system_metrics_interval": "bench_train's system-metrics sampling interval, seconds",
}


# A run logging every step records about ten series per step (bench_train's four plus the trainer's logs).
DUMP_SERIES = (
    "step_time_seconds",
    "step_tokens",
    "step_samples",
    "tokens_per_second",
    "loss",
    "grad_norm",
    "learning_rate",
    "entropy",
    "mean_token_accuracy",
    "epoch",
)


def dump_benchmark(points: int, workdir: Path) -> dict:
    """Time bench_train's record path on ``points`` points, ten per step: recording each step's points while training
    (``RunRecord.record_many``, as the benchmark callback calls it, on the training thread), the journal's writer
    catching up with them (spread over training in a real run, where points come at training's pace), then
    the end-of-run work: aggregating into the dump (``RunRecord.finish``) and writing it (``write_dump``)."""
    from tuning.benchmarking.dump import write_dump
    from tuning.benchmarking.journal import Journal, journal_path
    from tuning.benchmarking.record import RunRecord
    from tuning.benchmarking.system_metrics import environment_info

    metrics_path = workdir / "dump" / "benchmark.json"
    metrics_path.parent.mkdir(parents=True)
    header = {"experiment": "overhead", "host": platform.node(), "rank": 0, "world_size": 1}
    record = RunRecord(Journal(journal_path(str(metrics_path))), {**header, "environment": environment_info()})
    record.note(train_start=time.time(), warmup_steps=5)
    steps = -(-points // len(DUMP_SERIES))
    start = time.perf_counter()
    for step in range(1, steps + 1):
        count = min(len(DUMP_SERIES), points - (step - 1) * len(DUMP_SERIES))
        record.record_many([(name, step * 0.5, step, None) for name in DUMP_SERIES[:count]])
    recorded = time.perf_counter()
    journal = Path(record.journal.path)
    while journal.read_text().count("\n") < len(record.records):
        time.sleep(0.01)
    journaled = time.perf_counter()
    dump = record.finish("ok", training_steps=steps)
    aggregated = time.perf_counter()
    write_dump(str(metrics_path), dump)
    written = time.perf_counter()
    return {
        "points": points,
        "record_us_per_step": (recorded - start) / steps * 1e6,
        "journal_catch_up_s": journaled - recorded,
        "aggregate_s": aggregated - journaled,
        "write_s": written - aggregated,
        "total_s": written - journaled,
        "bytes": metrics_path.stat().st_size,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    summary, details = __doc__.split("\n\n", 1)
    parser = argparse.ArgumentParser(
        description=summary, epilog=details, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pairs", type=int, default=6, help="rounds of alternating runs, one run per arm (6)")
    parser.add_argument(
        "--arms",
        default="all",
        help=f"comma-separated subset of {','.join(ARMS)} (all = {','.join(DEFAULT_ARMS)}); {BASELINE} always runs",
    )
    parser.add_argument("--no_warmup", action="store_true", help="skip the untimed 2-step round that warms caches")
    parser.add_argument("--dump_points", type=int, default=100_000, help="points of the dump benchmark; 0 skips it")
    parser.add_argument("--output", default="bench_output/overhead.json", help="JSON results file (%(default)s)")
    parser.add_argument("--workdir", default=None, help="keep model, run outputs and stderr logs in this new folder")
    for name, value in asdict(Settings()).items():
        parser.add_argument(f"--{name}", type=type(value), default=value, help=f"{SETTING_HELP[name]} ({value})")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    settings = Settings(**{name: getattr(args, name) for name in asdict(Settings())})
    arms = list(DEFAULT_ARMS) if args.arms == "all" else [BASELINE, *(a for a in args.arms.split(",") if a != BASELINE)]
    unknown = set(arms) - set(ARMS)
    if unknown:
        raise SystemExit(f"unknown arm(s) {sorted(unknown)}; choose from {list(ARMS)}")
    with tempfile.TemporaryDirectory(prefix="overhead-") as scratch:
        workdir = Path(args.workdir or scratch)
        runs = measure(settings, arms, args.pairs, not args.no_warmup, workdir)
        dump = dump_benchmark(args.dump_points, workdir) if args.dump_points > 0 else None
    helpers = interference(runs)
    summary = summarise(runs, arms, helpers["slowdown_percent"])
    results = {
        "command": shlex.join(["python", "benchmarks/overhead.py", *(sys.argv[1:] if argv is None else argv)]),
        "settings": asdict(settings),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "summary": summary,
        "interference": helpers,
        "dump": dump,
        "runs": [asdict(run) for run in runs],
    }
    print(markdown_table(summary, helpers, dump))
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(results, indent=2))
    print(f"results: {output}")
    return results


if __name__ == "__main__":
    main()
