"""How tests train: the checkout's paths, the child jobs' environment, CLI flags and argument dataclasses of a short
run on the tiny model, and child processes: start a job, wait for its steps, signal it, collect its stderr."""

import contextlib
import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import psutil

from tuning.benchmarking.dump import STEP_TIME
from tuning.config.configs import DataArguments, ModelArguments, TrainingArguments
from tuning.utils.tiny_model import SAMPLE_TRAIN_PATH

REPO_ROOT = Path(__file__).resolve().parents[2]
SFT_TRAINER = str(REPO_ROOT / "tuning" / "sft_trainer.py")
BENCH_TRAIN = REPO_ROOT / "wrappers" / "bench_train.py"
BENCH_CALLBACKS = "tests.helpers.bench_callbacks"  # bench_train's --callbacks module for injected slowness and faults
RESPONSE_TEMPLATE = "\n### Response:"
TORCHRUN = ["-m", "torch.distributed.run"]
MARKER = re.compile(r"^TUNING_ERROR category=(\w+) rank=(\d+) step=(\S+) exit_code=(\d+) type=", re.M)

# The design notes' torchrun command, verbatim; tests add the tracker flags they check.
SEED_COMMAND = (
    "torchrun --nnodes=1 --nproc_per_node=2 --master_port={port} tuning/sft_trainer.py "
    "--tokenizer_name_or_path {model} --model_name_or_path {model} --data_path {data} --use_peft --bf16 True "
    "--output_dir {output} --num_train_epochs 1 --per_device_train_batch_size 1 --per_device_eval_batch_size 1 "
    '--gradient_accumulation_steps 8 --evaluation_strategy "no" --save_strategy "steps" --save_steps 2000 '
    '--save_total_limit 1 --learning_rate 2e-5 --weight_decay 0. --warmup_ratio 0.03 --lr_scheduler_type "cosine" '
    '--logging_steps 1 --fsdp "full_shard auto_wrap" --fsdp_config tuning/config/fsdp_config.json --bf16 True '
    '--response_template "\\n### Response:" --dataset_text_field "output" '
)


def subprocess_env(**overrides: str) -> dict[str, str]:
    """The environment for child jobs: offline, importing this checkout, single-threaded math."""
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        PYTHONPATH=str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
        OMP_NUM_THREADS="1",
    )
    env.update(overrides)
    return env


def cli_args(model: str, output_dir: str, data: str = SAMPLE_TRAIN_PATH, **extra) -> list[str]:
    """Flags of a short, quick CLI run on the tiny model; ``extra`` adds or overrides flags, ``None`` drops one."""
    flags = {
        "model_name_or_path": model,
        "training_data_path": data,
        "dataset_text_field": "output",
        "response_template": RESPONSE_TEMPLATE,
        "output_dir": output_dir,
        "max_steps": "3",
        "per_device_train_batch_size": "4",
        "logging_strategy": "steps",
        "logging_steps": "1",
        "save_strategy": "no",
        "torch_dtype": "float32",
        "use_flash_attn": "False",
    }
    flags.update({key: None if value is None else str(value) for key, value in extra.items()})
    args = []
    for key, value in flags.items():
        if value is not None:
            args += [f"--{key}", value]
    return args


def make_args(model: str, output_dir: str, data: str, **training):
    """The argument dataclasses of a short in-process ``train()`` on the tiny model; ``training`` overrides."""
    model_args = ModelArguments(model_name_or_path=model, torch_dtype="float32", use_flash_attn=False)
    data_args = DataArguments(training_data_path=data, dataset_text_field="output", response_template=RESPONSE_TEMPLATE)
    options = dict(
        output_dir=output_dir,
        max_steps=2,
        per_device_train_batch_size=4,
        logging_strategy="steps",
        logging_steps=1,
        save_strategy="no",
        report_to="none",
    )
    options.update(training)
    return model_args, data_args, TrainingArguments(**options)


