"""Vision-language fine-tuning (``--dataset_image_field``) on the tiny LLaVA and LLaVA-Next of
``tuning.utils.tiny_model``: the labels mask, LoRA and full training in process, the CLI once, reloading the saved
result and generating, and every bad input refused as a user error before training."""

import io
import json
import logging
import re
import shutil
import sys

import datasets
import pytest
import torch
from PIL import Image
from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor

from tests.helpers.bench import read_dump, series
from tests.helpers.training import BENCH_TRAIN, SFT_TRAINER, TORCHRUN, load_script, run_main, run_python, two_ranks
from tuning import sft_trainer
from tuning.config.configs import DataArguments, ModelArguments, TrainingArguments
from tuning.config.peft_config import LoraConfig
from tuning.data.masking import IGNORE_INDEX
from tuning.data.vision import VisionDataCollator, find_conversation_column, images_per_row, model_row
from tuning.utils.error_logging import UserInputError
from tuning.utils.tiny_model import build_tiny_vision_model


@pytest.fixture(scope="module")
def tiny_llava(tmp_path_factory) -> str:
    return build_tiny_vision_model(str(tmp_path_factory.mktemp("tiny-llava")), "llava")


@pytest.fixture(scope="module")
def tiny_llava_next(tmp_path_factory) -> str:
    return build_tiny_vision_model(str(tmp_path_factory.mktemp("tiny-llava-next")), "llava-next")


def png(index: int, width: int = 32) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, 32), (30 * index % 256, 90, 200)).save(buffer, format="PNG")
    return buffer.getvalue()


def conversation(index: int, images: int = 1) -> list[dict]:
    parts = [{"type": "image", "text": None}] * images + [{"type": "text", "text": f"Which picture is {index}?"}]
    return [
        {"role": "user", "content": parts},
        {"role": "assistant", "content": [{"type": "text", "text": f"Picture {index}.", "image": None}]},
    ]


@pytest.fixture(scope="module")
def parquet_data(tmp_path_factory) -> str:
    """Parquet rows with Arrow image structs (bytes), one image each, images of two sizes."""
    path = tmp_path_factory.mktemp("vision-data") / "train.parquet"
    rows = [
        {"messages": conversation(i), "images": [{"bytes": png(i, 32 + 16 * (i % 2)), "path": None}]} for i in range(6)
    ]
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    return str(path)


@pytest.fixture(scope="module")
def json_data(tmp_path_factory) -> str:
    """JSON lines rows whose images are file paths relative to the data file, two images in a row."""
    folder = tmp_path_factory.mktemp("vision-json")
    for i in range(4):
        (folder / f"picture-{i}.png").write_bytes(png(i))
    lines = [
        json.dumps({"messages": conversation(i, 2), "images": [f"picture-{i}.png", f"picture-{(i + 1) % 4}.png"]})
        for i in range(4)
    ]
    (folder / "train.jsonl").write_text("\n".join(lines) + "\n")
    return str(folder / "train.jsonl")


def arguments(model: str, data: str, output_dir, data_options: dict | None = None, **training):
    return (
        ModelArguments(model_name_or_path=model, torch_dtype="float32"),
        DataArguments(training_data_path=data, dataset_image_field="images", **(data_options or {})),
        TrainingArguments(
            output_dir=str(output_dir),
            max_steps=2,
            per_device_train_batch_size=2,
            save_strategy="no",
            learning_rate=1e-2,
            trackers=[],
            **training,
        ),
    )


def reloads_and_generates(saved, architecture: str):
    """The saved result loaded with ``AutoModelForImageTextToText`` and the processor beside it, generating 3 tokens
    for a prompt with an image; returns the model."""
    model = AutoModelForImageTextToText.from_pretrained(str(saved))
    processor = AutoProcessor.from_pretrained(str(saved))
    assert type(model).__name__ == architecture
    prompt = processor.apply_chat_template(conversation(2)[:1], tokenize=False, add_generation_prompt=True)
    inputs = processor(text=[prompt], images=[Image.open(io.BytesIO(png(2)))], return_tensors="pt")
    generated = model.generate(**inputs, max_new_tokens=3, min_new_tokens=3, do_sample=False)
    assert generated.shape[1] == inputs["input_ids"].shape[1] + 3
    return model


