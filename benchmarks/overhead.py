"""Does the tool distort what it measures? The same training as bare TRL, as sft_trainer and as bench_train.

Each arm trains the identical work (a tiny Llama of ``tuning.utils.tiny_model``, the shipped sample data, fixed steps,
batch size, sequence length and seed; float32, one logged loss per step) in a process of its own:

  trl                 ``benchmarks/bare_trl.py``: TRL's SFTTrainer with no callbacks, the baseline
  sft_trainer         ``tuning/sft_trainer.py`` with the default file logger
  bench_train         ``wrappers/bench_train.py`` with a local Aim repo, its journal and system metrics
  bench_train_no_aim  the same with ``--trackers none`` (not run unless asked for with ``--arms``)

Two model sizes (``--cases``): ``realistic`` (a step of roughly 50-100 ms on one CPU thread) and ``stress`` (the
smallest model: every per-step cost looks its largest). After an untimed warm-up round the arms alternate run by run,
each round starting one arm later: process, loop and step time against the same round's trl run (targets ≤ 1.03,
1.01, 1.01). Then each arm runs once under ``py-spy`` (the ``dev`` extra), sampling 1000 times a second: our share
of the training loop (target ≤ 1 %). docs/performance.md's "Overhead" section says what each figure means.

    python benchmarks/overhead.py                                  # the full measurement, on a quiet machine
    python benchmarks/overhead.py --pairs 1 --max_steps 20         # a quick check that every arm runs
"""

import argparse
import ast
import itertools
import json
import math
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NamedTuple

import psutil

from tuning.utils.tiny_model import SAMPLE_TRAIN_PATH, build_tiny_model

REPO_ROOT = Path(__file__).resolve().parent.parent
BASELINE = "trl"
DEFAULT_ARMS = ("trl", "sft_trainer", "bench_train")
CASES = {"realistic": {"hidden_size": 256, "num_layers": 6}, "stress": {"hidden_size": 64, "num_layers": 2}}
TARGETS = {"process": 1.03, "loop": 1.01, "step": 1.01}
LOOP_FRAME = "._inner_training_loop ("  # transformers' Trainer loop, as py-spy names a frame: "function (file:line)"
FINAL_FRAME = "._finalize_training ("  # where the loop's train_runtime has been taken; on_train_end runs there
OWN_CODE = tuple(f" ({REPO_ROOT / folder}{os.sep}" for folder in ("tuning", "wrappers"))
# The libraries that train, in every arm alike; what they call (numpy, the standard library...) is theirs too.
TRAINING_LIBRARIES = ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "tokenizers", "safetensors")
SHARED_CODE = tuple(f"{os.sep}site-packages{os.sep}{name}{os.sep}" for name in (*TRAINING_LIBRARIES, "huggingface_hub"))
RESPONSE_TEMPLATE = "\n### Response:"


@dataclass
class Settings:
    """The training every arm repeats."""

    max_steps: int = 200
    batch_size: int = 4
    max_seq_length: int = 128
    seed: int = 42
    threads: int = 1


@dataclass
class Run:
    case: str
    arm: str
    round: int
    process_s: float
    loop_s: float
    step_s: float
    losses: list = field(repr=False)
    step_ends: list = field(default_factory=list, repr=False)  # seconds from spawn to each step's loss line
    threads_cpu_s: float = 0.0  # a py-spy run's: CPU time of its threads but the main one, first to last step


def training_flags(settings: Settings, model_dir: str, output_dir: str) -> list[str]:
    """Flags every arm understands with the same meaning (bare TRL's SFTConfig and our TrainingArguments)."""
    flags = {
        "model_name_or_path": model_dir,
        "training_data_path": SAMPLE_TRAIN_PATH,
        "dataset_text_field": "output",
        "response_template": RESPONSE_TEMPLATE,
        "torch_dtype": "float32",
        "output_dir": output_dir,
        "max_steps": settings.max_steps,
        "per_device_train_batch_size": settings.batch_size,
        "learning_rate": 5e-5,
        "seed": settings.seed,
        "bf16": False,
        "gradient_checkpointing": False,
        "logging_strategy": "steps",
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
    }
    return [item for key, value in flags.items() for item in (f"--{key}", str(value))]


