"""What only a GPU can show, in one command: ``make gpu-check`` (``python -m benchmarks.gpu_check``), on one CUDA
device, in under 8 minutes, with nothing downloaded.

A random-initialised ~1 B Llama and its data, built locally; bench_train (local Aim repo, journal, system metrics)
against bare TRL on identical work, alternated as ``benchmarks/overhead.py`` runs its arms; a real OOM; the NVML
series and CUDA peak memory in bench_train's dump (the README's "On a GPU" says what each figure means). One Markdown
table (figure, value, target, ✓/✗), printed and written to ``--output`` with the raw numbers beside it (.json); exit 0
when every target is met, 1 otherwise. Without CUDA it prints one line saying so and exits 0. It uses the first GPU
that ``CUDA_VISIBLE_DEVICES`` leaves visible; the GPU series need NVML (the ``nvml`` extra: ``make gpu-check`` has it).
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
from tuning.benchmarking import system_metrics
from tuning.benchmarking.schema import STEP_TOKENS
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
NVML_SERIES = (
    system_metrics.GPU_UTILIZATION,
    system_metrics.GPU_MEMORY_USED,
    system_metrics.GPU_POWER,
    system_metrics.GPU_POWER_PERCENT,
)


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


def find_gpu() -> Gpu:
    """The first GPU this process's CUDA sees; NVML stays open for the OOM step's memory readings."""
    nvml = system_metrics.init_nvml()
    handles = system_metrics.visible_gpu_handles(nvml) if nvml is not None else []
    if not handles:
        return Gpu()
    handle, text = handles[0], system_metrics.nvml_text
    uuid, name = text(nvml.nvmlDeviceGetUUID(handle)), text(nvml.nvmlDeviceGetName(handle))
    return Gpu(uuid, name, nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0, nvml, handle)


def build_model(model_dir: Path, workload: Workload) -> dict[str, Any]:
    """The Llama and its tokenizer in ``model_dir``; its parameter count and dtypes (from the safetensors headers)."""
    from safetensors import safe_open

    started = time.perf_counter()
    build_llama(str(model_dir), **workload.model_shape(), dtype=workload.torch_dtype, seed=workload.seed)
    parameters, dtypes = 0, set()
    for path in model_dir.glob("*.safetensors"):
        with safe_open(str(path), "pt") as weights:
            for name in weights.keys():  # noqa: SIM118 - a safetensors file is not iterable
                tensor = weights.get_slice(name)
                parameters += math.prod(tensor.get_shape())
                dtypes.add(tensor.get_dtype())
    return {"parameters": parameters, "dtypes": sorted(dtypes), "seconds": time.perf_counter() - started}


def build_dataset(path: Path, records: int, seq_length: int, seed: int) -> Path:
    """JSON lines in the sample data's shape and words, each response ``seq_length`` words long: every example has
    more than ``seq_length`` tokens (a word is at least one), so every sequence is cut to it and none is padded."""
    words = sorted({word for record in load_records(SAMPLE_TRAIN_PATH) for word in record["output"].split()})
    rng = random.Random(seed)
    with path.open("w", encoding="utf-8") as handle:
        for _ in range(records):
            text = f"### Input: {' '.join(rng.choices(words, k=4))}\n{overhead.RESPONSE_TEMPLATE} "
            handle.write(json.dumps({"output": text + " ".join(rng.choices(words, k=seq_length))}) + "\n")
    return path


def job_command(
    arm: str, workload: Workload, model_dir: Path, data_path: Path, run_dir: Path, attention: str
) -> list[str]:
    """overhead.py's command for ``arm`` (so both arms share its flags) with this check's settings appended: argparse
    keeps the last value of a flag given twice."""
    settings = overhead.Settings(
        max_steps=workload.max_steps,
        batch_size=workload.batch_size,
        max_seq_length=workload.seq_length,
        seed=workload.seed,
        threads=workload.threads,
    )
    command = [
        *overhead.command(arm, settings, str(model_dir), run_dir),
        *("--training_data_path", str(data_path), "--torch_dtype", workload.torch_dtype),
        *("--bf16", str(workload.torch_dtype == "bfloat16"), "--learning_rate", str(workload.learning_rate)),
    ]
    if arm == "trl":
        return [*command, "--attn_implementation", attention]
    return [
        *command,
        *("--use_flash_attn", str(attention == FLASH_ATTENTION), "--skip_warmup_steps", str(workload.warmup_steps)),
        *("--system_metrics_interval", str(workload.system_metrics_interval)),
    ]


def device0(peaks: list[dict[str, Any]] | None) -> dict[str, Any]:
    """Device 0's entry in ``tuning.benchmarking.cuda_peak_memory``'s list ({} without CUDA)."""
    return next((device for device in peaks or [] if device["device"] == 0), {})


@dataclass
class Job:
    """One timed job: overhead.py's record of its run, and torch's peak GPU memory (reserved) in it."""

    run: overhead.Run
    peak_reserved_bytes: int | None  # None without CUDA


def peak_reserved_bytes(arm: str, run_dir: Path) -> int | None:
    """torch's peak on device 0: bench_train's from its dump's summary, bare TRL's from the file beside its model."""
    from benchmarks.bare_trl import CUDA_PEAK_FILE

    if arm == "trl":
        path = run_dir / "out" / CUDA_PEAK_FILE
        peaks = json.loads(path.read_text()) if path.exists() else None
    else:
        peaks = json.loads((run_dir / "metrics.json").read_text())["summary"]["cuda"]
    return device0(peaks).get("max_memory_reserved_bytes")


def run_throughput(
    workload: Workload, workdir: Path, env: dict[str, str], command: Callable[..., list[str]], warmup: bool
) -> list[Job]:
    """overhead.py's alternating rounds of both arms, after a two-step warm-up round where ``warmup`` (the first job
    pays for cold caches); ``command(arm, workload, run_dir)`` is a job's command line."""

    def argv(arm: str, round_index: int, run_dir: Path) -> list[str]:
        return command(arm, replace(workload, max_steps=2) if round_index < 0 else workload, run_dir)

    jobs = []
    for run in overhead.alternating_runs("gpu", list(ARMS), workload.rounds, warmup, workdir, env, argv):
        run_dir = overhead.run_dir_of(workdir, run.arm, run.round)
        peak = peak_reserved_bytes(run.arm, run_dir)
        shutil.rmtree(run_dir / "out", ignore_errors=True)  # the trained model: 2 GB at the default size
        print(f"{run_dir.name}: {run.process_s:.1f} s, loop {run.loop_s:.2f} s", flush=True)
        if run.round >= 0:
            jobs.append(Job(run, peak))
    return jobs


