"""The processed-data cache (--data_cache_dir) and tokenising on several processes (--dataset_num_proc): a hit for
the same work, a miss for each part of the key changed, concurrent builders and a killed one (real processes, real
SIGKILL), eviction by size, 'none'. In-process through prepare_with_cache, on a temporary cache directory."""

import dataclasses
import json
import multiprocessing
import os
import shutil
import signal
import time
from pathlib import Path

import datasets
import pytest
import yaml
from transformers import AutoTokenizer

from tests.helpers.training import RESPONSE_TEMPLATE, make_args
from tuning.config.configs import DataArguments, TrainingArguments
from tuning.data import masking, prepared_cache
from tuning.data.cache import PREFIX
from tuning.data.setup_dataprocessor import check_data_arguments, prepare_with_cache
from tuning.sft_trainer import train
from tuning.utils.error_logging import UserInputError
from tuning.utils.tiny_model import SAMPLE_TRAIN_PATH


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    return AutoTokenizer.from_pretrained(tiny_model)


@pytest.fixture
def data(tmp_path) -> str:
    return str(shutil.copy(SAMPLE_TRAIN_PATH, tmp_path / "train.jsonl"))


def data_args(data: str, cache: Path | str, **fields) -> DataArguments:
    flags = {"dataset_text_field": "output", "response_template": RESPONSE_TEMPLATE, **fields}
    return DataArguments(training_data_path=data, data_cache_dir=str(cache), **flags)


def prepare(arguments: DataArguments, tokenizer, max_length: int = 64, **training):
    train_args = TrainingArguments(output_dir="unused", report_to="none", **training)
    (rows, _), preparation = prepare_with_cache(arguments, train_args, tokenizer, max_length)
    return rows, preparation


def entries(cache: Path) -> list[Path]:
    return sorted(meta.parent for meta in cache.glob(f"*/{prepared_cache.META_FILE}"))


def test_a_hit_for_the_same_work_and_a_miss_for_each_part_of_the_key_changed(data, tokenizer, tmp_path):
    cache = tmp_path / "cache"
    built, first = prepare(data_args(data, cache), tokenizer)
    uncached, off = prepare(data_args(data, "none"), tokenizer)
    assert (first.status, off.status) == ("miss", "off")
    again, second = prepare(data_args(data, cache), tokenizer)
    assert (second.status, second.key) == ("hit", first.key)
    assert again["labels"] == built["labels"] == uncached["labels"] and again["input_ids"] == uncached["input_ids"]

    keys = {first.key}

    def changed(arguments: DataArguments, tokenizer=tokenizer, max_length: int = 64):
        rows, preparation = prepare(arguments, tokenizer, max_length)
        assert preparation.status == "miss" and preparation.key not in keys
        keys.add(preparation.key)
        return rows

    assert max(len(row) for row in changed(data_args(data, cache), max_length=16)["input_ids"]) == 16
    template = "### Input: {{input}}\n\n### Response: {{response}} (edited)"
    edited = changed(data_args(data, cache, dataset_text_field=None, data_formatter_template=template))
    assert "(edited)" in tokenizer.decode(edited[0]["input_ids"])
    other_tokenizer = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
    other_tokenizer.add_tokens(["Input"])  # another vocabulary
    changed(data_args(data, cache), tokenizer=other_tokenizer)
    changed(data_args(data, cache, chat_template="{{ messages }}"))  # the chat template is the tokenizer's too

    # The same size and mtime, other bytes: a miss, and the new rows.
    status = os.stat(data)
    text = Path(data).read_text()
    Path(data).write_text(text.replace("21 plus 10 is 31.", "21 plus 10 is 13."))
    os.utime(data, ns=(status.st_atime_ns, status.st_mtime_ns))
    assert os.stat(data).st_size == status.st_size
    assert "is 13." in tokenizer.decode(changed(data_args(data, cache))[0]["input_ids"])
    assert len(entries(cache)) == len(keys)