def run_python(*argv: str, timeout: float = 300, cwd: Path = REPO_ROOT, **env: str) -> subprocess.CompletedProcess:
    """``python ARGV`` in ``cwd`` (the checkout) with the child jobs' environment (``env`` added); returns the
    finished process, its output captured as text."""
    return subprocess.run(
        [sys.executable, *argv],
        env=subprocess_env(**env),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_sft_trainer(args: list[str], timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    """Run ``python tuning/sft_trainer.py ARGS`` as users do; returns the finished process."""
    return run_python(SFT_TRAINER, *args, timeout=timeout, **env)


def run_main(args: list[str], monkeypatch, capfd, **env: str) -> tuple[int, str]:
    """``sft_trainer.main()`` with the command line ``args``, in this process, ``env`` set for it (no job config from
    this process's environment unless given there): its exit code and what it wrote to stderr. What only a process
    of its own shows (the script's path handling, the signal handlers before torch loads, the exit status as the
    shell sees it) is tested once with real processes (``run_sft_trainer``); everything behind ``main()`` is the
    same here, without paying the CLI's imports for each case."""
    from tuning.sft_trainer import main
    from tuning.utils.config_utils import CONFIG_BASE64_ENV, CONFIG_PATH_ENV

    for name in (CONFIG_PATH_ENV, CONFIG_BASE64_ENV):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(sys, "argv", [SFT_TRAINER, *map(str, args)])
    capfd.readouterr()  # what came before is not this run's
    exit_code = main()
    return exit_code, capfd.readouterr().err


def load_script(path: Path) -> ModuleType:
    """A script imported as a module, for checks below its command line."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def two_ranks(script: Path | str, args: list[str]) -> list[str]:
    """torchrun's flags and command line for ``script ARGS`` on two local ranks (after ``TORCHRUN`` or
    ``-m tuning.launch``)."""
    return ["--nproc_per_node=2", f"--master_port={free_port()}", str(script), *args]


def start_launch(args: list[str], log_dir: Path, **env: str) -> "Job":
    """``python -m tuning.launch ARGS`` as a pod runs it: its output and the pod's termination log
    (``log_dir/termination-log``) in ``log_dir``."""
    return Job(["-m", "tuning.launch", *args], log_dir, TERMINATION_LOG_FILE=str(log_dir / "termination-log"), **env)


class Job(subprocess.Popen):
    """``python ARGV`` started in the checkout with the child jobs' environment (``env`` added). Its output goes to
    pipes, or with ``log_dir`` to ``log_dir/stdout`` and ``log_dir/stderr``, which never fill up while nobody reads."""

    def __init__(self, argv: list[str], log_dir: Path | None = None, **env: str):
        self.log_dir = log_dir
        with contextlib.ExitStack() as files:
            if log_dir is None:
                stdout = stderr = subprocess.PIPE
            else:
                log_dir.mkdir(parents=True, exist_ok=True)
                stdout, stderr = (files.enter_context(open(log_dir / name, "w")) for name in ("stdout", "stderr"))
            command = [sys.executable, *map(str, argv)]
            super().__init__(command, env=subprocess_env(**env), cwd=REPO_ROOT, text=True, stdout=stdout, stderr=stderr)

    def finish(self, timeout: float = 300) -> str:
        """Wait for the job and return its stderr; kill it (failing the test) if it does not end in time."""
        try:
            _, stderr = self.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            self.communicate()
            raise
        return stderr if self.log_dir is None else (self.log_dir / "stderr").read_text()


def succeeded(job: Job, timeout: float = 300) -> str:
    """Wait for the job and return its stderr, after checking that it exited 0."""
    stderr = job.finish(timeout)
    assert job.returncode == 0, stderr[-3000:]
    return stderr


def logged_steps(path: Path) -> list[int]:
    """The steps logged so far in a bench_train journal (its step-time points) or a ``training_logs.jsonl`` (its
    training losses); a last line still being written is left out."""
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            records.append(json.loads(line))
    if path.name.endswith(".journal.jsonl"):
        return [r["step"] for r in records if r.get("type") == "point" and r.get("name") == STEP_TIME]
    return [r["data"]["step"] for r in records if r.get("name") == "training_loss"]


def wait_until(
    condition: Callable[[], bool], process: subprocess.Popen | None, what: str, timeout: float = 180
) -> None:
    """Wait until ``condition()`` holds while ``process`` (if any) runs; fail naming ``what`` did not happen if the
    process ends first (with a ``Job``'s stderr) or the time runs out."""
    deadline = time.monotonic() + timeout
    while not condition():
        if process is not None and process.poll() is not None:
            stderr = process.finish()[-3000:] if isinstance(process, Job) else ""
            raise AssertionError(f"the process ended (exit {process.returncode}) before {what}: {stderr}")
        assert time.monotonic() < deadline, f"no {what} after {timeout} s"
        time.sleep(0.1)


def wait_for_steps(path: Path, count: int, job: Job, signum: int | None = None, timeout: float = 180) -> None:
    """Start-wait-signal: wait until ``path`` (see ``logged_steps``) holds ``count`` steps while ``job`` runs, then
    send it ``signum`` when given."""
    wait_until(lambda: len(logged_steps(path)) >= count, job, f"{count} steps in {path}", timeout)
    if signum is not None:
        job.send_signal(signum)


def wait_for_exit(pid: int, timeout: float, message: str) -> None:
    """Wait until process ``pid`` has exited (gone, or a zombie: an orphan nobody may reap); fail with ``message``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        assert time.monotonic() < deadline, message
        time.sleep(0.05)


def worker_pid(launcher: subprocess.Popen, rank: int) -> int:
    """The pid of the torchrun worker with ``RANK=rank``: a child of the launcher we started."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            if parent == launcher.pid and f"RANK={rank}".encode() in (stat.parent / "environ").read_bytes().split(
                b"\0"
            ):
                return int(stat.parent.name)
        except (OSError, IndexError, ValueError):
            continue  # the process ended while we looked
    raise AssertionError(f"no worker with RANK={rank} under torchrun pid {launcher.pid}")


def termination_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


def markers(stderr: str) -> list[tuple[str, str, str, str]]:
    """The ``TUNING_ERROR`` lines of ``stderr`` as (category, rank, step, exit code)."""
    return MARKER.findall(stderr)
