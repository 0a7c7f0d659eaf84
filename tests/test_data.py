"""Loading, formatting and loss masking on the tiny tokenizer."""

import json

import pytest
from transformers import AutoTokenizer

from tests.conftest import RESPONSE_TEMPLATE
from tuning.data.formatting import format_texts
from tuning.data.loading import load_records
from tuning.data.masking import IGNORE_INDEX, tokenize_and_mask
from tuning.utils.error_logging import UserInputError


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    return AutoTokenizer.from_pretrained(tiny_model)


def test_json_lines_and_arrays_load_alike(tmp_path, sample_train):
    records = load_records(sample_train)
    array = tmp_path / "train.json"
    array.write_text(json.dumps(records))
    assert load_records(str(array)) == records and len(records) == 96


@pytest.mark.parametrize(
    ("content", "culprit"),
    [
        ("", "empty"),
        ("   \n", "empty"),
        ('{"output": "a"}\n{"output": ', "line 2"),
        ("[1, 2]", "record 0"),
        ("[]", "no records"),
        ("[{]", "malformed JSON array"),
    ],
)
def test_bad_data_files(tmp_path, content, culprit):
    path = tmp_path / "data.jsonl"
    path.write_text(content)
    with pytest.raises(UserInputError, match=culprit):
        load_records(str(path))


def test_missing_data_file(tmp_path):
    with pytest.raises(UserInputError, match="not found"):
        load_records(str(tmp_path / "nope.jsonl"))


def test_template_fills_fields_and_appends_eos():
    texts = format_texts([{"q": "2+2?", "a": 4}], "</s>", template="Q: {{q}}\nA: {{ a }}")
    assert texts == ["Q: 2+2?\nA: 4</s>"]


def test_template_unknown_key_names_it():
    with pytest.raises(UserInputError, match=r"\['answer'\].*record 1"):
        format_texts([{"q": 1, "answer": 2}, {"q": 3}], "</s>", template="{{q}} {{answer}}")


def test_missing_text_field_names_it():
    with pytest.raises(UserInputError, match="'text'.*record 0"):
        format_texts([{"output": "x"}], "</s>", dataset_text_field="text")


def test_masking_keeps_only_the_response(tokenizer):
    text = "### Input: What is 2 plus 3?\n\n### Response: 2 plus 3 is 5." + tokenizer.eos_token
    row = tokenize_and_mask([text], tokenizer, 128, RESPONSE_TEMPLATE)[0]
    kept = [label for label in row["labels"] if label != IGNORE_INDEX]
    first_kept = row["labels"].index(kept[0])
    assert all(label == IGNORE_INDEX for label in row["labels"][:first_kept])
    assert row["labels"][first_kept:] == row["input_ids"][first_kept:]
    assert tokenizer.decode(kept) == " 2 plus 3 is 5." + tokenizer.eos_token
    assert tokenizer.decode(row["input_ids"][:first_kept]).endswith("### Response:")


def test_masking_skips_examples_without_template(tokenizer):
    texts = ["no template here</s>", "### Input: x\n### Response: y</s>"]
    dataset = tokenize_and_mask(texts, tokenizer, 64, RESPONSE_TEMPLATE)
    assert len(dataset) == 1


def test_template_in_no_example_is_an_error(tokenizer):
    with pytest.raises(UserInputError, match="none of the 2 examples"):
        tokenize_and_mask(["a</s>", "b</s>"], tokenizer, 64, "### Answer:")


def test_without_template_everything_is_trained(tokenizer):
    row = tokenize_and_mask(["hello world</s>"], tokenizer, 64, None)[0]
    assert row["labels"] == row["input_ids"]