def test_another_handler_argument_is_a_miss(tokenizer, tmp_path):
    cache = tmp_path / "cache"

    def config(template: str) -> str:
        handler = {
            "name": "apply_custom_jinja_template",
            "arguments": {
                "remove_columns": "all",
                "batched": False,
                "fn_kwargs": {"formatted_text_column_name": "output", "template": template},
            },
        }
        path = tmp_path / "data_config.yaml"
        dataset = {"name": "tweets", "data_paths": [SAMPLE_TRAIN_PATH], "data_handlers": [handler]}
        path.write_text(yaml.safe_dump({"datasets": [dataset]}))
        return str(path)

    arguments = DataArguments(
        data_config_path=config("{{ element['output'] }}"),
        dataset_text_field="output",
        response_template=RESPONSE_TEMPLATE,
        data_cache_dir=str(cache),
    )
    _, first = prepare(arguments, tokenizer)
    _, hit = prepare(arguments, tokenizer)
    arguments = dataclasses.replace(arguments, data_config_path=config("{{ element['output'] }} more"))  # a new job
    rows, other = prepare(arguments, tokenizer)
    assert (first.status, hit.status, other.status) == ("miss", "hit", "miss") and other.key != first.key
    assert "more" in tokenizer.decode(rows[0]["input_ids"])


def test_none_caches_nothing_and_the_default_comes_from_the_environment(data, tokenizer, tmp_path, monkeypatch):
    monkeypatch.setenv(prepared_cache.CACHE_DIR_ENV, str(tmp_path / "default"))
    _, preparation = prepare(data_args(data, "none"), tokenizer)
    assert preparation.status == "off" and not (tmp_path / "default").exists()
    _, preparation = prepare(
        DataArguments(training_data_path=data, dataset_text_field="output", response_template=RESPONSE_TEMPLATE),
        tokenizer,
    )
    assert preparation.status == "miss" and len(entries(tmp_path / "default")) == 1