def job_figures(job: Job, workload: Workload) -> dict[str, Any]:
    """Tokens/s and median step time of the steps after the first ``warmup_steps`` (a step ends when its loss line
    arrives), the loop (``train_runtime``) and the peak memory."""
    ends = job.run.step_ends[max(workload.warmup_steps, 1) - 1 :]
    steps = [later - earlier for earlier, later in itertools.pairwise(ends)]
    return {
        "step_s": statistics.median(steps),
        "tokens_per_second": workload.tokens_per_step / statistics.mean(steps),
        "loop_s": job.run.loop_s,
        "peak_reserved_bytes": job.peak_reserved_bytes,
    }


def throughput_summary(jobs: list[Job], workload: Workload) -> dict[str, Any]:
    """Per arm the medians of its jobs' figures (the largest peak); bench_train against bare TRL as medians of
    per-round ratios."""
    figures = {(job.run.arm, job.run.round): job_figures(job, workload) for job in jobs}
    losses = {(job.run.arm, job.run.round): job.run.losses for job in jobs}
    rounds = sorted({job.run.round for job in jobs})  # complete: a failed job fails the whole step

    def ratio(key: str) -> float:
        return statistics.median(figures["bench_train", index][key] / figures["trl", index][key] for index in rounds)

    def per_arm(key: str, combine: Callable[[list], Any] = statistics.median) -> dict[str, Any]:
        return {arm: combine([figures[arm, index][key] for index in rounds]) for arm in ARMS}

    loss_differences = [  # losses as the trainer logged them (formatted numbers)
        abs(float(ours) - float(theirs)) / abs(float(theirs))
        for index in rounds
        for ours, theirs in zip(losses["bench_train", index], losses["trl", index], strict=True)
    ]
    return {
        "rounds": len(rounds),
        "tokens_per_second_ratio": ratio("tokens_per_second"),
        "step_time_ratio": ratio("step_s"),
        "loop_ratio": ratio("loop_s"),
        "tokens_per_second": per_arm("tokens_per_second"),
        "step_s": per_arm("step_s"),
        "loop_s": per_arm("loop_s"),
        "peak_reserved_bytes": per_arm("peak_reserved_bytes", lambda peaks: None if None in peaks else max(peaks)),
        "max_loss_difference": max(loss_differences),
        "jobs": {f"{arm}-{index}": values for (arm, index), values in figures.items()},
    }


