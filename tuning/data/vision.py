"""Vision-language data (``--dataset_image_field``): rows of OpenAI-style ``messages`` (each ``content`` a string or
a list of ``{"type": "text", "text": ...}`` and ``{"type": "image"}`` parts) and an image column (one image or a list
per row: PIL images, bytes, Parquet/Arrow image structs ``{"bytes", "path"}``, or file paths, relative ones read
beside the training data file). ``tuning.data.setup_dataprocessor.prepare_vision_datasets`` loads them (from the data
flags, or from a data config through its handlers, ``prepare_multimodal_data_processor`` among them); this module
finds the conversations' column when none is named, and checks every row before the model loads (every image decoded
once, each row's images matched to its image placeholders and the image tokens its rendered text holds; a model
given one image a row keeps the first); ``VisionDataCollator`` turns a batch into the processor's inputs through the
chat template, with labels on the assistant turns' tokens only (never the prompt, never an image token, never
padding); ``trainable_vision_rows`` refuses data where ``--max_seq_length`` leaves no row an assistant token (and
leaves out, with one warning, the rows it leaves none). It imports no data module above the handlers (only masking's
constant, labels and data_config), so that the handlers can use it."""

import copy
import io
import logging
import os
from collections.abc import Sequence
from typing import Any

import torch

from tuning.data.labels import LabelLoss, check_label_loss
from tuning.data.masking import IGNORE_INDEX
from tuning.utils.error_logging import UserInputError

logger = logging.getLogger(__name__)

DEFAULT_MESSAGES_FIELD = "messages"
# Where fms-hf-tuning 3.2 looks for the conversations when no column is named, in this order.
CONVERSATION_COLUMNS = ("messages", "conversation", "chat", "turns")
# Architectures given one image a row, as fms-hf-tuning feeds them (its multimodal handler keeps the first image for
# LlavaProcessor and for granite-vision's LlavaNextProcessor): model type, and the language model's type if it matters.
ONE_IMAGE_MODELS = (("llava", None), ("llava_next", "granite"))


def is_vision_config(config: Any) -> bool:
    """Whether a model config is a vision-language model's: it has a vision tower's config."""
    return getattr(config, "vision_config", None) is not None


def images_per_row(config: Any) -> int | None:
    """How many images a row may give the model: 1 for the ``ONE_IMAGE_MODELS``, None (as many as the row's image
    placeholders) for the others and a config not read (None)."""
    if config is None:
        return None
    text_type = getattr(getattr(config, "text_config", None), "model_type", None)
    for model_type, language in ONE_IMAGE_MODELS:
        if config.model_type == model_type and language in (None, text_type):
            return 1
    return None


