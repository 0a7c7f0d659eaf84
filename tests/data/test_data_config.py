"""fms-hf-tuning v3.1.0's data framework on the tiny model: data configs, chat data with loss on the assistant turns
only, Parquet/CSV files, folders and globs, mixing datasets by sampling ratios, pretokenised data, offline data
processing, user handlers, and bad configs refused as user errors naming the file, the dataset and the key."""

import json
import re
from pathlib import Path

import datasets
import pytest
import yaml
from transformers import AutoTokenizer

from tests.helpers.data_files import CHAT_TEMPLATE, write_config, write_jsonl
from tests.helpers.file_reads import FileReads
from tests.helpers.training import RESPONSE_TEMPLATE, cli_args, make_args, run_main
from tuning.config.configs import DataArguments, TrainingArguments
from tuning.data.data_config import load_and_validate_data_config
from tuning.data.data_handlers import IGNORE_INDEX, DataHandler, DataHandlerType
from tuning.data.setup_dataprocessor import process_dataargs
from tuning.sft_trainer import train, validate_arguments
from tuning.utils.error_logging import ErrorCategory, UserInputError, classify
from tuning.utils.tiny_model import SAMPLE_TRAIN_PATH

CONVERSATIONS = [
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2 plus 2?"},
        {"role": "assistant", "content": "Four."},
        {"role": "user", "content": "And 3 plus 3?"},
        {"role": "assistant", "content": "Six."},
    ],
    [{"role": "user", "content": "Spell cat backwards."}, {"role": "assistant", "content": "tac"}],
]


def sample_rows() -> list[dict]:
    return [json.loads(line) for line in Path(SAMPLE_TRAIN_PATH).read_text().splitlines()]


def trained_texts(trainer, tokenizer) -> list[str]:
    """Per training row, the text of its tokens that carry a loss."""
    return [
        tokenizer.decode([token for token in row["labels"] if token != IGNORE_INDEX]) for row in trainer.train_dataset
    ]


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    return AutoTokenizer.from_pretrained(tiny_model)


def one_step(tiny_model, tmp_path, data_args: DataArguments, **training):
    model_args, _, train_args = make_args(tiny_model, str(tmp_path / "out"), "", max_steps=1, **training)
    return train(model_args, data_args, train_args)


# --- chat data --------------------------------------------------------------------------------------------------


def test_chat_jsonl_trains_on_the_assistant_turns_only(tiny_model, tokenizer, tmp_path):
    data = write_jsonl(tmp_path / "chat.jsonl", [{"messages": turns} for turns in CONVERSATIONS])
    data_args = DataArguments(
        training_data_path=data,
        chat_template=CHAT_TEMPLATE,
        dataset_conversation_field="messages",
        instruction_template="<|user|>",
        response_template="<|assistant|>",
    )
    trainer, _, _ = one_step(tiny_model, tmp_path, data_args)
    assert trainer.state.global_step == 1
    eos = tokenizer.eos_token
    texts = [text.replace(" ", "").replace("\n", "") for text in trained_texts(trainer, tokenizer)]
    assert texts == [f"Four.{eos}Six.{eos}", f"tac{eos}"]


def test_chat_masking_handler_of_a_data_config(tiny_model, tokenizer, tmp_path):
    data = write_jsonl(tmp_path / "chat.jsonl", [{"messages": turns} for turns in CONVERSATIONS])
    handler = {
        "name": "tokenize_and_apply_chat_template_with_masking",
        "arguments": {"remove_columns": "all", "fn_kwargs": {"max_seq_length": 256, "conversation_column": "messages"}},
    }
    config = {
        "dataprocessor": {"type": "default", "chat_template": CHAT_TEMPLATE},
        "datasets": [{"name": "chat", "data_paths": [data], "data_handlers": [handler]}],
    }
    data_args = DataArguments(data_config_path=write_config(tmp_path / "chat.yaml", config))
    trainer, _, _ = one_step(tiny_model, tmp_path, data_args)
    texts = trained_texts(trainer, tokenizer)
    # Each assistant turn with what the template puts after it; no system or user text, no role markers before it.
    assert [re.sub(r"\s", "", text) for text in texts] == [
        f"Four.{tokenizer.eos_token}Six.{tokenizer.eos_token}",
        f"tac{tokenizer.eos_token}",
    ]
    assert all("<|user|>" not in text and "2 plus 2" not in text for text in texts)


