"""The dump's ``data``: which data a run trained on, as the data framework reads it. A run with ``--data_config_path``
is described by that file (its path and the sha256 of its bytes, so that an edited file is told from the one a run
used); a run from the plain flags by the data config they become (``tuning.data.setup_dataprocessor``), its path
null. Only the settings that change which rows are trained, and in which mix: the processor's type, streaming, seed,
stopping strategy and chat template (by its source and hash), and per dataset its name, paths, builder, sampling
ratio, split and handler names in order; and what tokenised the rows (``tokenised_by``: the data preparation before
training, or for vision data the vision collator, batch by batch). Handler arguments are left out: the config's hash
covers them.
"""

import copy
import hashlib
from typing import Any

from tuning.data.data_config import DataConfig, job_data_config, job_data_config_sha256
from tuning.data.vision import is_vision_data_config

# The dump's data.tokenised_by: the rows tokenised (and masked) before training, or each batch by the vision collator.
DATA_PREPARATION, VISION_COLLATOR = "data_preparation", "vision_collator"


def describe_data(data_args: Any, max_seq_length: int) -> dict[str, Any]:
    """The ``data`` description of ``data_args`` (``DataArguments``), reading the data config or, for the plain
    flags, the first record of the training data (whether it is pretokenised decides the handlers)."""
    path = data_args.data_config_path
    if path:
        config = job_data_config(data_args)
    else:
        from tuning.data.setup_dataprocessor import raw_data_config  # the datasets loaders: only when needed

        # A copy: building the handlers fills in defaults (the text column) that the caller's arguments must not get.
        config, _ = raw_data_config(copy.copy(data_args), max_seq_length)
    vision = bool(data_args.dataset_image_field) or is_vision_data_config(data_args)
    return {
        **data_config_description(config, path, job_data_config_sha256(data_args), data_args.chat_template),
        "tokenised_by": VISION_COLLATOR if vision else DATA_PREPARATION,
    }


def data_config_description(
    config: DataConfig, data_config_path: str | None, sha256: str | None, chat_template_flag: str | None = None
) -> dict[str, Any]:
    """``config`` as the dump's ``data``: ``data_config_path`` the file it was read from (None: the plain flags'),
    ``sha256`` the hash of the bytes read, ``chat_template_flag`` the ``--chat_template`` given, which a data config's
    own template overrides."""
    processor = config.dataprocessor
    return {
        "data_config_path": data_config_path,
        "data_config_sha256": sha256,
        "type": processor.type,
        "streaming": bool(processor.streaming),
        "seed": processor.seed,
        "sampling_stopping_strategy": processor.sampling_stopping_strategy,
        "chat_template": _chat_template(processor.chat_template, processor.chat_template_path, chat_template_flag),
        "datasets": [
            {
                "name": dataset.name,
                "data_paths": list(dataset.data_paths),
                "builder": dataset.builder,
                "sampling": dataset.sampling,
                "split": dataset.split,
                "handlers": [handler.name for handler in dataset.data_handlers or []],
            }
            for dataset in config.datasets
        ],
    }


def _chat_template(
    from_config: str | None, template_path: str | None, from_flag: str | None
) -> dict[str, str | None] | None:
    """The chat template the run applies, as the data processor picks it (the data config's over the flag's): where
    it came from and the sha256 of its text; None when the tokenizer's own is used."""
    if from_config:
        source = "chat_template_path" if template_path else "data_config"
        return {"source": source, "path": template_path, "sha256": _text_sha256(from_config)}
    if from_flag:
        return {"source": "--chat_template", "path": None, "sha256": _text_sha256(from_flag)}
    return None


def _text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
