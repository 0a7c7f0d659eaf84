"""What the step anatomy and a profile window cost: bench_train on the tiny model, as separate processes in alternating
rounds, against the same training without them.

Arms (each a process of its own, bench_train's ``main`` with ``--trackers none``, no system samples):

  no_anatomy  the benchmark's callback with its step anatomy off (``BenchmarkCallback.step_anatomy = False``)
  anatomy     as every run is: the step anatomy on
  profiled    the anatomy and ``--profile_steps`` on a window in the middle of the run

Each round runs every arm once, each round starting one arm later; per round the median step time of the steps after
the warm-up (for ``profiled`` those outside the window and the step after it, which holds the trace's export) against
the same round's ``no_anatomy``. Beside it, in this process, the anatomy's own work per step on the same model (its
hooks, marks, parts and recorded points, no training): the cost that A/B rounds on a noisy machine cannot resolve.
Targets: anatomy ≤ 1.005× (its own work ≤ 0.5 % of the step), profiled within the rounds' spread of 1.

    python benchmarks/step_anatomy.py --rounds 8                  # on a quiet machine; results in bench_output/
    python benchmarks/step_anatomy.py --rounds 1 --max_steps 12   # a quick check that every arm runs
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
ARMS = ("no_anatomy", "anatomy", "profiled")
TARGET = 1.005


def run_arm(arm: str, model: str, output_dir: str, max_steps: int, warmup: int) -> None:
    """One arm's run, in this process: bench_train's recipe, the anatomy switched off for ``no_anatomy``."""
    sys.path.insert(0, str(REPO_ROOT / "wrappers"))
    import bench_train

    from tuning.benchmarking import api

    flags = ["--metrics_path", f"{output_dir}/bench.json", "--skip_warmup_steps", str(warmup)]
    flags += ["--system_metrics_interval", "0", "--trackers", "none"]
    if arm == "profiled":
        flags += ["--profile_steps", "{}-{}".format(*window(max_steps, warmup))]
    if arm == "no_anatomy":

        class Job(api.BenchmarkJob):
            def callbacks(self, extra=()):
                callbacks = super().callbacks(extra)
                self.bench.step_anatomy = False
                return callbacks

        api.BenchmarkJob = Job
    training = ["--model_name_or_path", model, "--training_data_path", sample_data(), "--output_dir", output_dir]
    training += ["--dataset_text_field", "output", "--response_template", "\n### Response:", "--max_steps"]
    training += [str(max_steps), "--per_device_train_batch_size", "4", "--logging_steps", "1", "--save_strategy"]
    training += ["no", "--torch_dtype", "float32", "--use_flash_attn", "False", "--max_seq_length", "128"]
    training += ["--seed", "42", "--logging_strategy", "steps"]
    sys.exit(bench_train.main([*training, *flags]))


def sample_data() -> str:
    from tuning.utils.tiny_model import SAMPLE_TRAIN_PATH

    return SAMPLE_TRAIN_PATH


def window(max_steps: int, warmup: int) -> tuple[int, int]:
    """Two steps in the middle of the measured steps."""
    middle = (warmup + 1 + max_steps) // 2
    return middle, middle + 1


def measured_step_time(dump: dict, arm: str, max_steps: int, warmup: int) -> float:
    """The median step time after the warm-up; for ``profiled`` without its window's steps, the one before (the
    profiler's warm-up) and the one after (the export)."""
    found = next(m for m in dump["metrics"] if m["name"] == "step_time_seconds" and not m["context"])
    first, last = window(max_steps, warmup)
    left_out = range(first - 1, last + 2) if arm == "profiled" else ()
    times = [v for s, v in zip(found["steps"], found["values"], strict=True) if s > warmup and s not in left_out]
    return statistics.median(times)


def own_work_per_step(model_dir: str, steps: int = 200) -> float:
    """Seconds of the anatomy's own work per step on the model: a forward's two marks (the hooks' bodies, called
    directly), a micro-batch's end, the step's end, its parts read and recorded (into a journal), without training."""
    import torch
    from transformers import AutoModelForCausalLM

    from tuning.benchmarking.anatomy import StepAnatomy
    from tuning.benchmarking.dump import STEP_PART_SERIES
    from tuning.benchmarking.journal import Journal
    from tuning.benchmarking.record import RunRecord

    model = AutoModelForCausalLM.from_pretrained(model_dir).train()
    header = {"host": "h", "rank": 0, "world_size": 1, "environment": {}}
    with tempfile.TemporaryDirectory() as scratch:
        record = RunRecord(Journal(f"{scratch}/journal.jsonl"), header)
        anatomy = StepAnatomy(model, torch.device("cpu"))
        began = time.perf_counter()
        for step in range(1, steps + 1):
            anatomy._forward_begins(model, ())
            anatomy._forward_ends(model, (), None)
            anatomy.micro_batch_ends()
            anatomy.batches_fetched(0.001)
            anatomy.step_ends(step)
            points = [
                (STEP_PART_SERIES[part], seconds, done, None)
                for done, parts in anatomy.ready()
                for part, seconds in parts.items()
                if seconds is not None
            ]
            record.record_batches([(time.time(), points)])
        seconds = (time.perf_counter() - began) / steps
        anatomy.detach()
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--max_steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--output", default="bench_output/step_anatomy.json")
    parser.add_argument("--arm", choices=ARMS, help=argparse.SUPPRESS)  # one arm's run (a child process)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--run_dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.arm:
        run_arm(args.arm, args.model, args.run_dir, args.max_steps, args.warmup)
    from tuning.utils.tiny_model import build_tiny_model

    workdir = Path(tempfile.mkdtemp(prefix="step_anatomy-"))
    model = build_tiny_model(str(workdir / "model"))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)}
    ratios: dict[str, list[float]] = {arm: [] for arm in ARMS}
    step_times: dict[str, list[float]] = {arm: [] for arm in ARMS}
    for index in range(-1, args.rounds):  # round -1: the warm-up round, not counted
        order = ARMS[index % len(ARMS) :] + ARMS[: index % len(ARMS)]
        times = {}
        for arm in order:
            run_dir = workdir / f"{index}-{arm}"
            command = [sys.executable, __file__, "--arm", arm, "--model", model, "--run_dir", str(run_dir)]
            command += ["--max_steps", str(args.max_steps), "--warmup", str(args.warmup)]
            subprocess.run(command, check=True, cwd=REPO_ROOT, capture_output=True, env=env)
            dump = json.loads((run_dir / "bench.json").read_text())
            times[arm] = measured_step_time(dump, arm, args.max_steps, args.warmup)
        print(f"round {index}: " + ", ".join(f"{arm} {1000 * seconds:.2f} ms" for arm, seconds in times.items()))
        if index >= 0:
            for arm in ARMS:
                step_times[arm].append(times[arm])
                ratios[arm].append(times[arm] / times["no_anatomy"])
    own = own_work_per_step(model)
    shutil.rmtree(workdir)
    step = statistics.median(step_times["no_anatomy"])
    results = {
        "rounds": args.rounds,
        "step_ms": {arm: 1000 * statistics.median(values) for arm, values in step_times.items()},
        "ratio": {arm: statistics.median(values) for arm, values in ratios.items()},
        "ratio_range": {arm: [min(values), max(values)] for arm, values in ratios.items()},
        "own_work_us_per_step": 1e6 * own,
        "own_work_share": own / step,
    }
    print(json.dumps(results, indent=2))
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(results, indent=2))
    return 0 if results["own_work_share"] <= TARGET - 1 else 1


if __name__ == "__main__":
    sys.exit(main())
