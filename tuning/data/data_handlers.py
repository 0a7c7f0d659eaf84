"""The data handlers of fms-hf-tuning v3.1.0's data framework: named steps a data config applies, in order, to each
dataset (``datasets``' ``map``, ``filter``, or its column operations). The processor hands every ``map`` handler the
tokenizer as ``fn_kwargs["tokenizer"]``; users register their own with ``train(..., additional_data_handlers=)``."""

import functools
import logging
import threading
from collections.abc import Callable
from enum import Enum
from numbers import Number
from typing import Any

from tuning.data.formatting import value_kind
from tuning.utils.error_logging import InputKeyError, UserInputError

logger = logging.getLogger(__name__)
IGNORE_INDEX = -100


class DataHandlerType(Enum):
    """How a handler applies: ``map`` or ``filter`` with its ``op``, or ``datasets``' column operations."""

    MAP = 1
    FILTER = 2
    REMOVE = 3
    SELECT = 4
    RENAME = 5


class DataHandler:
    """A handler: ``op`` (None for the column operations), how it applies, whether it takes batches of rows."""

    def __init__(
        self,
        op: Callable | None = None,
        handler_type: DataHandlerType | None = None,
        allows_batching: bool = False,
        desc: str | None = None,
    ):
        self.op = op
        self.handler_type = handler_type
        self.allows_batching = allows_batching
        self.desc = desc if desc is not None else str(self)

    def __str__(self) -> str:
        name = getattr(self.op, "__name__", str(self.op))
        kind = self.handler_type.name if self.handler_type else None
        return f"DataHandler(op={name}, handler_type={kind}, allows_batching={self.allows_batching})"


class RowError(UserInputError):
    """A row a handler cannot use (a field missing, null, or of the wrong kind). The message names the field; the
    data processor adds where the row is (file and line, or row number) before it reaches the user. ``batch_row``
    is the row's place in the batch when the handler took a batch."""

    batch_row: int | None = None


def row_text(element: dict, column: str, batch_row: int | None = None) -> str:
    """``element[column]`` when it is a string, else a ``RowError`` saying what it is."""
    value = element.get(column)
    if isinstance(value, str):
        return value
    problem = f"field '{column}' is " + ("null or missing" if value is None else value_kind(value))
    error = RowError(f"{problem}, not a string")
    error.batch_row = batch_row
    raise error


def check_conversation(messages: Any, column: str) -> list:
    """A conversation: a non-empty list of turns, each with a string ``role`` and a ``content`` that is a string or
    a list of parts (mappings); else a ``RowError`` naming the turn and its field."""
    if not isinstance(messages, list) or not messages:
        kind = "empty" if isinstance(messages, list) else value_kind(messages)
        raise RowError(f"field '{column}' is {kind}, not a list of turns")
    for index, turn in enumerate(messages):
        where = f"field '{column}[{index}]'"
        if not isinstance(turn, dict):
            raise RowError(f"{where} is {value_kind(turn)}, not a turn (a mapping with role and content)")
        if not isinstance(turn.get("role"), str):
            raise RowError(f"{where}.role is {value_kind(turn.get('role'))}, not a string")
        content = turn.get("content")
        if not isinstance(content, str) and not (
            isinstance(content, list) and all(isinstance(part, dict) for part in content)
        ):
            raise RowError(f"{where}.content is {value_kind(content)}, not a string or a list of parts")
    return messages


def check_tokenized_row(element: dict, vocab_size: int | None = None, **kwargs) -> None:
    """A pretokenized row: ``input_ids`` a list of token ids (below ``vocab_size``), ``labels`` (when given) and
    ``attention_mask`` (when given) lists of the same length, each label a token id or -100. Rows that disagree would
    be padded out of line in a batch (training on the wrong tokens) or fail at the first step."""
    input_ids = element.get("input_ids")
    if not isinstance(input_ids, list) or not input_ids:
        kind = "empty" if isinstance(input_ids, list) else value_kind(input_ids)
        raise RowError(f"field 'input_ids' is {kind}, not a list of token ids")
    for name in ("labels", "attention_mask"):
        values = element.get(name)
        if values is not None and (not isinstance(values, list) or len(values) != len(input_ids)):
            what = f"{len(values)} items long" if isinstance(values, list) else value_kind(values)
            raise RowError(f"field '{name}' is {what}, input_ids {len(input_ids)}: they must be equally long")
    limit = vocab_size if vocab_size else float("inf")
    for name, allowed in (("input_ids", ()), ("labels", (IGNORE_INDEX,))):
        for position, token in enumerate(element.get(name) or []):
            if not isinstance(token, int) or not (0 <= token < limit or token in allowed):
                raise RowError(
                    f"field '{name}[{position}]' is {token!r}, not a token id of the vocabulary (0 to {vocab_size - 1})"
                    if vocab_size
                    else f"field '{name}[{position}]' is {token!r}, not a token id"
                )


