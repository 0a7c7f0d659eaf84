"""What only a GPU can show, in one command: ``make gpu-check`` (``python -m benchmarks.gpu_check``), on one CUDA
device, in under 8 minutes, with nothing downloaded.

A random-initialised ~1 B Llama and its data, built locally; bench_train against bare TRL on identical work, alternated
as ``benchmarks/overhead.py`` runs its arms; a real OOM and its memory snapshot; the NVML series, CUDA peak memory and
the CUDA-event step anatomy in bench_train's dump; a profiled step window with its memory snapshot. One Markdown table
(figure, value, target, ✓/✗), printed and written to ``--output`` with the raw numbers beside it (.json); exit 0 when
every target is met (and without CUDA), 1 otherwise. docs/performance.md's "On a GPU" section says what each figure
means and what the check needs. On the lent GPU machine, which has no network, ``benchmarks/gpu_device.sh`` runs it;
``--cpu_rehearsal`` runs every step on CPU with stand-ins.
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
from contextlib import closing
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch
import transformers
from safetensors import safe_open
from transformers.utils import is_flash_attn_2_available

from benchmarks import overhead
from benchmarks.bare_trl import CUDA_PEAK_FILE
from tuning.benchmarking import system_metrics
from tuning.benchmarking.dump import STEP_PART_SERIES, STEP_TIME, STEP_TOKENS
from tuning.benchmarking.system_metrics import GPU_MEMORY_USED, GPU_POWER, GPU_POWER_PERCENT, GPU_UTILIZATION
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
MEMORY_ESTIMATE_TOLERANCE = 0.10  # the config-only estimate against the measured peak (docs/benchmarking.md)
MIN_UTILIZATION = 50.0  # % while a 1 B model trains
POWER_PERCENT_TOLERANCE = 0.5  # percentage points between the dump's percentages and its watts over the limit
FREED_TOLERANCE_BYTES = GIB  # GPU memory in use after the OOM job, above what was in use before it
FREED_WAIT_S = 30.0
OOM_TIMEOUT_S = 300.0
FAILED = "failed: "  # the value of a step's row when the step failed
OOM_JOB = "OOM job (batch {oom_batch_size})"  # the figures of its rows begin with it
RATIOS = {"tokens_per_second": "tokens_per_second_ratio", "step_s": "step_time_ratio", "loop_s": "loop_ratio"}
NVML_SERIES = (GPU_UTILIZATION, GPU_MEMORY_USED, GPU_POWER, GPU_POWER_PERCENT)
PADDING_FREE_STEPS = 20  # optimizer steps of each padded and padding-free job
PADDING_FREE_JOB = "padded against padding-free (varied lengths)"
PROFILE_WINDOW = (2, 3)  # the profile job's --profile_steps; it trains one step more
PROFILE_JOB = "profile job (steps {first}-{last})"
ANATOMY_TOLERANCE = 0.05  # the step parts' sum against the step time, relative
EFFICIENCY_KEYS = ("mfu", "peak_tflops_per_device", "joules_per_token", "energy_source")  # of the dump's summary


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
    if nvml is None or not (handles := system_metrics.visible_gpu_handles(nvml)):
        return Gpu()
    handle, text = handles[0], system_metrics.nvml_text
    uuid, name = text(nvml.nvmlDeviceGetUUID(handle)), text(nvml.nvmlDeviceGetName(handle))
    return Gpu(uuid, name, nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0, nvml, handle)


def build_model(model_dir: Path, workload: Workload) -> dict[str, Any]:
    """The Llama and its tokenizer in ``model_dir``; its parameter count and dtypes (from the safetensors headers)."""
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


def build_varied_dataset(path: Path, records: int, seq_length: int, seed: int) -> Path:
    """Like ``build_dataset``, with responses of ``seq_length / 8`` to ``seq_length`` words: padded batches carry
    padding, which padding-free ones leave out."""
    words = sorted({word for record in load_records(SAMPLE_TRAIN_PATH) for word in record["output"].split()})
    rng = random.Random(seed)
    with path.open("w", encoding="utf-8") as handle:
        for _ in range(records):
            text = f"### Input: {' '.join(rng.choices(words, k=4))}\n{overhead.RESPONSE_TEMPLATE} "
            length = rng.randint(max(seq_length // 8, 1), seq_length)
            handle.write(json.dumps({"output": text + " ".join(rng.choices(words, k=length))}) + "\n")
    return path


def padding_free_command(workload: Workload, model_dir: Path, data_path: Path, run_dir: Path, attention: str):
    """``benchmarks/padding_free.py`` on this check's model: one warm-up and one measured round of each arm, one
    epoch of ``data_path`` per job."""
    return [
        *(sys.executable, "-m", "benchmarks.padding_free", "--workdir", str(run_dir), "--model_dir", str(model_dir)),
        *("--data_path", str(data_path), "--max_steps", str(PADDING_FREE_STEPS), "--rounds", "1"),
        *("--batch_size", str(workload.batch_size), "--torch_dtype", workload.torch_dtype),
        *("--use_flash_attn", str(attention == FLASH_ATTENTION), "--seed", str(workload.seed)),
        *("--json", str(run_dir / "padding_free.json")),
    ]


def run_padding_free(command: list[str], run_dir: Path, env: dict[str, str]) -> dict[str, Any]:
    run_dir.mkdir(parents=True)
    with (run_dir / "stderr.log").open("w", encoding="utf-8") as stderr:
        subprocess.run(command, env=env, cwd=overhead.REPO_ROOT, stdout=stderr, stderr=stderr, check=True)
    return json.loads((run_dir / "padding_free.json").read_text())


def job_command(
    arm: str, workload: Workload, model_dir: Path, data_path: Path, run_dir: Path, attention: str
) -> list[str]:
    """overhead.py's command for ``arm`` (so both arms share its flags) with this check's settings appended: argparse
    keeps the last value of a flag given twice."""
    shared = {name: getattr(workload, name) for name in ("max_steps", "batch_size", "seed", "threads")}
    settings = overhead.Settings(**shared, max_seq_length=workload.seq_length)
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


def read_json(path: Path, missing: Any = None) -> Any:
    return json.loads(path.read_text()) if path.exists() else missing


def device0(peaks: list[dict[str, Any]] | None) -> dict[str, Any]:
    """cuda:0's entry in ``tuning.benchmarking.cuda_peak_memory``'s list, the only one of a job ({} without CUDA)."""
    return (peaks or [{}])[0]


Job = tuple[overhead.Run, int | None]  # a timed run and torch's peak GPU memory (reserved) in it, None without CUDA


def throughput_summary(jobs: list[Job], workload: Workload) -> dict[str, Any]:
    """Per job: tokens/s and median step time of the steps after the first ``warmup_steps`` (a step ends when its
    loss line arrives), the loop (``train_runtime``) and the peak memory. Per arm the medians of its jobs' figures
    (the largest peak); bench_train against bare TRL as medians of per-round ratios."""
    figures, losses = {}, {}
    for run, peak in jobs:
        ends = run.step_ends[max(workload.warmup_steps, 1) - 1 :]
        steps = [later - earlier for earlier, later in itertools.pairwise(ends)]
        figures[run.arm, run.round] = {
            "step_s": statistics.median(steps),
            "tokens_per_second": workload.tokens_per_step / statistics.mean(steps),
            "loop_s": run.loop_s,
            "peak_reserved_bytes": peak,
        }
        losses[run.arm, run.round] = run.losses  # as the trainer logged them (formatted numbers)
    rounds = sorted({run.round for run, _ in jobs})  # complete: a failed job fails the whole step
    summary: dict[str, Any] = {"rounds": len(rounds)}
    by_round = [(figures["bench_train", index], figures["trl", index]) for index in rounds]
    for key, ratio in RATIOS.items():
        summary[ratio] = statistics.median(ours[key] / theirs[key] for ours, theirs in by_round)
        summary[key] = {arm: statistics.median(figures[arm, index][key] for index in rounds) for arm in ARMS}
    peaks = {arm: [figures[arm, index]["peak_reserved_bytes"] for index in rounds] for arm in ARMS}
    summary["peak_reserved_bytes"] = {arm: None if None in values else max(values) for arm, values in peaks.items()}
    pairs = [pair for index in rounds for pair in zip(losses["bench_train", index], losses["trl", index], strict=True)]
    summary["max_loss_difference"] = max(abs(float(ours) / float(theirs) - 1) for ours, theirs in pairs)
    summary["jobs"] = {f"{arm}-{index}": values for (arm, index), values in figures.items()}
    return summary


def run_oom(command: list[str], run_dir: Path, env: dict[str, str], gpu: Gpu) -> dict[str, Any]:
    """The OOM job's exit code, its dump's error category, its termination-log line, and the GPU memory in use before
    it and once it has exited (waiting up to FREED_WAIT_S for that to come back)."""
    run_dir.mkdir(parents=True)
    termination_log, stderr_path = run_dir / "termination-log", run_dir / "stderr.log"
    env = {**env, "TERMINATION_LOG_FILE": str(termination_log)}
    before = gpu.memory_used()
    with stderr_path.open("w", encoding="utf-8") as stderr:
        process = subprocess.run(
            command, env=env, cwd=overhead.REPO_ROOT, stdout=subprocess.DEVNULL, stderr=stderr, timeout=OOM_TIMEOUT_S
        )
    exited = time.monotonic()
    after = gpu.memory_used()
    while after is not None and after > before + FREED_TOLERANCE_BYTES and time.monotonic() - exited < FREED_WAIT_S:
        time.sleep(0.2)
        after = gpu.memory_used()
    dump = read_json(run_dir / "metrics.json", {})
    snapshot = dump.get("oom_snapshot") or {}
    return {
        "exit_code": process.returncode,
        "dump_category": (dump.get("error") or {}).get("category"),
        "oom_snapshot": snapshot,
        "oom_snapshot_bytes": file_size(run_dir, snapshot.get("memory_snapshot")),
        "termination_log": termination_log.read_text().strip() if termination_log.exists() else None,
        "memory_before_bytes": before,
        "memory_after_bytes": after,
        "freed_after_s": time.monotonic() - exited if after is not None else None,
        "stderr_tail": stderr_path.read_text(errors="replace")[-2000:],
    }


def file_size(folder: Path, relative: str | None) -> int | None:
    """The size of a file a dump links (relative to its folder), None when it links none or it is not there."""
    path = folder / relative if relative else None
    return path.stat().st_size if path is not None and path.is_file() else None


def run_profile(command: list[str], run_dir: Path, env: dict[str, str]) -> dict[str, Any]:
    """The profile job: its dump's profile, the trace's and the window's memory snapshot's sizes, its anatomy."""
    run_dir.mkdir(parents=True)
    with (run_dir / "stderr.log").open("w", encoding="utf-8") as stderr:
        subprocess.run(command, env=env, cwd=overhead.REPO_ROOT, stdout=subprocess.DEVNULL, stderr=stderr, check=True)
    dump = json.loads((run_dir / "metrics.json").read_text())
    profile = dump["profile"]
    files = profile["traces"][0]
    return {
        "profile": profile,
        "trace_bytes": file_size(run_dir, files.get("trace")),
        "memory_snapshot_bytes": file_size(run_dir, files.get("memory_snapshot")),
        **anatomy_summary(dump),
    }


def dump_summary(dump: dict[str, Any]) -> dict[str, Any]:
    """The GPU series' contexts; on ``{"gpu": 0}`` their counts, maxima and means from the dump's own aggregates
    (system samples have no step, so none is left out as warmup); CUDA peaks and token counts."""
    gpu0 = {one["name"]: one for one in dump["aggregates"] if one["context"] == {"gpu": 0}}
    contexts = {json.dumps(one["context"], sort_keys=True) for one in dump["metrics"] if one["name"].startswith("gpu_")}
    tokens = [one["values"] for one in dump["metrics"] if one["name"] == STEP_TOKENS and not one["context"]]
    return {
        "gpu_contexts": sorted(contexts),
        "samples": {name: gpu0.get(name, {}).get("count") or 0 for name in NVML_SERIES},
        "utilization_max": gpu0.get(GPU_UTILIZATION, {}).get("max"),
        "memory_used_max_bytes": gpu0.get(GPU_MEMORY_USED, {}).get("max"),
        "power_avg_watts": gpu0.get(GPU_POWER, {}).get("avg"),
        "power_avg_percent": gpu0.get(GPU_POWER_PERCENT, {}).get("avg"),
        "cuda": dump["summary"]["cuda"],
        "tokens_per_step": sorted({int(value) for values in tokens for value in values if value is not None}),
        "tokens_per_second": dump["summary"]["tokens_per_second"],
        **{key: dump["summary"].get(key) for key in EFFICIENCY_KEYS},
        "estimate": dump.get("estimate"),
        "peak_tensor_bytes": dump["summary"].get("peak_tensor_bytes"),
        "memory_estimate_ratio": dump["summary"].get("memory_estimate_ratio"),
        **anatomy_summary(dump),
    }


def anatomy_summary(dump: dict[str, Any]) -> dict[str, Any]:
    """The step anatomy of a dump: the median over its steps of the parts' sum over the step time, the parts' median
    shares and bound_by with its figures."""
    per_step = {m["name"]: dict(zip(m["steps"], m["values"], strict=True)) for m in dump["metrics"] if not m["context"]}
    times = per_step.get(STEP_TIME, {})
    sums = [
        sum(per_step.get(name, {}).get(step) or 0.0 for name in STEP_PART_SERIES.values()) / seconds
        for step, seconds in times.items()
        if seconds
    ]
    summary = dump["summary"]
    return {
        "parts_sum_ratio": statistics.median(sums) if sums else None,
        "step_parts": summary.get("step_parts"),
        "bound_by": summary.get("bound_by"),
        "bound_by_shares": summary.get("bound_by_shares"),
    }


def run_check(
    workload: Workload, workdir: Path, gpu: Gpu, attention: str, warmup_round: bool = True, oom_flags: tuple = ()
) -> dict[str, Any]:
    """Every step of the check; a step that fails is recorded as its error and the others still run. Tests skip the
    warm-up round and give ``oom_flags`` to the OOM job only, to inject a stand-in OOM where no GPU can run out."""
    started = time.perf_counter()
    results: dict[str, Any] = {
        "workload": asdict(workload),
        "attention": attention,
        "gpu": {"uuid": gpu.uuid, "name": gpu.name, "power_limit_watts": gpu.power_limit_watts},
        "versions": {"torch": torch.__version__, "cuda": torch.version.cuda, "transformers": transformers.__version__},
    }
    env = overhead.child_env(workload.threads)
    if gpu.uuid is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu.uuid  # the dump must still key its series by index
    model_dir, data_path, oom_dir = workdir / "model", workdir / "train.jsonl", workdir / "oom"
    varied_path, padding_free_dir = workdir / "varied.jsonl", workdir / "padding_free"
    workdir.mkdir(parents=True, exist_ok=True)
    records = max(workload.oom_batch_size, workload.batch_size * workload.max_steps)
    build_dataset(data_path, records, workload.seq_length, workload.seed)
    build_varied_dataset(varied_path, workload.batch_size * PADDING_FREE_STEPS, workload.seq_length, workload.seed)
    padding_free = padding_free_command(workload, model_dir, varied_path, padding_free_dir, attention)
    jobs: list[Job] = []

    def argv(arm: str, run_dir: Path) -> list[str]:
        return job_command(arm, workload, model_dir, data_path, run_dir, attention)

    def throughput() -> dict[str, Any]:
        for run in overhead.alternating_runs("gpu", list(ARMS), workload.rounds, warmup_round, workdir, env, argv):
            run_dir = overhead.run_dir_of(workdir, run.arm, run.round)
            peak_file = run_dir / "out" / CUDA_PEAK_FILE  # bare TRL's; bench_train's peaks are in its dump's summary
            peaks = read_json(peak_file) if run.arm == "trl" else read_json(run_dir / "metrics.json")["summary"]["cuda"]
            shutil.rmtree(run_dir / "out", ignore_errors=True)  # the trained model: 2 GB at the default size
            print(f"{run_dir.name}: {run.process_s:.1f} s, loop {run.loop_s:.2f} s", flush=True)
            if run.round >= 0:
                jobs.append((run, device0(peaks).get("max_memory_reserved_bytes")))
        return throughput_summary(jobs, workload)

    last_dump = overhead.run_dir_of(workdir, "bench_train", workload.rounds - 1) / "metrics.json"
    oom_work = replace(workload, batch_size=workload.oom_batch_size)
    oom_command = [*job_command("bench_train", oom_work, model_dir, data_path, oom_dir, attention), *oom_flags]
    oom_command.append("--oom_snapshot")
    profile_dir = workdir / "profile"
    profile_work = replace(workload, max_steps=PROFILE_WINDOW[1] + 1, warmup_steps=1)
    profile_command = [
        *job_command("bench_train", profile_work, model_dir, data_path, profile_dir, attention),
        *("--trackers", "none", "--profile_steps", "{}-{}".format(*PROFILE_WINDOW)),
    ]
    steps = {
        "model": lambda: build_model(model_dir, workload),
        "throughput": throughput,
        "dump": lambda: dump_summary(json.loads(last_dump.read_text())),
        "oom": lambda: run_oom(oom_command, oom_dir, env, gpu),
        "profile": lambda: run_profile(profile_command, profile_dir, env),
        "padding_free": lambda: run_padding_free(padding_free, padding_free_dir, env),
    }
    for name, step in steps.items():
        print(f"--- {name} (at {time.perf_counter() - started:.0f} s)", flush=True)
        try:
            results[name] = step()
        except Exception as exc:  # noqa: BLE001 - one failed step must not hide the others' figures
            traceback.print_exc()
            results[name] = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
    results["runs"] = [{**asdict(run), "peak_reserved_bytes": peak} for run, peak in jobs]
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


def model_rows(results: dict[str, Any]) -> list[Row]:
    model, work, (low, high) = results["model"], Workload(**results["workload"]), MODEL_PARAMETERS
    parameters, dtypes, rounds = model["parameters"], model["dtypes"], work.rounds
    value = f"{parameters:,} ({parameters / 1e9:.2f} B), {'/'.join(dtypes)}, built in {model['seconds']:.0f} s"
    every_job = f"batch {work.batch_size} × {work.seq_length} tokens, {work.max_steps} steps (first "
    every_job += f"{work.warmup_steps} left out), {results['attention']}, {rounds} round{'s' * (rounds != 1)}"
    ok = low <= parameters <= high and dtypes == ["BF16"]
    return [
        Row("random-initialised Llama: parameters", value, f"{low / 1e9:g}-{high / 1e9:g} B, BF16", ok),
        Row("work of every throughput job", every_job),
    ]


def throughput_rows(results: dict[str, Any]) -> list[Row]:
    summary = results["throughput"]
    tokens, steps, loops = summary["tokens_per_second"], summary["step_s"], summary["loop_s"]
    tokens_ratio, step_ratio = summary["tokens_per_second_ratio"], summary["step_time_ratio"]
    loop_ratio, peaks, loss = summary["loop_ratio"], summary["peak_reserved_bytes"], summary["max_loss_difference"]
    our_share = 100 * (1 - 1 / loop_ratio)  # of bench_train's loop, what bare TRL's lacks
    tokens_value = f"{tokens_ratio:.3f}× ({tokens['bench_train']:,.0f} vs {tokens['trl']:,.0f})"
    step_value = f"{step_ratio:.3f}× ({steps['bench_train'] * 1e3:.1f} vs {steps['trl'] * 1e3:.1f} ms)"
    peak_value = f"bench_train {_gib(peaks['bench_train'])}, bare TRL {_gib(peaks['trl'])}"
    peak_target = f"bench_train ≤ bare TRL + {MEMORY_TOLERANCE:.0%}"
    peak_ok = None not in peaks.values() and peaks["bench_train"] <= peaks["trl"] * (1 + MEMORY_TOLERANCE)
    loss_value, loss_target = f"differ by ≤ {loss:.3%}", f"≤ {LOSS_TOLERANCE:.0%}"
    loop_value = f"{loop_ratio:.3f}× ({loops['bench_train']:.1f} vs {loops['trl']:.1f} s): ours {our_share:+.2f} %"
    loop_target, loop_ok = f"≤ {LOOP_TARGET:g}×", loop_ratio <= LOOP_TARGET
    return [
        Row("tokens/s, bench_train ÷ bare TRL", tokens_value, f"≥ {MIN_RATIO}×", tokens_ratio >= MIN_RATIO),
        Row("step time, bench_train ÷ bare TRL", step_value, f"≤ {1 / MIN_RATIO:.2f}×", step_ratio <= 1 / MIN_RATIO),
        Row("peak GPU memory (torch, reserved)", peak_value, peak_target, peak_ok),
        Row("same work: per-step losses against bare TRL's", loss_value, loss_target, loss <= LOSS_TOLERANCE),
        Row("loop (train_runtime), bench_train ÷ bare TRL: our share of the loop", loop_value, loop_target, loop_ok),
    ]


def dump_rows(results: dict[str, Any]) -> list[Row]:
    dump, work, gpu, count = results["dump"], Workload(**results["workload"]), results["gpu"], len(NVML_SERIES)
    samples, contexts, tokens = dump["samples"], dump["gpu_contexts"], dump["tokens_per_step"]
    utilization, used = dump["utilization_max"], dump["memory_used_max_bytes"]
    watts, percent, limit = dump["power_avg_watts"], dump["power_avg_percent"], gpu["power_limit_watts"]
    reserved, allocated = (device0(dump["cuda"]).get(f"max_memory_{kind}_bytes") for kind in ("reserved", "allocated"))
    series_figure = f'NVML series under {{"gpu": 0}}, GPU named by UUID ({gpu["uuid"] or "no NVML here"})'
    series = f"{sum(number > 0 for number in samples.values())}/{count} series, ≥ {min(samples.values())} samples "
    series += f"each; GPU contexts {', '.join(contexts) or 'none'}"
    series_ok = all(samples.values()) and contexts == ['{"gpu": 0}']
    busy = "—" if utilization is None else f"{utilization:.0f} %"
    busy_ok = utilization is not None and utilization >= MIN_UTILIZATION
    power = "—" if None in (watts, percent) else f"{watts:.0f} W = {percent:.1f} % (enforced limit {limit or 0:.0f} W)"
    power_target = f"% = 100 × W ÷ enforced limit (± {POWER_PERCENT_TOLERANCE})"
    power_ok = None not in (watts, percent, limit) and watts > 0
    power_ok = bool(power_ok and abs(percent - 100 * watts / limit) <= POWER_PERCENT_TOLERANCE)
    peak = f"reserved {_gib(reserved)}, allocated {_gib(allocated)}"
    used_value, used_ok = f"{_gib(used)} against {_gib(reserved)}", None not in (used, reserved) and used >= reserved
    per_step = ", ".join(map(str, tokens)) or "—"
    per_step_target = f"{work.batch_size} × {work.seq_length} = {work.tokens_per_step}"
    rows = [
        Row(series_figure, series, f'{count}/{count}, only {{"gpu": 0}}', series_ok),
        Row("GPU utilisation while training (max)", busy, f"≥ {MIN_UTILIZATION:.0f} %", busy_ok),
        Row("GPU power while training (mean)", power, power_target, power_ok),
        Row("CUDA peak memory in the dump's summary", peak, "present (device 0)", bool(reserved)),
        Row("GPU memory used by NVML (max) against CUDA's reserved peak", used_value, "NVML ≥ CUDA", used_ok),
        Row("bench_train's tokens per step", per_step, per_step_target, tokens == [work.tokens_per_step]),
        *memory_estimate_rows(dump, reserved, allocated),
        *efficiency_rows(dump),
        *anatomy_rows(dump),
    ]
    same_job = results["throughput"].get("jobs", {}).get(f"bench_train-{work.rounds - 1}")
    if same_job and dump["tokens_per_second"]:
        ratio = dump["tokens_per_second"] / same_job["tokens_per_second"]
        ok, tolerance = abs(ratio - 1) <= DUMP_THROUGHPUT_TOLERANCE, f"1 ± {DUMP_THROUGHPUT_TOLERANCE}"
        rows.append(Row("bench_train's tokens/s in its dump ÷ from its step ends", f"{ratio:.3f}×", tolerance, ok))
    return rows


def memory_estimate_rows(dump: dict[str, Any], reserved: int | None, allocated: int | None) -> list[Row]:
    """The config-only memory estimate against the measured peak (max_memory_allocated on a GPU, torch's tracker on a
    CPU), and the caching allocator's overhead beside it (reserved − allocated)."""
    estimate, ratio = dump.get("estimate") or {}, dump.get("memory_estimate_ratio")
    measured = dump.get("peak_tensor_bytes")
    value = estimate.get("not_estimated") or f"{_gib(estimate.get('peak_bytes_per_device'))} vs {_gib(measured)}"
    if ratio is not None:
        value += f" = {ratio:.3f}×"
    ok = ratio is not None and abs(ratio - 1) <= MEMORY_ESTIMATE_TOLERANCE
    overhead_value = "—" if None in (reserved, allocated) else _gib(reserved - allocated)
    target = f"1 ± {MEMORY_ESTIMATE_TOLERANCE}"
    return [
        Row("memory estimate (config only) ÷ measured peak tensor memory", value, target, ok),
        Row("caching allocator overhead (reserved − allocated)", overhead_value),
    ]