def looks_like_conversation(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and isinstance(value[0], dict) and "role" in value[0]


def find_conversation_column(dataset, source: str) -> str:
    """The column holding the conversations when none is named, as fms-hf-tuning 3.2 finds it: the first of
    ``CONVERSATION_COLUMNS`` whose first row is a list of messages (dicts with a ``role``); a ``UserInputError``
    naming the columns when none is."""
    first = dataset[0] if len(dataset) else {}
    for name in CONVERSATION_COLUMNS:
        if looks_like_conversation(first.get(name)):
            logger.info("%s: the conversations are in column %r (--dataset_text_field names it)", source, name)
            return name
    raise UserInputError(
        f"{source}: no column of conversations found (none of {', '.join(CONVERSATION_COLUMNS)} holds a list of "
        f"{{role, content}} messages; columns: {', '.join(dataset.column_names or [])}): name it with "
        "--dataset_text_field"
    )


def first_image_only(messages: Sequence[dict]) -> list[dict]:
    """A conversation with its first ``{"type": "image"}`` part only (for a model given one image a row)."""
    kept, seen = [], False
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            parts = []
            for part in content:
                if isinstance(part, dict) and part.get("type") == "image":
                    if seen:
                        continue
                    seen = True
                parts.append(part)
            message = {**message, "content": parts}
        kept.append(message)
    return kept


def model_row(messages: list, images: list, max_images: int | None) -> tuple[list, list]:
    """A row's conversation and images as the model takes them: with ``max_images`` 1 and more images than that,
    the first image and the first image placeholder."""
    if max_images == 1 and len(images) > 1:
        return first_image_only(messages), images[:1]
    return messages, images


def image_values(value: Any) -> list:
    """A row's image cell as a list (None: no image)."""
    if value is None:
        return []
    return list(value) if isinstance(value, list | tuple) else [value]


def to_image(value: Any, base_dir: str | None = None):
    """One image cell item as an RGB PIL image; ``ValueError`` naming why when it does not decode."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(value, Image.Image):
        image = value
    else:
        if isinstance(value, dict):  # a Parquet/Arrow image struct
            value = value.get("bytes") or value.get("path")
        if isinstance(value, str):
            path = value if os.path.isabs(value) or base_dir is None else os.path.join(base_dir, value)
            if not os.path.isfile(path):
                raise ValueError(f"image file {path} does not exist")
            value = open(path, "rb").read()  # noqa: SIM115 - read at once, closed by the collector
        if not isinstance(value, bytes | bytearray):
            raise ValueError(f"{type(value).__name__} is no image (PIL image, bytes, image struct or file path)")
        try:
            image = Image.open(io.BytesIO(value))
            image.load()
        except (UnidentifiedImageError, OSError) as exc:
            raise ValueError(f"the image does not decode: {exc}") from exc
    return image.convert("RGB")


def image_size(value: Any, base_dir: str | None = None) -> tuple[int, int]:
    """An image cell item's (width, height), read from its header (a PIL image's own): nothing is decoded."""
    from PIL import Image

    if isinstance(value, Image.Image):
        return value.size
    if isinstance(value, dict):
        value = value.get("bytes") or value.get("path")
    if isinstance(value, str):
        path = value if os.path.isabs(value) or base_dir is None else os.path.join(base_dir, value)
        with Image.open(path) as image:
            return image.size
    with Image.open(io.BytesIO(value)) as image:
        return image.size


def image_placeholders(messages: Sequence[dict]) -> int:
    """The number of ``{"type": "image"}`` parts of a conversation."""
    count = 0
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            count += sum(1 for part in content if isinstance(part, dict) and part.get("type") == "image")
    return count


def data_path_dir(data_args) -> str | None:
    """Where relative image paths are read from: the folder holding the data files (``--training_data_path`` and
    ``--validation_data_path``, or every dataset of ``--data_config_path``), when they are all in one; else None
    (the working directory)."""
    from tuning.data.loading import files_dir

    if data_args.data_config_path:
        from tuning.data.data_config import job_data_config

        config = job_data_config(data_args)
        return files_dir([path for dataset in config.datasets for path in dataset.data_paths])
    return files_dir([path for path in (data_args.training_data_path, data_args.validation_data_path) if path])


def _undecoded(feature):
    """``feature`` with an ``Image`` in it (alone, or a list's items) set not to decode; None when it has none."""
    from datasets import Image

    if isinstance(feature, Image):
        return Image(mode=feature.mode, decode=False) if feature.decode else None
    inner = getattr(feature, "feature", None)
    if isinstance(inner, Image) and inner.decode:
        changed = copy.copy(feature)
        changed.feature = Image(mode=inner.mode, decode=False)
        return changed
    return None


def undecoded_images(dataset):
    """``dataset`` with its ``datasets`` Image columns (Parquet and Arrow files carry the feature) read as
    ``{bytes, path}`` structs: images then decode in ``to_image``, whose errors name the row, and a struct's relative
    path is read beside the data file, never by ``datasets`` from the working directory."""
    for name, feature in dict(getattr(dataset, "features", None) or {}).items():
        if (changed := _undecoded(feature)) is not None:
            dataset = dataset.cast_column(name, changed)
    return dataset


def _check_placeholders(messages: list, images: list, where: str, processor) -> None:
    """A conversation's images match its image parts in number, and its text rendered by ``processor``'s chat
    template holds one image token an image."""
    placeholders = image_placeholders(messages)
    if len(images) > placeholders:
        raise UserInputError(
            f'{where}: {len(images)} images but {placeholders} image placeholders ({{"type": "image"}} parts) in '
            "its messages"
        )
    if len(images) < placeholders:
        raise UserInputError(f"{where}: {placeholders} image placeholders in its messages but {len(images)} images")
    if images and getattr(processor, "image_token", None):
        rendered = processor.apply_chat_template(messages, tokenize=False).count(processor.image_token)
        if rendered != len(images):
            raise UserInputError(
                f"{where}: {len(images)} images but its text, rendered by the chat template, holds {rendered} image "
                f'tokens ({processor.image_token!r}): the template must render each {{"type": "image"}} part as one '
                "(see --chat_template)"
            )


def check_vision_dataset(
    dataset,
    text_field: str,
    image_field: str,
    source: str,
    base_dir: str | None,
    processor=None,
    max_images: int | None = None,
) -> None:
    """Refuse (``UserInputError`` naming ``source`` and the row) a dataset the collator cannot turn into inputs: a
    missing messages or image column, an image column without any image, an image that does not decode, a row whose
    images and image placeholders disagree in number, a row with images whose text, rendered by ``processor``'s chat
    template, holds fewer or more image tokens. With ``max_images`` 1, rows with more images use their first (one
    warning for the dataset)."""
    columns = list(dataset.column_names or [])
    for flag, field in (("--dataset_text_field", text_field), ("--dataset_image_field", image_field)):
        if field not in columns:
            raise UserInputError(f"{flag} {field}: {source} has no column {field!r} (columns: {', '.join(columns)})")
    if len(dataset) == 0:
        raise UserInputError(f"{source} has no rows")
    images_seen, first_only = 0, []
    image_token = getattr(processor, "image_token", None)
    for index, row in enumerate(dataset, 1):  # rows counted from 1, as everywhere in errors
        where = f"{source}, row {index}"
        messages, images = row[text_field], image_values(row[image_field])
        if isinstance(messages, str):  # rendered already (a data config's apply_tokenizer_chat_template)
            tokens = messages.count(image_token) if image_token else len(images)
            if tokens != len(images):
                raise UserInputError(
                    f"{where}: {len(images)} images but its text holds {tokens} image tokens ({image_token!r})"
                )
        else:
            if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
                raise UserInputError(f"{where}: column {text_field!r} must hold a list of messages (role, content)")
            if max_images is not None and len(images) > max_images:
                first_only.append(index)
            messages, images = model_row(messages, images, max_images)
            _check_placeholders(messages, images, where, processor)
        for number, value in enumerate(images):
            try:
                to_image(value, base_dir)
            except ValueError as exc:
                raise UserInputError(f"{where}, image {number}: {exc}") from exc
        images_seen += len(images)
    if first_only:
        logger.warning(
            "%s: the model takes one image a row; %d rows give more (the first: row %d) and use their first image",
            source,
            len(first_only),
            first_only[0],
        )
    if not images_seen:
        raise UserInputError(
            f"--dataset_image_field {image_field}: the column is empty in {source} (no image in any row)"
        )


def trainable_vision_rows(dataset, collator: "VisionDataCollator", source: str):
    """The rows of ``dataset`` that keep a label token within the collator's ``max_length``: none is a
    ``UserInputError`` naming ``source``, its row count and the longest prompt (with its image tokens); rows left
    out are one warning (``tuning.data.labels``)."""
    if collator.max_length is None:
        return dataset
    loss, kept = LabelLoss(), []
    for index, row in enumerate(dataset):
        start = collator.first_label(row)
        if start is None:
            loss.unlabelled += 1
        elif start >= collator.max_length:
            loss.add_truncated(start)
        else:
            kept.append(index)
    check_label_loss(loss, len(dataset), source, collator.max_length)
    return dataset if len(kept) == len(dataset) else dataset.select(kept)


MULTIMODAL_HANDLER = "prepare_multimodal_data_processor"


def is_vision_data_config(data_args) -> bool:
    """Whether ``--data_config_path`` names vision data: ``--dataset_image_field`` is given, or one of its datasets
    runs v3.1.0's ``prepare_multimodal_data_processor`` handler."""
    if not data_args.data_config_path:
        return False
    if data_args.dataset_image_field:
        return True
    from tuning.data.data_config import job_data_config

    config = job_data_config(data_args)
    return any(
        handler.name == MULTIMODAL_HANDLER for dataset in config.datasets for handler in dataset.data_handlers or ()
    )


class VisionDataCollator:
    """A batch of rows (messages, images) as the processor's inputs: the chat template renders each conversation,
    the processor expands its image placeholders and prepares the pixels, and ``labels`` keep the tokens of the
    assistant turns only. A turn's tokens are found by rendering the conversation up to it (with the generation
    prompt) and through it, each processed with the images it holds so far, so that image tokens count as the model
    sees them. With ``max_length`` a batch longer than it is cut there (after the last image token: a cut through
    an image's tokens is a ``UserInputError``, since the model needs them all). With ``max_images`` 1, a row with
    more images gives the model its first (``model_row``).

    v3.1.0's calling convention works too: ``VisionDataCollator(processor)`` takes the fields from the rows'
    ``fields_name`` and the processor's keywords from their ``processor_kwargs`` (what its
    ``prepare_multimodal_data_processor`` handler leaves); a row whose text is a rendered string rather than messages
    is labelled as v3.1.0 labels it: every token but padding and image tokens."""

    def __init__(
        self,
        processor,
        text_field: str | None = None,
        image_field: str | None = None,
        base_dir: str | None = None,
        max_length: int | None = None,
        max_images: int | None = None,
    ):
        self.processor = processor
        self.max_length, self.max_images = max_length, max_images
        self.text_field, self.image_field, self.base_dir = text_field, image_field, base_dir
        processor.tokenizer.padding_side = "right"  # labels are placed from the start of each row
        if processor.tokenizer.pad_token is None:  # padding is never labelled: any token will do, as train() does
            processor.tokenizer.pad_token = processor.tokenizer.eos_token
        self.image_token_id = getattr(processor, "image_token_id", None)
        self._image_token_counts: dict[tuple[int, int], int] = {}

    def _length(self, messages: list, images: list, generation_prompt: bool) -> int:
        text = self.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
        used = images[: image_placeholders(messages)]
        encoded = self.processor(text=[text], images=[used] if used else None)
        return len(encoded["input_ids"][0])

    def first_label(self, row: dict) -> int | None:
        """The position of a row's first label token before any cut (the tokens of its prompt), None when it has
        no assistant turn; 0 for a rendered text (every token but image tokens is labelled). The prompt's text is
        tokenised with each image as the tokens an image of its size becomes (``_image_tokens``): images are not
        processed a row."""
        text_field, image_field = self._fields(row)
        text = row[text_field]
        if isinstance(text, str):
            return 0
        messages, values = model_row(text, image_values(row.get(image_field)), self.max_images)
        turn = next((index for index, message in enumerate(messages) if message.get("role") == "assistant"), None)
        if not turn:
            return None if turn is None else 0
        prompt = messages[:turn]
        token = getattr(self.processor, "image_token", None)
        if token is None:  # no placeholder to count by: the prompt processed with its images
            return self._length(prompt, [to_image(value, self.base_dir) for value in values], True)
        rendered = self.processor.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
        length = len(self.processor.tokenizer(rendered)["input_ids"])
        for value in values[: image_placeholders(prompt)]:
            length += self._image_tokens(image_size(value, self.base_dir)) - 1
        return length

    def _image_tokens(self, size: tuple[int, int]) -> int:
        """The tokens the processor turns one image placeholder into for an image of ``size`` (width, height),
        measured once per size: the count depends on the size alone, not on the pixels."""
        if size not in self._image_token_counts:
            from PIL import Image

            token = self.processor.image_token
            expanded = self.processor(text=[token], images=[[Image.new("RGB", size)]])["input_ids"][0]
            self._image_token_counts[size] = len(expanded) - len(self.processor.tokenizer(token)["input_ids"]) + 1
        return self._image_token_counts[size]

    def text_tokens(self, row: dict) -> list[int]:
        """A row's text as rendered by the chat template and tokenised, each image as its one placeholder token
        (no image is read)."""
        text_field, image_field = self._fields(row)
        text = row[text_field]
        if not isinstance(text, str):
            messages, _ = model_row(text, image_values(row.get(image_field)), self.max_images)
            text = self.processor.apply_chat_template(messages, tokenize=False)
        return self.processor.tokenizer(text, add_special_tokens=False)["input_ids"]

    def assistant_spans(self, messages: list, images: list) -> list[tuple[int, int]]:
        """``(start, end)`` token positions of each assistant turn of a conversation."""
        spans = []
        for index, message in enumerate(messages):
            if message.get("role") == "assistant":
                start = self._length(messages[:index], images, True) if index else 0
                spans.append((start, self._length(messages[: index + 1], images, False)))
        return spans

    def _fields(self, row: dict) -> tuple[str, str | None]:
        """The text and image columns: the collator's, else those the row's ``fields_name`` names."""
        fields = row.get("fields_name") or {}
        text_field = self.text_field or fields.get("dataset_text_field", DEFAULT_MESSAGES_FIELD)
        return text_field, self.image_field or fields.get("dataset_image_field")

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        text_field, image_field = self._fields(features[0])
        texts, images, spans = [], [], []
        for row in features:
            text = row[text_field]
            row_images = [to_image(value, self.base_dir) for value in image_values(row.get(image_field))]
            if isinstance(text, str):  # rendered already (v3.1.0's handler): every token is labelled
                texts.append(text)
                spans.append(None)
            else:
                text, row_images = model_row(text, row_images, self.max_images)
                texts.append(self.processor.apply_chat_template(text, tokenize=False))
                spans.append(self.assistant_spans(text, row_images))
            images.append(row_images)
        keywords = {**(features[0].get("processor_kwargs") or {}), "padding": True, "return_tensors": "pt"}
        batch = self.processor(text=texts, images=images if any(images) else None, **keywords)
        input_ids = batch["input_ids"]
        labels = torch.full_like(input_ids, IGNORE_INDEX)
        for row, row_spans in enumerate(spans):
            if row_spans is None:
                labels[row] = input_ids[row]
            for start, end in row_spans or ():
                labels[row, start:end] = input_ids[row, start:end]
        labels[batch["attention_mask"] == 0] = IGNORE_INDEX
        if self.image_token_id is not None:
            labels[input_ids == self.image_token_id] = IGNORE_INDEX
        batch["labels"] = labels
        return self._truncated(dict(batch))

    def _truncated(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        length = batch["input_ids"].shape[1]
        if self.max_length is None or length <= self.max_length:
            return batch
        if self.image_token_id is not None and (batch["input_ids"][:, self.max_length :] == self.image_token_id).any():
            raise UserInputError(
                f"--max_seq_length {self.max_length} cuts through a row's image tokens (the row is {length} tokens "
                "with its images): raise --max_seq_length or shorten the conversation"
            )
        for key in ("input_ids", "attention_mask", "labels", "token_type_ids", "mm_token_type_ids"):
            if key in batch:
                batch[key] = batch[key][:, : self.max_length]
        return batch
