"""Tokenisation with loss masking: only the response (what follows the response template) is trained on.

TRL 1.16 has no ``DataCollatorForCompletionOnlyLM``; we mask while tokenising, by character offsets (a token is in
the response when it starts at or after the template's end), which cannot miss a template that tokenises differently
in context. Rows go a batch at a time to an Arrow file in a directory of its own under ``HF_DATASETS_CACHE``
(``tuning.data.cache``: removed when the run ends, or by the next run if it was killed): memory is bounded by a batch,
not by the data.

In one process the fast tokenizer encodes a batch on its own threads, without the GIL, while this process masks and
writes the one before. By default as many processes as the process may use cores (``--dataset_num_proc``, at most
``MAX_DEFAULT_PROCESSES``) each tokenise a contiguous shard: the Python work around the encoding is most of it, and
only more processes spread that (docs/performance.md); each costs a fork and ~200 MB.
"""

import functools
import itertools
import logging
import os
import uuid
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor

import datasets
from datasets import Dataset
from datasets.exceptions import DatasetGenerationError

from tuning.data.cache import new_cache_dir
from tuning.data.labels import LabelLoss, check_label_loss
from tuning.utils.error_logging import UserInputError
from tuning.utils.processes import children_die_with_this_process

IGNORE_INDEX = -100
# A batch takes ~300 bytes per token until written: at most this many texts or characters keeps it near 10 MB.
BATCH_TEXTS = 1000
BATCH_CHARACTERS = 1 << 16
# Rows the Arrow writer buffers before writing them out; a row holds up to max_seq_length tokens.
WRITER_BATCH_ROWS = 100
_FEATURES = datasets.Features(
    {"input_ids": datasets.List(datasets.Value("int32")), "labels": datasets.List(datasets.Value("int32"))}
)

# Below this many texts one process tokenises whatever --dataset_num_proc says: starting more costs more than they
# gain.
PARALLEL_MIN_TEXTS = 20_000
MAX_DEFAULT_PROCESSES = 8
_TEXT_FEATURES = datasets.Features({"text": datasets.Value("string")})

logger = logging.getLogger(__name__)


def default_num_proc() -> int:
    """The cores this process may use (its CPU affinity), at most ``MAX_DEFAULT_PROCESSES``."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, MAX_DEFAULT_PROCESSES))


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
    spans: list[tuple[int, int]] | None = None,
) -> list[int] | None:
    """Labels that keep only the responses' tokens (``spans``: the text's, when found already); None when the text
    has no (untruncated) response."""
    if spans is None:
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


def _encoded_batches(
    texts: Iterable[str], tokenizer, max_length: int, offsets: bool
) -> Iterator[tuple[list[str], dict]]:
    """``(batch, encoding)`` pairs in order, the next batch encoding on a thread while the caller masks and writes
    this one: the fast tokenizer releases the GIL while it encodes (on its own threads), so that the encoding and
    our Python work share the cores instead of taking turns. One batch is ahead, no more."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenise") as encoder:
        pending = None
        for batch in _batches(texts):
            encoding = encoder.submit(_encode, tokenizer, batch, max_length, offsets)
            if pending is not None:
                yield pending[0], pending[1].result()
            pending = (batch, encoding)
        if pending is not None:
            yield pending[0], pending[1].result()


def _masked(
    texts: list[str],
    encoded,
    response_template: str | None,
    instruction_template: str | None,
    loss: LabelLoss | None = None,
    tokenizer=None,
) -> Iterator[tuple[list[int], list[int]]]:
    """``(input_ids, labels)`` of each text of a batch, less the texts without their (untruncated) response, which
    ``loss`` (with ``tokenizer``, which measures a truncated text's prompt) counts when given."""
    for index, text in enumerate(texts):
        input_ids = encoded["input_ids"][index]
        if response_template is None:
            yield input_ids, input_ids
            continue
        spans = _response_spans(text, response_template, instruction_template)
        offsets = encoded["offset_mapping"][index]
        labels = _mask(text, input_ids, offsets, response_template, instruction_template, spans)
        if labels is not None:
            yield input_ids, labels
        elif loss is not None:
            _count_loss(loss, text, spans, tokenizer)


def _count_loss(loss: LabelLoss, text: str, spans: list[tuple[int, int]], tokenizer) -> None:
    """Count a text that keeps no label: without its response template, or with its prompt's tokens (those before
    its first response) filling ``max_seq_length``."""
    if not spans:
        loss.untemplated += 1
        return
    prompt = tokenizer(text[: spans[0][0]], return_attention_mask=False, return_token_type_ids=False)
    loss.add_truncated(len(prompt["input_ids"]))


def _label_loss(
    texts: Iterable[str], tokenizer, max_length: int, response_template: str, instruction_template: str | None
) -> LabelLoss:
    """The texts that keep no label at all, and why: those without the response template, and those whose prompt
    fills ``max_length`` (a pass of its own, encoding prompts only: the parallel tokenisers count none)."""
    loss = LabelLoss(response_template)
    for batch in _batches(texts):
        prompts = []
        for text in batch:
            spans = _response_spans(text, response_template, instruction_template)
            if spans:
                prompts.append(text[: spans[0][0]])
            else:
                loss.untemplated += 1
        encoded = tokenizer(prompts, return_attention_mask=False, return_token_type_ids=False) if prompts else None
        for prompt in encoded["input_ids"] if encoded else ():
            if len(prompt) >= max_length:
                loss.add_truncated(len(prompt))
    return loss