def command(arm: str, settings: Settings, model_dir: str, run_dir: Path) -> list[str]:
    shared = training_flags(settings, model_dir, str(run_dir / "out"))
    if arm == "trl":
        return [sys.executable, "benchmarks/bare_trl.py", *shared, "--max_length", str(settings.max_seq_length)]
    ours = [*shared, "--max_seq_length", str(settings.max_seq_length), "--use_flash_attn", "False"]
    if arm == "sft_trainer":
        return [sys.executable, "tuning/sft_trainer.py", *ours, "--trackers", "file_logger"]
    # One Aim repo for all runs, as a benchmarking team keeps one.
    trackers = ["none"] if arm == "bench_train_no_aim" else ["aim", "--aim_repo", str(run_dir.parent / "aim")]
    bench = ["--experiment", "overhead", "--metrics_path", str(run_dir / "metrics.json")]
    return [sys.executable, "wrappers/bench_train.py", *ours, "--trackers", *trackers, *bench]


def run_once(
    case: str, arm: str, round_index: int, argv: list[str], run_dir: Path, env: dict[str, str], wrapper: list[str] = ()
) -> Run:
    """One process, its stdout lines timestamped as they arrive; stderr goes to a file beside it. Started by
    ``wrapper`` (py-spy) where given, and then also the CPU time of its other threads, read at every step (never
    beside the timed runs, where the reading would be work of ours on the machine)."""
    run_dir.mkdir(parents=True)
    stderr_path = run_dir / "stderr.log"
    losses, step_ends, runtime, trainer = [], [], None, None
    first_cpu: dict[str, float] = {}  # per thread other than the trainer's main one, at its first step
    last_cpu: dict[str, float] = {}  # the same at its latest step; a thread that has ended keeps its last reading
    with stderr_path.open("w") as stderr:
        start = time.perf_counter()
        process = subprocess.Popen(
            [*wrapper, *argv], stdout=subprocess.PIPE, stderr=stderr, text=True, env=env, cwd=REPO_ROOT
        )
        for line in process.stdout:
            if not line.startswith("{'"):
                continue
            # The dict transformers' progress callback prints per log; py-spy's own warnings can end the same line.
            logs = ast.literal_eval(line.split("py-spy>", 1)[0].strip())
            if "loss" in logs:
                step_ends.append(time.perf_counter() - start)
                losses.append(logs["loss"])
                if wrapper:
                    if trainer is None:
                        trainer = psutil.Process(process.pid).children()[0].pid
                        first_cpu = other_threads_cpu_s(trainer)
                    last_cpu.update(other_threads_cpu_s(trainer))
            if "train_runtime" in logs:
                runtime = float(logs["train_runtime"])
        returncode = process.wait()
        process_s = time.perf_counter() - start
    if returncode != 0 or len(step_ends) < 2 or runtime is None:
        tail = stderr_path.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{case}/{arm} run {round_index} failed (exit {returncode}); stderr ends with:\n{tail}")
    step_s = statistics.median(later - earlier for earlier, later in itertools.pairwise(step_ends))
    threads_cpu_s = sum(last_cpu.values()) - sum(first_cpu.values())
    return Run(case, arm, round_index, process_s, runtime, step_s, losses, step_ends, threads_cpu_s)