# --- file formats, folders, globs -------------------------------------------------------------------------------


def test_parquet_file_trains(tiny_model, tmp_path):
    rows = sample_rows()
    path = tmp_path / "train.parquet"
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    data_args = DataArguments(
        training_data_path=str(path), dataset_text_field="output", response_template=RESPONSE_TEMPLATE
    )
    trainer, _, _ = one_step(tiny_model, tmp_path, data_args)
    assert len(trainer.train_dataset) == len(rows) and trainer.state.global_step == 1


def test_folder_of_csv_files_and_a_glob_give_every_row(tokenizer, tmp_path):
    rows = sample_rows()
    folder = tmp_path / "csv"
    folder.mkdir()
    datasets.Dataset.from_list(rows[:5]).to_csv(str(folder / "a.csv"))
    datasets.Dataset.from_list(rows[5:]).to_csv(str(folder / "b.csv"))
    train_args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to="none")
    for path in (str(folder), str(folder / "*.csv")):
        data_args = DataArguments(training_data_path=path, dataset_text_field="output", response_template="x")
        train_dataset, *_ = process_dataargs(data_args, tokenizer, train_args)
        assert sorted(train_dataset["output"]) == sorted(row["output"] + tokenizer.eos_token for row in rows)


# --- mixing -----------------------------------------------------------------------------------------------------


def test_two_datasets_mix_by_their_sampling_ratios(tokenizer, tmp_path):
    first = write_jsonl(tmp_path / "a.jsonl", [{"text": f"a {i}"} for i in range(200)])
    second = write_jsonl(tmp_path / "b.jsonl", [{"text": f"b {i}"} for i in range(200)])
    config = {
        "dataprocessor": {"sampling_stopping_strategy": "first_exhausted", "seed": 7},
        "datasets": [
            {"name": "a", "sampling": 0.8, "data_paths": [first]},
            {"name": "b", "sampling": 0.2, "data_paths": [second]},
        ],
    }
    data_args = DataArguments(data_config_path=write_config(tmp_path / "mix.yaml", config))
    train_args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to="none", packing=True)
    mixed = process_dataargs(data_args, tokenizer, train_args)[0]["text"]
    share = sum(text.startswith("a") for text in mixed) / len(mixed)
    assert 0.7 < share < 0.9, share
    assert mixed == process_dataargs(data_args, tokenizer, train_args)[0]["text"]  # the seed fixes the mix


# --- pretokenised data ------------------------------------------------------------------------------------------


def test_pretokenized_rows_train_as_given(tiny_model, tokenizer, tmp_path):
    rows = []
    for index in range(6):
        input_ids = tokenizer(f"question {index} answer {index}").input_ids
        rows.append({"input_ids": input_ids, "labels": [IGNORE_INDEX] * 3 + input_ids[3:]})
    data_args = DataArguments(training_data_path=write_jsonl(tmp_path / "tokens.jsonl", rows))
    trainer, _, _ = one_step(tiny_model, tmp_path, data_args)
    assert [dict(row) for row in trainer.train_dataset] == rows


def test_formatting_flags_on_pretokenized_data_are_a_user_error(tiny_model, tokenizer, tmp_path):
    rows = [{"input_ids": [1, 2, 3], "labels": [1, 2, 3]}]
    data_args = DataArguments(
        training_data_path=write_jsonl(tmp_path / "tokens.jsonl", rows), response_template=RESPONSE_TEMPLATE
    )
    with pytest.raises(UserInputError, match="not applicable to pretokenized data"):
        one_step(tiny_model, tmp_path, data_args)


# --- offline processing and user handlers -----------------------------------------------------------------------


def test_do_dataprocessing_only_writes_parquet_shards(tiny_model, tmp_path):
    data_args = DataArguments(
        training_data_path=SAMPLE_TRAIN_PATH,
        dataset_text_field="output",
        response_template=RESPONSE_TEMPLATE,
        do_dataprocessing_only=True,
        num_train_dataset_shards=2,
    )
    assert one_step(tiny_model, tmp_path, data_args) == (None, None, None)
    shards = sorted((tmp_path / "out" / "train_dataset").glob("*.parquet"))
    assert [shard.name for shard in shards] == ["ds_00000.parquet", "ds_00001.parquet"]
    written = datasets.load_dataset("parquet", data_files=[str(shard) for shard in shards], split="train")
    assert len(written) == len(sample_rows())
    assert not list((tmp_path / "out").glob("checkpoint-*"))


