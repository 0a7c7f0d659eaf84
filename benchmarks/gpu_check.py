"""What only a GPU can show, in one command: ``make gpu-check`` (``python -m benchmarks.gpu_check``), on one CUDA
device, in under 8 minutes, with nothing downloaded.

1. Model: a random-initialised Llama of ~1 B parameters (TinyLlama's shape, with the repo's own 512-token tokenizer),
   bf16, and a data set in the sample data's shape whose every example is longer than the sequence length, so that
   every step trains batch x sequence length tokens with no padding; both built locally.
2. Throughput: ``wrappers/bench_train.py`` (a local Aim repo, its journal, system metrics every second) against bare
   TRL (``benchmarks/bare_trl.py``) on identical work (data, batch, sequence length, steps, seed, flash attention
   where installed, else sdpa), each job a process of its own, run and timed as ``benchmarks/overhead.py`` runs its
   arms (a step ends when its loss line arrives): an untimed warm-up round, then ``--rounds`` rounds, alternating
   which arm goes first. Against that round's bare-TRL job (medians of per-round ratios): tokens/s and median step
   time of the steps after the first ``--warmup_steps``, and the whole loop (``train_runtime``: bench_train's share
   of it); besides, torch's peak GPU memory of each arm and the per-step losses (the same work).
3. A real OOM: the same bench_train job at a batch far beyond the GPU's memory exits 204 with ``gpu_oom`` in its
   dump and in the termination log, and the GPU's memory is back to what it was before the job.
4. NVML: the last bench_train dump of step 2 holds utilisation, memory used, power (W) and power in % of the
   enforced limit under ``{"gpu": 0}``, although every job sees its GPU as ``CUDA_VISIBLE_DEVICES=<its UUID>``; the
   dump's summary holds CUDA's peak memory.
5. One Markdown table (figure, value, target, ✓/✗), printed and written to ``--output`` (the raw numbers beside it,
   as .json). Exit 0 when every target is met, 1 otherwise.

Without CUDA it prints one line saying so and exits 0. It uses the first GPU that ``CUDA_VISIBLE_DEVICES`` leaves
visible; the GPU series need NVML (``pip install 'tuning-bench[nvml]'``, which ``make gpu-check`` does).
"""

import argparse
import itertools
import json
import math
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from benchmarks import overhead
from tuning.benchmarking.schema import STEP_TOKENS
from tuning.benchmarking.system_metrics import (
    GPU_MEMORY_USED,
    GPU_POWER,
    GPU_POWER_PERCENT,
    GPU_UTILIZATION,
    init_nvml,
    nvml_text,
    visible_gpu_handles,
)
from tuning.data.loading import load_records
from tuning.utils.error_logging import ErrorCategory, exit_code_for
from tuning.utils.tiny_model import SAMPLE_TRAIN_PATH, build_llama

ARMS = ("trl", "bench_train")
FLASH_ATTENTION = "flash_attention_2"
GIB = 2**30
TIME_LIMIT_S = 8 * 60
MIN_RATIO = 0.99  # bench_train's tokens/s against bare TRL's; its step time may be 1/MIN_RATIO of TRL's
LOOP_TARGET = overhead.TARGETS["loop"]  # bench_train's train_runtime against bare TRL's
MODEL_PARAMETERS = (0.8e9, 1.3e9)  # "about 1 B"
LOSS_TOLERANCE = 0.01  # per-step losses of the same work, relative (GPU kernels need not be bit-reproducible)
MEMORY_TOLERANCE = 0.01  # bench_train's peak GPU memory above bare TRL's, relative
DUMP_THROUGHPUT_TOLERANCE = 0.02  # the dump's own tokens/s against the one measured from the step ends
MIN_UTILIZATION = 50.0  # % while a 1 B model trains
POWER_PERCENT_TOLERANCE = 0.5  # percentage points between the dump's percentages and its watts over the limit
FREED_TOLERANCE_BYTES = GIB  # GPU memory in use after the OOM job, above what was in use before it
FREED_WAIT_S = 30.0
OOM_TIMEOUT_S = 300.0
NVML_SERIES = (GPU_UTILIZATION, GPU_MEMORY_USED, GPU_POWER, GPU_POWER_PERCENT)


