"""Hugging Face Hub dataset ids as data paths, as fms-hf-tuning v3.1.0 takes them: which paths count as ids, the
offline refusal (before the model loads, naming the flag or dataset, the id and the switch), and local-looking paths
that still fail as missing files. These machines have no network: loading an id online is not tested here."""

import json
import re

import pytest
import yaml
from datasets.exceptions import DatasetNotFoundError

from tests.helpers.training import cli_args, make_args, termination_lines
from tuning import sft_trainer
from tuning.config.configs import DataArguments
from tuning.data.data_config import DataPreProcessorConfig
from tuning.data.data_processors import get_datapreprocessor, is_hub_dataset_id, looks_like_hub_dataset_id
from tuning.data.loading import InputFileNotFoundError
from tuning.data.setup_dataprocessor import is_pretokenized_dataset
from tuning.utils import config_utils
from tuning.utils.error_logging import ErrorCategory, UserInputError, classify

HUB_ID = "lhoestq/demo1"  # the id v3.1.0's test_run_e2e_with_hf_dataset_id trains on


@pytest.fixture
def unloadable_model(tmp_path) -> str:
    """A model directory that loading fails on (an unknown model type): a refusal proves it came first."""
    path = tmp_path / "unloadable"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "refused-before-loading"}))
    return str(path)


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """Only ``HF_HUB_OFFLINE=1`` set, run from an empty folder (no local path shadows an id)."""
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize(
    ("path", "is_id"),
    [
        ("lhoestq/demo1", True),
        ("squad", True),
        ("org/data.v2", True),  # a dot that is no data file's extension
        ("org/name/more", False),  # two slashes: a local path
        ("/data/train", False),
        ("./demo1", False),
        ("../org/name", False),
        (".hidden", False),
        ("~/demo1", False),
        ("train.jsonl", False),  # a data file's extension: a file, as in v3.1.0
        ("org/train.parquet", False),
        ("data.CSV", False),
        ("org/*", False),
        ("data?", False),
        ("org/[ab]", False),
        ("", False),
    ],
)
def test_which_paths_count_as_hub_dataset_ids(path, is_id):
    assert looks_like_hub_dataset_id(path) is is_id


def test_a_local_folder_shaped_like_an_id_is_local(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert is_hub_dataset_id(HUB_ID)
    (tmp_path / HUB_ID).mkdir(parents=True)
    assert not is_hub_dataset_id(HUB_ID)


@pytest.mark.parametrize(
    ("flag", "switch"),
    [("training_data_path", "HF_HUB_OFFLINE"), ("validation_data_path", "HF_DATASETS_OFFLINE")],
)
def test_cli_refuses_an_id_offline_before_the_model_loads(
    flag, switch, offline, unloadable_model, sample_train, tmp_path, monkeypatch
):
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv(switch, "1")
    termination_log = tmp_path / "termination-log"
    monkeypatch.setenv("TERMINATION_LOG_FILE", str(termination_log))
    monkeypatch.delenv(config_utils.CONFIG_PATH_ENV, raising=False)
    monkeypatch.delenv(config_utils.CONFIG_BASE64_ENV, raising=False)
    data = {"data": sample_train, flag: HUB_ID}
    monkeypatch.setattr("sys.argv", ["sft_trainer.py", *cli_args(unloadable_model, str(tmp_path / "out"), **data)])
    assert sft_trainer.main() == 1
    assert termination_lines(termination_log) == [
        f"user_error: InputFileNotFoundError: --{flag}: {HUB_ID} is no local file, folder or glob, and the Hugging "
        f"Face Hub is offline ({switch}=1), so it cannot be loaded as a Hub dataset id"
    ]
    assert not (tmp_path / "out").exists()


def test_train_refuses_an_id_in_a_data_config_offline(offline, unloadable_model, tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"datasets": [{"name": "demo", "data_paths": [HUB_ID]}]}), encoding="utf-8")
    model_args, _, train_args = make_args(unloadable_model, str(tmp_path / "out"), "")
    label = f"data config {re.escape(str(config))}: dataset 'demo': key 'data_paths'"
    pattern = rf"^{label}: {HUB_ID} is no local file, folder or glob, and the Hugging Face Hub is offline"
    with pytest.raises(UserInputError, match=pattern) as caught:
        sft_trainer.train(model_args, DataArguments(data_config_path=str(config)), train_args)
    assert classify(caught.value) is ErrorCategory.USER_ERROR
    # What fms-hf-tuning v3.1.0 raises for a training data path that does not exist (its own test catches this).
    assert isinstance(caught.value, DatasetNotFoundError)
    assert not (tmp_path / "out").exists()


def test_loading_an_id_offline_is_refused_alike(offline):
    """The data framework's own entry points, which a caller may reach without ``train()``'s early checks."""
    processor = get_datapreprocessor(DataPreProcessorConfig(), tokenizer=None)
    with pytest.raises(UserInputError, match=rf"^data path: {HUB_ID} is no local .*offline \(HF_HUB_OFFLINE=1\)"):
        processor.load_dataset(None, streaming=False, splitName="train", datafile=HUB_ID)
    with pytest.raises(UserInputError, match="offline"):
        is_pretokenized_dataset(HUB_ID)


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("missing.jsonl", "data file not found: missing.jsonl"),
        ("data/missing.jsonl", "data file not found: data/missing.jsonl"),
        ("./demo1", "data file not found: ./demo1"),
        ("~/demo1", "data file not found: ~/demo1"),
        ("org/name/more", "data file not found: org/name/more"),
        ("org/*", "no data file matches org/*"),
    ],
)
def test_a_missing_local_looking_path_is_still_not_found(path, message, offline, unloadable_model, tmp_path):
    model_args, data_args, train_args = make_args(unloadable_model, str(tmp_path / "out"), path)
    with pytest.raises(InputFileNotFoundError, match=f"^{re.escape(message)}$"):
        sft_trainer.train(model_args, data_args, train_args)
