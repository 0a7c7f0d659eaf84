"""The data handlers of fms-hf-tuning v3.1.0's data framework: named steps a data config applies, in order, to each
dataset (``datasets``' ``map``, ``filter``, or its column operations). The processor hands every ``map`` handler the
tokenizer as ``fn_kwargs["tokenizer"]``; users register their own with ``train(..., additional_data_handlers=)``."""

import functools
import logging
from collections.abc import Callable
from enum import Enum
from typing import Any

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
    prompt, response = element[input_column_name], element[output_column_name]
    joiner = "" if prompt.endswith((" ", "\n", "\t")) or response.startswith((" ", "\n", "\t")) else " "
    text = prompt + joiner + response + (tokenizer.eos_token if add_eos_token else "")
    tokenizer_kwargs = kwargs.get("tokenizer_kwargs", {})
    whole = tokenizer(text, **tokenizer_kwargs)
    prompt_length = len(tokenizer(prompt, **tokenizer_kwargs).input_ids)
    input_ids = list(whole.input_ids)
    labels = [IGNORE_INDEX] * min(prompt_length, len(input_ids)) + input_ids[prompt_length:]
    return {"input_ids": input_ids, "labels": labels, "attention_mask": list(whole.attention_mask)}


@functools.lru_cache(maxsize=32)
def _compiled(template: str):
    """A template compiled once per process, not once per row."""
    from jinja2 import StrictUndefined
    from jinja2.sandbox import SandboxedEnvironment

    return SandboxedEnvironment(undefined=StrictUndefined).from_string(template)


def apply_custom_jinja_template(element: dict, formatted_text_column_name: str, template: str, **kwargs) -> dict:
    """Render ``template`` (sandboxed Jinja2; ``element``, the row's keys and the tokenizer's special tokens by name)
    into the column ``formatted_text_column_name``."""
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
    return {
        formatted_text_column_name: _render(lambda: compiled.render({**special_tokens, **element, "element": element}))
    }


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
    into ``formatted_text_column_name``."""
    tokenizer = kwargs.get("processor") or _tokenizer(kwargs)
    if tokenizer.chat_template is None:
        raise UserInputError(
            "the tokenizer has no chat template: give --chat_template (or chat_template in a data config)"
        )
    if conversation_column_name:
        if conversation_column_name not in element:
            raise InputKeyError(
                f"conversation column '{conversation_column_name}' is not in the data (keys: {sorted(element)})"
            )
        conversation = element[conversation_column_name]
    else:
        return {formatted_text_column_name: _render(lambda: _render_whole_record(tokenizer, element))}
    text = _render(lambda: tokenizer.apply_chat_template(conversation, tokenize=False, **_conversation_extras(element)))
    return {formatted_text_column_name: text}


def tokenize(
    element: dict, text_column_name: str, truncation: bool | str = True, max_length: int | None = None, **kwargs
):
    """Tokenise the column ``text_column_name`` (batched or not); ``fn_kwargs["tokenizer_kwargs"]`` go along."""
    tokenizer = _tokenizer(kwargs)
    return tokenizer(
        element[text_column_name], truncation=truncation, max_length=max_length, **kwargs.get("tokenizer_kwargs", {})
    )


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
    """v3.1.0's vision handler for data configs: registered under its name, refused when used (vision data goes
    through ``--dataset_image_field``)."""
    raise UserInputError(
        "prepare_multimodal_data_processor: vision data in a data config is not supported by tuning-bench; give "
        "--training_data_path with --dataset_image_field"
    )


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