@pytest.mark.parametrize(
    "kind, image_tokens, pixels",
    [
        ("llava", 4, (2, 3, 32, 32)),  # 4 patches, the class token dropped
        ("llava-next", None, None),  # any-resolution tiles and their newline tokens
    ],
)
def test_labels_are_the_assistant_text_only(kind, image_tokens, pixels, request):
    model = request.getfixturevalue({"llava": "tiny_llava", "llava-next": "tiny_llava_next"}[kind])
    processor = AutoProcessor.from_pretrained(model)
    processor.tokenizer.pad_token = processor.tokenizer.eos_token
    two_turns = conversation(1) + [
        {"role": "user", "content": [{"type": "text", "text": "And again?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Still 1."}]},
    ]
    rows = [
        {"messages": conversation(0), "images": [{"bytes": png(0), "path": None}]},
        {"messages": two_turns, "images": [Image.open(io.BytesIO(png(1)))]},
    ]
    batch = VisionDataCollator(processor, "messages", "images")(rows)
    image_token = processor.image_token_id
    counts = (batch["input_ids"] == image_token).sum(dim=1).tolist()
    assert counts[0] == counts[1] == (image_tokens or counts[0]) > 0
    eos = processor.tokenizer.eos_token
    for row, answers in zip(batch["labels"], (["Picture 0."], ["Picture 1.", "Still 1."]), strict=True):
        labelled = row[row != IGNORE_INDEX]
        assert image_token not in labelled.tolist()
        assert processor.tokenizer.decode(labelled) == "".join(f"{answer}{eos}\n" for answer in answers)
    assert batch["labels"][batch["attention_mask"] == 0].eq(IGNORE_INDEX).all()
    assert pixels is None or batch["pixel_values"].shape == pixels


def test_v3_1_0_calling_convention_labels_all_but_padding_and_image_tokens(tiny_llava):
    """v3.1.0's ``VisionDataCollator(processor)`` on rows its handler leaves: fields and processor keywords in each
    row, the text rendered already."""
    from tuning.data.collators import VisionDataCollator as UpstreamName

    processor = AutoProcessor.from_pretrained(tiny_llava)
    processor.tokenizer.pad_token = processor.tokenizer.eos_token
    fields = {"dataset_text_field": "text", "dataset_image_field": "image"}
    rows = [
        {"text": text, "image": [Image.open(io.BytesIO(png(i)))], "fields_name": fields, "processor_kwargs": {}}
        for i, text in enumerate(["<image>Describe the image.", "<image>Describe it, please, in a few words."])
    ]
    batch = UpstreamName(processor)(rows)
    expected = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, IGNORE_INDEX)
    expected[batch["input_ids"] == processor.image_token_id] = IGNORE_INDEX
    assert torch.equal(batch["labels"], expected) and (batch["attention_mask"] == 0).any()


def test_max_seq_length_cuts_after_the_image_tokens_never_through_them(tiny_llava):
    processor = AutoProcessor.from_pretrained(tiny_llava)
    processor.tokenizer.pad_token = processor.tokenizer.eos_token
    rows = [{"messages": conversation(0), "images": [png(0)]}]
    whole = VisionDataCollator(processor, "messages", "images")(rows)
    last_image = int((whole["input_ids"][0] == processor.image_token_id).nonzero().max())
    cut = VisionDataCollator(processor, "messages", "images", max_length=last_image + 3)(rows)
    assert cut["input_ids"].shape[1] == last_image + 3 < whole["input_ids"].shape[1]
    assert torch.equal(cut["labels"], whole["labels"][:, : last_image + 3])
    with pytest.raises(UserInputError, match="--max_seq_length 3 cuts through a row's image tokens"):
        VisionDataCollator(processor, "messages", "images", max_length=3)(rows)