def _tokenizer(kwargs: dict):
    if "tokenizer" not in kwargs:
        raise RuntimeError("the data processor passes the tokenizer to map handlers; none was given")
    return kwargs["tokenizer"]


def _render(template_call: Callable[[], Any]) -> Any:
    """Run a Jinja rendering, its failures as the user errors they are."""
    from jinja2 import TemplateSyntaxError, UndefinedError
    from jinja2.sandbox import SecurityError

    try:
        return template_call()
    except TemplateSyntaxError as exc:
        raise UserInputError(f"the template is not valid Jinja2: {exc}") from exc
    except UndefinedError as exc:
        raise InputKeyError(f"a template key is not in the dataset: {exc}") from exc
    except SecurityError as exc:
        raise UserInputError(f"the template does something unsafe: {exc}") from exc


def tokenize_and_apply_input_masking(
    element: dict, input_column_name: str, output_column_name: str, add_eos_token: bool = True, **kwargs
) -> dict:
    """Tokenise ``input`` + ``output`` (a space between them unless one has it) + EOS; labels keep the output's
    tokens only. ``fn_kwargs["tokenizer_kwargs"]`` go to the tokenizer (truncation, max_length)."""
    tokenizer = _tokenizer(kwargs)
    missing = [name for name in (input_column_name, output_column_name) if name not in element]
    if missing:
        raise InputKeyError(
            f"the dataset has no column(s) {missing} (keys: {sorted(element)}); without --dataset_text_field or "
            "--data_formatter_template the data needs input and output columns"
        )
    prompt, response = row_text(element, input_column_name), row_text(element, output_column_name)
    joiner = "" if prompt.endswith((" ", "\n", "\t")) or response.startswith((" ", "\n", "\t")) else " "
    text = prompt + joiner + response + (tokenizer.eos_token if add_eos_token else "")
    tokenizer_kwargs = kwargs.get("tokenizer_kwargs", {})
    whole = tokenizer(text, **tokenizer_kwargs)
    prompt_length = len(tokenizer(prompt, **tokenizer_kwargs).input_ids)
    input_ids = list(whole.input_ids)
    labels = [IGNORE_INDEX] * min(prompt_length, len(input_ids)) + input_ids[prompt_length:]
    return {"input_ids": input_ids, "labels": labels, "attention_mask": list(whole.attention_mask)}


_rendering = threading.local()  # the row being rendered, for ``_text_only`` to name a key


def _text_only(value: Any) -> Any:
    """Each ``{{ }}`` value of a template, before it becomes text: a string or a number, else a ``RowError`` naming
    the row's key that holds it (a struct, a list, null or a boolean would train on its Python form)."""
    from jinja2 import Undefined

    if isinstance(value, str | Undefined) or (isinstance(value, Number) and not isinstance(value, bool)):
        return value
    element = getattr(_rendering, "element", None) or {}
    key = next((key for key, field in element.items() if field is value), None)
    what = "a template value" if key is None else f"field '{key}'"
    raise RowError(f"{what} is {'null' if value is None else value_kind(value)}, not text (a string or a number)")


@functools.lru_cache(maxsize=32)
def _compiled(template: str):
    """A template compiled once per process, not once per row."""
    from jinja2 import StrictUndefined
    from jinja2.sandbox import SandboxedEnvironment

    return SandboxedEnvironment(undefined=StrictUndefined, finalize=_text_only).from_string(template)


