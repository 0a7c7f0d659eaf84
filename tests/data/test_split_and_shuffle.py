"""fms-hf-tuning 3.2's per-dataset ``dataset_split_name`` and ``shuffle`` in a data config: accepted, checked like the
other keys, and applied (3.2's own test of the split name reads a Hub-hosted dataset: not runnable offline)."""

import re

import pytest
from transformers import AutoTokenizer

from tests.helpers.data_files import GOOD, prepare, write_config, write_jsonl
from tuning.config.configs import DataArguments, TrainingArguments
from tuning.data.data_config import load_and_validate_data_config
from tuning.data.setup_dataprocessor import check_data_arguments, process_dataargs
from tuning.utils.error_logging import UserInputError

HANDLER = {
    "name": "apply_custom_jinja_template",
    "arguments": {"fn_kwargs": {"formatted_text_column_name": "text", "template": "{{ input }} {{ output }}"}},
}


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    return AutoTokenizer.from_pretrained(tiny_model)


def dataset(path: str, **keys) -> dict:
    return {"name": "qa", "data_paths": [path], "data_handlers": [HANDLER], **keys}


def texts(tokenizer, tmp_path, **keys) -> tuple[list[str], list[str] | None]:
    rows = [{"input": f"question {index}", "output": f"answer {index}"} for index in range(10)]
    config = write_config(
        tmp_path / "c.yaml", {"datasets": [dataset(write_jsonl(tmp_path / "qa.jsonl", rows), **keys)]}
    )
    train_args = TrainingArguments(output_dir=str(tmp_path / "out"), eval_strategy="no")
    train, evaluation, *_ = process_dataargs(
        DataArguments(data_config_path=config, response_template=" answer"), tokenizer, train_args
    )
    return list(train["text"]), None if evaluation is None else list(evaluation["text"])


def test_the_split_name_selects_rows_and_shuffle_false_keeps_their_order(tokenizer, tmp_path):
    train, _ = texts(tokenizer, tmp_path, dataset_split_name="train[:4]")
    assert train == [f"question {index} answer {index}" for index in range(4)]
    kept, held_out = texts(tokenizer, tmp_path, split={"train": 0.8, "validation": 0.2}, shuffle=False)
    assert kept == [f"question {index} answer {index}" for index in range(8)] and len(held_out) == 2
    shuffled, _ = texts(tokenizer, tmp_path, split={"train": 0.8, "validation": 0.2})
    assert len(shuffled) == 8 and shuffled != kept  # shuffle true, the default, as before


def test_bad_split_name_and_shuffle_values_are_user_errors(tokenizer, tmp_path):
    path = write_jsonl(tmp_path / "qa.jsonl", [GOOD])
    for keys, culprit in (({"dataset_split_name": 3}, "dataset_split_name"), ({"shuffle": "yes"}, "shuffle")):
        config = write_config(tmp_path / "c.yaml", {"datasets": [dataset(path, **keys)]})
        with pytest.raises(UserInputError, match=f"dataset 'qa': key '{culprit}'"):
            load_and_validate_data_config(config)
    config = write_config(tmp_path / "c.yaml", {"datasets": [dataset(path, dataset_split_name="validation")]})
    named = r"dataset 'qa': key 'dataset_split_name': split 'validation': local data files have one split, train"
    with pytest.raises(UserInputError, match=f"^data config {re.escape(config)}: {named}"):
        check_data_arguments(DataArguments(data_config_path=config))  # before the model loads
    with pytest.raises(UserInputError, match=f"^{named}"):
        prepare(tokenizer, tmp_path, data_config_path=config)