def test_lora_trains_saves_and_reloads_to_generate(tiny_llava, json_data, tmp_path, caplog):
    """train(), LoRA on LLaVA, which takes one image a row: rows of two images use their first, with one warning for
    the job (not one a row); the adapter reloads on its base with the processor and generates."""
    with caplog.at_level(logging.WARNING, logger="tuning.data.vision"):
        trainer, info, _ = sft_trainer.train(
            *arguments(tiny_llava, json_data, tmp_path / "out"), LoraConfig(r=4, lora_alpha=8)
        )
    warnings = [record.getMessage() for record in caplog.records if "takes one image a row" in record.getMessage()]
    assert len(warnings) == 1 and "4 rows give more" in warnings[0]
    adapted = {name for name, parameter in trainer.model.named_parameters() if parameter.requires_grad}
    assert adapted and all("language_model" in name and "lora_" in name for name in adapted)
    assert any("q_proj" in name for name in adapted) and any("v_proj" in name for name in adapted)
    sft_trainer.save(str(tmp_path / "saved"), trainer)
    # the base named by the adapter, adapter on top
    model = reloads_and_generates(tmp_path / "saved", "LlavaForConditionalGeneration")
    loaded = {name: value for name, value in model.named_parameters() if "lora_B" in name}
    trained = {name: value for name, value in trainer.model.named_parameters() if "lora_B" in name}
    assert len(loaded) == len(trained) == 4  # 2 layers, q and v
    assert all(torch.equal(a, b) for a, b in zip(loaded.values(), trained.values(), strict=True))
    assert any(value.abs().sum() > 0 for value in loaded.values())


def test_full_fine_tuning_of_llava_next_through_the_cli(tiny_llava_next, json_data, tmp_path, monkeypatch):
    """The CLI in process (main()), granite-vision's architecture, two images per row given as relative paths."""
    before = AutoModelForImageTextToText.from_pretrained(tiny_llava_next).state_dict()
    args = [
        *("--model_name_or_path", tiny_llava_next, "--training_data_path", json_data),
        *("--dataset_text_field", "messages", "--dataset_image_field", "images", "--torch_dtype", "float32"),
        *("--output_dir", str(tmp_path / "out"), "--save_model_dir", str(tmp_path / "saved"), "--max_steps", "2"),
        *("--per_device_train_batch_size", "2", "--learning_rate", "1e-2", "--save_strategy", "no"),
        *("--trackers", "none"),
    ]
    monkeypatch.setattr(sys, "argv", [SFT_TRAINER, *args])
    assert sft_trainer.main() == 0
    after = reloads_and_generates(tmp_path / "saved", "LlavaNextForConditionalGeneration").state_dict()
    changed = [name for name, value in before.items() if not torch.equal(value, after[name])]
    assert any("language_model" in name for name in changed) and any("vision_tower" in name for name in changed)


def _bad(tmp_path, rows) -> str:
    path = tmp_path / "bad.parquet"
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    return str(path)


def _image_column(folder, images: list, remove: str | None = None) -> str:
    """Parquet rows whose ``images`` column is ``datasets``' Image feature (as a Hub dataset's Parquet carries it):
    ``bytes``, or a file name written beside the data file (``remove``: deleted once written)."""
    for image in images:
        if isinstance(image, str):
            (folder / image).write_bytes(png(1))
    structs = [
        {"bytes": None, "path": str(folder / image)} if isinstance(image, str) else {"bytes": image, "path": None}
        for image in images
    ]
    rows = [{"messages": conversation(i), "images": [image]} for i, image in enumerate(structs)]
    path = folder / "images.parquet"
    data = datasets.Dataset.from_list(rows).cast_column("images", datasets.List(datasets.Image()))
    data.to_parquet(str(path))
    if remove:
        (folder / remove).unlink()
    return str(path)