def apply_custom_jinja_template(element: dict, formatted_text_column_name: str, template: str, **kwargs) -> dict:
    """Render ``template`` (sandboxed Jinja2; ``element``, the row's keys and the tokenizer's special tokens by name)
    into the column ``formatted_text_column_name``. A value rendered must be a string or a number (``_text_only``)."""
    tokenizer = _tokenizer(kwargs)
    special_tokens = {
        name: value
        for name, value in {
            "bos_token": tokenizer.bos_token,
            "eos_token": tokenizer.eos_token,
            "unk_token": tokenizer.unk_token,
            "pad_token": tokenizer.pad_token,
        }.items()
        if value is not None
    }
    compiled = _render(lambda: _compiled(template))
    _rendering.element = element
    try:
        text = _render(lambda: compiled.render({**special_tokens, **element, "element": element}))
    finally:
        _rendering.element = None
    return {formatted_text_column_name: text}


def _render_whole_record(tokenizer, element: dict) -> str:
    """The chat template rendered with the whole record as ``messages`` (``messages['messages']`` in the template),
    which fms-hf-tuning v3.1.0 did through transformers 4 and transformers 5's ``apply_chat_template`` refuses."""
    import json
    from datetime import datetime

    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str):
        raise UserInputError(f"the chat template refused a record: {message}")

    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    environment.filters["tojson"] = lambda value, indent=None: json.dumps(value, ensure_ascii=False, indent=indent)
    environment.globals.update(raise_exception=raise_exception, strftime_now=lambda fmt: datetime.now().strftime(fmt))
    names = ("bos_token", "eos_token", "unk_token", "pad_token")
    special_tokens = {name: getattr(tokenizer, name) for name in names if getattr(tokenizer, name, None)}
    template = environment.from_string(tokenizer.chat_template)
    extras = _conversation_extras(element)
    return template.render(messages=element, add_generation_prompt=False, **special_tokens, **extras)


def _conversation_extras(element: dict) -> dict:
    return {key: element[key] for key in ("tools", "documents") if element.get(key) is not None}


def apply_tokenizer_chat_template(
    element: dict, formatted_text_column_name: str, conversation_column_name: str | None = None, **kwargs
) -> dict:
    """Render the row (or its ``conversation_column_name`` column) with the tokenizer's chat template, untokenised,
    into ``formatted_text_column_name``. With a vision-language model's processor (fms-hf-tuning 3.2): its chat
    template renders, the conversation column when none is named is the first of ``messages``, ``conversation``,
    ``chat``, ``turns`` holding a conversation (else the whole record, as without a processor), and a row with images
    (an ``image``, ``images`` or ``pixel_values`` field) whose text holds no image token is a user error."""
    processor = kwargs.get("processor")
    tokenizer = processor or _tokenizer(kwargs)
    if tokenizer.chat_template is None:
        raise UserInputError(
            "the tokenizer has no chat template: give --chat_template (or chat_template in a data config)"
        )
    if not conversation_column_name and processor is not None:
        from tuning.data.vision import CONVERSATION_COLUMNS, looks_like_conversation

        found = (name for name in CONVERSATION_COLUMNS if looks_like_conversation(element.get(name)))
        conversation_column_name = next(found, None)
    if conversation_column_name:
        if conversation_column_name not in element:
            raise InputKeyError(
                f"conversation column '{conversation_column_name}' is not in the data (keys: {sorted(element)})"
            )
        conversation = check_conversation(element[conversation_column_name], conversation_column_name)
        text = _render(
            lambda: tokenizer.apply_chat_template(conversation, tokenize=False, **_conversation_extras(element))
        )
    else:
        text = _render(lambda: _render_whole_record(tokenizer, element))
    image_token = getattr(processor, "image_token", None)
    has_images = any(element.get(name) for name in ("image", "images", "pixel_values"))
    if image_token and has_images and image_token not in text:
        raise RowError(
            f"the row has images but its text, rendered by the chat template, holds no image token ({image_token!r}):"
            " its conversation needs {'type': 'image'} parts"
            + ("" if conversation_column_name else " (name the conversation column: conversation_column_name)")
        )
    return {formatted_text_column_name: text}


