"""JSON job configs for Kubernetes launchers: the same keys as the CLI flags, from a file or a base64 env var; and
fms-hf-tuning v3.1.0's ``tuning.utils.config_utils`` helpers (``get_hf_peft_config``, ``create_tuning_config``,
``update_config``)."""

import base64
import json
import logging
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tuning.config.peft_config import LoraConfig, PromptTuningConfig, to_peft_config
from tuning.config.unsupported import PLAIN_FLAGS, refuse_unsupported
from tuning.utils.error_logging import UserInputError

logger = logging.getLogger(__name__)

CONFIG_PATH_ENV = "SFT_TRAINER_CONFIG_JSON_PATH"
CONFIG_BASE64_ENV = "SFT_TRAINER_CONFIG_JSON_ENV_VAR"
PICKLE_PROTOCOL_MARK = b"\x80"  # the first byte of every pickle of protocol 2 or later


def json_object(text: str, what: str) -> dict:
    """``text`` parsed as a JSON object; otherwise a ``UserInputError`` saying what ``what`` is not."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserInputError(f"{what} is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise UserInputError(f"{what} must be a JSON object, got {type(value).__name__}")
    return value


def get_json_config() -> dict:
    """The job config named by the environment: ``SFT_TRAINER_CONFIG_JSON_ENV_VAR`` (base64 JSON) if set, else the
    file ``SFT_TRAINER_CONFIG_JSON_PATH``; ``{}`` when neither is set (then argv is used)."""
    encoded = os.environ.get(CONFIG_BASE64_ENV)
    if encoded:
        try:  # line breaks allowed: GNU base64 wraps its output at 76 columns
            decoded = base64.b64decode("".join(encoded.split()), validate=True)
        except ValueError as exc:  # binascii.Error
            raise UserInputError(f"{CONFIG_BASE64_ENV} is not base64-encoded UTF-8 JSON: {exc}") from exc
        if decoded.startswith(PICKLE_PROTOCOL_MARK):  # fms-hf-tuning unpickles these; we never run what a job hands us
            raise UserInputError(
                f"{CONFIG_BASE64_ENV} holds a pickled object, which is refused (unpickling runs arbitrary code): "
                "give the job config as base64-encoded JSON"
            )
        try:
            text = decoded.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UserInputError(f"{CONFIG_BASE64_ENV} is not base64-encoded UTF-8 JSON: {exc}") from exc
        return json_object(text, f"job config from {CONFIG_BASE64_ENV}")
    path = os.environ.get(CONFIG_PATH_ENV)
    if path:
        try:
            return json_object(Path(path).read_text(encoding="utf-8"), f"job config from {path}")
        except OSError as exc:
            raise UserInputError(f"cannot read job config {path} ({CONFIG_PATH_ENV}): {exc}") from exc
    return {}


def update_config(config: Any, **kwargs: Any) -> None:
    """Set each ``kwargs`` entry that ``config`` (or each config of a list or tuple) has as a field; a key written
    ``ClassName.field`` applies to configs of that class only (fms-hf-tuning's ``update_config``)."""
    for each in config if isinstance(config, list | tuple) else [config]:
        for key, value in kwargs.items():
            class_name, _, name = key.rpartition(".")
            if class_name and class_name != type(each).__name__:
                continue
            if hasattr(each, name):
                setattr(each, name, value)
            elif class_name:
                logger.warning("%s has no parameter %s", class_name, name)


class UnknownPeftMethodError(UserInputError, AssertionError):
    """A ``peft_method`` that names no PEFT method: a user error here, and the ``AssertionError`` that v3.1.0's
    ``create_tuning_config`` raises, so that ``except AssertionError`` written against v3.1.0 still catches it."""


def create_tuning_config(peft_method: str | None, **kwargs: Any) -> "LoraConfig | PromptTuningConfig | None":
    """The PEFT argument dataclass of ``peft_method`` (lora or alora: a ``LoraConfig``, as in v3.1.0; pt; None or
    "none" for full fine-tuning) with ``kwargs`` applied by ``update_config``."""
    method = str(peft_method).lower()
    refuse_unsupported(**{PLAIN_FLAGS: SimpleNamespace(peft_method=method)})
    if method in ("none", ""):
        return None
    if method not in ("lora", "alora", "pt"):
        raise UnknownPeftMethodError(
            f"peft config {peft_method} not defined in peft.py: choose lora, alora, pt or none"
        )
    tune_config = PromptTuningConfig() if method == "pt" else LoraConfig()
    update_config(tune_config, **kwargs)
    return tune_config


def get_hf_peft_config(task_type: str | None, tuning_config: Any, tokenizer_name_or_path: str | None) -> Any:
    """The ``peft`` library's config for one of our PEFT dataclasses (None for full fine-tuning), with ``task_type``
    when given (``CAUSAL_LM`` otherwise)."""
    if not isinstance(tuning_config, LoraConfig | PromptTuningConfig):
        return None
    hf_config = to_peft_config(tuning_config, tokenizer_name_or_path)
    if task_type:
        hf_config.task_type = task_type
    return hf_config
