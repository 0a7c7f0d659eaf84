"""Tokenisation with loss masking: only the response (what follows the response template) is trained on.

TRL 1.16 has no ``DataCollatorForCompletionOnlyLM``; we mask while tokenising, by character offsets (a token is in
the response when it starts at or after the template's end), which cannot miss a template that tokenises differently
in context. Rows go a batch at a time to an Arrow file in a directory of its own under ``HF_DATASETS_CACHE``
(``tuning.data.cache``: removed when the run ends, or by the next run if it was killed): memory is bounded by a batch,
not by the data.
"""

import functools
import logging
import uuid
from collections.abc import Iterable, Iterator

import datasets
from datasets import Dataset
from datasets.exceptions import DatasetGenerationError

from tuning.data.cache import new_cache_dir
from tuning.utils.error_logging import UserInputError

IGNORE_INDEX = -100
# A batch takes ~300 bytes per token until written: at most this many texts or characters keeps it near 10 MB.
BATCH_TEXTS = 1000
BATCH_CHARACTERS = 1 << 16
# Rows the Arrow writer buffers before writing them out; a row holds up to max_seq_length tokens.
WRITER_BATCH_ROWS = 100
_FEATURES = datasets.Features(
    {"input_ids": datasets.List(datasets.Value("int32")), "labels": datasets.List(datasets.Value("int32"))}
)

logger = logging.getLogger(__name__)


def _response_spans(text: str, response_template: str, instruction_template: str | None) -> list[tuple[int, int]]:
    """Character spans trained on: after the response template to the end, or, with an instruction template (chat
    turns), after each response template up to the next instruction template."""
    if instruction_template is None:
        position = text.find(response_template)
        return [] if position < 0 else [(position + len(response_template), len(text))]
    spans, position = [], 0
    while (found := text.find(response_template, position)) >= 0:
        start = found + len(response_template)
        end = text.find(instruction_template, start)
        end = len(text) if end < 0 else end
        spans.append((start, end))
        position = end
    return spans


def _mask(
    text: str,
    input_ids: list[int],
    offsets: list[tuple[int, int]],
    response_template: str,
    instruction_template: str | None = None,
) -> list[int] | None:
    """Labels that keep only the responses' tokens; None when the text has no (untruncated) response."""
    spans = _response_spans(text, response_template, instruction_template)
    if not spans:
        return None
    if len(spans) == 1:  # the common case, without a generator per token
        ((low, high),) = spans
        labels = [
            token if end > start and low <= start < high else IGNORE_INDEX
            for token, (start, end) in zip(input_ids, offsets, strict=True)
        ]
    else:
        labels = [
            token if end > start and any(low <= start < high for low, high in spans) else IGNORE_INDEX
            for token, (start, end) in zip(input_ids, offsets, strict=True)
        ]
    return None if all(label == IGNORE_INDEX for label in labels) else labels


def _batches(texts: Iterable[str]) -> Iterator[list[str]]:
    batch, characters = [], 0
    for text in texts:
        batch.append(text)
        characters += len(text)
        if len(batch) == BATCH_TEXTS or characters >= BATCH_CHARACTERS:
            yield batch
            batch, characters = [], 0
    if batch:
        yield batch


def _rows(
    texts: Iterable[str],
    tokenizer,
    max_length: int,
    response_template: str | None,
    source: str,
    instruction_template: str | None = None,
) -> Iterator[dict[str, list[int]]]:
    total = without_template = 0
    for batch in _batches(texts):
        encoded = tokenizer(
            batch, truncation=True, max_length=max_length, return_offsets_mapping=response_template is not None
        )
        for index, text in enumerate(batch):
            input_ids = encoded["input_ids"][index]
            labels = input_ids
            if response_template is not None:
                labels = _mask(
                    text, input_ids, encoded["offset_mapping"][index], response_template, instruction_template
                )
                if labels is None:
                    without_template += 1
                    continue
            yield {"input_ids": input_ids, "labels": labels}
        total += len(batch)
    if without_template == total:
        raise UserInputError(
            f"response template {response_template!r} occurs in none of the {total} examples of {source} "
            "(or every response was truncated away by max_seq_length)"
        )
    if without_template:
        logger.warning(
            "%d of %d examples of %s lack the response template %r (or lost their response to truncation); "
            "they are skipped",
            without_template,
            total,
            source,
            response_template,
        )


def tokenize_and_mask(
    texts: Iterable[str],
    tokenizer,
    max_length: int,
    response_template: str | None,
    source: str = "data",
    instruction_template: str | None = None,
) -> Dataset:
    """Tokenise texts (read once, a batch at a time); with a response template, label every prompt token -100 and
    drop texts lacking it. With an instruction template too (chat turns), only the spans from each response template
    to the next instruction template are trained. Our errors raised while reading ``texts`` come out unwrapped by
    ``datasets``."""
    cache_dir = new_cache_dir(datasets.config.HF_DATASETS_CACHE)
    try:
        return Dataset.from_generator(
            # Bound here, not passed as gen_kwargs, which datasets would split into shards where it finds lists.
            functools.partial(_rows, texts, tokenizer, max_length, response_template, source, instruction_template),
            features=_FEATURES,
            cache_dir=cache_dir,
            writer_batch_size=WRITER_BATCH_ROWS,
            # A fresh directory holds nothing to reuse: a random fingerprint spares hashing the texts and tokenizer.
            fingerprint=uuid.uuid4().hex,
        )
    except DatasetGenerationError as exc:
        if isinstance(exc.__cause__, UserInputError):
            raise exc.__cause__ from None
        raise
