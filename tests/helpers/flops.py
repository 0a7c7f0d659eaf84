"""The tiny Llama's FLOPs counted by hand, for the tests that check the dump's ``model_flops_per_token``."""

LAYERS = 2
ATTENTION_WIDTH = 64  # 4 heads of 16
# LoRA's defaults (r=8 on q_proj 64→64 and v_proj 64→32), per layer: A is in x r, B is r x out.
LORA_WEIGHTS = LAYERS * ((64 * 8 + 8 * 64) + (64 * 8 + 8 * 32))


def tiny_llama_matmul_weights(vocab: int) -> int:
    """The tiny Llama (hidden 64, MLP 128, 2 layers, 4 heads of 16, 2 key/value heads, untied head): per layer q 64x64,
    k and v 64x32, o 64x64, gate and up 64x128, down 128x64, two norms of 64; a final norm of 64 and the output head
    64 x vocab. The token embedding is a lookup: not counted."""
    per_layer = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128 + 2 * 64
    return LAYERS * per_layer + 64 + 64 * vocab


def attention_flops(sequence_length: float) -> float:
    return 12 * LAYERS * ATTENTION_WIDTH * sequence_length
