"""The dump's ``data``: which data config, which datasets, ratios, splits and handlers a run trained on, for a data
config file and for the data config the plain flags become."""

import copy
import hashlib

import yaml

from tuning.benchmarking.data_description import describe_data
from tuning.benchmarking.schema import DataDescription
from tuning.config.configs import DataArguments
from tuning.utils.tiny_model import SAMPLE_TRAIN_PATH, SAMPLE_VALIDATION_PATH

TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_data_config_is_described_by_its_file_its_processor_and_each_dataset(tmp_path):
    template = tmp_path / "chat.jinja"
    template.write_text(TEMPLATE, encoding="utf-8")
    renamed = {"name": "rename_columns", "arguments": {"column_mapping": {"output": "text"}}}
    selected = {"name": "select_columns", "arguments": {"column_names": ["text"]}}
    config = {
        "dataprocessor": {
            "seed": 7,
            "sampling_stopping_strategy": "first_exhausted",
            "chat_template_path": str(template),
        },
        "datasets": [
            {
                "name": "tweets",
                "data_paths": [SAMPLE_TRAIN_PATH],
                "sampling": 0.7,
                "data_handlers": [renamed, selected],
            },
            {
                "name": "more",
                "data_paths": [SAMPLE_VALIDATION_PATH],
                "builder": "json",
                "sampling": 0.3,
                "split": {"train": 0.8, "validation": 0.2},
            },
        ],
    }
    path = tmp_path / "mix.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")

    data = describe_data(DataArguments(data_config_path=str(path), chat_template="ignored: the config has one"), 64)
    assert DataDescription.model_validate(data)
    assert data == {
        "data_config_path": str(path),
        "data_config_sha256": sha256(path.read_bytes()),
        "type": "default",
        "streaming": False,
        "seed": 7,
        "sampling_stopping_strategy": "first_exhausted",
        "chat_template": {"source": "chat_template_path", "path": str(template), "sha256": sha256(TEMPLATE.encode())},
        "datasets": [
            {
                "name": "tweets",
                "data_paths": [SAMPLE_TRAIN_PATH],
                "builder": None,
                "sampling": 0.7,
                "split": None,
                "handlers": ["rename_columns", "select_columns"],
            },
            {
                "name": "more",
                "data_paths": [SAMPLE_VALIDATION_PATH],
                "builder": "json",
                "sampling": 0.3,
                "split": {"train": 0.8, "validation": 0.2},
                "handlers": [],
            },
        ],
        "tokenised_by": "data_preparation",
    }


def test_the_plain_flags_are_described_as_the_data_config_they_become_and_stay_as_given():
    data_args = DataArguments(
        training_data_path=SAMPLE_TRAIN_PATH,
        validation_data_path=SAMPLE_VALIDATION_PATH,
        data_formatter_template="{{ output }}",
        response_template="\n### Response:",
        chat_template=TEMPLATE,
    )
    as_given = copy.copy(data_args)
    data = describe_data(data_args, 64)
    assert DataDescription.model_validate(data)
    assert data_args == as_given  # building the handlers names a text column: not on the job's own arguments
    assert (data["data_config_path"], data["data_config_sha256"], data["seed"]) == (None, None, 42)
    assert data["chat_template"] == {"source": "--chat_template", "path": None, "sha256": sha256(TEMPLATE.encode())}
    assert [(d["name"], d["data_paths"], d["sampling"], d["split"], d["handlers"]) for d in data["datasets"]] == [
        (
            "training_data",
            [SAMPLE_TRAIN_PATH],
            None,
            {"train": 1.0, "validation": 0.0},
            ["apply_custom_jinja_template"],
        ),
        (
            "validation_data",
            [SAMPLE_VALIDATION_PATH],
            None,
            {"train": 0.0, "validation": 1.0},
            ["apply_custom_jinja_template"],
        ),
    ]


def test_vision_data_is_described_as_the_vision_collator_tokenises_it(tmp_path):
    """--dataset_image_field: the rows go to the vision collator as they are (no data handler runs on them)."""
    data = tmp_path / "pictures.jsonl"
    data.write_text('{"messages": [{"role": "user", "content": "Hi"}], "images": ["a.png"]}\n', encoding="utf-8")
    description = describe_data(DataArguments(training_data_path=str(data), dataset_image_field="images"), 64)
    assert DataDescription.model_validate(description)
    assert description["tokenised_by"] == "vision_collator"
    assert [(d["name"], d["data_paths"], d["handlers"]) for d in description["datasets"]] == [
        ("training_data", [str(data)], [])
    ]