def run_oom(command: list[str], run_dir: Path, env: dict[str, str], gpu: Gpu) -> dict[str, Any]:
    """The OOM job's exit code, its dump's error category, its termination-log line, and the GPU memory in use before
    it and once it has exited (waiting up to FREED_WAIT_S for that to come back)."""
    run_dir.mkdir(parents=True)
    termination_log, stderr_path = run_dir / "termination-log", run_dir / "stderr.log"
    before = gpu.memory_used()
    with stderr_path.open("w", encoding="utf-8") as stderr:
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
        "stderr_tail": stderr_path.read_text(errors="replace")[-2000:],
    }


def dump_summary(dump: dict[str, Any]) -> dict[str, Any]:
    """The GPU series' contexts; on ``{"gpu": 0}`` their counts, maxima and means from the dump's own aggregates
    (system samples have no step, so none is left out as warmup); CUDA peaks and token counts."""
    gpu0 = {one["name"]: one for one in dump["aggregates"] if one["context"] == {"gpu": 0}}

    def aggregate(name: str, key: str) -> Any:
        return gpu0.get(name, {}).get(key)

    contexts = {json.dumps(one["context"], sort_keys=True) for one in dump["metrics"] if one["name"].startswith("gpu_")}
    tokens = [one["values"] for one in dump["metrics"] if one["name"] == STEP_TOKENS and not one["context"]]
    return {
        "gpu_contexts": sorted(contexts),
        "samples": {name: aggregate(name, "count") or 0 for name in NVML_SERIES},
        "utilization_max": aggregate(system_metrics.GPU_UTILIZATION, "max"),
        "memory_used_max_bytes": aggregate(system_metrics.GPU_MEMORY_USED, "max"),
        "power_avg_watts": aggregate(system_metrics.GPU_POWER, "avg"),
        "power_avg_percent": aggregate(system_metrics.GPU_POWER_PERCENT, "avg"),
        "cuda": dump["summary"]["cuda"],
        "tokens_per_step": sorted({int(value) for values in tokens for value in values if value is not None}),
        "tokens_per_second": dump["summary"]["tokens_per_second"],
    }


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
    env = overhead.child_env(workload.threads)
    if gpu.uuid is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu.uuid  # the dump must still key its series by index
    model_dir, data_path = workdir / "model", workdir / "train.jsonl"

    def command(arm: str, work: Workload, run_dir: Path) -> list[str]:
        return job_command(arm, work, model_dir, data_path, run_dir, attention)

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
        jobs.extend(run_throughput(workload, workdir, env, command, warmup_round))
        return throughput_summary(jobs, workload)

    step("throughput", throughput)
    last_dump = overhead.run_dir_of(workdir, "bench_train", workload.rounds - 1) / "metrics.json"
    step("dump", lambda: dump_summary(json.loads(last_dump.read_text())))
    oom_dir = workdir / "oom"
    oom_command = [*command("bench_train", replace(workload, batch_size=workload.oom_batch_size), oom_dir), *oom_flags]
    step("oom", lambda: run_oom(oom_command, oom_dir, env, gpu))
    results["runs"] = [{**asdict(job.run), "peak_reserved_bytes": job.peak_reserved_bytes} for job in jobs]
    results["seconds"] = time.perf_counter() - started
    return results


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
    model, work = results["model"], results["workload"]
    if "error" in model:
        return _failed("model", model)
    (low, high), parameters, rounds = MODEL_PARAMETERS, model["parameters"], work["rounds"]
    value = f"{parameters:,} ({parameters / 1e9:.2f} B), {'/'.join(model['dtypes'])}, built in {model['seconds']:.0f} s"
    ok = low <= parameters <= high and model["dtypes"] == ["BF16"]
    every_job = (
        f"batch {work['batch_size']} × {work['seq_length']} tokens, {work['max_steps']} steps "
        f"(first {work['warmup_steps']} left out), {results['attention']}, {rounds} round{'s' * (rounds != 1)}"
    )
    return [
        Row("random-initialised Llama: parameters", value, f"{low / 1e9:g}-{high / 1e9:g} B, BF16", ok),
        Row("work of every throughput job", every_job),
    ]