def tokenize(
    element: dict, text_column_name: str, truncation: bool | str = True, max_length: int | None = None, **kwargs
):
    """Tokenise the column ``text_column_name`` (batched or not); ``fn_kwargs["tokenizer_kwargs"]`` go along."""
    tokenizer = _tokenizer(kwargs)
    if text_column_name not in element:
        raise InputKeyError(f"text column '{text_column_name}' is not in the data (keys: {sorted(element)})")
    texts = element[text_column_name]
    if isinstance(texts, list):  # a batch
        for index in range(len(texts)):
            row_text({text_column_name: texts[index]}, text_column_name, index)
    else:
        row_text(element, text_column_name)
    return tokenizer(texts, truncation=truncation, max_length=max_length, **kwargs.get("tokenizer_kwargs", {}))


def duplicate_columns(element: dict, existing_column_name: str, new_column_name: str, **kwargs) -> dict:
    """Copy column ``existing_column_name`` into a new column ``new_column_name``."""
    if not existing_column_name or not new_column_name:
        raise UserInputError("duplicate_columns needs existing_column_name and new_column_name")
    if existing_column_name not in element:
        raise UserInputError(f"cannot duplicate {existing_column_name}: no such column (keys: {sorted(element)})")
    if new_column_name in element:
        raise UserInputError(f"cannot duplicate {existing_column_name} to {new_column_name}: that column exists")
    return {existing_column_name: element[existing_column_name], new_column_name: element[existing_column_name]}


def skip_samples_with_large_columns(element: dict, column_name: str, max_allowed_length: int, **kwargs) -> bool:
    """A ``filter``: keep rows whose ``column_name`` holds at most ``max_allowed_length`` items (tokens, characters)."""
    if column_name not in element or max_allowed_length is None:
        raise UserInputError(
            f"skip_samples_with_large_columns needs an existing column_name (got {column_name!r}) "
            "and max_allowed_length"
        )
    if element[column_name] is None:
        raise UserInputError(f"column {column_name} is null in a row of the dataset")
    return len(element[column_name]) <= max_allowed_length


def _chat_ids(tokenizer, messages: list, max_seq_length: int | None, generation_prompt: bool, extras: dict) -> list:
    encoded = _render(
        lambda: tokenizer.apply_chat_template(
            messages,
            tokenize=True,
            add_generation_prompt=generation_prompt,
            truncation=max_seq_length is not None,
            max_length=max_seq_length,
            return_dict=False,
            **extras,
        )
    )
    if hasattr(encoded, "keys"):  # a BatchEncoding in some transformers versions
        encoded = encoded["input_ids"]
    return list(encoded)


def _check_generation_prompt(tokenizer) -> None:
    """Refuse a chat template that ignores ``add_generation_prompt`` yet opens the assistant's turn with a prefix:
    the masking could not find the prefix, and the model would be trained on it."""
    template = tokenizer.chat_template
    if template is None or template in _CHECKED_TEMPLATES:
        return
    user = [{"role": "user", "content": "U"}]
    plain = _render(lambda: tokenizer.apply_chat_template(user, tokenize=False))
    prompted = _render(lambda: tokenizer.apply_chat_template(user, tokenize=False, add_generation_prompt=True))
    whole = _render(
        lambda: tokenizer.apply_chat_template(user + [{"role": "assistant", "content": _PROBE}], tokenize=False)
    )
    if plain == prompted and whole.startswith(plain) and _PROBE in whole[len(plain) :]:
        prefix = whole[len(plain) : whole.index(_PROBE, len(plain))]
        if prefix.strip():
            raise UserInputError(
                f"the chat template renders no generation prompt (add_generation_prompt), so the assistant prefix "
                f"{prefix!r} would be trained on: use a template that renders it when add_generation_prompt is true"
            )
    _CHECKED_TEMPLATES.add(template)


_CHECKED_TEMPLATES: set[str] = set()
_PROBE = "QZXJ"  # an assistant reply no template's own text contains