@dataclass
class Workload:
    """What every job of the check trains; the flags of the same names change it."""

    hidden_size: int = field(default=2048, metadata={"help": "hidden size of the Llama"})
    intermediate_size: int = field(default=5632, metadata={"help": "MLP size of the Llama"})
    num_layers: int = field(default=22, metadata={"help": "layers of the Llama"})
    num_attention_heads: int = field(default=32, metadata={"help": "attention heads"})
    num_key_value_heads: int = field(default=4, metadata={"help": "key/value heads (grouped-query attention)"})
    seq_length: int = field(default=1024, metadata={"help": "tokens of every example (each is cut to it)"})
    batch_size: int = field(default=8, metadata={"help": "per-device train batch size of the throughput jobs"})
    max_steps: int = field(default=60, metadata={"help": "optimizer steps of each throughput job"})
    warmup_steps: int = field(default=10, metadata={"help": "first steps of each job left out of its figures"})
    rounds: int = field(default=3, metadata={"help": "rounds of one job per arm, after the warm-up round"})
    oom_batch_size: int = field(default=512, metadata={"help": "batch size of the OOM job, far beyond the GPU"})
    torch_dtype: str = field(default="bfloat16", metadata={"help": "dtype of the model and of training"})
    learning_rate: float = field(default=1e-5, metadata={"help": "learning rate"})
    seed: int = field(default=42, metadata={"help": "seed of the model, the data and training"})
    threads: int = field(default=4, metadata={"help": "OMP_NUM_THREADS of every job"})
    system_metrics_interval: float = field(default=1.0, metadata={"help": "bench_train's sampling interval, s"})

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_length

    def model_shape(self) -> dict[str, int]:
        """The Llama's shape, as ``tuning.utils.tiny_model.build_llama`` and ``llama_config`` take it."""
        names = ("hidden_size", "intermediate_size", "num_layers", "num_attention_heads", "num_key_value_heads")
        return {**{name: getattr(self, name) for name in names}, "max_length": self.seq_length}


@dataclass
class Gpu:
    """The GPU every job runs on, as NVML sees it (all None where NVML is not usable)."""

    uuid: str | None = None
    name: str | None = None
    power_limit_watts: float | None = None
    nvml: Any = field(default=None, repr=False)
    handle: Any = field(default=None, repr=False)

    def memory_used(self) -> int | None:
        return None if self.nvml is None else int(self.nvml.nvmlDeviceGetMemoryInfo(self.handle).used)

    def close(self) -> None:
        if self.nvml is not None:
            self.nvml.nvmlShutdown()
            self.nvml = None


def find_gpu() -> Gpu:
    """The first GPU this process's CUDA sees, by NVML (which the check keeps open for its memory readings)."""
    nvml = init_nvml()
    handles = visible_gpu_handles(nvml) if nvml is not None else []
    if not handles:
        return Gpu()
    handle = handles[0]
    return Gpu(
        uuid=nvml_text(nvml.nvmlDeviceGetUUID(handle)),
        name=nvml_text(nvml.nvmlDeviceGetName(handle)),
        power_limit_watts=nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0,
        nvml=nvml,
        handle=handle,
    )


# ---- 1. model and data ----


def build_model(model_dir: Path, workload: Workload) -> dict[str, Any]:
    """The random-initialised Llama and its tokenizer in ``model_dir``; its parameter count, dtype and build time."""
    from safetensors import safe_open

    started = time.perf_counter()
    build_llama(str(model_dir), **workload.model_shape(), dtype=workload.torch_dtype, seed=workload.seed)
    parameters, dtypes = 0, set()
    for path in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(path), "pt") as weights:
            for name in weights.keys():  # noqa: SIM118 - a safetensors file is not iterable
                tensor = weights.get_slice(name)
                parameters += math.prod(tensor.get_shape())
                dtypes.add(tensor.get_dtype())
    return {"parameters": parameters, "dtypes": sorted(dtypes), "seconds": time.perf_counter() - started}


