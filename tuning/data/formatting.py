"""Turning records into training texts, each followed by EOS: a text field, or a template. A template is either
fms-hf-tuning v3.1.0's Jinja2 over the record (``{{element['Tweet text']}}``; record keys by name too, and
``eos_token``), rendered sandboxed, or the older ``{{key}}`` form (the key as written between the braces, else
stripped, so that keys with spaces work). A key the record lacks is a ``KeyError`` naming it. A value that becomes
text must be a string or a number: null, a list, an object or a bool would train the model on "None" or "[...]", so
it is a user error naming the key and the record."""

import re
from collections.abc import Iterable, Iterator
from numbers import Number
from typing import Any

from tuning.data.loading import iter_records
from tuning.utils.error_logging import InputKeyError, UserInputError

FORMATTED_DATA_FIELD = "formatted_data_field"
_PLACEHOLDER = re.compile(r"\{\{([^{}]+)\}\}")
# A template is Jinja2 when it has statements or comments, or an expression no plain key looks like.
_JINJA_STATEMENT = re.compile(r"\{%|\{#")
_JINJA_EXPRESSION = re.compile(r"[\[\]().|'\"]|^\s*element\s*$")
_KINDS = {type(None): "null", bool: "a boolean", list: "a list", dict: "an object"}


def value_kind(value: Any) -> str:
    """What ``value`` is, in words for an error: null, a boolean, a list, an object, int..."""
    return _KINDS.get(type(value), type(value).__name__)


def text_value(value: Any, what: str, where: str) -> str:
    """``value`` as training text when it is a string or a number; otherwise a user error naming ``what``."""
    if isinstance(value, str):
        return value
    if isinstance(value, Number) and not isinstance(value, bool):
        return str(value)
    raise UserInputError(f"{what} in {where} is {value_kind(value)}, not text (a string or a number)")


class TextFormatter:
    """Makes one record's training text: ``record[dataset_text_field]`` or the filled ``template``, plus EOS."""

    def __init__(self, eos_token: str, dataset_text_field: str | None = None, template: str | None = None):
        self.eos_token = eos_token
        self.dataset_text_field = dataset_text_field
        # Literal text at even positions, the placeholders' keys (as written) at odd ones.
        self.parts = _PLACEHOLDER.split(template) if template is not None else None
        self.jinja = None
        if template is not None and (
            _JINJA_STATEMENT.search(template) or any(_JINJA_EXPRESSION.search(key) for key in self.parts[1::2])
        ):
            self.jinja = _compile(template, self._finalize)
        self._record: dict = {}
        self._where = ""

    def __call__(self, record: dict, where: str) -> str:
        """``where`` says which record this is ("record 3 (line 4) of train.jsonl") for errors."""
        if self.parts is None:
            if self.dataset_text_field not in record:
                raise InputKeyError(
                    f"dataset_text_field '{self.dataset_text_field}' not in {where} (keys: {sorted(record)})"
                )
            field = self.dataset_text_field
            return text_value(record[field], f"dataset_text_field '{field}'", where) + self.eos_token
        if self.jinja is not None:
            return self._render(record, where) + self.eos_token
        keys = [written if written in record else written.strip() for written in self.parts[1::2]]
        missing = [key for key in dict.fromkeys(keys) if key not in record]
        if missing:
            raise InputKeyError(f"template key(s) {missing} not in {where} (keys: {sorted(record)})")
        pieces = list(self.parts)
        pieces[1::2] = [text_value(record[key], f"template key '{key}'", where) for key in keys]
        return "".join(pieces) + self.eos_token

    def _render(self, record: dict, where: str) -> str:
        from jinja2 import UndefinedError
        from jinja2.sandbox import SecurityError

        self._record, self._where = record, where
        try:
            return self.jinja.render({"eos_token": self.eos_token, **record, "element": record})
        except UndefinedError as exc:
            raise InputKeyError(f"template key not in {where}: {exc} (keys: {sorted(record)})") from exc
        except SecurityError as exc:
            raise UserInputError(f"--data_formatter_template does something unsafe on {where}: {exc}") from exc

    def _finalize(self, value: Any) -> Any:
        """Jinja calls this with each ``{{ }}`` value before it becomes text (an undefined one raises right after)."""
        from jinja2 import Undefined

        if isinstance(value, Undefined):
            return value
        key = next((key for key, field in self._record.items() if field is value), None)
        return text_value(value, "a template value" if key is None else f"template key '{key}'", self._where)


def _compile(template: str, finalize):
    """The template in Jinja2's sandbox, with undefined names an error (fms-hf-tuning v3.1.0's environment)."""
    from jinja2 import StrictUndefined, TemplateSyntaxError
    from jinja2.sandbox import SandboxedEnvironment

    try:
        return SandboxedEnvironment(undefined=StrictUndefined, finalize=finalize).from_string(template)
    except TemplateSyntaxError as exc:
        raise UserInputError(f"--data_formatter_template is not a valid Jinja2 template: {exc}") from exc


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


def apply_custom_formatting_template(dataset, template: str, eos_token: str = ""):
    """fms-hf-tuning's template formatting of a ``datasets`` ``Dataset`` or ``DatasetDict``: adds a column holding
    each record's filled ``template`` plus ``eos_token``; returns the mapped dataset and the column's name."""
    formatter = TextFormatter(eos_token, template=template)

    def format_record(record: dict, index: int) -> dict[str, str]:
        return {FORMATTED_DATA_FIELD: formatter(record, f"record {index} of the dataset")}

    return dataset.map(format_record, with_indices=True), FORMATTED_DATA_FIELD