def tokenize_and_apply_chat_template_with_masking(
    element: dict, max_seq_length: int | None = None, conversation_column: str = "messages", **kwargs
) -> dict:
    """Tokenise a conversation with the chat template; labels keep only the assistant turns' tokens. A turn's span is
    found by rendering the conversation up to it and up to its end (with the assistant prefix when an assistant turn
    follows, so the prefix is not trained on)."""
    tokenizer = _tokenizer(kwargs)
    if conversation_column not in element:
        raise InputKeyError(f"conversation column '{conversation_column}' is not in the data (keys: {sorted(element)})")
    messages = element[conversation_column]
    if not messages:
        raise UserInputError(f"Contents of the column {conversation_column} must not be empty.")
    check_conversation(messages, conversation_column)
    _check_generation_prompt(tokenizer)
    extras = _conversation_extras(element)
    input_ids = _chat_ids(tokenizer, messages, max_seq_length, False, extras)
    labels = list(input_ids)
    for index, message in enumerate(messages):
        if message["role"] == "assistant":
            continue
        start = len(_chat_ids(tokenizer, messages[:index], max_seq_length, False, extras)) if index else 0
        followed_by_assistant = index + 1 < len(messages) and messages[index + 1]["role"] == "assistant"
        end = len(_chat_ids(tokenizer, messages[: index + 1], max_seq_length, followed_by_assistant, extras))
        labels[start:end] = [IGNORE_INDEX] * len(labels[start:end])
        if max_seq_length and end >= max_seq_length:
            break
    return {"input_ids": input_ids, "labels": labels, "attention_mask": [1] * len(input_ids)}


def prepare_multimodal_data_processor(element: dict, **kwargs) -> dict:
    """v3.1.0's vision handler: the row's text (messages, or text a chat template rendered) and its images as RGB PIL
    images (from any form ``tuning.data.vision`` reads: PIL, bytes, image structs, file paths), with ``fields_name``
    (``dataset_text_field``, ``dataset_image_field``) and ``processor_kwargs`` (when given), which the vision collator
    reads from each row. Relative image paths are read from ``image_dir``, which the data processor sets to the folder
    of the dataset's files. The processor is a vision-language model's, handed over by the data processor."""
    from tuning.data.vision import image_values, to_image

    if kwargs.get("processor") is None:
        raise UserInputError(
            "Processor is missing: prepare_multimodal_data_processor needs a vision-language model's processor (the "
            "model is text-only)"
        )
    fields = dict(kwargs.get("fields_name") or {})
    missing = [name for name in ("dataset_text_field", "dataset_image_field") if not fields.get(name)]
    if missing:
        raise UserInputError(f"prepare_multimodal_data_processor: fields_name needs {' and '.join(missing)}")
    text_field, image_field = fields["dataset_text_field"], fields["dataset_image_field"]
    for field in (text_field, image_field):
        if element.get(field) is None:
            raise RowError(f"field '{field}' is null or missing")
    images = []
    for number, value in enumerate(image_values(element[image_field])):
        try:
            images.append(to_image(value, kwargs.get("image_dir")))
        except ValueError as exc:
            raise RowError(f"field '{image_field}', image {number}: {exc}") from exc
    row = {text_field: element[text_field], image_field: images, "fields_name": fields}
    if kwargs.get("processor_kwargs"):
        row["processor_kwargs"] = dict(kwargs["processor_kwargs"])
    return row


AVAILABLE_DATA_HANDLERS = {
    "remove_columns": DataHandler(handler_type=DataHandlerType.REMOVE, desc="Removing columns"),
    "select_columns": DataHandler(handler_type=DataHandlerType.SELECT, desc="Selecting columns"),
    "rename_columns": DataHandler(handler_type=DataHandlerType.RENAME, desc="Renaming columns"),
    "tokenize": DataHandler(tokenize, DataHandlerType.MAP, True, "Tokenizing the dataset"),
    "apply_custom_jinja_template": DataHandler(
        apply_custom_jinja_template, DataHandlerType.MAP, False, "Formatting dataset with given formatting template"
    ),
    "tokenize_and_apply_input_masking": DataHandler(
        tokenize_and_apply_input_masking, DataHandlerType.MAP, False, "Tokenizing input and output, masking input"
    ),
    "apply_tokenizer_chat_template": DataHandler(
        apply_tokenizer_chat_template, DataHandlerType.MAP, False, "Applying chat template to dataset"
    ),
    "tokenize_and_apply_chat_template_with_masking": DataHandler(
        tokenize_and_apply_chat_template_with_masking,
        DataHandlerType.MAP,
        False,
        "Applying chat template to dataset and tokenizing",
    ),
    "duplicate_columns": DataHandler(duplicate_columns, DataHandlerType.MAP, True, "Duplicating columns"),
    "skip_samples_with_large_columns": DataHandler(
        skip_samples_with_large_columns, DataHandlerType.FILTER, False, "Skipping large samples"
    ),
    "prepare_multimodal_data_processor": DataHandler(
        prepare_multimodal_data_processor, DataHandlerType.MAP, False, "Processing multimodal data"
    ),
}

