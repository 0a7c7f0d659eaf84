"""Build a tiny Llama checkpoint and BPE tokenizer from nothing, offline, in seconds, for tests, the demo and the
benchmarks; the tokenizer is trained on the package's sample data, so its tokenisation is realistic.

    python -m tuning.utils.tiny_model OUTPUT_DIR [--vision llava|llava-next]
"""

import argparse
import json
import os

SAMPLE_DATA_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "samples")
SAMPLE_TRAIN_PATH = os.path.join(SAMPLE_DATA_DIR, "train.jsonl")
SAMPLE_VALIDATION_PATH = os.path.join(SAMPLE_DATA_DIR, "validation.json")

BOS, EOS, UNK = "<s>", "</s>", "<unk>"


def build_tokenizer(output_dir: str, vocab_size: int = 512, model_max_length: int = 512):
    """A byte-level BPE tokenizer with BOS/EOS/UNK and deliberately no pad token (train() must add one); it encodes
    as a Llama tokenizer does, BOS first (``<s> A``, a pair ``<s> A <s> B``), so that tests behave as on real models."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    with open(SAMPLE_TRAIN_PATH, encoding="utf-8") as handle:
        corpus = [json.loads(line)["output"] for line in handle if line.strip()]
    tokenizer = Tokenizer(models.BPE(unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[UNK, BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, tokenizer.token_to_id(BOS))]
    )
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token=BOS, eos_token=EOS, unk_token=UNK, model_max_length=model_max_length
    )
    wrapped.save_pretrained(output_dir)
    return wrapped


# The tiny Llama's shape (``llama_config``'s keywords): the tests' and the demo's model, and the vision models' language
# model.
TINY_LLAMA_SHAPE = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_length": 512,
}


def build_tiny_model(output_dir: str, hidden_size: int = 64, num_layers: int = 2, seed: int = 0) -> str:
    """Write a randomly initialised ~100k-parameter Llama and its tokenizer to ``output_dir``."""
    shape = {
        **TINY_LLAMA_SHAPE,
        "hidden_size": hidden_size,
        "intermediate_size": hidden_size * 2,
        "num_layers": num_layers,
    }
    return build_llama(output_dir, seed=seed, **shape)


def llama_config(
    tokenizer,
    hidden_size: int,
    intermediate_size: int,
    num_layers: int,
    num_attention_heads: int,
    num_key_value_heads: int,
    max_length: int,
):
    """The config of a Llama of this shape for ``tokenizer`` (its vocabulary and special tokens)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        max_position_embeddings=max_length,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
    )