def efficiency_rows(dump: dict[str, Any]) -> list[Row]:
    """MFU against the device's datasheet peak, energy per token and where it came from (docs/benchmarking.md)."""
    mfu, peak, joules, source = (dump.get(key) for key in EFFICIENCY_KEYS)
    mfu_value = "—" if mfu is None else f"{100 * mfu:.1f} % of {peak:g} TFLOP/s"
    return [
        Row(
            "MFU in the dump (dense bf16 peak from the datasheet table)",
            mfu_value,
            "0 < MFU ≤ 100 %",
            mfu is not None and 0 < mfu <= 1,
        ),
        Row("energy per token in the dump", "—" if joules is None else f"{joules:.3g} J/token", "> 0", bool(joules)),
        Row("energy source", source or "—", "nvml_energy_counter", source == "nvml_energy_counter"),
    ]


def anatomy_rows(anatomy: dict[str, Any]) -> list[Row]:
    """The step anatomy (CUDA events on a GPU): its parts sum to the step time; what the steps were bound by."""
    ratio, shares, bound = anatomy["parts_sum_ratio"], anatomy["step_parts"] or {}, anatomy["bound_by"]
    compute = [shares.get(part) for part in ("forward", "backward", "optimizer")]
    parts = ", ".join(f"{part} {share:.2f}" for part, share in shares.items() if share is not None) or "—"
    ratio_ok = ratio is not None and abs(ratio - 1) <= ANATOMY_TOLERANCE and all(compute)
    return [
        Row(
            "step anatomy: the parts' sum ÷ the step time (median)",
            "—" if ratio is None else f"{ratio:.3f}× ({parts})",
            f"1 ± {ANATOMY_TOLERANCE}, forward, backward, optimizer > 0",
            ratio_ok,
        ),
        Row("bound_by (the dump's)", f"{bound} {json.dumps(anatomy['bound_by_shares'])}"),
    ]


