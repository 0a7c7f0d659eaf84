"""Turning records into training texts: a text field or a ``{{key}}`` template, each followed by EOS."""

import re

from tuning.utils.error_logging import UserInputError

_PLACEHOLDER = re.compile(r"\{\{\s*([^{}\s]+)\s*\}\}")


def template_keys(template: str) -> list[str]:
    return _PLACEHOLDER.findall(template)


def format_texts(
    records: list[dict],
    eos_token: str,
    dataset_text_field: str | None = None,
    template: str | None = None,
    source: str = "data",
) -> list[str]:
    """One training text per record, ending with ``eos_token`` so the model learns to stop."""
    texts = []
    for index, record in enumerate(records):
        if template is not None:
            missing = [key for key in template_keys(template) if key not in record]
            if missing:
                raise UserInputError(
                    f"template key(s) {missing} not in record {index} of {source} (keys: {sorted(record)})"
                )
            text = _PLACEHOLDER.sub(lambda match, values=record: str(values[match.group(1)]), template)
        else:
            if dataset_text_field not in record:
                raise UserInputError(
                    f"dataset_text_field '{dataset_text_field}' not in record {index} of {source} "
                    f"(keys: {sorted(record)})"
                )
            text = str(record[dataset_text_field])
        texts.append(text + eos_token)
    return texts