def _no_processor(model: str, tmp_path) -> str:
    copy = tmp_path / "no-processor"
    shutil.copytree(model, copy)
    (copy / "processor_config.json").unlink()
    return str(copy)


def _one(tmp, model: str, **row) -> tuple[str, str]:
    return model, _bad(tmp, [{"messages": conversation(0), "images": [png(0)], **row}])


# A chat template that drops the image parts: the rendered text holds no image token.
TEXT_ONLY_TEMPLATE = (
    "{% for m in messages %}{% for p in m.content %}{% if p.type == 'text' %}{{ p.text }}{% endif %}{% endfor %}"
    "{% endfor %}"
)

# Each case: (models -> (model, data[, DataArguments options]), the message's words).
BAD_INPUTS = {
    "image column missing": (
        lambda tmp, m: (m["llava"], _bad(tmp, [{"messages": conversation(0), "pictures": [png(0)]}])),
        "no column 'images'",
    ),
    "image column empty": (
        lambda tmp, m: (m["llava"], _bad(tmp, [{"messages": conversation(0, 0), "images": []}] * 2)),
        "the column is empty",
    ),
    "image does not decode": (
        lambda tmp, m: (
            m["llava"],
            _bad(
                tmp, [{"messages": conversation(i), "images": [png(i) if i != 1 else b"not a png"]} for i in range(3)]
            ),
        ),
        "row 2, image 0: the image does not decode",  # rows counted from 1
    ),
    "more images than placeholders": (  # LLaVA-Next takes them all (LLaVA would use the first)
        lambda tmp, m: _one(tmp, m["llava-next"], images=[png(0), png(1)]),
        "row 1: 2 images but 1 image placeholders",
    ),
    "images but no image token in the rendered text": (
        lambda tmp, m: (*_one(tmp, m["llava"]), {"chat_template": TEXT_ONLY_TEMPLATE}),
        "row 1: 1 images but its text, rendered by the chat template, holds 0 image tokens ('<image>')",
    ),
    "a corrupt image in an Image column": (  # datasets decoded it before any check: exit 203 and a traceback
        lambda tmp, m: (m["llava"], _image_column(tmp, [png(0), b"not a png", png(2)])),
        "images.parquet, row 2, image 0: the image does not decode",
    ),
    "an image struct whose file is gone": (
        lambda tmp, m: (m["llava"], _image_column(tmp, [png(0), "gone.png"], remove="gone.png")),
        "images.parquet, row 2, image 0: image file",
    ),
    "no conversation column found": (
        lambda tmp, m: (m["llava"], _bad(tmp, [{"text": "Picture 0.", "images": [png(0)]}])),
        "no column of conversations found (none of messages, conversation, chat, turns",
    ),
    "text-only model": (
        lambda tmp, m: _one(tmp, m["text"]),
        "is a text-only model (LlamaConfig)",
    ),
    "vision model without a processor": (
        lambda tmp, m: _one(tmp, _no_processor(m["llava"], tmp)),
        "needs its processor",
    ),
}


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_bad_input_is_a_user_error_before_training(name, tiny_llava, tiny_llava_next, tiny_model, tmp_path):
    make, message = BAD_INPUTS[name]
    model, data, *options = make(tmp_path, {"llava": tiny_llava, "llava-next": tiny_llava_next, "text": tiny_model})
    with pytest.raises(UserInputError, match=re.escape(message)):
        sft_trainer.train(*arguments(model, data, tmp_path / "out", *options))
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_models_given_one_image_a_row_are_llava_and_granite_vision():
    """As fms-hf-tuning feeds them: LLaVA-1.5, and LLaVA-Next only with a Granite language model (granite-vision)."""
    from transformers import GraniteConfig, LlamaConfig, LlavaConfig, LlavaNextConfig, Qwen2VLConfig

    assert images_per_row(LlavaConfig()) == 1
    assert images_per_row(LlavaNextConfig(text_config=GraniteConfig().to_dict())) == 1
    assert images_per_row(LlavaNextConfig(text_config=LlamaConfig().to_dict())) is None
    assert images_per_row(Qwen2VLConfig()) is None and images_per_row(None) is None


