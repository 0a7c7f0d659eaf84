"""Tokenisation with loss masking: only the response (what follows the response template) is trained on.

TRL 1.16 dropped ``DataCollatorForCompletionOnlyLM``. We mask once, while tokenising, using character offsets:
a token is part of the response when it starts at or after the end of the template in the text. Unlike matching
template token ids, this cannot miss a template that tokenises differently in context. The result is a
pre-tokenised dataset with a ``labels`` column that TRL pads (with -100) and packs as it is.
"""

import logging

from datasets import Dataset

from tuning.utils.error_logging import UserInputError

IGNORE_INDEX = -100

logger = logging.getLogger(__name__)


def tokenize_and_mask(
    texts: list[str], tokenizer, max_length: int, response_template: str | None, source: str = "data"
) -> Dataset:
    """Tokenise texts; with a response template, label every prompt token -100 and drop texts lacking it."""
    encoded = tokenizer(
        texts, truncation=True, max_length=max_length, return_offsets_mapping=response_template is not None
    )
    rows = {"input_ids": [], "attention_mask": [], "labels": []}
    without_template = 0
    for index, text in enumerate(texts):
        input_ids = encoded["input_ids"][index]
        labels = list(input_ids)
        if response_template is not None:
            position = text.find(response_template)
            if position < 0:
                without_template += 1
                continue
            response_start = position + len(response_template)
            offsets = encoded["offset_mapping"][index]
            labels = [
                token if start >= response_start and end > start else IGNORE_INDEX
                for token, (start, end) in zip(input_ids, offsets, strict=True)
            ]
            if all(label == IGNORE_INDEX for label in labels):
                without_template += 1
                continue
        rows["input_ids"].append(input_ids)
        rows["attention_mask"].append(encoded["attention_mask"][index])
        rows["labels"].append(labels)
    if without_template == len(texts):
        raise UserInputError(
            f"response template {response_template!r} occurs in none of the {len(texts)} examples of {source} "
            "(or every response was truncated away by max_seq_length)"
        )
    if without_template:
        logger.warning(
            "%d of %d examples of %s lack the response template %r (or lost their response to truncation); "
            "they are skipped",
            without_template,
            len(texts),
            source,
            response_template,
        )
    return Dataset.from_dict(rows)
