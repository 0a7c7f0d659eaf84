"""Shared fixtures: a tiny local Llama built once per session, the shipped sample data, CLI runners."""

import importlib.util
import os
import socket
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The tiny model's math is too small to gain from threads, which only contend with each other: in-process
# training runs single-threaded, as the child jobs do (subprocess_env), unless the caller sets its own.
os.environ.setdefault("OMP_NUM_THREADS", "1")

from tuning.utils.tiny_model import SAMPLE_TRAIN_PATH, SAMPLE_VALIDATION_PATH, build_tiny_model  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent
SFT_TRAINER = str(REPO_ROOT / "tuning" / "sft_trainer.py")
RESPONSE_TEMPLATE = "\n### Response:"


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    return build_tiny_model(str(tmp_path_factory.mktemp("tiny-llama")))


@pytest.fixture(scope="session")
def sample_train() -> str:
    return SAMPLE_TRAIN_PATH


@pytest.fixture(scope="session")
def sample_validation() -> str:
    return SAMPLE_VALIDATION_PATH


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
    """Flags of a short, quick CLI run on the tiny model; ``extra`` adds or overrides flags."""
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


def run_sft_trainer(
    args: list[str], timeout: float = 300, script: str = SFT_TRAINER, **env: str
) -> subprocess.CompletedProcess:
    """Run ``python tuning/sft_trainer.py ARGS`` (or another ``script``) as users do; returns the finished process."""
    return subprocess.run(
        [sys.executable, script, *args],
        env=subprocess_env(**env),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def load_script(path: Path) -> ModuleType:
    """A wrapper script imported as a module, for checks below its command line."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# A test not marked slow that takes seconds pushes `make test-fast` past its inner-loop budget: the summary names it
# (a note, never a failure: timings vary by machine).
FAST_TEST_SECONDS = 3.0
_unmarked_test_seconds: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if "slow" not in report.keywords:
        _unmarked_test_seconds[report.nodeid] = _unmarked_test_seconds.get(report.nodeid, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    over = {nodeid: seconds for nodeid, seconds in _unmarked_test_seconds.items() if seconds > FAST_TEST_SECONDS}
    if over:
        terminalreporter.section("tests not marked slow that took seconds: mark them slow or make them cheaper")
        for nodeid, seconds in sorted(over.items(), key=lambda item: -item[1]):
            terminalreporter.write_line(f"{seconds:6.1f} s  {nodeid}")