def test_the_conversation_column_is_found_when_not_named():
    """3.2's order (messages, conversation, chat, turns), the first holding a list of messages in its first row."""
    rows = [{"messages": "not a conversation", "chat": conversation(0), "turns": conversation(1)}]
    assert find_conversation_column(datasets.Dataset.from_list(rows), "data") == "chat"


def multimodal_data_config(tmp_path, data: str) -> str:
    """v3.1.0's vision data config: the chat template renders the conversations (column not named: found, as 3.2
    finds it) into ``text``, then ``prepare_multimodal_data_processor`` names the fields for the collator."""
    render = {"fn_kwargs": {"formatted_text_column_name": "text"}}
    fields = {"dataset_text_field": "text", "dataset_image_field": "images"}
    handlers = [
        {"name": "apply_tokenizer_chat_template", "arguments": render},
        {"name": "prepare_multimodal_data_processor", "arguments": {"fn_kwargs": {"fields_name": fields}}},
    ]
    config = {"datasets": [{"name": "pictures", "data_paths": [data], "data_handlers": handlers}]}
    path = tmp_path / "vision.json"
    path.write_text(json.dumps(config))
    return str(path)


def test_a_data_config_with_the_multimodal_handler_trains(tiny_llava_next, tiny_model, parquet_data, tmp_path):
    """v3.1.0's data config (no --dataset_image_field: the handler names the fields) trains LLaVA-Next through
    train(): the rows hold the rendered text, one image token an image, and the collator labels them as v3.1.0 does
    (all but padding and image tokens); the same config on a text-only model is a user error before training."""
    config = multimodal_data_config(tmp_path, parquet_data)
    model_args, _, train_args = arguments(tiny_llava_next, parquet_data, tmp_path / "out")
    trainer, _, _ = sft_trainer.train(model_args, DataArguments(data_config_path=config), train_args)
    assert trainer.state.global_step == 2
    row = trainer.train_dataset[0]
    assert row["text"].count("<image>") == len(row["images"]) == 1 and "Picture 0." in row["text"]
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(2)])
    image_token = trainer.processing_class.image_token_id
    assert (batch["input_ids"] == image_token).any() and not (batch["labels"] == image_token).any()
    with pytest.raises(UserInputError, match=r"\(prepare_multimodal_data_processor\): .* is a text-only model"):
        sft_trainer.train(
            ModelArguments(model_name_or_path=tiny_model), DataArguments(data_config_path=config), train_args
        )


def test_relative_image_paths_are_read_beside_the_data_file(tiny_llava, tmp_path, monkeypatch):
    """Not from the working directory: path structs of an Image column, and file names in rows a data config's
    multimodal handler reads."""
    from tuning.data.setup_dataprocessor import prepare_vision_data

    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "picture.png").write_bytes(png(3))
    rows = [{"messages": conversation(i), "images": [{"bytes": None, "path": "picture.png"}]} for i in range(2)]
    monkeypatch.chdir(folder)  # datasets measures the images as it writes
    structs = str(folder / "structs.parquet")
    datasets.Dataset.from_list(rows).cast_column("images", datasets.List(datasets.Image())).to_parquet(structs)
    names = folder / "names.jsonl"
    names.write_text(
        "".join(json.dumps({"messages": conversation(i), "images": ["picture.png"]}) + "\n" for i in range(2))
    )
    monkeypatch.chdir(tmp_path)
    processor = AutoProcessor.from_pretrained(tiny_llava)
    train_args = arguments(tiny_llava, structs, tmp_path / "out")[2]
    for data_args in (
        DataArguments(training_data_path=structs, dataset_image_field="images"),
        DataArguments(data_config_path=multimodal_data_config(folder, str(names))),
    ):
        (train, _), collator = prepare_vision_data(data_args, train_args, processor, 256)
        assert collator([train[0], train[1]])["pixel_values"].shape[0] == 2