def add_marker(element: dict, **kwargs) -> dict:
    return {"output": element["output"].replace("### Response:", "### Response: [marked]")}


def test_additional_data_handlers_run_by_name(tiny_model, tokenizer, tmp_path):
    config = {
        "datasets": [
            {
                "name": "marked",
                "data_paths": [SAMPLE_TRAIN_PATH],
                "data_handlers": [{"name": "add_marker", "arguments": {}}],
            }
        ]
    }
    data_args = DataArguments(
        data_config_path=write_config(tmp_path / "c.yaml", config),
        dataset_text_field="output",
        response_template=RESPONSE_TEMPLATE,
    )
    model_args, _, train_args = make_args(tiny_model, str(tmp_path / "out"), "", max_steps=1)
    handlers = {"add_marker": DataHandler(add_marker, DataHandlerType.MAP)}
    trainer, _, _ = train(model_args, data_args, train_args, additional_data_handlers=handlers)
    assert all(text.startswith(" [marked]") for text in trained_texts(trainer, tokenizer))


# --- bad configs: user errors before the model loads ------------------------------------------------------------


def good_dataset(**overrides) -> dict:
    return {"name": "tweets", "data_paths": [SAMPLE_TRAIN_PATH], **overrides}


@pytest.mark.parametrize(
    ("content", "culprit"),
    [
        (
            {"datasets": [good_dataset(data_handlers=[{"name": "no_such_handler", "arguments": {}}])]},
            r"dataset 'tweets': key 'data_handlers\[0\]': unknown handler 'no_such_handler'",
        ),
        (
            {"datasets": [good_dataset(data_paths=["/nowhere/train.jsonl"])]},
            r"dataset 'tweets': key 'data_paths': data file not found: /nowhere/train.jsonl",
        ),
        ({"datasets": [good_dataset(sampling=1.5)]}, r"dataset 'tweets': key 'sampling': sampling ratio: 1.5"),
        (
            {"datasets": [good_dataset(sampling=0.5), good_dataset(name="again", sampling=0.2)]},
            r"key 'sampling': the ratios \[0.5, 0.2\] sum to 0.7",
        ),
        ({"datasets": [good_dataset(split={"train": 0.9, "test": 0.1})]}, r"dataset 'tweets': key 'split'"),
        ({"datasets": [good_dataset(sampled=0.5)]}, r"dataset 'tweets': unknown key\(s\) \['sampled'\]"),
        ({"dataprocessor": {"type": "odm"}, "datasets": [good_dataset()]}, r"odm.*not supported by tuning-bench"),
        ({"dataprocessor": {"streaming": "yes"}, "datasets": [good_dataset()]}, r"key 'streaming'"),
        ("datasets: [\n  - name: x\n    data_paths: [a.jsonl\n", r"not valid YAML/JSON"),
        ({"dataprocessor": {}}, r"key 'datasets': datasets should be provided"),
    ],
    ids=[
        "unknown-handler",
        "missing-path",
        "ratio-out-of-range",
        "ratios-not-summing-to-1",
        "unknown-split",
        "unknown-key",
        "odm",
        "streaming-not-bool",
        "bad-yaml",
        "no-datasets",
    ],
)
def test_bad_data_configs_are_user_errors_naming_file_dataset_and_key(content, culprit, tiny_model, tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(content if isinstance(content, str) else yaml.safe_dump(content), encoding="utf-8")
    model_args, _, train_args = make_args(tiny_model, str(tmp_path / "out"), "")
    data_args = DataArguments(data_config_path=str(path))
    with pytest.raises(UserInputError, match=rf"data config {re.escape(str(path))}: .*{culprit}") as caught:
        train(model_args, data_args, train_args)
    assert classify(caught.value) is ErrorCategory.USER_ERROR
    assert not (tmp_path / "out").exists()


def test_base64_and_file_chat_templates_are_read(tmp_path):
    import base64

    template_file = tmp_path / "template.jinja"
    template_file.write_text(CHAT_TEMPLATE, encoding="utf-8")
    encoded = base64.b64encode(CHAT_TEMPLATE.encode()).decode()
    for processor in ({"chat_template_base64": encoded}, {"chat_template_path": str(template_file)}):
        path = write_config(tmp_path / "c.yaml", {"dataprocessor": processor, "datasets": [good_dataset()]})
        assert load_and_validate_data_config(path).dataprocessor.chat_template == CHAT_TEMPLATE
    both = write_config(
        tmp_path / "both.yaml",
        {"dataprocessor": {"chat_template": "x", "chat_template_base64": encoded}, "datasets": [good_dataset()]},
    )
    with pytest.raises(UserInputError, match="Only one of"):
        load_and_validate_data_config(both)


def test_a_job_reads_its_data_config_once_and_the_next_job_reads_it_anew(tiny_model, tmp_path):
    """The checks and the vision test (validate_arguments, as main() runs them before train()), then train()'s cache
    key and data preparation read the data config file, and the chat template file it names, once between them: the
    job trains on that reading though the file is replaced after it. The next job (train() again, into another output
    directory) reads the file anew: its new data file does not exist."""
    template = tmp_path / "template.jinja"
    template.write_text(CHAT_TEMPLATE, encoding="utf-8")
    dataset = {"name": "samples", "data_paths": [SAMPLE_TRAIN_PATH]}
    config = write_config(
        tmp_path / "c.yaml", {"dataprocessor": {"chat_template_path": str(template)}, "datasets": [dataset]}
    )
    model_args, _, train_args = make_args(tiny_model, str(tmp_path / "out"), "", max_steps=1)
    data_args = DataArguments(
        data_config_path=config,
        response_template=RESPONSE_TEMPLATE,
        dataset_text_field="output",
        data_cache_dir=str(tmp_path / "cache"),
    )
    with FileReads(config) as config_reads, FileReads(template) as template_reads:
        validate_arguments(model_args, data_args, train_args)
        write_config(tmp_path / "c.yaml", {"datasets": [{**dataset, "data_paths": [str(tmp_path / "gone.jsonl")]}]})
        trainer, *_ = train(model_args, data_args, train_args, trackers=[])
        assert trainer.state.global_step == 1 and (config_reads.count(), template_reads.count()) == (1, 1)
        train_args.output_dir = str(tmp_path / "again")
        with pytest.raises(FileNotFoundError, match="gone.jsonl"):
            train(model_args, data_args, train_args, trackers=[])
        assert config_reads.count() == 2


def test_cli_bad_data_config_exits_1_and_data_config_trains(tiny_model, tmp_path, monkeypatch, capfd):
    bad = write_config(tmp_path / "bad.yaml", {"datasets": [good_dataset(sampling=2)]})
    flags = {"training_data_path": None, "dataset_text_field": None, "response_template": None}
    exit_code, stderr = run_main(
        cli_args(tiny_model, str(tmp_path / "out"), data_config_path=bad, **flags), monkeypatch, capfd
    )
    assert exit_code == 1 and "key 'sampling'" in stderr, stderr[-3000:]
    good = write_config(tmp_path / "good.yaml", {"datasets": [good_dataset()]})
    flags.update(dataset_text_field="output", response_template=RESPONSE_TEMPLATE, max_steps=1)
    exit_code, stderr = run_main(
        cli_args(tiny_model, str(tmp_path / "out"), data_config_path=good, **flags), monkeypatch, capfd
    )
    assert exit_code == 0, stderr[-3000:]


def test_cli_do_dataprocessing_only_exits_0_with_the_shards(tiny_model, tmp_path, monkeypatch, capfd):
    flags = {"do_dataprocessing_only": True, "num_train_dataset_shards": 3}
    exit_code, stderr = run_main(cli_args(tiny_model, str(tmp_path / "out"), **flags), monkeypatch, capfd)
    assert exit_code == 0, stderr[-3000:]
    shards = sorted(path.name for path in (tmp_path / "out" / "train_dataset").glob("*.parquet"))
    assert shards == ["ds_00000.parquet", "ds_00001.parquet", "ds_00002.parquet"]


def test_datasets_to_join_need_the_same_columns():
    from datasets import Dataset

    from tuning.data.utils import _validate_mergeable_datasets, try_concatenate_datasets

    first, same = Dataset.from_dict({"a": [1], "b": ["x"]}), Dataset.from_dict({"b": ["y"], "a": [2]})
    _validate_mergeable_datasets([first, same])
    assert try_concatenate_datasets([first, same])["a"] == [1, 2]
    with pytest.raises(ValueError, match=r"same column names: \['a', 'b'\] in the first, others in dataset\(s\) \[1\]"):
        _validate_mergeable_datasets([first, Dataset.from_dict({"a": [0.5], "c": ["z"]})])