# What the built-in handlers read from ``**kwargs`` besides the tokenizer and processor the data processor passes;
# None: anything (the handler's keyword arguments are open). Handlers from elsewhere with ``**kwargs`` are open too.
_READ_FROM_KWARGS: dict[str, set[str] | None] = {
    "tokenize_and_apply_input_masking": {"tokenizer_kwargs"},
    "apply_tokenizer_chat_template": {"tokenizer_kwargs"},
    "tokenize": {"tokenizer_kwargs"},
    "prepare_multimodal_data_processor": None,
    # fms-hf-tuning 3.2's own data configs pass it; the handler leaves token rows, so it names nothing.
    "tokenize_and_apply_chat_template_with_masking": {"formatted_text_column_name"},
}
_PASSED_BY_THE_PROCESSOR = {"tokenizer", "processor"}
_COLUMN_ARGUMENTS = {
    DataHandlerType.REMOVE: {"column_names"},
    DataHandlerType.SELECT: {"column_names"},
    DataHandlerType.RENAME: {"column_mapping"},
}


@functools.lru_cache(maxsize=4)
def _call_arguments(handler_type: DataHandlerType) -> frozenset[str]:
    """The keyword arguments of ``datasets``' ``map``/``filter`` (of a dataset or a streaming one)."""
    import inspect

    from datasets import Dataset, IterableDataset

    method = "filter" if handler_type is DataHandlerType.FILTER else "map"
    names = set()
    for kind in (Dataset, IterableDataset):
        names |= set(inspect.signature(getattr(kind, method)).parameters)
    return frozenset(names - {"self", "function"})


def _op_arguments(op: Callable) -> tuple[set[str] | None, set[str]]:
    """The ``fn_kwargs`` names ``op`` accepts (None: any) and those it requires."""
    import inspect

    parameters = list(inspect.signature(op).parameters.values())[1:]  # the first is the row (or batch)
    named = {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    required = {p.name for p in parameters if p.name in named and p.default is p.empty} - _PASSED_BY_THE_PROCESSOR
    if not any(p.kind is p.VAR_KEYWORD for p in parameters):
        return named, required
    name = getattr(op, "__name__", "")
    if (
        getattr(op, "__module__", None) != __name__
        or name not in _READ_FROM_KWARGS
        and name not in AVAILABLE_DATA_HANDLERS
    ):
        return None, required
    extra = _READ_FROM_KWARGS.get(name, set())
    return (None if extra is None else named | extra | _PASSED_BY_THE_PROCESSOR), required


def _closest(name: str, valid) -> str:
    import difflib

    match = difflib.get_close_matches(name, sorted(valid), n=1, cutoff=0.5)
    return f"did you mean '{match[0]}'? " if match else ""


def handler_argument_problem(handler: DataHandler, arguments: dict | None) -> str | None:
    """What is wrong with a data config's ``arguments`` for ``handler`` (an unknown argument, with the closest valid
    name; a required one missing), or None."""
    arguments = arguments or {}
    if handler.handler_type in _COLUMN_ARGUMENTS:
        valid = _COLUMN_ARGUMENTS[handler.handler_type]
    else:
        valid = _call_arguments(handler.handler_type)
    for key in arguments:
        if key not in valid:
            return f"unknown argument '{key}': {_closest(key, valid) or f'it takes {sorted(valid)}'}"
    if handler.op is None or handler.handler_type not in (DataHandlerType.MAP, DataHandlerType.FILTER):
        return None
    fn_kwargs = arguments.get("fn_kwargs") or {}
    if not isinstance(fn_kwargs, dict):
        return f"fn_kwargs must be a mapping, got {fn_kwargs!r}"
    accepted, required = _op_arguments(handler.op)
    if accepted is not None:
        for key in fn_kwargs:
            if key not in accepted:
                known = sorted(accepted - _PASSED_BY_THE_PROCESSOR)
                return f"unknown fn_kwargs '{key}': {_closest(key, known)}it takes {known}"
    if missing := sorted(required - set(fn_kwargs)):
        return f"fn_kwargs {missing} required"
    return None