def test_the_chat_template_handler_refuses_a_row_with_images_and_no_image_token(tiny_llava):
    """3.2's check in apply_tokenizer_chat_template with a processor: images, but no image part to render."""
    from tuning.data.data_handlers import apply_tokenizer_chat_template

    processor = AutoProcessor.from_pretrained(tiny_llava)
    row = {"messages": conversation(0, images=0), "images": [png(0)]}
    with pytest.raises(
        UserInputError, match="the row has images but its text, rendered by the chat template, holds no image token"
    ):
        apply_tokenizer_chat_template(row, "text", tokenizer=processor.tokenizer, processor=processor)


def test_v3_1_0_process_dataargs_with_a_processor_returns_the_vision_data_and_collator(
    tiny_llava, parquet_data, tmp_path
):
    from tuning.data.setup_dataprocessor import process_dataargs

    processor = AutoProcessor.from_pretrained(tiny_llava)
    _, data_args, train_args = arguments(tiny_llava, parquet_data, tmp_path / "out")
    train, evaluation, field, collator, _, dataset_kwargs = process_dataargs(
        data_args, processor.tokenizer, train_args, processor=processor
    )
    assert (len(train), evaluation, field, dataset_kwargs) == (6, None, "messages", {"skip_prepare_dataset": True})
    batch = collator([train[0], train[1]])
    assert (batch["input_ids"] == processor.image_token_id).sum() == 8 and "pixel_values" in batch


def test_do_dataprocessing_only_writes_the_checked_rows_and_loads_no_model(tiny_llava, parquet_data, tmp_path):
    """As on the text path: train() returns (None, None, None) and output_dir holds the rows that would train."""
    from datasets import load_dataset

    model_args, data_args, train_args = arguments(tiny_llava, parquet_data, tmp_path / "out")
    data_args.do_dataprocessing_only = True
    assert sft_trainer.train(model_args, data_args, train_args) == (None, None, None)
    written = load_dataset("parquet", data_dir=str(tmp_path / "out" / "train_dataset"), split="train")
    assert len(written) == 6 and {"messages", "images"} <= set(written.column_names)
    assert not list((tmp_path / "out").glob("checkpoint-*"))


def prompt_length(model: str, index: int, image: bytes) -> int:
    """The tokens of row ``index``'s user turn and generation prompt with its image, as the processor makes them."""
    processor = AutoProcessor.from_pretrained(model)
    prompt = processor.apply_chat_template(conversation(index)[:1], tokenize=False, add_generation_prompt=True)
    return len(processor(text=[prompt], images=[Image.open(io.BytesIO(image))])["input_ids"][0])


@pytest.mark.parametrize("kind", ["llava", "llava-next"])
def test_a_prompt_is_measured_as_the_processor_makes_it_without_processing_its_images(kind, request):
    """first_label (one tokenisation a row, each image's tokens measured once per size) agrees with the collator's
    own spans (the prompt processed with its images) for images of several sizes, one or two a row."""
    model = request.getfixturevalue({"llava": "tiny_llava", "llava-next": "tiny_llava_next"}[kind])
    processor = AutoProcessor.from_pretrained(model)
    collate = VisionDataCollator(
        processor, "messages", "images", max_images=images_per_row(AutoConfig.from_pretrained(model))
    )
    for index, widths in enumerate([(32,), (48,), (80, 32), (120, 48)]):
        images = [png(index, width) for width in widths]
        row = {"messages": conversation(index, len(images)), "images": images}
        messages, kept = model_row(
            row["messages"], [Image.open(io.BytesIO(image)).convert("RGB") for image in images], collate.max_images
        )
        assert collate.first_label(row) == collate.assistant_spans(messages, kept)[0][0]


