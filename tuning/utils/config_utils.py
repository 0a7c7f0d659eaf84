"""JSON job configs for Kubernetes launchers: the same keys as the CLI flags, from a file or a base64 env var."""

import base64
import json
import os
from pathlib import Path

from tuning.utils.error_logging import UserInputError

CONFIG_PATH_ENV = "SFT_TRAINER_CONFIG_JSON_PATH"
CONFIG_BASE64_ENV = "SFT_TRAINER_CONFIG_JSON_ENV_VAR"


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
        try:
            text = base64.b64decode(encoded, validate=True).decode("utf-8")
        except ValueError as exc:  # binascii.Error, UnicodeDecodeError
            raise UserInputError(f"{CONFIG_BASE64_ENV} is not base64-encoded UTF-8 JSON: {exc}") from exc
        return json_object(text, f"job config from {CONFIG_BASE64_ENV}")
    path = os.environ.get(CONFIG_PATH_ENV)
    if path:
        try:
            return json_object(Path(path).read_text(encoding="utf-8"), f"job config from {path}")
        except OSError as exc:
            raise UserInputError(f"cannot read job config {path} ({CONFIG_PATH_ENV}): {exc}") from exc
    return {}
