"""Loading, formatting, loss masking and embedding resizing on the tiny model; data errors of train() and the CLI."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import datasets
import pytest
import torch
from datasets.exceptions import DatasetGenerationError, DatasetNotFoundError
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import SFTTrainer

from tests.helpers.training import REPO_ROOT, RESPONSE_TEMPLATE, cli_args, run_main, subprocess_env
from tuning.config.configs import DataArguments, ModelArguments, TrainingArguments
from tuning.data.formatting import apply_custom_formatting_template, format_file, format_texts
from tuning.data.loading import iter_records, load_records
from tuning.data.masking import IGNORE_INDEX, tokenize_and_mask
from tuning.data.tokenizer_data_utils import tokenizer_and_embedding_resize
from tuning.data.tokenizer_utils import get_special_tokens_dict
from tuning.sft_trainer import _to_sft_config, save, train
from tuning.utils.error_logging import ErrorCategory, UserInputError, classify
from tuning.utils.tiny_model import SAMPLE_TRAIN_PATH


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
    with pytest.raises(
        UserInputError, match="none of its 2 rows keeps a token to train on: 2 lack the response template"
    ):
        tokenize_and_mask(["a</s>", "b</s>"], tokenizer, 64, "### Answer:")


def test_without_template_everything_is_trained(tokenizer):
    row = tokenize_and_mask(["hello world</s>"], tokenizer, 64, None)[0]
    assert row["labels"] == row["input_ids"]


# --- upstream's exception types, still user errors -------------------------------------------------------------


def _args(model: str, output_dir: str, data: str, **data_fields):
    model_args = ModelArguments(model_name_or_path=model, torch_dtype="float32", use_flash_attn=False)
    fields = {"dataset_text_field": "output", "response_template": RESPONSE_TEMPLATE, **data_fields}
    data_args = DataArguments(training_data_path=data, **fields)
    train_args = TrainingArguments(
        output_dir=output_dir, max_steps=2, per_device_train_batch_size=4, save_strategy="no", report_to="none"
    )
    return model_args, data_args, train_args


def _write(path: Path, content: str | bytes) -> str:
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return str(path)


@pytest.mark.parametrize(
    ("make_data", "fields", "expected", "culprit"),
    [
        (lambda d: str(d / "missing.jsonl"), {}, FileNotFoundError, "data file not found: .*missing.jsonl"),
        (lambda d: str(d / "missing.jsonl"), {}, DatasetNotFoundError, "data file not found: .*missing.jsonl"),
        (lambda d: str(d), {}, FileNotFoundError, "data folder has no files: "),  # folders of data files train
        (lambda d: _write(d / "bad.json", "This is not JSON.\n"), {}, DatasetGenerationError, "line 1, column 1"),
        (lambda d: _write(d / "empty.json", ""), {}, DatasetGenerationError, "empty"),
        (lambda d: SAMPLE_TRAIN_PATH, {"dataset_text_field": "not found"}, KeyError, "'not found' not in record 0"),
        (
            lambda d: SAMPLE_TRAIN_PATH,
            {"dataset_text_field": None, "data_formatter_template": "{{input}} {{not found}}"},
            KeyError,
            r"\['not found'\] not in record 0 \(line 1\)",
        ),
        (
            lambda d: _write(d / "null.jsonl", '{"output": "a"}\n{"output": null}\n'),
            {},
            UserInputError,
            r"dataset_text_field 'output' in record 1 \(line 2\) of .*null.jsonl is null, not text",
        ),
        (
            lambda d: _write(d / "list.jsonl", '{"q": "a", "r": ["x"]}\n'),
            {"dataset_text_field": None, "data_formatter_template": "{{q}}\n### Response: {{element['r']}}"},
            UserInputError,
            r"template key 'r' in record 0 \(line 1\) of .*list.jsonl is a list, not text",
        ),
        (
            lambda d: SAMPLE_TRAIN_PATH,
            {"dataset_text_field": None, "data_formatter_template": "{{element['not found']}}"},
            KeyError,
            r"template key not in record 0 \(line 1\) of .*: 'dict object' has no attribute 'not found'",
        ),
    ],
)
def test_train_raises_upstreams_exception_types(make_data, fields, expected, culprit, tiny_model, tmp_path):
    data = make_data(tmp_path)
    with pytest.raises(expected, match=culprit) as caught:
        train(*_args(tiny_model, str(tmp_path / "out"), data, **fields))
    assert isinstance(caught.value, UserInputError)
    assert classify(caught.value) is ErrorCategory.USER_ERROR
    assert not (tmp_path / "out").exists()  # nothing trained, nothing saved


# --- templates: v3.1.0's Jinja2 and the older {{key}} form; only strings and numbers become text ---------------


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("{{element['Tweet text']}} => {{element['label']}}", "I hate it => 1</s>"),
        ("{{ element['Tweet text'] | upper }}", "I HATE IT</s>"),
        ("{% if element.label %}complaint: {% endif %}{{id}}", "complaint: 7</s>"),
        ("{{Tweet text}} => {{ label }}", "I hate it => 1</s>"),  # the {{key}} form, a key with a space
        ("{{element['id']}}{{eos_token}}", "7</s></s>"),
    ],
)
def test_templates_in_both_forms(template, expected):
    record = {"Tweet text": "I hate it", "label": 1, "id": 7}
    assert format_texts([record], "</s>", template=template) == [expected]


@pytest.mark.parametrize(
    ("value", "kind"), [(None, "null"), (["x"], "a list"), ({"a": 1}, "an object"), (True, "a bool")]
)
@pytest.mark.parametrize("template", [None, "{{output}}", "{{ element['output'] }}"])
def test_values_that_are_not_text_name_file_line_and_key(value, kind, template, tmp_path):
    path = _write(tmp_path / "d.jsonl", '{"output": "fine", "n": 1.5}\n' + json.dumps({"output": value}) + "\n")
    field = "output" if template is None else None
    with pytest.raises(UserInputError, match=rf"'output' in record 1 \(line 2\) of {re.escape(path)} is {kind}"):
        list(format_file(path, "</s>", field, template))
    assert list(format_file(_write(tmp_path / "n.jsonl", '{"output": 2.5}\n'), "", field, template)) == ["2.5"]


def test_an_invalid_jinja_template_is_a_user_error():
    with pytest.raises(UserInputError, match="--data_formatter_template is not a valid Jinja2 template"):
        format_texts([{"a": "x"}], "</s>", template="{{element['a'}}")


# --- reading: line numbers, UTF-8, JSON arrays read piecewise --------------------------------------------------

BIG_RECORD = {"output": "x" * 1500, "nested": [1.5, None, True, {"é": '✓ "q" \\ \u2028'}]}


@pytest.mark.parametrize("dump", [lambda r: json.dumps(r, indent=2), lambda r: json.dumps(r, separators=(",", ":"))])
def test_json_arrays_spanning_many_reads_load_whole(tmp_path, dump):
    records = [dict(BIG_RECORD, index=index) for index in range(2500)]  # ~4 MB: several 1 MiB reads
    records.insert(1000, {"output": "y" * (3 << 20)})  # one record longer than a read
    path = _write(tmp_path / "data.json", dump(records))
    assert load_records(path) == records
    lines = Path(path).read_text().split("\n")
    starts = [line for line, _ in iter_records(path)]
    assert all(lines[line - 1].lstrip().startswith(("{", "[{")) for line in starts)
    assert starts == sorted(starts)


def test_malformed_json_array_names_line_and_column_beyond_the_first_read(tmp_path):
    text = json.dumps([BIG_RECORD] * 2000, indent=1)  # ~3 MB, 1 + 12 lines per record
    text = text[:-2] + ',\n {"output": tru}\n]'
    path = _write(tmp_path / "data.json", text)
    line = text.count("\n", 0, text.index("tru}")) + 1
    with pytest.raises(DatasetGenerationError, match=rf"data.json on line {line}, column 13: Expecting value"):
        load_records(path)


@pytest.mark.parametrize(
    ("content", "where"),
    [
        (b'{"output": "ok"}\n{"output": "caf\xe9"}\n', "byte 0xe9 on line 2, column 16"),
        (b'[\n {"output": "ok"},\n {"output": "caf\xe9"}\n]', "byte 0xe9 on line 3, column 17"),
        (json.dumps([BIG_RECORD] * 1500, indent=1).encode()[:-2] + b',\n {"output": "\xff"}\n]', "byte 0xff on line "),
    ],
    ids=["json-lines", "json-array", "json-array-beyond-the-first-read"],
)
def test_bytes_that_are_not_utf8_name_the_file_and_line(tmp_path, content, where):
    path = _write(tmp_path / "data.json", content)
    with pytest.raises(DatasetGenerationError, match=rf"data.json is not valid UTF-8: {where}") as caught:
        load_records(path)
    if where.endswith("line "):
        line = content.count(b"\n", 0, content.index(b"\xff")) + 1
        assert f"on line {line}, column 14" in str(caught.value)


def test_byte_order_mark_and_blank_lines_are_accepted(tmp_path):
    assert load_records(_write(tmp_path / "a.jsonl", b'\xef\xbb\xbf{"a": 1}\n\n{"a": 2}\n')) == [{"a": 1}, {"a": 2}]
    assert load_records(_write(tmp_path / "b.json", b'\xef\xbb\xbf [{"a": 1}] \n')) == [{"a": 1}]


@pytest.mark.parametrize(
    ("content", "culprit"),
    [
        ('[{"a": 1},]', "line 1, column 11: Expecting value"),
        ('[{"a": 1}\n {"a": 2}]', "line 2, column 2: expected ',' or ']'"),
        ('[{"a": 1}', "the array is not closed"),
        ('[{"a": 1}] {"b": 2}', "line 1, column 12: extra data after the array"),
        ('{"a": 1}\n"text"\n', "record 1 \\(line 2\\) .* is str, expected a JSON object"),
        ('{"a": 1} {"b": 2}\n', "line 1, column 10: extra data after a record"),
    ],
)
def test_malformed_structure_names_the_place(tmp_path, content, culprit):
    with pytest.raises(DatasetGenerationError, match=culprit):
        load_records(_write(tmp_path / "data.json", content))


# --- templates: keys as written, spaces included ---------------------------------------------------------------


def test_template_keys_with_spaces_are_filled(tmp_path):
    path = _write(tmp_path / "tweets.jsonl", TWEETS)
    template = "### Text: {{Tweet text}}\n\n### Label: {{ text_label }}"
    texts = list(format_file(path, "</s>", template=template))
    assert texts == ["### Text: @acme my parcel never came\n\n### Label: complaint</s>", TWEET_2]


def test_template_key_that_the_data_lacks_is_a_key_error_naming_it(tmp_path):
    path = _write(tmp_path / "tweets.jsonl", TWEETS)
    with pytest.raises(KeyError, match=r"\['Tweet txt'\] not in record 0 \(line 1\) of .*tweets.jsonl") as caught:
        list(format_file(path, "</s>", template="{{Tweet txt}} {{Tweet txt}} {{text_label}}"))
    assert isinstance(caught.value, UserInputError)


def test_key_written_with_spaces_is_taken_as_written_when_the_data_has_it():
    record = {" a ": "spaced", "a": "bare"}
    assert format_texts([record], "", template="{{ a }}|{{a}}") == ["spaced|bare"]


TWEETS = (
    '{"Tweet text": "@acme my parcel never came", "ID": 0, "text_label": "complaint"}\n'
    '{"Tweet text": "@acme thanks, all good", "ID": 1, "text_label": "no complaint"}\n'
)
TWEET_2 = "### Text: @acme thanks, all good\n\n### Label: no complaint</s>"


def test_apply_custom_formatting_template_on_a_datasets_dataset(tmp_path):
    dataset = datasets.load_dataset("json", data_files=_write(tmp_path / "tweets.jsonl", TWEETS))
    template = "### Text: {{Tweet text}}\n\n### Label: {{text_label}}"
    formatted, field = apply_custom_formatting_template(dataset, template)
    assert field == "formatted_data_field"
    assert formatted["train"][1][field] == TWEET_2.removesuffix("</s>")
    formatted, field = apply_custom_formatting_template(dataset["train"], template, "EOS")
    assert formatted[0][field] == "### Text: @acme my parcel never came\n\n### Label: complaintEOS"
    with pytest.raises(KeyError, match="not found"):
        apply_custom_formatting_template(dataset, "{{not found}} {{text_label}}", "EOS")


# --- embeddings -------------------------------------------------------------------------------------------------


def _greedy(model, tokenizer, text: str) -> list[int]:
    inputs = tokenizer(text, return_tensors="pt")
    return model.generate(**inputs, max_new_tokens=12, do_sample=False, pad_token_id=tokenizer.eos_token_id)[0].tolist()


def test_tokenizer_and_embedding_resize_keeps_greedy_outputs(tiny_model):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    plain = AutoModelForCausalLM.from_pretrained(tiny_model)
    resized = AutoModelForCausalLM.from_pretrained(tiny_model)
    old_size = plain.get_input_embeddings().weight.shape[0]
    result = tokenizer_and_embedding_resize({"pad_token": "<pad>"}, tokenizer, resized, multiple_of=64)
    new_size = 64 * -(-(old_size + 1) // 64)
    # fms-hf-tuning v3.1.0 counts the rows added to reach the multiple among the new tokens.
    assert result == {"num_new_tokens": new_size - old_size, "new_embedding_size": new_size}
    assert len(tokenizer) == old_size + 1
    for embedding in (resized.get_input_embeddings(), resized.get_output_embeddings()):
        weight = embedding.weight.detach()
        assert weight.shape[0] == new_size
        assert torch.allclose(weight[old_size:], weight[:old_size].mean(dim=0).expand(new_size - old_size, -1))
    assert torch.equal(resized.get_input_embeddings().weight[:old_size], plain.get_input_embeddings().weight)
    text = "### Input: What is 2 plus 3?\n\n### Response:"
    assert _greedy(resized, tokenizer, text) == _greedy(plain, tokenizer, text)


def test_tokenizer_and_embedding_resize_covers_tokens_added_before(tiny_model):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    old_size = len(tokenizer)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<a>", "<b>"]})
    result = tokenizer_and_embedding_resize({}, tokenizer, model, multiple_of=1)
    assert result == {"num_new_tokens": 0, "new_embedding_size": old_size + 2}
    weight = model.get_output_embeddings().weight.detach()
    assert torch.allclose(weight[old_size:], weight[:old_size].mean(dim=0).expand(2, -1))


# --- streaming --------------------------------------------------------------------------------------------------


def test_text_generators_are_read_once_in_batches(tokenizer):
    consumed = []

    def texts():
        for index in range(2500):
            consumed.append(index)
            yield f"### Input: {index}\n### Response: {index}</s>"

    dataset = tokenize_and_mask(texts(), tokenizer, 64, RESPONSE_TEMPLATE)
    assert consumed == list(range(2500)) and len(dataset) == 2500
    assert dataset.cache_files  # memory-mapped from disk, not held in memory
    assert tokenizer.decode([t for t in dataset[2499]["labels"] if t != IGNORE_INDEX]) == " 2499</s>"


def _eager_rows(path: str, tokenizer, max_length: int) -> list[dict]:
    """The rows the streaming pipeline must produce, computed the plain way: all texts at once, in memory."""
    texts = [json.loads(line)["output"] + tokenizer.eos_token for line in Path(path).read_text().splitlines()]
    encoded = tokenizer(texts, truncation=True, max_length=max_length, return_offsets_mapping=True)
    rows = []
    for text, input_ids, offsets in zip(texts, encoded["input_ids"], encoded["offset_mapping"], strict=True):
        response_start = text.index(RESPONSE_TEMPLATE) + len(RESPONSE_TEMPLATE)
        first = next(index for index, (start, _) in enumerate(offsets) if start >= response_start)
        rows.append({"input_ids": input_ids, "labels": [IGNORE_INDEX] * first + input_ids[first:]})
    return rows


def test_training_on_the_streamed_dataset_equals_training_in_memory(tiny_model, sample_train, tmp_path):
    model_args, data_args, train_args = _args(tiny_model, str(tmp_path / "streamed"), sample_train)
    train_args.max_steps = 4
    trainer, *_ = train(model_args, data_args, train_args)
    save(str(tmp_path / "streamed"), trainer)

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    tokenizer.pad_token = tokenizer.eos_token
    rows = _eager_rows(sample_train, tokenizer, train_args.max_seq_length)
    assert (
        list(tokenize_and_mask(format_file(sample_train, "</s>", "output"), tokenizer, 4096, RESPONSE_TEMPLATE)) == rows
    )
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32, attn_implementation="sdpa")
    train_args.output_dir = str(tmp_path / "in-memory")
    trainer = SFTTrainer(
        model=model,
        args=_to_sft_config(train_args, train_args.max_seq_length),
        train_dataset=datasets.Dataset.from_list(rows),
        processing_class=tokenizer,
    )
    trainer.train()
    streamed = load_file(str(tmp_path / "streamed" / "model.safetensors"))
    in_memory = trainer.model.state_dict()
    assert streamed.keys() <= in_memory.keys()
    assert all(torch.equal(streamed[name], in_memory[name]) for name in streamed)
    assert not torch.equal(
        streamed["model.embed_tokens.weight"], load_file(f"{tiny_model}/model.safetensors")["model.embed_tokens.weight"]
    )


MEMORY_PROBE = """
import json, os, random, resource, sys
from transformers import AutoTokenizer
from tuning.data.formatting import format_file
from tuning.data.masking import tokenize_and_mask