def test_least_recently_used_entries_go_beyond_the_size_limit(data, tokenizer, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    keys = [prepare(data_args(data, cache), tokenizer, max_length)[1].key for max_length in (16, 32, 48)]
    sizes = {
        entry.name: json.loads((entry / prepared_cache.META_FILE).read_text())["bytes"] for entry in entries(cache)
    }
    assert sorted(sizes) == sorted(keys)
    for age, key in enumerate(keys):  # 16 is the least recently used, then 32...
        os.utime(cache / key / prepared_cache.META_FILE, (1000 + age, 1000 + age))
    assert prepare(data_args(data, cache), tokenizer, 16)[1].status == "hit"  # ...but a hit makes 16 the latest
    monkeypatch.setenv(prepared_cache.MAX_SIZE_ENV, str((sizes[keys[0]] + sizes[keys[2]] + 1) / (1 << 30)))
    _, newest = prepare(data_args(data, cache), tokenizer, 64)  # a fourth entry: 32 then 48 go
    assert [entry.name for entry in entries(cache)] == sorted([keys[0], newest.key])


@pytest.mark.slow  # tokenising on two processes
def test_several_processes_tokenise_the_same_rows_in_the_same_order(tokenizer, monkeypatch):
    texts = [f"### Input: question {index}\n\n### Response: answer {index * 7}" for index in range(300)]
    texts[5::7] = ["no template here"] * len(texts[5::7])
    monkeypatch.setattr(masking, "PARALLEL_MIN_TEXTS", 100)
    one = masking.tokenize_and_mask(texts, tokenizer, 32, RESPONSE_TEMPLATE, num_proc=1)
    two = masking.tokenize_and_mask(iter(texts), tokenizer, 32, RESPONSE_TEMPLATE, num_proc=2)
    assert len(one) == 300 - len(texts[5::7]) and one.to_dict() == two.to_dict()
    unmasked = masking.tokenize_and_mask(texts, tokenizer, 32, None, num_proc=2)
    assert len(unmasked) == 300 and unmasked["labels"] == unmasked["input_ids"]
    with pytest.raises(
        UserInputError,
        match="the shards: none of its 300 rows keeps a token to train on: 300 lack the response template '### Answer",
    ):
        masking.tokenize_and_mask(texts, tokenizer, 32, "### Answer:", source="the shards", num_proc=2)


# --- processes: concurrent builders, a killed one, a real training run on the entry -----------------------------


def build_entry(tiny_model: str, data: str, cache: Path, hold: float, report) -> None:
    """A builder process (forked: it starts without importing anything again): prepares the rows through the cache,
    waiting ``hold`` seconds once its entry is written and before it is published (long enough to be killed, or
    waited for), and reports how the rows came and their labels."""
    save = datasets.Dataset.save_to_disk

    def slow_save(self, *args, **kwargs):
        save(self, *args, **kwargs)
        report.send("written")
        time.sleep(hold)

    datasets.Dataset.save_to_disk = slow_save
    (rows, _), how = prepare_with_cache(
        data_args(data, cache), TrainingArguments(output_dir="unused"), AutoTokenizer.from_pretrained(tiny_model), 64
    )
    report.send((how.status, how.key, rows[:]["labels"]))


def builder(tiny_model: str, data: str, cache: Path, hold: float):
    """A started builder process and the end of the pipe it reports on."""
    receiver, sender = multiprocessing.get_context("fork").Pipe(duplex=False)
    process = multiprocessing.get_context("fork").Process(
        target=build_entry, args=(tiny_model, data, cache, hold, sender)
    )
    process.start()
    sender.close()
    return process, receiver


def message(report):
    """The builder's next report (a builder that hangs fails the test, not the suite)."""
    assert report.poll(120), "the builder reported nothing in 120 s"
    return report.recv()


def outcome(process, report) -> tuple:
    """What a builder reported last, once it has exited well."""
    while (last := message(report)) == "written":
        pass
    process.join(timeout=120)
    assert process.exitcode == 0
    return last


@pytest.mark.slow
def test_concurrent_builders_make_one_entry_and_a_killed_builder_leaves_none(tiny_model, data, tmp_path):
    cache = tmp_path / "cache"
    killed, report = builder(tiny_model, data, cache, hold=120)
    assert message(report) == "written"  # its rows are on disk, not yet published
    os.kill(killed.pid, signal.SIGKILL)
    killed.join(timeout=60)
    assert killed.exitcode == -signal.SIGKILL
    assert entries(cache) == [] and len(list(cache.glob(f"{PREFIX}*"))) == 1

    # Started together: one takes the key's lock and holds it a second after writing, the other waits for it.
    first, second = (builder(tiny_model, data, cache, hold=1) for _ in range(2))
    lines = [outcome(*first), outcome(*second)]
    assert sorted(line[0] for line in lines) == ["hit", "miss"]  # one built while the other waited, then read it
    assert lines[0][1:] == lines[1][1:]  # one key, the same labels
    assert [entry.name for entry in entries(cache)] == [lines[0][1]]
    assert list(cache.glob(f"{PREFIX}*")) == []  # the killed builder's private directory: removed by the next

    # A run trains on the entry: train() reads it (a hit) and its rows are the entry's.
    model_args, _, train_args = make_args(tiny_model, str(tmp_path / "out"), "", max_steps=1, max_seq_length=64)
    trainer, _, _ = train(model_args, data_args(data, cache), train_args)
    assert trainer.train_dataset[:]["labels"] == lines[0][2]
    assert [entry.name for entry in entries(cache)] == [lines[0][1]]


def test_dataset_num_proc_below_one_is_refused_before_the_model_loads(data):
    with pytest.raises(UserInputError, match="--dataset_num_proc must be a whole number of processes, at least 1"):
        check_data_arguments(DataArguments(training_data_path=data, dataset_num_proc=0))


# --- a damaged entry, a cache that cannot serve ------------------------------------------------------------------


def damage(entry: Path, how: str) -> None:
    arrow = next(entry.glob("train/*.arrow"))
    if how == "arrow cut short":
        arrow.write_bytes(arrow.read_bytes()[: arrow.stat().st_size // 2])
    elif how == "arrow byte changed":  # the same size: only the checksum shows it
        data = bytearray(arrow.read_bytes())
        data[-100] ^= 0xFF
        arrow.write_bytes(bytes(data))
    else:
        meta = entry / prepared_cache.META_FILE
        meta.write_text(meta.read_text()[:200])


def test_a_damaged_entry_is_never_read_it_is_removed_and_built_again(data, tokenizer, tmp_path, caplog):
    cache = tmp_path / "cache"
    built, first = prepare(data_args(data, cache), tokenizer)
    built = built.to_dict()  # read before its files are damaged (they are memory-mapped)
    for how in ("arrow cut short", "arrow byte changed", "meta.json cut short"):
        damage(cache / first.key, how)
        caplog.clear()
        rows, again = prepare(data_args(data, cache), tokenizer)
        assert (again.status, again.key) == ("miss", first.key), how
        assert rows.to_dict() == built, how
        assert [entry.name for entry in entries(cache)] == [first.key] and not list(cache.glob(".damaged-*"))
        assert any(f"entry {cache / first.key} is damaged" in r.message for r in caplog.records), how
    assert prepare(data_args(data, cache), tokenizer)[1].status == "hit"


def test_a_damaged_entry_that_cannot_be_removed_is_prepared_without_the_cache(
    data, tokenizer, tmp_path, caplog, monkeypatch
):
    cache = tmp_path / "cache"
    built, first = prepare(data_args(data, cache), tokenizer)
    built = built.to_dict()
    damage(cache / first.key, "arrow cut short")
    rename = Path.rename

    def refused(self, target):  # a stand-in: this machine's tests run as root, whom no permission stops
        if self.name == first.key:
            raise PermissionError(13, "Permission denied", str(self))
        return rename(self, target)

    monkeypatch.setattr(Path, "rename", refused)
    rows, how = prepare(data_args(data, cache), tokenizer)
    assert how.status == "uncached" and rows.to_dict() == built
    warned = [r.message for r in caplog.records if r.levelname == "WARNING" and "cannot be removed" in r.message]
    assert len(warned) == 1 and str(cache) in warned[0] and "without the cache" in warned[0]


def test_a_cache_that_cannot_serve_never_fails_the_run(data, tokenizer, tmp_path, caplog, monkeypatch):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    rows, how = prepare(data_args(data, blocked / "cache"), tokenizer)
    assert how.status == "uncached" and len(rows) > 0
    assert any(
        f"processed-data cache {blocked / 'cache'}: the directory cannot be written" in r.message
        for r in caplog.records
    )

    monkeypatch.setenv(prepared_cache.MAX_SIZE_ENV, "lots")
    caplog.clear()
    rows, how = prepare(data_args(data, tmp_path / "cache"), tokenizer)
    assert how.status == "uncached" and len(rows) > 0
    assert [r.message for r in caplog.records if r.levelname == "WARNING"] == [
        f"processed-data cache {tmp_path / 'cache'}: {prepared_cache.MAX_SIZE_ENV}=lots: 'lots' is not a number of "
        "GB: the data is prepared without the cache"
    ]
    # The flag wins over the variable; a bad flag is refused before any work.
    assert prepare(data_args(data, tmp_path / "cache", data_cache_max_gb=1.0), tokenizer)[1].status == "miss"
    for bad in (-1.0, float("nan"), "lots"):
        with pytest.raises(UserInputError, match="--data_cache_max_gb: .* not a"):
            check_data_arguments(DataArguments(training_data_path=data, data_cache_max_gb=bad))