def profile_rows(results: dict[str, Any]) -> list[Row]:
    """The profiled window: a trace, top operators (CUDA ones on a GPU) and the window's CUDA memory snapshot."""
    measured, job = results["profile"], PROFILE_JOB.format(first=PROFILE_WINDOW[0], last=PROFILE_WINDOW[1])
    profile = measured["profile"]
    ops = profile["top_ops"] or {}
    cpu_ops, cuda_ops = len(ops.get("cpu") or []), len(ops.get("cuda") or [])
    trace_ok = profile["profiled_steps"] == list(PROFILE_WINDOW) and bool(measured["trace_bytes"]) and cpu_ops > 0
    snapshot = measured["memory_snapshot_bytes"]
    missing = profile["traces"][0].get("missing") or "—"
    return [
        Row(
            f"{job}: trace and top operators",
            f"steps {profile['profiled_steps']}, trace {measured['trace_bytes'] or 0:,} B, {cpu_ops} CPU / "
            f"{cuda_ops} CUDA ops",
            f"steps {list(PROFILE_WINDOW)}, a trace, CPU and CUDA ops",
            trace_ok and cuda_ops > 0,
        ),
        Row(
            f"{job}: the window's CUDA memory snapshot",
            f"{snapshot:,} B" if snapshot else f"none ({missing})",
            "written",
            bool(snapshot),
        ),
    ]