def build_dataset(path: Path, records: int, seq_length: int, seed: int) -> Path:
    """``records`` JSON lines shaped like the sample data (``output``: an input, the response template, a response),
    of the sample data's words, each response ``seq_length`` words long: every example then has more than
    ``seq_length`` tokens (a word is at least one), so every sequence is cut to exactly that and none is padded."""
    words = sorted({word for record in load_records(SAMPLE_TRAIN_PATH) for word in record["output"].split()})
    rng = random.Random(seed)
    with path.open("w", encoding="utf-8") as handle:
        for _ in range(records):
            prompt = " ".join(rng.choices(words, k=4))
            response = " ".join(rng.choices(words, k=seq_length))
            text = f"### Input: {prompt}\n{overhead.RESPONSE_TEMPLATE} {response}"
            handle.write(json.dumps({"output": text}) + "\n")
    return path


# ---- 2. throughput ----


def job_command(
    arm: str, workload: Workload, model_dir: Path, data_path: Path, run_dir: Path, attention: str
) -> list[str]:
    """One job of ``arm``: benchmarks/overhead.py's command for that arm (so both arms share its flags), with this
    check's data, dtype, learning rate, attention and sampling appended; argparse keeps the last value of a flag
    given twice."""
    settings = overhead.Settings(
        max_steps=workload.max_steps,
        batch_size=workload.batch_size,
        max_seq_length=workload.seq_length,
        seed=workload.seed,
        threads=workload.threads,
    )
    bf16 = str(workload.torch_dtype == "bfloat16")
    shared = [
        *("--training_data_path", str(data_path), "--torch_dtype", workload.torch_dtype, "--bf16", bf16),
        *("--learning_rate", str(workload.learning_rate)),
    ]
    own = overhead.command(arm, settings, str(model_dir), run_dir)
    if arm == "trl":
        return [*own, *shared, "--attn_implementation", attention]
    return [
        *own,
        *shared,
        *("--use_flash_attn", str(attention == FLASH_ATTENTION)),
        *("--skip_warmup_steps", str(workload.warmup_steps)),
        *("--system_metrics_interval", str(workload.system_metrics_interval)),
    ]


def job_env(workload: Workload, gpu: Gpu) -> dict[str, str]:
    """overhead.py's environment for every job, with the GPU named by its UUID (where NVML gave one)."""
    env = overhead.child_env(workload.threads)
    if gpu.uuid is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu.uuid
    return env


def run_dir_of(workdir: Path, arm: str, round_index: int) -> Path:
    return workdir / f"{'warmup' if round_index < 0 else f'round{round_index}'}-{arm}"


@dataclass
class Job:
    """One timed job: overhead.py's record of its run, and torch's peak GPU memory (reserved) in it."""

    run: overhead.Run
    peak_reserved_bytes: int | None  # None without CUDA


def peak_reserved_bytes(arm: str, run_dir: Path) -> int | None:
    """torch's peak reserved memory on the job's GPU (device 0): bench_train's from its dump's summary, bare TRL's
    from the file it writes beside its model."""
    from benchmarks.bare_trl import CUDA_PEAK_FILE

    if arm == "trl":
        path = run_dir / "out" / CUDA_PEAK_FILE
        peaks = json.loads(path.read_text()) if path.exists() else None
    else:
        peaks = json.loads((run_dir / "metrics.json").read_text())["summary"]["cuda"]
    return next((device["max_memory_reserved_bytes"] for device in peaks or [] if device["device"] == 0), None)


def run_throughput(
    workload: Workload,
    model_dir: Path,
    data_path: Path,
    workdir: Path,
    env: dict[str, str],
    attention: str,
    warmup_round: bool = True,
) -> list[Job]:
    """An untimed two-step round of both arms (``warmup_round``: the first of all jobs pays for cold caches), then
    ``rounds`` rounds, every other one starting with bench_train."""
    schedule = [(index, ARMS if index % 2 == 0 else ARMS[::-1]) for index in range(workload.rounds)]
    if warmup_round:
        schedule.insert(0, (-1, ARMS))
    timed = []
    for round_index, arms in schedule:
        for arm in arms:
            work = replace(workload, max_steps=2) if round_index < 0 else workload
            run_dir = run_dir_of(workdir, arm, round_index)
            command = job_command(arm, work, model_dir, data_path, run_dir, attention)
            run = overhead.run_once("gpu", arm, round_index, command, run_dir, env)
            peak = peak_reserved_bytes(arm, run_dir)
            shutil.rmtree(run_dir / "out", ignore_errors=True)  # the trained model: 2 GB at the default size
            print(f"{run_dir.name}: {run.process_s:.1f} s, loop {run.loop_s:.2f} s", flush=True)
            if round_index >= 0:
                timed.append(Job(run, peak))
    return timed


