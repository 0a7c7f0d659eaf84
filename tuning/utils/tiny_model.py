"""Build a tiny Llama checkpoint and BPE tokenizer from nothing, offline, in seconds, for tests, the demo and the
benchmarks; the tokenizer is trained on the package's sample data, so its tokenisation is realistic.

    python -m tuning.utils.tiny_model OUTPUT_DIR
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


def build_tiny_model(output_dir: str, hidden_size: int = 64, num_layers: int = 2, seed: int = 0) -> str:
    """Write a randomly initialised ~100k-parameter Llama and its tokenizer to ``output_dir``."""
    return build_llama(
        output_dir,
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_length=512,
        seed=seed,
    )


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output_dir")
    parser.add_argument(
        "--architecture",
        choices=sorted(BUILDERS),
        default="llama",
        help="llama (default), moe (GraniteMoe) or hybrid (GraniteMoeHybrid)",
    )
    args = parser.parse_args()
    print(BUILDERS[args.architecture](args.output_dir))


if __name__ == "__main__":
    main()