def oom_rows(results: dict[str, Any]) -> list[Row]:
    oom, category, job = results["oom"], ErrorCategory.GPU_OOM, OOM_JOB.format(**results["workload"])
    code, expected, line = oom["exit_code"], exit_code_for(category), oom["termination_log"] or "none"
    categories = f"{oom['dump_category']} / {line[:70]}"
    categories_ok = oom["dump_category"] == category and line.startswith(f"{category}: ")
    before, after = oom["memory_before_bytes"], oom["memory_after_bytes"]
    measured = None not in (before, after)
    freed = f"{(after - before) / GIB:+.2f} GiB, {oom['freed_after_s']:.1f} s after exit" if measured else "— (no NVML)"
    freed_target = f"≤ +{FREED_TOLERANCE_BYTES / GIB:.0f} GiB within {FREED_WAIT_S:.0f} s"
    freed_ok = measured and after - before <= FREED_TOLERANCE_BYTES
    snapshot, snapshot_bytes = oom.get("oom_snapshot") or {}, oom.get("oom_snapshot_bytes")
    snapshot_value = f"{snapshot_bytes:,} B" if snapshot_bytes else f"none ({snapshot.get('missing') or 'no link'})"
    return [
        Row(f"{job}: exit code", str(code), str(expected), code == expected),
        Row(f"{job}: category in the dump / termination log", categories, f"{category} in both", categories_ok),
        Row(f"{job}: GPU memory in use after it, against before", freed, freed_target, freed_ok),
        Row(
            f"{job}: memory snapshot at the failure",
            snapshot_value,
            "linked, written",
            bool(snapshot_bytes),
        ),
    ]