def measured_steps(run: overhead.Run, warmup_steps: int) -> list[float]:
    """Durations of the job's steps after the first ``warmup_steps``, from the arrival of its steps' loss lines."""
    return [later - earlier for earlier, later in itertools.pairwise(run.step_ends[max(warmup_steps, 1) - 1 :])]


def job_figures(job: Job, workload: Workload) -> dict[str, Any]:
    steps = measured_steps(job.run, workload.warmup_steps)
    return {
        "step_s": statistics.median(steps),
        "tokens_per_second": workload.tokens_per_step * len(steps) / sum(steps),
        "loop_s": job.run.loop_s,
        "peak_reserved_bytes": job.peak_reserved_bytes,
    }


def throughput_summary(jobs: list[Job], workload: Workload) -> dict[str, Any]:
    """Per arm the medians of its jobs' figures; bench_train against bare TRL as medians of per-round ratios."""
    figures = {(job.run.arm, job.run.round): job_figures(job, workload) for job in jobs}
    losses = {(job.run.arm, job.run.round): job.run.losses for job in jobs}
    rounds = sorted({index for arm, index in figures if arm == "trl" and ("bench_train", index) in figures})

    def ratios(key: str) -> list[float]:
        return [figures["bench_train", index][key] / figures["trl", index][key] for index in rounds]

    def arm_median(arm: str, key: str) -> float:
        return statistics.median(figures[arm, index][key] for index in rounds)

    def arm_peak(arm: str) -> int | None:
        peaks = [figures[arm, index]["peak_reserved_bytes"] for index in rounds]
        return None if None in peaks else max(peaks)

    loss_differences = [  # losses as the trainer logged them (formatted numbers)
        abs(float(ours) - float(theirs)) / abs(float(theirs))
        for index in rounds
        for ours, theirs in zip(losses["bench_train", index], losses["trl", index], strict=True)
    ]
    return {
        "rounds": len(rounds),
        "tokens_per_second_ratio": statistics.median(ratios("tokens_per_second")),
        "step_time_ratio": statistics.median(ratios("step_s")),
        "loop_ratio": statistics.median(ratios("loop_s")),
        "tokens_per_second": {arm: arm_median(arm, "tokens_per_second") for arm in ARMS},
        "step_s": {arm: arm_median(arm, "step_s") for arm in ARMS},
        "loop_s": {arm: arm_median(arm, "loop_s") for arm in ARMS},
        "peak_reserved_bytes": {arm: arm_peak(arm) for arm in ARMS},
        "max_loss_difference": max(loss_differences),
        "jobs": {f"{arm}-{index}": values for (arm, index), values in figures.items()},
    }


# ---- 3. a real OOM ----


def run_oom(command: list[str], run_dir: Path, env: dict[str, str], gpu: Gpu) -> dict[str, Any]:
    """Run the OOM job; its exit code, the error category of its dump, its termination-log line, and the GPU memory
    in use before it and once it has exited (waiting up to FREED_WAIT_S for that to come back)."""
    run_dir.mkdir(parents=True)
    termination_log = run_dir / "termination-log"
    before = gpu.memory_used()
    with (run_dir / "stderr.log").open("w", encoding="utf-8") as stderr:
        process = subprocess.run(
            command,
            env={**env, "TERMINATION_LOG_FILE": str(termination_log)},
            cwd=overhead.REPO_ROOT,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            timeout=OOM_TIMEOUT_S,
        )
    exited = time.monotonic()
    after = gpu.memory_used()
    while after is not None and after > before + FREED_TOLERANCE_BYTES and time.monotonic() - exited < FREED_WAIT_S:
        time.sleep(0.2)
        after = gpu.memory_used()
    dump_path = run_dir / "metrics.json"
    dump = json.loads(dump_path.read_text()) if dump_path.exists() else {}
    return {
        "exit_code": process.returncode,
        "dump_category": (dump.get("error") or {}).get("category"),
        "termination_log": termination_log.read_text().strip() if termination_log.exists() else None,
        "memory_before_bytes": before,
        "memory_after_bytes": after,
        "freed_after_s": time.monotonic() - exited if after is not None else None,
        "stderr_tail": (run_dir / "stderr.log").read_text(errors="replace")[-2000:],
    }