def _rows(
    texts: Iterable[str],
    tokenizer,
    max_length: int,
    response_template: str | None,
    source: str,
    instruction_template: str | None = None,
) -> Iterator[dict[str, list[int]]]:
    total, loss = 0, LabelLoss(response_template)
    for batch, encoded in _encoded_batches(texts, tokenizer, max_length, response_template is not None):
        for input_ids, labels in _masked(batch, encoded, response_template, instruction_template, loss, tokenizer):
            yield {"input_ids": input_ids, "labels": labels}
        total += len(batch)
    check_label_loss(loss, total, source, max_length)


def tokenize_and_mask(
    texts: Iterable[str],
    tokenizer,
    max_length: int,
    response_template: str | None,
    source: str = "data",
    instruction_template: str | None = None,
    num_proc: int | None = None,
) -> Dataset:
    """Tokenise texts (read once, a batch at a time); with a response template, label every prompt token -100 and
    drop texts lacking it. With an instruction template too (chat turns), only the spans from each response template
    to the next instruction template are trained. Our errors raised while reading ``texts`` come out unwrapped by
    ``datasets``. ``num_proc`` processes (default ``default_num_proc``) tokenise once there are ``PARALLEL_MIN_TEXTS``
    texts: the same rows, in the same order, as one process makes."""
    cache_dir = new_cache_dir(datasets.config.HF_DATASETS_CACHE)
    num_proc = default_num_proc() if num_proc is None else num_proc
    if num_proc > 1:
        texts = iter(texts)
        first = list(itertools.islice(texts, PARALLEL_MIN_TEXTS))
        if len(first) == PARALLEL_MIN_TEXTS:  # enough to gain from more processes than one
            return _tokenize_in_processes(
                itertools.chain(first, texts),
                tokenizer,
                max_length,
                response_template,
                source,
                instruction_template,
                num_proc,
                cache_dir,
            )
        texts = first
    # Bound here, not passed as gen_kwargs, which datasets would split into shards where it finds lists.
    rows = functools.partial(_rows, texts, tokenizer, max_length, response_template, source, instruction_template)
    return _generate(rows, _FEATURES, cache_dir, WRITER_BATCH_ROWS)


def _generate(generator, features: datasets.Features, cache_dir: str, writer_batch_size: int) -> Dataset:
    """``generator``'s rows as an Arrow dataset in ``cache_dir``; our errors raised while reading come out unwrapped
    by ``datasets``."""
    try:
        return Dataset.from_generator(
            generator,
            features=features,
            cache_dir=cache_dir,
            writer_batch_size=writer_batch_size,
            # A fresh directory holds nothing to reuse: a random fingerprint spares hashing the texts and tokenizer.
            fingerprint=uuid.uuid4().hex,
        )
    except DatasetGenerationError as exc:
        if isinstance(exc.__cause__, UserInputError):
            raise exc.__cause__ from None
        raise


def _text_rows(texts: Iterable[str]) -> Iterator[dict[str, str]]:
    for text in texts:
        yield {"text": text}


def _encode(tokenizer, texts: list[str], max_length: int, offsets: bool):
    """The texts' ``input_ids`` (and character offsets), truncated; nothing else the rows do not keep (an
    attention mask or token types would cost a Python list per text)."""
    return tokenizer(
        texts,
        truncation=True,
        max_length=max_length,
        return_offsets_mapping=offsets,
        return_attention_mask=False,
        return_token_type_ids=False,
    )


def _tokenize_batch(
    batch: dict[str, list], tokenizer, max_length: int, response_template: str | None, instruction_template
) -> dict[str, list]:
    """One batch of texts as rows, less the texts without their response (counted by the caller from the rows
    left), so that no second pass filters them."""
    texts = batch["text"]
    encoded = _encode(tokenizer, texts, max_length, response_template is not None)
    rows = {"input_ids": [], "labels": []}
    for input_ids, labels in _masked(texts, encoded, response_template, instruction_template):
        rows["input_ids"].append(input_ids)
        rows["labels"].append(labels)
    return rows


def _tokenize_in_processes(
    texts: Iterable[str],
    tokenizer,
    max_length: int,
    response_template: str | None,
    source: str,
    instruction_template: str | None,
    num_proc: int,
    cache_dir: str,
) -> Dataset:
    """``tokenize_and_mask`` on ``num_proc`` processes: the texts go to an Arrow file (read once, a batch at a
    time), which ``datasets`` splits into contiguous shards, one per process, joined back in order."""
    text_rows = _generate(functools.partial(_text_rows, texts), _TEXT_FEATURES, cache_dir, BATCH_TEXTS)
    with children_die_with_this_process():  # a SIGKILLed run leaves no worker behind
        rows = text_rows.map(
            _tokenize_batch,
            fn_kwargs={
                "tokenizer": tokenizer,
                "max_length": max_length,
                "response_template": response_template,
                "instruction_template": instruction_template,
            },
            batched=True,
            batch_size=BATCH_TEXTS,
            writer_batch_size=WRITER_BATCH_ROWS,
            remove_columns=["text"],
            features=_FEATURES,
            num_proc=num_proc,
            new_fingerprint=uuid.uuid4().hex,
            desc=f"tokenising {source}",
        )
    if len(rows) < len(text_rows):
        texts = (text for batch in text_rows.iter(batch_size=BATCH_TEXTS) for text in batch["text"])
        loss = _label_loss(texts, tokenizer, max_length, response_template, instruction_template)
        loss.truncated += len(text_rows) - len(rows) - loss.rows  # responses with no token of their own
        check_label_loss(loss, len(text_rows), source, max_length)
    return rows