def padding_free_rows(results: dict[str, Any]) -> list[Row]:
    """Padding-free against padded tokens/s on varied-length data: flash attention skips across the concatenated
    sequences, so it must gain there; sdpa attends over the whole row under a mask, so there it is only a figure."""
    measured, attention = results["padding_free"], results["attention"]
    tokens, ratio = measured["tokens_per_second"], measured["ratio"]
    value = f"{ratio:.3f}× ({tokens['padding_free']:,.0f} vs {tokens['padded']:,.0f})"
    figure = f"tokens/s, padding-free ÷ padded ({attention}, responses 1/8-1× of the sequence)"
    if attention != FLASH_ATTENTION:
        return [Row(figure, value)]
    return [Row(figure, value, "> 1×", ratio > 1)]


# Per step: the figure of its one row when it failed ({} fields from the workload), and its rows when it did not.
STEP_ROWS = {
    "model": ("model", model_rows),
    "throughput": ("throughput: bench_train against bare TRL", throughput_rows),
    "dump": ("the last bench_train dump", dump_rows),
    "oom": (OOM_JOB, oom_rows),
    "profile": (PROFILE_JOB.format(first=PROFILE_WINDOW[0], last=PROFILE_WINDOW[1]), profile_rows),
    "padding_free": (PADDING_FREE_JOB, padding_free_rows),
}


