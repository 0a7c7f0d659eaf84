"""Fixtures every test module may use (registered by tests/conftest.py): the tiny local Llama, built once per
session, and the shipped sample data; for every test, no stop signal left noted by an earlier one; and jobs whose
outcome several test modules check (each listed in tests/conftest.py's SHARED_FIXTURES, so that it runs once): a
SIGTERMed sft_trainer job, and a directory of real bench_train runs."""

import dataclasses
import signal
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tuning.utils.error_logging import record_stop_signal
from tuning.utils.tiny_model import SAMPLE_TRAIN_PATH, SAMPLE_VALIDATION_PATH, build_tiny_model, build_tiny_moe

if TYPE_CHECKING:
    from tests.helpers.bench import BenchRuns


@pytest.fixture(autouse=True)
def no_stop_signal_left_behind():
    """An in-process test that stops training with a signal leaves it noted process-wide (a job's trackers end their
    runs as KILLED by it, and the job then exits): the next test starts as a new process would."""
    yield
    record_stop_signal(None)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    return build_tiny_model(str(tmp_path_factory.mktemp("tiny-llama")))


@pytest.fixture(scope="session")
def tiny_moe(tmp_path_factory) -> str:
    """A tiny GraniteMoe: 4 experts per layer, 2 routed per token."""
    return build_tiny_moe(str(tmp_path_factory.mktemp("tiny-moe")), num_experts=4, experts_per_token=2)


@pytest.fixture(scope="session")
def sample_train() -> str:
    return SAMPLE_TRAIN_PATH


@pytest.fixture(scope="session")
def sample_validation() -> str:
    return SAMPLE_VALIDATION_PATH


@dataclasses.dataclass
class SigtermedJob:
    """What a ``python tuning/sft_trainer.py`` job SIGTERMed after its first logged step left behind."""

    returncode: int
    stderr: str
    termination_log: Path
    training_logs: Path
    data_cache: Path  # its HF_DATASETS_CACHE, where the job tokenised its data
    caches_while_training: list[Path]  # the tokenised-data caches there when the signal was sent


@pytest.fixture(scope="session")
def sigtermed_sft_trainer(tiny_model, tmp_path_factory) -> SigtermedJob:
    """One CLI job long enough to be signalled while it trains (100 000 steps), tokenising into a directory of its
    own, SIGTERMed once a step is logged, for the tests of how such a job ends (its exit status and error reports:
    tests/utils/test_error_logging_e2e.py; its data caches: tests/data/test_data_cache.py)."""
    from tests.helpers.data_files import data_caches  # here: the plugin itself loads before the libraries are needed
    from tests.helpers.training import SFT_TRAINER, Job, cli_args, wait_for_steps

    tmp = tmp_path_factory.mktemp("sigtermed-sft-trainer")
    cache_root, log = tmp / "datasets-cache", tmp / "termination-log"
    args = cli_args(tiny_model, str(tmp / "out"), max_steps=100_000)
    job = Job([SFT_TRAINER, *args], tmp / "logs", HF_DATASETS_CACHE=str(cache_root), TERMINATION_LOG_FILE=str(log))
    training_logs = tmp / "out" / "training_logs.jsonl"
    wait_for_steps(training_logs, 1, job)
    caches_while_training = data_caches(cache_root)
    job.send_signal(signal.SIGTERM)
    stderr = job.finish(timeout=120)
    return SigtermedJob(job.returncode, stderr, log, training_logs, cache_root, caches_while_training)


@pytest.fixture(scope="session")
def bench_runs(tiny_model, tmp_path_factory) -> "BenchRuns":
    """The runs of tests/helpers/bench.py's ``BENCH_RUNS``, made once per session, all at the same time: what
    wrappers/bench_report reads, and a 2-rank job under tuning.launch whose rank 1 runs out of memory."""
    from tests.helpers.bench import make_bench_runs  # here: loading this module (every pytest run) stays light

    return make_bench_runs(tiny_model, tmp_path_factory.mktemp("bench-runs"))
