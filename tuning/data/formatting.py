"""Turning records into training texts: a text field or a ``{{key}}`` template (the key as written between the
braces, else stripped), each followed by EOS. A key the record lacks is a ``KeyError`` naming it."""

import re
from collections.abc import Iterable, Iterator

from tuning.data.loading import iter_records
from tuning.utils.error_logging import InputKeyError

_PLACEHOLDER = re.compile(r"\{\{([^{}]+)\}\}")


class TextFormatter:
    """Makes one record's training text: ``record[dataset_text_field]`` or the filled ``template``, plus EOS."""

    def __init__(self, eos_token: str, dataset_text_field: str | None = None, template: str | None = None):
        self.eos_token = eos_token
        self.dataset_text_field = dataset_text_field
        # Literal text at even positions, the placeholders' keys (as written) at odd ones.
        self.parts = _PLACEHOLDER.split(template) if template is not None else None

    def __call__(self, record: dict, where: str) -> str:
        """``where`` says which record this is ("record 3 (line 4) of train.jsonl") for errors."""
        if self.parts is None:
            if self.dataset_text_field not in record:
                raise InputKeyError(
                    f"dataset_text_field '{self.dataset_text_field}' not in {where} (keys: {sorted(record)})"
                )
            return str(record[self.dataset_text_field]) + self.eos_token
        keys = [written if written in record else written.strip() for written in self.parts[1::2]]
        missing = [key for key in dict.fromkeys(keys) if key not in record]
        if missing:
            raise InputKeyError(f"template key(s) {missing} not in {where} (keys: {sorted(record)})")
        pieces = list(self.parts)
        pieces[1::2] = [str(record[key]) for key in keys]
        return "".join(pieces) + self.eos_token


def format_texts(
    records: Iterable[dict],
    eos_token: str,
    dataset_text_field: str | None = None,
    template: str | None = None,
    source: str = "data",
) -> list[str]:
    """One training text per record, ending with ``eos_token`` so the model learns to stop."""
    formatter = TextFormatter(eos_token, dataset_text_field, template)
    return [formatter(record, f"record {index} of {source}") for index, record in enumerate(records)]


def format_file(
    path: str, eos_token: str, dataset_text_field: str | None = None, template: str | None = None
) -> Iterator[str]:
    """The training texts of a data file, read and formatted one record at a time."""
    formatter = TextFormatter(eos_token, dataset_text_field, template)
    for index, (line, record) in enumerate(iter_records(path)):
        yield formatter(record, f"record {index} (line {line}) of {path}")
