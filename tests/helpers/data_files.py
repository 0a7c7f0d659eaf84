"""Data files for the data framework's tests: JSON lines and data configs written as a user would, a chat template,
a good input/output row, and the training data prepared as train() prepares it (no model loaded)."""

import json
from pathlib import Path

import yaml

from tuning.config.configs import DataArguments, TrainingArguments
from tuning.data.cache import PREFIX
from tuning.data.setup_dataprocessor import prepare_training_datasets

CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
GOOD = {"input": "What is 2 plus 2?", "output": "Four."}


def data_caches(root: Path) -> list[Path]:
    """The tokenised-data caches (``tuning.data.cache``) under ``root``, a run's HF_DATASETS_CACHE."""
    return sorted(root.glob(f"{PREFIX}*"))


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return str(path)


def write_config(path: Path, config: dict) -> str:
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return str(path)


def prepare(tokenizer, tmp_path: Path, max_length: int = 128, **data):
    """The training data of ``DataArguments(**data)`` as train() prepares it, at ``max_length``."""
    train_args = TrainingArguments(output_dir=str(tmp_path / "out"), eval_strategy="no", max_seq_length=max_length)
    return prepare_training_datasets(DataArguments(**data), train_args, tokenizer, max_length)