def throughput_rows(results: dict[str, Any]) -> list[Row]:
    summary = results["throughput"]
    if "error" in summary:
        return _failed("throughput: bench_train against bare TRL", summary)
    tokens, steps, loops = summary["tokens_per_second"], summary["step_s"], summary["loop_s"]
    tokens_ratio, step_ratio = summary["tokens_per_second_ratio"], summary["step_time_ratio"]
    loop_ratio, peaks, loss = summary["loop_ratio"], summary["peak_reserved_bytes"], summary["max_loss_difference"]
    our_share = 100 * (1 - 1 / loop_ratio)  # of bench_train's loop, what bare TRL's lacks
    tokens_value = f"{tokens_ratio:.3f}× ({tokens['bench_train']:,.0f} vs {tokens['trl']:,.0f})"
    step_value = f"{step_ratio:.3f}× ({steps['bench_train'] * 1e3:.1f} vs {steps['trl'] * 1e3:.1f} ms)"
    peak_value = f"bench_train {_gib(peaks['bench_train'])}, bare TRL {_gib(peaks['trl'])}"
    peak_ok = None not in peaks.values() and peaks["bench_train"] <= peaks["trl"] * (1 + MEMORY_TOLERANCE)
    loop_value = f"{loop_ratio:.3f}× ({loops['bench_train']:.1f} vs {loops['trl']:.1f} s): ours {our_share:+.2f} %"
    return [
        Row("tokens/s, bench_train ÷ bare TRL", tokens_value, f"≥ {MIN_RATIO}×", tokens_ratio >= MIN_RATIO),
        Row("step time, bench_train ÷ bare TRL", step_value, f"≤ {1 / MIN_RATIO:.2f}×", step_ratio <= 1 / MIN_RATIO),
        Row(
            "peak GPU memory (torch, reserved)", peak_value, f"bench_train ≤ bare TRL + {MEMORY_TOLERANCE:.0%}", peak_ok
        ),
        Row(
            "same work: per-step losses against bare TRL's",
            f"differ by ≤ {loss:.3%}",
            f"≤ {LOSS_TOLERANCE:.0%}",
            loss <= LOSS_TOLERANCE,
        ),
        Row(
            "loop (train_runtime), bench_train ÷ bare TRL: our share of the loop",
            loop_value,
            f"≤ {LOOP_TARGET:g}×",
            loop_ratio <= LOOP_TARGET,
        ),
    ]


def dump_rows(results: dict[str, Any]) -> list[Row]:
    dump, workload, gpu = results["dump"], Workload(**results["workload"]), results["gpu"]
    if "error" in dump:
        return _failed("the last bench_train dump", dump)
    samples, contexts, tokens = dump["samples"], dump["gpu_contexts"], dump["tokens_per_step"]
    series = f"{sum(count > 0 for count in samples.values())}/{len(NVML_SERIES)} series, ≥ {min(samples.values())} "
    series += f"samples each; GPU contexts {', '.join(contexts) or 'none'}"
    series_ok = all(samples.values()) and contexts == ['{"gpu": 0}']
    utilization, used = dump["utilization_max"], dump["memory_used_max_bytes"]
    watts, percent, limit = dump["power_avg_watts"], dump["power_avg_percent"], gpu["power_limit_watts"]
    power_ok = None not in (watts, percent, limit) and watts > 0
    power_ok = bool(power_ok and abs(percent - 100 * watts / limit) <= POWER_PERCENT_TOLERANCE)
    power = "—" if None in (watts, percent) else f"{watts:.0f} W = {percent:.1f} % (enforced limit {limit or 0:.0f} W)"
    cuda = device0(dump["cuda"])
    reserved, allocated = cuda.get("max_memory_reserved_bytes"), cuda.get("max_memory_allocated_bytes")
    rows = [
        Row(
            f'NVML series under {{"gpu": 0}}, GPU named by UUID ({gpu["uuid"] or "no NVML here"})',
            series,
            f'{len(NVML_SERIES)}/{len(NVML_SERIES)}, only {{"gpu": 0}}',
            series_ok,
        ),
        Row(
            "GPU utilisation while training (max)",
            "—" if utilization is None else f"{utilization:.0f} %",
            f"≥ {MIN_UTILIZATION:.0f} %",
            utilization is not None and utilization >= MIN_UTILIZATION,
        ),
        Row(
            "GPU power while training (mean)",
            power,
            f"% = 100 × W ÷ enforced limit (± {POWER_PERCENT_TOLERANCE})",
            power_ok,
        ),
        Row(
            "CUDA peak memory in the dump's summary",
            f"reserved {_gib(reserved)}, allocated {_gib(allocated)}",
            "present (device 0)",
            bool(reserved),
        ),
        Row(
            "GPU memory used by NVML (max) against CUDA's reserved peak",
            f"{_gib(used)} against {_gib(reserved)}",
            "NVML ≥ CUDA",
            None not in (used, reserved) and used >= reserved,
        ),
        Row(
            "bench_train's tokens per step",
            ", ".join(map(str, tokens)) or "—",
            f"{workload.batch_size} × {workload.seq_length} = {workload.tokens_per_step}",
            tokens == [workload.tokens_per_step],
        ),
    ]
    same_job = results["throughput"].get("jobs", {}).get(f"bench_train-{workload.rounds - 1}")
    if same_job and dump["tokens_per_second"]:
        ratio = dump["tokens_per_second"] / same_job["tokens_per_second"]
        figure = "bench_train's tokens/s in its dump ÷ from its step ends"
        ok = abs(ratio - 1) <= DUMP_THROUGHPUT_TOLERANCE
        rows.append(Row(figure, f"{ratio:.3f}×", f"1 ± {DUMP_THROUGHPUT_TOLERANCE}", ok))
    return rows


