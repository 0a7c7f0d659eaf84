"""Fixtures every test module may use (registered by tests/conftest.py): the tiny local Llama, built once per
session, and the shipped sample data."""

import pytest

from tuning.utils.tiny_model import SAMPLE_TRAIN_PATH, SAMPLE_VALIDATION_PATH, build_tiny_model


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    return build_tiny_model(str(tmp_path_factory.mktemp("tiny-llama")))


@pytest.fixture(scope="session")
def sample_train() -> str:
    return SAMPLE_TRAIN_PATH


@pytest.fixture(scope="session")
def sample_validation() -> str:
    return SAMPLE_VALIDATION_PATH