model, directory, megabytes = sys.argv[1], sys.argv[2], int(sys.argv[3])
words = "what is the word spell backwards letters plus times green cat sun rests quietly".split()
rng = random.Random(0)

def write(path, size):
    with open(path, "w") as handle:
        while handle.tell() < size:
            response = " ".join(rng.choice(words) for _ in range(1500))
            handle.write(json.dumps({"output": "### Input: Say it.\\n\\n### Response: " + response}) + "\\n")

def prepare(path):
    texts = format_file(path, tokenizer.eos_token, dataset_text_field="output")
    return tokenize_and_mask(texts, tokenizer, 128, "\\n### Response:")

write(os.path.join(directory, "warm.jsonl"), 2 << 20)
write(os.path.join(directory, "big.jsonl"), megabytes << 20)
tokenizer = AutoTokenizer.from_pretrained(model)
prepare(os.path.join(directory, "warm.jsonl"))  # the first batches' one-off allocations
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
dataset = prepare(os.path.join(directory, "big.jsonl"))
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"rows": len(dataset), "peak_growth": (after - before) << 10}))
"""


@pytest.mark.slow
def test_preparing_a_large_file_keeps_memory_well_below_its_size(tiny_model, tmp_path):
    megabytes = 20
    result = subprocess.run(
        [sys.executable, "-c", MEMORY_PROBE, tiny_model, str(tmp_path), str(megabytes)],
        env=subprocess_env(),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    probe = json.loads(result.stdout.strip().splitlines()[-1])
    size = os.path.getsize(tmp_path / "big.jsonl")
    assert probe["rows"] == len((tmp_path / "big.jsonl").read_text().splitlines())
    assert probe["peak_growth"] < size / 4, f"peak RSS grew {probe['peak_growth'] >> 20} MiB for {size >> 20} MiB"


# --- the command line: exit code 1, one termination line naming the culprit ------------------------------------


@pytest.mark.parametrize(
    ("make_data", "extra", "line"),
    [
        (lambda d: str(d), {}, r"user_error: InputFileNotFoundError: data folder has no files: .+"),
        (
            lambda d: _write(d / "latin1.jsonl", b'{"output": "ok"}\n{"output": "### Response: caf\xe9"}\n'),
            {},
            r"user_error: MalformedDataError: .*latin1.jsonl is not valid UTF-8: byte 0xe9 on line 2, column 30",
        ),
        (
            lambda d: _write(d / "tweets.jsonl", TWEETS),
            {"dataset_text_field": None, "data_formatter_template": "{{Tweet txt}}\n### Response: {{text_label}}"},
            r"user_error: InputKeyError: template key\(s\) \['Tweet txt'\] not in record 0 \(line 1\) of .*tweets.jsonl"
            r" \(keys: .*\)",
        ),
        (
            lambda d: _write(d / "qa.csv", "input,output\nWhat is 2 plus 2?,Four.\nAnd 3 plus 3?,\n"),
            {"dataset_text_field": None, "response_template": None},
            r"user_error: UserInputError: dataset 'training_data': .*qa.csv row 2: field 'output' is null or missing, "
            r"not a string \(data handler tokenize_and_apply_input_masking\)",
        ),
        (  # the CLI's share of the no-label refusal (tests/data/test_bad_rows.py has its wording on every path)
            lambda d: _write(d / "train.jsonl", Path(SAMPLE_TRAIN_PATH).read_bytes()),
            {"max_seq_length": 4},
            r"user_error: UserInputError: --training_data_path .*train.jsonl: none of its 96 rows keeps a token to "
            r"train on: 96 lost every label to truncation at --max_seq_length 4 \(the longest prompt takes \d+ "
            r"tokens\); raise --max_seq_length or shorten the prompts",
        ),
    ],
    ids=["directory", "not-utf8", "template-key-with-space", "csv-empty-cell", "every-label-truncated"],
)
def test_cli_bad_data_exits_1_with_one_line_naming_it(make_data, extra, line, tiny_model, tmp_path, monkeypatch, capfd):
    termination_log = tmp_path / "termination-log"
    args = cli_args(tiny_model, str(tmp_path / "out"), data=make_data(tmp_path), **extra)
    exit_code, stderr = run_main(args, monkeypatch, capfd, TERMINATION_LOG_FILE=str(termination_log))
    assert exit_code == 1, stderr[-3000:]
    assert re.fullmatch(line + r"\n", termination_log.read_text())
    assert "Traceback" not in stderr


def test_cli_fills_template_keys_with_spaces(tiny_model, tmp_path, monkeypatch, capfd):
    data = _write(tmp_path / "tweets.jsonl", TWEETS)
    template = "### Text: {{Tweet text}}\n### Response: {{text_label}}"
    args = cli_args(tiny_model, str(tmp_path), data=data, dataset_text_field=None, data_formatter_template=template)
    exit_code, stderr = run_main([*args, "--per_device_train_batch_size", "2", "--max_steps", "1"], monkeypatch, capfd)
    assert exit_code == 0, stderr[-3000:]


def test_special_tokens_dict_of_v3(tiny_model):
    """fms-hf-tuning v3.1.0's get_special_tokens_dict: nothing for a separately named tokenizer; otherwise each
    missing special token, and a pad token distinct from eos."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    assert get_special_tokens_dict("separate-tokenizer", tokenizer) == {}
    tokenizer.pad_token = tokenizer.eos_token
    special_tokens = get_special_tokens_dict(None, tokenizer)
    assert special_tokens["pad_token"] == tokenizer.pad_token != tokenizer.eos_token
    assert all(getattr(tokenizer, name) is not None or name in special_tokens for name in ("bos_token", "unk_token"))
