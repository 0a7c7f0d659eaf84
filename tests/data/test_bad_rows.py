"""Messy data as user errors: a row with a missing, null or non-text field (real JSON lines, JSON, CSV, Parquet and
Arrow files), a chat turn without role or content, a pretokenized row whose columns disagree, prompts truncated past
every label, and a data config's handler argument typos. Each is a ``UserInputError`` (exit 1) raised while the data
is prepared, before the model loads, naming the file, the row (line for JSON lines, row number otherwise) and the
field; the command-line exit is proven in test_data.py's ``csv-empty-cell`` case."""

import json
import logging
import re
from pathlib import Path

import datasets
import pyarrow
import pyarrow.parquet
import pytest
from transformers import AutoTokenizer

from tests.helpers.data_files import CHAT_TEMPLATE, GOOD, prepare, write_config, write_jsonl
from tuning.config.configs import DataArguments
from tuning.data.data_handlers import IGNORE_INDEX
from tuning.data.setup_dataprocessor import check_data_arguments
from tuning.utils.error_logging import UserInputError
from tuning.utils.tiny_model import SAMPLE_TRAIN_PATH

RESPONSE_TEMPLATE = "\n### Response:"


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    return AutoTokenizer.from_pretrained(tiny_model)


def _columns(rows: list[dict]) -> dict[str, list]:
    return {key: [row.get(key) for row in rows] for key in rows[0]}


def write_rows(path: Path, rows: list[dict]) -> str:
    """``rows`` in the format of ``path``'s extension, as another tool would have written them."""
    kind = path.suffix
    if kind == ".jsonl":
        return write_jsonl(path, rows)
    if kind == ".json":
        path.write_text(json.dumps(rows, indent=1), encoding="utf-8")
    elif kind == ".csv":
        lines = [",".join(rows[0])] + [",".join("" if v is None else str(v) for v in row.values()) for row in rows]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    elif kind == ".parquet":
        pyarrow.parquet.write_table(pyarrow.table(_columns(rows)), path)
    elif kind == ".arrow":
        table = pyarrow.table(_columns(rows))
        with pyarrow.OSFile(str(path), "wb") as sink, pyarrow.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
    return str(path)


@pytest.mark.parametrize(
    ("name", "bad", "where", "field"),
    [
        ("missing.jsonl", {"input": "no output"}, "line 3", "field 'output' is null or missing"),
        ("numbers.jsonl", {"input": 5, "output": 6}, "line 3", "field 'input' is int"),
        ("null.json", {"input": "x", "output": None}, r"record 2 \(line \d+\)", "field 'output' is null or missing"),
        ("empty-cell.csv", {"input": "x", "output": None}, "row 3", "field 'output' is null or missing"),
        ("null.parquet", {"input": None, "output": "y"}, "row 3", "field 'input' is null or missing"),
        ("null.arrow", {"input": "x", "output": None}, "row 3", "field 'output' is null or missing"),
    ],
)
@pytest.mark.parametrize("how", ["flags", "data_config"])
def test_a_bad_input_output_row_names_file_row_and_field(tokenizer, tmp_path, name, bad, where, field, how):
    path = write_rows(tmp_path / name, [GOOD, GOOD, bad, GOOD])
    if how == "flags":
        data = {"training_data_path": path}
    else:
        handler = {
            "name": "tokenize_and_apply_input_masking",
            "arguments": {
                "remove_columns": "all",
                "fn_kwargs": {"input_column_name": "input", "output_column_name": "output"},
            },
        }
        data = {
            "data_config_path": write_config(
                tmp_path / "c.yaml", {"datasets": [{"name": "qa", "data_paths": [path], "data_handlers": [handler]}]}
            )
        }
    with pytest.raises(UserInputError) as caught:
        prepare(tokenizer, tmp_path, **data)
    message = str(caught.value)
    assert "\n" not in message
    assert re.search(f"{re.escape(path)} {where}: {field}, not a string", message), message
    assert "tokenize_and_apply_input_masking" in message


def chat_config(tmp_path: Path, path: str, template: str) -> str:
    """A data config training the chat file ``path`` with the masking chat handler and ``template``."""
    handler = {"name": "tokenize_and_apply_chat_template_with_masking", "arguments": {"remove_columns": "all"}}
    config = {
        "dataprocessor": {"chat_template": template},
        "datasets": [{"name": "chat", "data_paths": [path], "data_handlers": [handler]}],
    }
    return write_config(tmp_path / "c.yaml", config)