def test_a_max_seq_length_that_cuts_every_assistant_token_is_refused(
    tiny_llava, parquet_data, tmp_path, monkeypatch, capfd
):
    """The CLI (main()): a cut after the image tokens and before the first answer token left every label -100 (loss
    0.0 at every step, exit 0); refused before the model loads, naming the data, its rows and the longest prompt."""
    prompts = [prompt_length(tiny_llava, i, png(i, 32 + 16 * (i % 2))) for i in range(6)]
    cut, longest = min(prompts), max(prompts)
    args = [
        *("--model_name_or_path", tiny_llava, "--training_data_path", parquet_data, "--dataset_image_field", "images"),
        *("--output_dir", str(tmp_path / "out"), "--max_seq_length", str(cut), "--torch_dtype", "float32"),
        *("--trackers", "none", "--save_strategy", "no", "--max_steps", "2"),
    ]
    code, stderr = run_main(args, monkeypatch, capfd)
    assert code == 1
    assert (
        f"UserInputError: --training_data_path {parquet_data}: none of its 6 rows keeps a token to train on: 6 lost "
        f"every label to truncation at --max_seq_length {cut} (the longest prompt takes {longest} tokens); raise "
        "--max_seq_length or shorten the prompts"
    ) in stderr


def test_rows_whose_answers_a_max_seq_length_cuts_away_are_left_out_with_one_warning(tiny_llava, tmp_path, caplog):
    """train() with --do_dataprocessing_only: the rows written are those that keep an answer token; one warning
    names how many were left out, of which data, and why."""
    from datasets import load_dataset

    long_question = [{"type": "image"}, {"type": "text", "text": "Which picture is it? " * 8}]
    rows = [{"messages": conversation(i), "images": [png(i)]} for i in range(4)]
    for row in rows[1:3]:
        row["messages"] = [{"role": "user", "content": long_question}, row["messages"][1]]
    data = _bad(tmp_path, rows)
    short = prompt_length(tiny_llava, 0, png(0))
    model_args, data_args, train_args = arguments(tiny_llava, data, tmp_path / "out", max_seq_length=short + 4)
    data_args.do_dataprocessing_only = True
    with caplog.at_level(logging.WARNING, logger="tuning.data.labels"):
        sft_trainer.train(model_args, data_args, train_args)
    (warning,) = [record.getMessage() for record in caplog.records]
    assert warning.startswith(
        f"--training_data_path {data}: 2 of 4 rows keep no token to train on and are left out: 2 lost every label "
        f"to truncation at --max_seq_length {short + 4} (the longest prompt takes "
    )
    written = load_dataset("parquet", data_dir=str(tmp_path / "out" / "train_dataset"), split="train")
    assert [row["messages"][0]["content"][1]["text"] for row in written] == [
        "Which picture is 0?",
        "Which picture is 3?",
    ]


def test_alora_whose_invocation_tokens_occur_in_no_conversation_is_refused(tiny_llava, parquet_data, tmp_path):
    """train(), aLoRA on LLaVA: the conversations rendered by the chat template never hold the invocation's tokens."""
    lora = LoraConfig(r=4)
    lora.alora_invocation_string = "### Answer:"
    with pytest.raises(UserInputError, match="occur in none of the 6 rows of --training_data_path"):
        sft_trainer.train(*arguments(tiny_llava, parquet_data, tmp_path / "out"), lora)


def test_packing_is_refused(tiny_llava, parquet_data, tmp_path):
    with pytest.raises(UserInputError, match="--packing with --dataset_image_field"):
        sft_trainer.train(*arguments(tiny_llava, parquet_data, tmp_path / "out", packing=True))


