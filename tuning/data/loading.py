"""Reading training records from JSON arrays or JSON lines, with errors that name the file and line."""

import json
import os

from tuning.utils.error_logging import UserInputError


def load_records(path: str) -> list[dict]:
    """Load a JSON array or JSON lines file into a list of objects."""
    if not os.path.exists(path):
        raise UserInputError(f"data file not found: {path}")
    if not os.path.isfile(path):
        raise UserInputError(f"data path is not a file: {path}")
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    if not text.strip():
        raise UserInputError(f"data file is empty: {path}")
    if text.lstrip().startswith("["):
        try:
            records = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UserInputError(f"malformed JSON array in {path}: {exc}") from exc
    else:
        records = []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise UserInputError(f"malformed JSON on line {number} of {path}: {exc.msg}") from exc
    if not records:
        raise UserInputError(f"data file has no records: {path}")
    for index, record in enumerate(records):
        if not isinstance(record, dict):
            raise UserInputError(f"record {index} of {path} is {type(record).__name__}, expected a JSON object")
    return records