@pytest.mark.parametrize(
    ("turn", "field"),
    [
        ({"role": "user"}, r"messages\[0\]'.content is null"),
        ({"content": "Hi"}, r"messages\[0\]'.role is null"),
        ({"role": "user", "content": 7}, r"messages\[0\]'.content is int"),
    ],
)
def test_a_bad_chat_turn_names_file_line_and_turn(tokenizer, tmp_path, turn, field):
    good = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]
    path = write_jsonl(tmp_path / "chat.jsonl", [{"messages": good}, {"messages": [turn, good[1]]}])
    with pytest.raises(UserInputError, match=f"dataset 'chat': {re.escape(path)} line 2: field '{field}"):
        prepare(tokenizer, tmp_path, data_config_path=chat_config(tmp_path, path, CHAT_TEMPLATE))


def test_a_chat_template_without_a_generation_prompt_is_refused(tokenizer, tmp_path):
    path = write_jsonl(
        tmp_path / "chat.jsonl",
        [{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]}],
    )
    template = "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n{% endfor %}"
    with pytest.raises(UserInputError, match=r"no generation prompt .* prefix '<\|assistant\|>\\n' would be trained"):
        prepare(tokenizer, tmp_path, data_config_path=chat_config(tmp_path, path, template))


@pytest.mark.parametrize(
    ("name", "bad", "message"),
    [
        ("labels.jsonl", {"labels": [5, 6]}, r"line 2: field 'labels' is 2 items long, input_ids 3"),
        ("mask.parquet", {"attention_mask": [1, 1]}, r"row 2: field 'attention_mask' is 2 items long, input_ids 3"),
        ("vocab.arrow", {"input_ids": [1, 5, 100000]}, r"row 2: field 'input_ids\[2\]' is 100000, not a token id"),
        ("label.csv", {"labels": [5, -1, 7]}, None),
    ],
)
def test_a_misaligned_pretokenized_row_is_named(tokenizer, tmp_path, name, bad, message):
    good = {"input_ids": [1, 5, 6], "labels": [IGNORE_INDEX, 5, 6], "attention_mask": [1, 1, 1]}
    if name.endswith(".csv"):  # lists do not fit a CSV cell: written as JSON lines, named .jsonl
        name, message = "label.jsonl", r"line 2: field 'labels\[1\]' is -1, not a token id"
    path = write_rows(tmp_path / name, [good, {**good, **bad}])
    with pytest.raises(UserInputError, match=f"{re.escape(path)} {message}"):
        prepare(tokenizer, tmp_path, training_data_path=path)


def test_prompts_truncated_past_every_label(tokenizer, tmp_path, caplog):
    long = {"input": "word " * 60, "output": "yes"}
    every = write_jsonl(tmp_path / "long.jsonl", [long] * 3)
    with pytest.raises(
        UserInputError,
        match=rf"^--training_data_path {re.escape(every)}: none of its 3 rows keeps a token to train on: 3 lost "
        r"every label to truncation at --max_seq_length 16 \(the longest prompt takes 16 tokens or more\); raise "
        r"--max_seq_length or shorten the prompts$",
    ):
        prepare(tokenizer, tmp_path, max_length=16, training_data_path=every)
    some = write_jsonl(tmp_path / "some.jsonl", [long, GOOD, long])
    with caplog.at_level(logging.WARNING):
        train_rows, _ = prepare(tokenizer, tmp_path, max_length=16, training_data_path=some)
    assert len(train_rows) == 1
    assert [r.message for r in caplog.records if "truncation" in r.message] == [
        f"--training_data_path {some}: 2 of 3 rows keep no token to train on and are left out: 2 lost every label "
        "to truncation at --max_seq_length 16 (the longest prompt takes 16 tokens or more)"
    ]
    assert prepare(tokenizer, tmp_path, max_length=16, training_data_path=some, do_dataprocessing_only=True) is None
    written = datasets.load_dataset("parquet", data_files=str(tmp_path / "out/train_dataset/*.parquet"), split="train")
    assert [row["input_ids"] for row in written] == [list(train_rows[0]["input_ids"])]


def sample_prompts(tokenizer) -> dict[str, list[int]]:
    """The token counts of the sample data's prompts: the text before its output (the input/output handler's) and
    the output column up to the end of its response template (the text field's)."""
    rows = [json.loads(line) for line in Path(SAMPLE_TRAIN_PATH).read_text(encoding="utf-8").splitlines()]
    ends = [row["output"].index(RESPONSE_TEMPLATE) + len(RESPONSE_TEMPLATE) for row in rows]
    return {
        "input": [len(tokenizer(row["input"]).input_ids) for row in rows],
        "output": [len(tokenizer(row["output"][:end]).input_ids) for row, end in zip(rows, ends, strict=True)],
    }