def test_bench_train_counts_image_tokens_apart_and_names_the_run(tiny_llava, parquet_data, tmp_path):
    """bench_train in process, full fine-tuning of LLaVA: the dump's config names the image field and model class;
    each step's image tokens (2 rows, one 32x32 image each: 4 tokens an image) are a series, and the summary splits
    the throughput; the saved model (tower trained too) reloads with its processor and generates."""
    bench_train = load_script(BENCH_TRAIN)
    args = [
        *("--model_name_or_path", tiny_llava, "--training_data_path", parquet_data, "--dataset_image_field", "images"),
        *("--output_dir", str(tmp_path / "out"), "--metrics_path", str(tmp_path / "bench.json"), "--max_steps", "3"),
        *("--per_device_train_batch_size", "2", "--save_strategy", "no", "--torch_dtype", "float32"),
        *("--skip_warmup_steps", "1", "--trackers", "none", "--save_model_dir", str(tmp_path / "saved")),
        *("--memory_estimate", "False"),
    ]
    assert bench_train.main(args) == 0
    saved = reloads_and_generates(tmp_path / "saved", "LlavaForConditionalGeneration").state_dict()
    base = AutoModelForImageTextToText.from_pretrained(tiny_llava).state_dict()
    assert any(not torch.equal(value, saved[name]) for name, value in base.items() if "vision_tower" in name)
    dump = read_dump(tmp_path / "bench.json")
    # The vision collator tokenised the rows: no data handler ran (the dump once named the text path's).
    assert dump["data"]["tokenised_by"] == "vision_collator"
    assert [(d["name"], d["handlers"]) for d in dump["data"]["datasets"]] == [("training_data", [])]
    # 3 steps of 2 rows: one epoch of the 6 rows, each trained on its answer's tokens (a row's first label excluded).
    processor = AutoProcessor.from_pretrained(tiny_llava)
    collate = VisionDataCollator(processor, "messages", "images")
    answers = [
        int(collate([row])["labels"][0, 1:].ne(IGNORE_INDEX).sum())
        for row in datasets.load_dataset("parquet", data_files=parquet_data, split="train")
    ]
    steps = series(dump, "step_label_tokens")["values"]
    assert len(steps) == 3 and all(step > 0 for step in steps)
    assert dump["summary"]["label_tokens"] == sum(steps) == sum(answers)
    assert dump["config"]["dataset_image_field"] == "images"
    assert dump["config"]["model_class"] == "LlavaForConditionalGeneration"
    assert series(dump, "step_image_tokens")["values"] == [8, 8, 8]
    summary = dump["summary"]
    assert summary["image_tokens_per_second"] > 0
    assert summary["text_tokens_per_second"] + summary["image_tokens_per_second"] == pytest.approx(
        summary["tokens_per_second"]
    )
    # MFU's FLOPs: the language model per token and the image path (trained too) per image token, and the split
    assert 0 < summary["vision_flops_fraction"] < 1
    assert summary["model_flops_per_token"] == pytest.approx(
        summary["language_flops_per_token"] / (1 - summary["vision_flops_fraction"])
    )


@pytest.mark.slow
def test_sft_trainer_on_two_torchrun_ranks_lora_on_llava_next(tiny_llava_next, json_data, tmp_path):
    """``torchrun tuning/sft_trainer.py`` on 2 ranks, LoRA on LLaVA-Next, two images a row: rank 0 saves the adapter,
    which reloads on its base with the processor and generates."""
    args = [
        *(
            "--model_name_or_path",
            tiny_llava_next,
            "--training_data_path",
            json_data,
            "--dataset_image_field",
            "images",
        ),
        *("--output_dir", str(tmp_path / "out"), "--save_model_dir", str(tmp_path / "saved"), "--max_steps", "2"),
        *("--per_device_train_batch_size", "2", "--save_strategy", "no", "--torch_dtype", "float32"),
        *("--trackers", "none", "--peft_method", "lora", "--learning_rate", "1e-2"),
    ]
    process = run_python(*TORCHRUN, *two_ranks(SFT_TRAINER, args))
    assert process.returncode == 0, process.stderr[-3000:]
    model = reloads_and_generates(tmp_path / "saved", "LlavaNextForConditionalGeneration")
    trained = [value for name, value in model.named_parameters() if "lora_B" in name]
    assert trained and any(value.abs().sum() > 0 for value in trained)