# ---- 4. NVML series and CUDA peak memory in a dump ----


def dump_summary(dump: dict[str, Any]) -> dict[str, Any]:
    """What the check reads from a bench_train dump: the GPU series' contexts and sample counts, their extremes and
    averages on ``{"gpu": 0}``, the CUDA peaks and the token counts."""

    def values(name: str, context: dict[str, Any]) -> list[float]:
        found = [series for series in dump["metrics"] if series["name"] == name and series["context"] == context]
        return [value for series in found for value in series["values"] if value is not None]

    gpu_contexts = [series["context"] for series in dump["metrics"] if series["name"].startswith("gpu_")]
    gpu0 = {"gpu": 0}
    power, percent = values(GPU_POWER, gpu0), values(GPU_POWER_PERCENT, gpu0)
    return {
        "gpu_contexts": sorted({json.dumps(context, sort_keys=True) for context in gpu_contexts}),
        "samples": {name: len(values(name, gpu0)) for name in NVML_SERIES},
        "utilization_max": max(values(GPU_UTILIZATION, gpu0), default=None),
        "memory_used_max_bytes": max(values(GPU_MEMORY_USED, gpu0), default=None),
        "power_avg_watts": statistics.mean(power) if power else None,
        "power_avg_percent": statistics.mean(percent) if percent else None,
        "cuda": dump["summary"]["cuda"],
        "tokens_per_step": sorted({int(value) for value in values(STEP_TOKENS, {})}),
        "tokens_per_second": dump["summary"]["tokens_per_second"],
    }


# ---- the whole check ----


