"""Fixtures every test module may use (registered by tests/conftest.py): the tiny local Llama, built once per
session, and the shipped sample data; and, for every test, no stop signal left noted by an earlier one."""

import pytest

from tuning.utils.error_logging import record_stop_signal
from tuning.utils.tiny_model import SAMPLE_TRAIN_PATH, SAMPLE_VALIDATION_PATH, build_tiny_model, build_tiny_moe


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