@pytest.mark.parametrize(
    ("flags", "prompt", "known"),
    [
        ({"dataset_text_field": "output", "response_template": RESPONSE_TEMPLATE}, "output", True),
        ({}, "input", False),  # the input/output handler truncates the prompt itself: known to fill the length
    ],
)
def test_every_prompt_longer_than_max_seq_length_is_one_message_with_file_rows_and_longest_prompt(
    tokenizer, tmp_path, flags, prompt, known
):
    """Once two wordings ("response template occurs in none of the 96 examples (or every response was truncated
    away)", "all 96 rows of the training data lost every label..."), neither naming both the file and the prompt."""
    prompts = sample_prompts(tokenizer)[prompt]
    cut = min(prompts)
    longest = f"{max(prompts)} tokens" if known else f"{cut} tokens or more"
    with pytest.raises(UserInputError) as refused:
        prepare(tokenizer, tmp_path, max_length=cut, training_data_path=SAMPLE_TRAIN_PATH, **flags)
    assert str(refused.value) == (
        f"--training_data_path {SAMPLE_TRAIN_PATH}: none of its 96 rows keeps a token to train on: 96 lost every "
        f"label to truncation at --max_seq_length {cut} (the longest prompt takes {longest}); raise "
        "--max_seq_length or shorten the prompts"
    )


COLUMNS = {"input_column_name": "input", "output_column_name": "output"}


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        (
            {"fn_kwargs": {**COLUMNS, "add_eos_tokn": False}},
            r"unknown fn_kwargs 'add_eos_tokn': did you mean 'add_eos_token'",
        ),
        ({"fn_kwargs": COLUMNS, "batchd": False}, r"unknown argument 'batchd': did you mean 'batched'\?"),
        ({"fn_kwargs": {"input_column_name": "input"}}, r"fn_kwargs \['output_column_name'\] required"),
    ],
)
def test_handler_argument_typos_name_file_dataset_handler_and_closest_name(tokenizer, tmp_path, arguments, problem):
    handler = {"name": "tokenize_and_apply_input_masking", "arguments": arguments}
    dataset = {"name": "qa", "data_paths": [write_jsonl(tmp_path / "qa.jsonl", [GOOD])], "data_handlers": [handler]}
    config = write_config(tmp_path / "c.yaml", {"datasets": [dataset]})
    named = r"key 'data_handlers\[0\]': handler 'tokenize_and_apply_input_masking': "
    with pytest.raises(UserInputError, match=f"data config {re.escape(config)}: dataset 'qa': {named}{problem}"):
        check_data_arguments(DataArguments(data_config_path=config))  # what train() checks before the model loads
    with pytest.raises(UserInputError, match=f"dataset qa: data handler tokenize_and_apply_input_masking: {problem}"):
        prepare(tokenizer, tmp_path, data_config_path=config)


TEXT = "### Input: What is 2 plus 2? ### Response: Four."  # one line: write_rows writes CSV unquoted


@pytest.mark.parametrize(
    ("name", "bad", "field"),
    [
        ("struct.parquet", {"a": TEXT}, "field 'text' is an object"),
        ("list.arrow", [TEXT], "field 'text' is a list"),
        ("null.parquet", None, "field 'text' is null"),
        ("empty-cell.csv", None, "field 'text' is null"),
    ],
)
def test_a_text_field_that_is_no_text_names_file_row_and_field(tokenizer, tmp_path, name, bad, field):
    """A struct, a list or a null given as the text field was trained on as its Python form ({'a': '### Input…'})."""
    good = {"a": TEXT} if isinstance(bad, dict) else [TEXT] if isinstance(bad, list) else TEXT
    rows = [{"id": index, "text": good if index != 1 else bad} for index in range(3)]
    if bad is not None:  # the whole column is of the wrong kind: its first row is named
        rows = [{"id": index, "text": bad} for index in range(3)]
    path = write_rows(tmp_path / name, rows)
    with pytest.raises(UserInputError) as caught:
        prepare(
            tokenizer, tmp_path, training_data_path=path, dataset_text_field="text", response_template="### Response:"
        )
    message = str(caught.value)
    row = "row 1" if bad is not None else "row 2"
    assert "\n" not in message and f"{path} {row}: {field}, not text" in message, message