def other_threads_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds so far of each of process ``pid``'s threads other than its main one, from Linux's per-thread
    schedstat (nanoseconds on a CPU); none where that cannot be read (another OS, a thread that has ended)."""
    seconds = {}
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with suppress(OSError, ValueError, IndexError):
            if task.name != str(pid):
                seconds[task.name] = int((task / "schedstat").read_text().split()[0]) / 1e9
    return seconds


class Samples(NamedTuple):
    loop_samples: int  # the training loop's
    own_loop_samples: int  # ... with a frame of ours below the loop
    process_samples: int  # the loop's thread's, with a Python frame
    own_process_samples: int  # ... that are ours (``count_samples``)


def _stacks(raw: str) -> Iterator[tuple[str, list[str], int]]:
    """(thread id, frames, count) of py-spy's raw output: one line per distinct stack,
    ``thread (id)[: name];frame;frame... count``, a frame ``function (file:line)``."""
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdecimal():  # the head of a stack cut by a line break in a frame's name: left out
            continue
        frames = stack.split(";")
        yield frames[0].partition(")")[0], frames[1:], int(count)


def _function(frame: str) -> str:
    return frame.rpartition(":")[0]  # "function (file" without the line


def frame_is_ours(frame: str, shared: Collection[str] = ()) -> bool:
    """A frame of our code that is not in ``shared``: functions of ours that the baseline runs too."""
    return any(folder in frame for folder in OWN_CODE) and _function(frame) not in shared


def baseline_functions(raw: str) -> set[str]:
    """The functions of ours that a (bare TRL) profile runs: they are shared work, not ours, in the others."""
    return {_function(frame) for _, frames, _ in _stacks(raw) for frame in frames if frame_is_ours(frame)}


def count_samples(raw: str, shared: Collection[str] = ()) -> Samples:
    """Our share of the training loop and of the whole process on the loop's thread (``shared``: functions of ours the
    baseline runs too). The loop ends where its ``train_runtime`` does, before the end-of-training callbacks; a sample
    there is ours with a frame of ours below the loop. In the process, a sample is ours with a frame of ours that the
    baseline does not run below its outermost frame of shared code (a training library or a ``shared`` function):
    our callbacks and what they call, our imports, flags, dump and closing; not the training our ``train()`` hands to
    the libraries. Samples without a Python frame (the interpreter's own teardown, alike in every arm) are left out,
    which leaves our share at its largest."""

    def is_shared(frame: str) -> bool:
        return _function(frame) in shared or any(code in frame for code in SHARED_CODE)

    stacks = list(_stacks(raw))
    loop_thread = next((thread for thread, frames, _ in stacks if any(LOOP_FRAME in frame for frame in frames)), None)
    loop = own_loop = process = own_process = 0
    for thread, frames, count in stacks:
        start = next((index for index, frame in enumerate(frames) if LOOP_FRAME in frame), None)
        if start is not None and not any(FINAL_FRAME in frame for frame in frames[start:]):
            loop += count
            own_loop += count if any(map(frame_is_ours, frames[start:])) else 0
        if thread == loop_thread and frames:
            process += count
            outermost = next((index for index, frame in enumerate(frames) if is_shared(frame)), 0)
            own_process += count if any(frame_is_ours(frame, shared) for frame in frames[outermost:]) else 0
    return Samples(loop, own_loop, process, own_process)


def profile_once(
    case: str, arm: str, py_spy: str, argv: list[str], run_dir: Path, env: dict, shared: set[str] | None
) -> tuple[dict, set[str]]:
    """One run under py-spy, idle samples included (a wait in our code is time we add): the loop's and the process's
    samples and ours among them (``count_samples``), the other threads' CPU time from the first to the last step over
    that time, and **ours** in the loop and in the process (``share``, ``process_share``): each sampled share plus
    that CPU share, with the 95 % interval of the sampled part. ``shared`` None: this is the baseline, whose functions
    of ours are the ``shared`` set returned for the other arms (its own process share is then 0)."""
    raw_path = run_dir / "py-spy.txt"
    spy = [py_spy, "record", "--rate", "1000", "--nonblocking", "--threads", "--idle", "--full-filenames"]
    run = run_once(case, arm, -1, argv, run_dir, env, [*spy, "--format", "raw", "--output", str(raw_path), "--"])
    raw = raw_path.read_text(errors="replace")
    shared = baseline_functions(raw) if shared is None else shared
    samples = count_samples(raw, shared)
    threads = run.threads_cpu_s / (run.step_ends[-1] - run.step_ends[0])
    row = {"case": case, "arm": arm, **samples._asdict(), "threads_cpu_share": threads}
    for prefix, total, own in (("", *samples[:2]), ("process_", *samples[2:])):
        share, low, high = share_interval(own, total) if total else (0.0, 0.0, 1.0)
        row |= {f"{prefix}share": share + threads, f"{prefix}share_low": low + threads}
        row[f"{prefix}share_high"] = high + threads
    return row, shared


def share_interval(own: int, total: int, z: float = 1.96) -> tuple[float, float, float]:
    """The share ``own / total`` and its Wilson score interval (95 % with the default ``z``)."""
    share = own / total
    centre = share + z * z / (2 * total)
    margin = z * math.sqrt(share * (1 - share) / total + z * z / (4 * total * total))
    low, high = (centre - margin) / (1 + z * z / total), (centre + margin) / (1 + z * z / total)
    return share, min(share, max(0.0, low)), max(share, high)  # rounding aside, low <= share <= high


def child_env(threads: int) -> dict[str, str]:
    """The environment of every run: offline, unbuffered, ``threads`` OpenMP threads, the repository importable."""
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONUNBUFFERED": "1",  # a log line arrives when it is printed
        "OMP_NUM_THREADS": str(threads),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
    }


def run_dir_of(workdir: Path, arm: str, round_index: int) -> Path:
    return workdir / (f"warmup-{arm}" if round_index < 0 else f"{round_index}-{arm}")


def alternating_runs(
    case: str,
    arms: list[str],
    pairs: int,
    warmup: bool,
    workdir: Path,
    env: dict[str, str],
    argv: Callable[[str, Path], list[str]],
) -> Iterator[Run]:
    """An untimed 2-step warm-up round (round -1) where ``warmup``, then ``pairs`` rounds of one run per arm, each
    round starting one arm later than the last. ``argv(arm, run_dir)`` is a run's command line; the warm-up appends
    ``--max_steps 2`` to it (every arm's parser keeps the last value of a flag given twice)."""
    schedule = [(-1, arms)] if warmup else []
    schedule += [(index, arms[index % len(arms) :] + arms[: index % len(arms)]) for index in range(pairs)]
    for round_index, order in schedule:
        for arm in order:
            run_dir = run_dir_of(workdir, arm, round_index)
            short = ["--max_steps", "2"] if round_index < 0 else []
            yield run_once(case, arm, round_index, [*argv(arm, run_dir), *short], run_dir, env)


def measure(
    case: str,
    settings: Settings,
    arms: list[str],
    pairs: int,
    warmup: bool,
    workdir: Path,
    py_spy: str | None,
) -> tuple[list[Run], list[dict]]:
    """The alternating rounds of every arm, then one run of each under py-spy where ``py_spy`` is its path."""
    model_dir = build_tiny_model(str(workdir / "model"), **CASES[case])

    def argv(arm: str, run_dir: Path) -> list[str]:
        return command(arm, settings, model_dir, run_dir)

    env = child_env(settings.threads)
    runs = []
    for run in alternating_runs(case, arms, pairs, warmup, workdir, env, argv):
        if run.round >= 0:
            print(f"{case} {run.round + 1}/{pairs} {run.arm}: process {run.process_s:.2f} s, loop {run.loop_s:.2f} s")
            runs.append(run)
    profiles, shared = [], None
    for arm in arms if py_spy else ():  # the baseline first: what it runs of ours is shared work in the others
        run_dir = workdir / f"profile-{arm}"
        row, shared = profile_once(case, arm, py_spy, argv(arm, run_dir), run_dir, env, shared)
        profiles.append(row)
        print(f"{case} py-spy {arm}: {row}")
    return runs, profiles


def summarise(runs: list[Run]) -> list[dict]:
    """Per case and arm: median timings and the median per-round ratio to the baseline arm's run."""
    rows = []
    for case in dict.fromkeys(run.case for run in runs):
        baseline = {run.round: run for run in runs if run.case == case and run.arm == BASELINE}
        for arm in dict.fromkeys(run.arm for run in runs if run.case == case):
            own = [run for run in runs if run.case == case and run.arm == arm]
            row = {"case": case, "arm": arm, "runs": len(own)}
            for metric in TARGETS:
                median_s = statistics.median(getattr(run, f"{metric}_s") for run in own)
                ratios = [getattr(run, f"{metric}_s") / getattr(baseline[run.round], f"{metric}_s") for run in own]
                row[metric] = {"median_s": median_s, "ratio": statistics.median(ratios), **spread(ratios)}
            row["same_work"] = all(run.losses == baseline[run.round].losses for run in own)
            rows.append(row)
    return rows


def spread(ratios: list[float]) -> dict[str, float]:
    """The first and third quartiles of the rounds' ratios, between which their middle half lies (one ratio: itself)."""
    low, _, high = statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1 else ratios * 3
    return {"ratio_q1": low, "ratio_q3": high}


def verdict(ratio: dict, target: float) -> str:
    """✓ when even the third quartile of the per-round ratios meets the target, ✗ when even the first misses it, ≈
    when the target lies inside the middle half of the rounds: this machine's noise does not resolve it."""
    if ratio["ratio_q3"] <= target:
        return "✓"
    return "✗" if ratio["ratio_q1"] > target else "≈"


def markdown(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table, a ``|`` inside a cell escaped."""
    lines = ["| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |" for cells in [header, *rows]]
    return "\n".join([lines[0], "|" + "---|" * len(header), *lines[1:]])


def markdown_table(rows: list[dict]) -> str:
    header = ["case", "arm", "runs"]
    for metric, target in TARGETS.items():
        header += [f"{metric} {'ms' if metric == 'step' else 's'}", f"× trl (≤ {target:g})"]
    table = []
    for row in rows:
        cells = [row["case"], row["arm"], str(row["runs"])]
        for metric, target in TARGETS.items():
            figures = row[metric]
            value = figures["median_s"] * (1000 if metric == "step" else 1)
            spread = f"{figures['ratio_q1']:.3f}-{figures['ratio_q3']:.3f}"
            cells += [f"{value:.2f}", f"{figures['ratio']:.3f}× ({spread}) {verdict(figures, target)}"]
        table.append([*cells, "yes" if row["same_work"] else "NO"])
    return markdown([*header, "same work"], table)


def profile_table(rows: list[dict]) -> str:
    """Ours in the loop against 1 %, in the process against 1.03× (our share s: the process without it takes 1 - s)."""
    loop_limit, process_limit = TARGETS["loop"] - 1, 1 - 1 / TARGETS["process"]

    def judged(row: dict, prefix: str, limit: float) -> str:
        share, low, high = (row[f"{prefix}share{end}"] for end in ("", "_low", "_high"))
        return f"{share:.2%} ({low:.2%}-{high:.2%}) {verdict({'ratio_q1': 1 + low, 'ratio_q3': 1 + high}, 1 + limit)}"

    header = ["case", "arm", "loop samples", "ours in the loop", "other threads' CPU", f"ours (≤ {loop_limit:.0%})"]
    header += ["process samples", "ours in the process", f"ours in the process (≤ {process_limit:.1%})"]
    table = [
        [
            *(row["case"], row["arm"], str(row["loop_samples"]), str(row["own_loop_samples"])),
            *(f"{row['threads_cpu_share']:.2%}", judged(row, "", loop_limit)),
            *(str(row["process_samples"]), str(row["own_process_samples"]), judged(row, "process_", process_limit)),
        ]
        for row in rows
    ]
    return markdown(header, table)


def argument_parser(doc: str) -> argparse.ArgumentParser:
    """A parser described by ``doc``: its first paragraph, then the rest as written."""
    summary, details = doc.split("\n\n", 1)
    return argparse.ArgumentParser(
        description=summary, epilog=details, formatter_class=argparse.RawDescriptionHelpFormatter
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argument_parser(__doc__)
    parser.add_argument("--pairs", type=int, default=6, help="rounds of alternating runs, one run per arm (6)")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated subset of {','.join(CASES)}")
    parser.add_argument(
        "--arms", default=",".join(DEFAULT_ARMS), help="comma-separated arms; trl always runs (%(default)s)"
    )
    parser.add_argument("--no_warmup", action="store_true", help="skip the untimed 2-step round that warms caches")
    parser.add_argument("--output", default="bench_output/overhead.json", help="JSON results file (%(default)s)")
    parser.add_argument("--workdir", default=None, help="keep models, run outputs and stderr logs in this new folder")
    for name, value in asdict(Settings()).items():
        parser.add_argument(f"--{name}", type=type(value), default=value, help=f"({value})")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    settings = Settings(**{name: getattr(args, name) for name in asdict(Settings())})
    arms = [BASELINE, *(arm for arm in args.arms.split(",") if arm != BASELINE)]
    cases = args.cases.split(",")
    unknown = set(arms) - {*DEFAULT_ARMS, "bench_train_no_aim"} | set(cases) - set(CASES)
    if unknown:
        raise SystemExit(f"unknown arm(s) or case(s): {sorted(unknown)}")
    py_spy = shutil.which("py-spy", path=os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]]))
    if not py_spy:
        print("py-spy is not installed (pip install py-spy, or the dev extra): no py-spy runs")
    runs, profiles = [], []
    with tempfile.TemporaryDirectory(prefix="overhead-") as scratch:
        for case in cases:
            workdir = Path(args.workdir or scratch) / case
            case_runs, case_profiles = measure(case, settings, arms, args.pairs, not args.no_warmup, workdir, py_spy)
            runs, profiles = runs + case_runs, profiles + case_profiles
    rows = summarise(runs)
    results = {
        "command": shlex.join(["python", "benchmarks/overhead.py", *(sys.argv[1:] if argv is None else argv)]),
        "settings": asdict(settings),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "summary": rows,
        "profile": profiles,
        "runs": [asdict(run) for run in runs],
    }
    print(markdown_table(rows))
    if profiles:
        print(profile_table(profiles))
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(results, indent=2))
    print(f"results: {output}")
    return results


if __name__ == "__main__":
    main()