def run_check(
    workload: Workload,
    workdir: Path,
    gpu: Gpu,
    attention: str,
    warmup_round: bool = True,
    oom_flags: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Every step of the check; a step that fails is recorded as its error and the others still run.
    ``oom_flags`` go to the OOM job only (tests inject a stand-in OOM with them where no GPU can run out)."""
    import torch

    started = time.perf_counter()
    results: dict[str, Any] = {
        "workload": asdict(workload),
        "attention": attention,
        "gpu": {"uuid": gpu.uuid, "name": gpu.name, "power_limit_watts": gpu.power_limit_watts},
        "versions": {"torch": torch.__version__, "cuda": torch.version.cuda},
    }
    env = job_env(workload, gpu)
    model_dir, data_path = workdir / "model", workdir / "train.jsonl"

    def step(name: str, work: Callable[[], Any]) -> None:
        print(f"--- {name} (at {time.perf_counter() - started:.0f} s)", flush=True)
        try:
            results[name] = work()
        except Exception as exc:  # noqa: BLE001 - one failed step must not hide the others' figures
            traceback.print_exc()
            results[name] = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0]}

    step("model", lambda: build_model(model_dir, workload))
    records = max(workload.oom_batch_size, workload.batch_size * workload.max_steps)
    build_dataset(data_path, records, workload.seq_length, workload.seed)
    jobs: list[Job] = []

    def throughput() -> dict[str, Any]:
        jobs.extend(run_throughput(workload, model_dir, data_path, workdir, env, attention, warmup_round))
        return throughput_summary(jobs, workload)

    step("throughput", throughput)
    last_dump = run_dir_of(workdir, "bench_train", workload.rounds - 1) / "metrics.json"
    step("dump", lambda: dump_summary(json.loads(last_dump.read_text())))
    oom_workload = replace(workload, batch_size=workload.oom_batch_size)
    oom_dir = workdir / "oom"
    oom_command = [*job_command("bench_train", oom_workload, model_dir, data_path, oom_dir, attention), *oom_flags]
    step("oom", lambda: run_oom(oom_command, oom_dir, env, gpu))
    results["runs"] = [{**asdict(job.run), "peak_reserved_bytes": job.peak_reserved_bytes} for job in jobs]
    results["seconds"] = time.perf_counter() - started
    return results


# ---- 5. the table ----


@dataclass
class Row:
    figure: str
    value: str
    target: str = ""
    ok: bool | None = None  # None: a figure without a target


def _gib(value: float | None) -> str:
    return "—" if value is None else f"{value / GIB:.2f} GiB"


def _failed(figure: str, result: dict[str, Any]) -> list[Row]:
    return [Row(figure, f"failed: {result['error']}", "completes", False)]


def model_rows(results: dict[str, Any]) -> list[Row]:
    model, workload = results["model"], results["workload"]
    if "error" in model:
        return _failed("model", model)
    low, high = MODEL_PARAMETERS
    ok = low <= model["parameters"] <= high and model["dtypes"] == ["BF16"]
    parameters, rounds = model["parameters"], workload["rounds"]
    value = f"{parameters:,} ({parameters / 1e9:.2f} B), {'/'.join(model['dtypes'])}, built in {model['seconds']:.0f} s"
    work = (
        f"batch {workload['batch_size']} × {workload['seq_length']} tokens, {workload['max_steps']} steps "
        f"(first {workload['warmup_steps']} left out), {results['attention']}, {rounds} round{'s' * (rounds != 1)}"
    )
    return [
        Row("random-initialised Llama: parameters", value, f"{low / 1e9:g}-{high / 1e9:g} B, BF16", ok),
        Row("work of every throughput job", work),
    ]


def throughput_rows(results: dict[str, Any]) -> list[Row]:
    summary = results["throughput"]
    if "error" in summary:
        return _failed("throughput: bench_train against bare TRL", summary)
    tokens, steps, peaks = summary["tokens_per_second"], summary["step_s"], summary["peak_reserved_bytes"]
    loop_ratio, loops = summary["loop_ratio"], summary["loop_s"]
    our_share = 100 * (1 - 1 / loop_ratio)  # of bench_train's loop, what bare TRL's lacks
    peak_ok = None not in peaks.values() and peaks["bench_train"] <= peaks["trl"] * (1 + MEMORY_TOLERANCE)
    return [
        Row(
            "tokens/s, bench_train ÷ bare TRL",
            f"{summary['tokens_per_second_ratio']:.3f}× ({tokens['bench_train']:,.0f} vs {tokens['trl']:,.0f})",
            f"≥ {MIN_RATIO}×",
            summary["tokens_per_second_ratio"] >= MIN_RATIO,
        ),
        Row(
            "step time, bench_train ÷ bare TRL",
            f"{summary['step_time_ratio']:.3f}× ({steps['bench_train'] * 1e3:.1f} vs {steps['trl'] * 1e3:.1f} ms)",
            f"≤ {1 / MIN_RATIO:.2f}×",
            summary["step_time_ratio"] <= 1 / MIN_RATIO,
        ),
        Row(
            "peak GPU memory (torch, reserved)",
            f"bench_train {_gib(peaks['bench_train'])}, bare TRL {_gib(peaks['trl'])}",
            f"bench_train ≤ bare TRL + {MEMORY_TOLERANCE:.0%}",
            peak_ok,
        ),
        Row(
            "same work: per-step losses against bare TRL's",
            f"differ by ≤ {summary['max_loss_difference']:.3%}",
            f"≤ {LOSS_TOLERANCE:.0%}",
            summary["max_loss_difference"] <= LOSS_TOLERANCE,
        ),
        Row(
            "loop (train_runtime), bench_train ÷ bare TRL: our share of the loop",
            f"{loop_ratio:.3f}× ({loops['bench_train']:.1f} vs {loops['trl']:.1f} s): ours {our_share:+.2f} %",
            f"≤ {LOOP_TARGET:g}×",
            loop_ratio <= LOOP_TARGET,
        ),
    ]


def dump_rows(results: dict[str, Any]) -> list[Row]:
    dump, workload, gpu = results["dump"], Workload(**results["workload"]), results["gpu"]
    if "error" in dump:
        return _failed("the last bench_train dump", dump)
    rows = []
    present = [name for name, count in dump["samples"].items() if count > 0]
    contexts_ok = dump["gpu_contexts"] == ['{"gpu": 0}']
    rows.append(
        Row(
            f'NVML series under {{"gpu": 0}}, GPU named by UUID ({gpu["uuid"] or "no NVML here"})',
            f"{len(present)}/{len(NVML_SERIES)} series, ≥ {min(dump['samples'].values())} samples each; "
            f"GPU contexts {', '.join(dump['gpu_contexts']) or 'none'}",
            f'{len(NVML_SERIES)}/{len(NVML_SERIES)}, only {{"gpu": 0}}',
            len(present) == len(NVML_SERIES) and contexts_ok,
        )
    )
    utilization = dump["utilization_max"]
    rows.append(
        Row(
            "GPU utilisation while training (max)",
            "—" if utilization is None else f"{utilization:.0f} %",
            f"≥ {MIN_UTILIZATION:.0f} %",
            utilization is not None and utilization >= MIN_UTILIZATION,
        )
    )
    watts, percent, limit = dump["power_avg_watts"], dump["power_avg_percent"], gpu["power_limit_watts"]
    power_ok = None not in (watts, percent, limit) and watts > 0
    power_ok = power_ok and abs(percent - 100 * watts / limit) <= POWER_PERCENT_TOLERANCE
    rows.append(
        Row(
            "GPU power while training (mean)",
            "—" if None in (watts, percent) else f"{watts:.0f} W = {percent:.1f} % (enforced limit {limit or 0:.0f} W)",
            f"% = 100 × W ÷ enforced limit (± {POWER_PERCENT_TOLERANCE})",
            bool(power_ok),
        )
    )
    cuda = next((device for device in dump["cuda"] or [] if device["device"] == 0), None)
    reserved = cuda["max_memory_reserved_bytes"] if cuda else None
    used = dump["memory_used_max_bytes"]
    rows.append(
        Row(
            "CUDA peak memory in the dump's summary",
            f"reserved {_gib(reserved)}, allocated {_gib(cuda['max_memory_allocated_bytes'] if cuda else None)}",
            "present (device 0)",
            bool(reserved),
        )
    )
    rows.append(
        Row(
            "GPU memory used by NVML (max) against CUDA's reserved peak",
            f"{_gib(used)} against {_gib(reserved)}",
            "NVML ≥ CUDA",
            None not in (used, reserved) and used >= reserved,
        )
    )
    rows.append(
        Row(
            "bench_train's tokens per step",
            ", ".join(map(str, dump["tokens_per_step"])) or "—",
            f"{workload.batch_size} × {workload.seq_length} = {workload.tokens_per_step}",
            dump["tokens_per_step"] == [workload.tokens_per_step],
        )
    )
    same_job = results["throughput"].get("jobs", {}).get(f"bench_train-{workload.rounds - 1}")
    measured = same_job["tokens_per_second"] if same_job else None
    if measured and dump["tokens_per_second"]:
        ratio = dump["tokens_per_second"] / measured
        rows.append(
            Row(
                "bench_train's tokens/s in its dump ÷ from its step ends",
                f"{ratio:.3f}×",
                f"1 ± {DUMP_THROUGHPUT_TOLERANCE}",
                abs(ratio - 1) <= DUMP_THROUGHPUT_TOLERANCE,
            )
        )
    return rows


def oom_rows(results: dict[str, Any]) -> list[Row]:
    oom, workload = results["oom"], results["workload"]
    figure = f"OOM job (batch {workload['oom_batch_size']})"
    if "error" in oom:
        return _failed(figure, oom)
    expected = exit_code_for(ErrorCategory.GPU_OOM)
    line = oom["termination_log"] or "none"
    category_ok = oom["dump_category"] == ErrorCategory.GPU_OOM and line.startswith(f"{ErrorCategory.GPU_OOM}: ")
    before, after, freed = oom["memory_before_bytes"], oom["memory_after_bytes"], oom["freed_after_s"]
    freed_ok = None not in (before, after) and after - before <= FREED_TOLERANCE_BYTES
    freed_value = (
        "— (no NVML)" if None in (before, after) else f"{(after - before) / GIB:+.2f} GiB, {freed:.1f} s after exit"
    )
    return [
        Row(f"{figure}: exit code", str(oom["exit_code"]), str(expected), oom["exit_code"] == expected),
        Row(
            f"{figure}: category in the dump / termination log",
            f"{oom['dump_category']} / {line[:70]}",
            f"{ErrorCategory.GPU_OOM} in both",
            category_ok,
        ),
        Row(
            f"{figure}: GPU memory in use after it, against before",
            freed_value,
            f"≤ +{FREED_TOLERANCE_BYTES / GIB:.0f} GiB within {FREED_WAIT_S:.0f} s",
            freed_ok,
        ),
    ]


def table_rows(results: dict[str, Any]) -> list[Row]:
    versions = results["versions"]
    device = f"{results['gpu']['name'] or 'unknown (no NVML)'}, torch {versions['torch']}, CUDA {versions['cuda']}"
    rows = [
        Row("GPU", device),
        *model_rows(results),
        *throughput_rows(results),
        *dump_rows(results),
        *oom_rows(results),
    ]
    minutes, seconds = divmod(round(results["seconds"]), 60)
    rows.append(
        Row(
            "whole check",
            f"{minutes} min {seconds} s",
            f"< {TIME_LIMIT_S // 60} min",
            results["seconds"] < TIME_LIMIT_S,
        )
    )
    return rows


def markdown(rows: list[Row]) -> str:
    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    lines = ["| figure | value | target | ✓/✗ |", "|---|---|---|---|"]
    for row in rows:
        verdict = "" if row.ok is None else ("✓" if row.ok else "✗")
        lines.append(f"| {cell(row.figure)} | {cell(row.value)} | {cell(row.target)} | {verdict} |")
    return "\n".join(lines)


def write_report(rows: list[Row], results: dict[str, Any], output: Path) -> None:
    """The table to ``output``, the raw results beside it (``.json``)."""
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(markdown(rows) + "\n", encoding="utf-8")
    output.with_suffix(".json").write_text(json.dumps(results, indent=2, default=str), encoding="utf-8")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    summary, details = __doc__.split("\n\n", 1)
    parser = argparse.ArgumentParser(
        description=summary, epilog=details, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--output", default="gpu_check.md", help="the table (%(default)s); raw numbers beside it")
    parser.add_argument("--workdir", default=None, help="keep model, data, job outputs and logs in this new folder")
    parser.add_argument("--no_warmup_round", action="store_true", help="skip the untimed round before the rounds")
    for spec in fields(Workload):
        parser.add_argument(
            f"--{spec.name}",
            type=type(spec.default),
            default=spec.default,
            help=f"{spec.metadata['help']} (%(default)s)",
        )
    args = parser.parse_args(argv)
    if not 0 <= args.warmup_steps < args.max_steps - 1:
        parser.error("--warmup_steps must leave at least two of --max_steps to measure")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device here (torch.cuda.is_available() is False), so nothing to check")
        return 0
    from transformers.utils import is_flash_attn_2_available

    workload = Workload(**{spec.name: getattr(args, spec.name) for spec in fields(Workload)})
    attention = FLASH_ATTENTION if is_flash_attn_2_available() else "sdpa"
    gpu = find_gpu()
    try:
        with tempfile.TemporaryDirectory(prefix="gpu-check-") as scratch:
            workdir = Path(args.workdir or scratch)
            results = run_check(workload, workdir, gpu, attention, warmup_round=not args.no_warmup_round)
    finally:
        gpu.close()
    rows = table_rows(results)
    print(markdown(rows))
    write_report(rows, results, Path(args.output))
    print(f"table: {args.output}, raw numbers: {Path(args.output).with_suffix('.json')}")
    return 0 if all(row.ok is not False for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