def oom_rows(results: dict[str, Any]) -> list[Row]:
    oom, category = results["oom"], ErrorCategory.GPU_OOM
    figure = f"OOM job (batch {results['workload']['oom_batch_size']})"
    if "error" in oom:
        return _failed(figure, oom)
    code, expected, line = oom["exit_code"], exit_code_for(category), oom["termination_log"] or "none"
    categories_ok = oom["dump_category"] == category and line.startswith(f"{category}: ")
    before, after = oom["memory_before_bytes"], oom["memory_after_bytes"]
    freed = (
        "— (no NVML)"
        if None in (before, after)
        else f"{(after - before) / GIB:+.2f} GiB, {oom['freed_after_s']:.1f} s after exit"
    )
    freed_ok = None not in (before, after) and after - before <= FREED_TOLERANCE_BYTES
    freed_target = f"≤ +{FREED_TOLERANCE_BYTES / GIB:.0f} GiB within {FREED_WAIT_S:.0f} s"
    return [
        Row(f"{figure}: exit code", str(code), str(expected), code == expected),
        Row(
            f"{figure}: category in the dump / termination log",
            f"{oom['dump_category']} / {line[:70]}",
            f"{category} in both",
            categories_ok,
        ),
        Row(f"{figure}: GPU memory in use after it, against before", freed, freed_target, freed_ok),
    ]


def table_rows(results: dict[str, Any]) -> list[Row]:
    versions, (minutes, seconds) = results["versions"], divmod(round(results["seconds"]), 60)
    device = f"{results['gpu']['name'] or 'unknown (no NVML)'}, torch {versions['torch']}, CUDA {versions['cuda']}"
    return [
        Row("GPU", device),
        *model_rows(results),
        *throughput_rows(results),
        *dump_rows(results),
        *oom_rows(results),
        Row(
            "whole check",
            f"{minutes} min {seconds} s",
            f"< {TIME_LIMIT_S // 60} min",
            results["seconds"] < TIME_LIMIT_S,
        ),
    ]


def markdown(rows: list[Row]) -> str:
    lines = ["| figure | value | target | ✓/✗ |", "|---|---|---|---|"]
    for row in rows:
        cells = [row.figure, row.value, row.target, "" if row.ok is None else ("✓" if row.ok else "✗")]
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines)


def write_report(rows: list[Row], results: dict[str, Any], output: Path) -> None:
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
        help_text = f"{spec.metadata['help']} (%(default)s)"
        parser.add_argument(f"--{spec.name}", type=type(spec.default), default=spec.default, help=help_text)
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
            results = run_check(workload, Path(args.workdir or scratch), gpu, attention, not args.no_warmup_round)
    finally:
        gpu.close()
    rows = table_rows(results)
    print(markdown(rows))
    write_report(rows, results, Path(args.output))
    print(f"table: {args.output}, raw numbers: {Path(args.output).with_suffix('.json')}")
    return 0 if all(row.ok is not False for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