def table_rows(results: dict[str, Any]) -> list[Row]:
    versions, (minutes, seconds) = results["versions"], divmod(round(results["seconds"]), 60)
    device = f"{results['gpu']['name'] or 'unknown (no NVML)'}, torch {versions['torch']}, CUDA {versions['cuda']}"
    device += f", transformers {versions.get('transformers', '—')}"
    rows = [Row("GPU", device)]
    for step, (figure, step_rows) in STEP_ROWS.items():
        if error := results[step].get("error"):
            rows.append(Row(figure.format(**results["workload"]), f"{FAILED}{error}", "completes", False))
        else:
            rows += step_rows(results)
    whole = f"{minutes} min {seconds} s"
    return [*rows, Row("whole check", whole, f"< {TIME_LIMIT_S // 60} min", results["seconds"] < TIME_LIMIT_S)]


def markdown(rows: list[Row]) -> str:
    cells = [[row.figure, row.value, row.target, "" if row.ok is None else ("✓" if row.ok else "✗")] for row in rows]
    return overhead.markdown(["figure", "value", "target", "✓/✗"], cells)


def write_report(rows: list[Row], results: dict[str, Any], output: Path) -> None:
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(markdown(rows) + "\n", encoding="utf-8")
    output.with_suffix(".json").write_text(json.dumps(results, indent=2, default=str), encoding="utf-8")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = overhead.argument_parser(__doc__)
    parser.add_argument("--output", default="gpu_check.md", help="the table (%(default)s); raw numbers beside it")
    parser.add_argument("--workdir", default=None, help="keep model, data, job outputs and logs in this new folder")
    parser.add_argument(
        "--cpu_rehearsal",
        action="store_true",
        help="run every step without CUDA (with NVML's stand-in on PYTHONPATH, the OOM injected by --oom_callbacks): "
        "it proves the installation and the code paths; only a step that fails makes the exit code 1",
    )
    parser.add_argument(
        "--oom_callbacks", default=None, help="MODULE:CLASS given to the OOM job's --callbacks (a stand-in OOM)"
    )
    for spec in fields(Workload):
        help_text = f"{spec.metadata['help']} (%(default)s)"
        parser.add_argument(f"--{spec.name}", type=type(spec.default), default=spec.default, help=help_text)
    args = parser.parse_args(argv)
    if not 0 <= args.warmup_steps < args.max_steps - 1:
        parser.error("--warmup_steps must leave at least two of --max_steps to measure")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available() and not args.cpu_rehearsal:
        print("gpu_check: no CUDA device here (torch.cuda.is_available() is False), so nothing to check")
        return 0
    workload = Workload(**{spec.name: getattr(args, spec.name) for spec in fields(Workload)})
    attention = FLASH_ATTENTION if is_flash_attn_2_available() else "sdpa"
    oom_flags = ("--callbacks", args.oom_callbacks) if args.oom_callbacks else ()
    with closing(find_gpu()) as gpu, tempfile.TemporaryDirectory(prefix="gpu-check-") as scratch:
        results = run_check(workload, Path(args.workdir or scratch), gpu, attention, oom_flags=oom_flags)
    rows = table_rows(results)
    print(markdown(rows))
    write_report(rows, results, Path(args.output))
    print(f"table: {args.output}, raw numbers: {Path(args.output).with_suffix('.json')}")
    return exit_code(rows, args.cpu_rehearsal)


def exit_code(rows: list[Row], cpu_rehearsal: bool) -> int:
    """0 when every target is met; in a CPU rehearsal, whose tiny model and missing CUDA miss targets by design,
    when every step completed."""
    if cpu_rehearsal:
        return 1 if any(row.value.startswith(FAILED) for row in rows) else 0
    return 0 if all(row.ok is not False for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