def build_llama(output_dir: str, dtype: str = "float32", seed: int = 0, **shape: int) -> str:
    """Write a random Llama of any shape (``llama_config``'s keywords) in ``dtype``, and its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM

    os.makedirs(output_dir, exist_ok=True)
    tokenizer = build_tokenizer(output_dir, model_max_length=shape["max_length"])
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(llama_config(tokenizer, **shape), dtype=getattr(torch, dtype))
    model.save_pretrained(output_dir)
    return output_dir


def build_tiny_moe(output_dir: str, num_experts: int = 4, experts_per_token: int = 2, seed: int = 0) -> str:
    """Write a random tiny GraniteMoe (2 layers, ``num_experts`` experts of which ``experts_per_token`` are routed
    each token) and its tokenizer to ``output_dir``."""
    from transformers import GraniteMoeConfig

    return _build_from_config(
        output_dir,
        seed,
        lambda tokenizer: GraniteMoeConfig(
            **_tiny_shape(tokenizer), num_local_experts=num_experts, num_experts_per_tok=experts_per_token
        ),
    )


def build_tiny_hybrid(output_dir: str, num_experts: int = 4, experts_per_token: int = 2, seed: int = 0) -> str:
    """Write a random tiny GraniteMoeHybrid (Granite 4.0-h's architecture: a Mamba-2 layer and an attention layer,
    each with experts; Mamba runs on its PyTorch fallback on CPU) and its tokenizer to ``output_dir``."""
    from transformers import GraniteMoeHybridConfig

    return _build_from_config(
        output_dir,
        seed,
        lambda tokenizer: GraniteMoeHybridConfig(
            **_tiny_shape(tokenizer),
            num_local_experts=num_experts,
            num_experts_per_tok=experts_per_token,
            shared_intermediate_size=64,
            layer_types=["mamba", "attention"],
            mamba_n_heads=4,
            mamba_d_head=32,
            mamba_d_state=16,
            mamba_chunk_size=64,
            mamba_n_groups=1,
        ),
    )


def _tiny_shape(tokenizer) -> dict:
    """The shape the tiny mixture-of-experts models share (2 layers, width 64, experts of width 64)."""
    return {
        "vocab_size": len(tokenizer),
        "hidden_size": 64,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "tie_word_embeddings": False,
    }


def _build_from_config(output_dir: str, seed: int, make_config) -> str:
    """Write the tokenizer, then a random model of ``make_config(tokenizer)`` in float32, to ``output_dir``."""
    import torch
    from transformers import AutoModelForCausalLM

    os.makedirs(output_dir, exist_ok=True)
    tokenizer = build_tokenizer(output_dir)
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(make_config(tokenizer), dtype=torch.float32).save_pretrained(output_dir)
    return output_dir


BUILDERS = {"llama": build_tiny_model, "moe": build_tiny_moe, "hybrid": build_tiny_hybrid}


# The chat template of the tiny vision models: OpenAI-style messages whose ``content`` is a string or a list of
# ``{"type": "text", "text": ...}`` and ``{"type": "image"}`` parts; each turn ends with the EOS token.
VISION_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|' + message['role'] + '|>\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '<image>' }}{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{{ eos_token + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)
VISION_KINDS = ("llava", "llava-next")
IMAGE_TOKEN = "<image>"


def build_tiny_vision_model(output_dir: str, kind: str = "llava", seed: int = 0) -> str:
    """Write a random tiny vision-language model and its processor (tokenizer, image processor, chat template) to
    ``output_dir``: ``llava`` is LLaVA-1.5's architecture (a CLIP vision tower, a projector, a Llama), 32x32 images in
    4 patches; ``llava-next`` is granite-vision's (LLaVA-Next: a SigLIP tower, any-resolution tiles of 32x32 pixels
    chosen from a small grid, a Llama standing in for Granite). The CLIP tower's class token is why its processor has
    ``num_additional_image_tokens=1``: the processor then counts the features the model produces for an image."""
    import torch
    from transformers import (
        AutoModelForImageTextToText,
        CLIPImageProcessorPil,
        CLIPVisionConfig,
        LlavaConfig,
        LlavaNextConfig,
        LlavaNextImageProcessorPil,
        LlavaNextProcessor,
        LlavaProcessor,
        SiglipVisionConfig,
    )

    if kind not in VISION_KINDS:
        raise ValueError(f"unknown vision model kind {kind!r}; choose one of {', '.join(VISION_KINDS)}")
    os.makedirs(output_dir, exist_ok=True)
    tokenizer = build_tokenizer(output_dir)
    tokenizer.add_special_tokens({"extra_special_tokens": [IMAGE_TOKEN]})
    text_config = llama_config(tokenizer, **TINY_LLAMA_SHAPE)
    tower = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2}
    image_token_id = tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    crop = {"height": 32, "width": 32}
    if kind == "llava":
        config = LlavaConfig(
            vision_config=CLIPVisionConfig(image_size=32, patch_size=16, **tower),
            text_config=text_config,
            image_token_id=image_token_id,
            vision_feature_layer=-1,
        )
        image_processor = CLIPImageProcessorPil(size={"shortest_edge": 32}, crop_size=crop)
        processor = LlavaProcessor(
            image_processor=image_processor,
            tokenizer=tokenizer,
            patch_size=16,
            vision_feature_select_strategy="default",
            num_additional_image_tokens=1,
            chat_template=VISION_CHAT_TEMPLATE,
        )
    else:
        pinpoints = [[32, 32], [32, 64], [64, 32], [64, 64]]
        config = LlavaNextConfig(
            vision_config=SiglipVisionConfig(image_size=32, patch_size=16, **tower),
            text_config=text_config,
            image_token_id=image_token_id,
            image_grid_pinpoints=pinpoints,
            vision_feature_layer=-1,
            vision_feature_select_strategy="full",
        )
        image_processor = LlavaNextImageProcessorPil(
            size={"height": 32, "width": 32}, crop_size=crop, image_grid_pinpoints=pinpoints, do_center_crop=False
        )
        processor = LlavaNextProcessor(
            image_processor=image_processor,
            tokenizer=tokenizer,
            patch_size=16,
            vision_feature_select_strategy="full",
            chat_template=VISION_CHAT_TEMPLATE,
        )
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
    model.save_pretrained(output_dir)
    processor.save_pretrained(output_dir)
    return output_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output_dir")
    parser.add_argument(
        "--architecture",
        choices=sorted(BUILDERS),
        default="llama",
        help="llama (default), moe (GraniteMoe) or hybrid (GraniteMoeHybrid)",
    )
    parser.add_argument(
        "--vision", choices=VISION_KINDS, default=None, help="A vision-language model (and its processor) instead."
    )
    args = parser.parse_args()
    if args.vision:
        print(build_tiny_vision_model(args.output_dir, args.vision))
    else:
        print(BUILDERS[args.architecture](args.output_dir))


if __name__ == "__main__":
    main()
