"""Model FLOPs per trained token and the devices' dense peak, for model FLOPs utilisation (MFU).

The formula is PaLM's (Chowdhery et al. 2022, appendix B) and Chinchilla's (Hoffmann et al. 2022, appendix F): a
matrix multiplication with N weights costs 2N FLOPs per token forward and 4N backward (2N for the gradient of its
input, 2N for the gradient of its weights), so a fully trained model costs 6N, plus 12 × layers × attention width ×
sequence length for the attention scores and their weighted sum. A frozen weight (LoRA's and prompt tuning's base
model) needs no weight gradient: 4N. An embedding lookup is no multiplication: its weights count nowhere. A
mixture-of-experts layer runs only the experts each token is routed to: its experts' weights count k/E of their
number (k routed of E experts per layer), the router and any shared expert in full.
Only ``parameter_counts`` and ``config_parameter_counts`` need torch; the rest is plain arithmetic for ``dump``.
"""

import re
from typing import Any

# Dense (no sparsity) bf16/fp16 tensor-core peaks in TFLOP/s per device, from each vendor's datasheet, matched
# against the CUDA device name in this order (the first pattern found in the name wins).
PEAK_TFLOPS: list[tuple[str, float, str]] = [
    (r"H200 NVL", 835.0, "NVIDIA H200 NVL datasheet: BF16 1671 TFLOPS with sparsity"),
    (r"H200", 989.0, "NVIDIA H200 SXM datasheet: BF16 1979 TFLOPS with sparsity"),
    (r"H100 NVL", 835.0, "NVIDIA H100 NVL datasheet: BF16 1671 TFLOPS with sparsity"),
    (r"H100 PCIe", 756.0, "NVIDIA H100 PCIe datasheet: BF16 1513 TFLOPS with sparsity"),
    (r"H100", 989.0, "NVIDIA H100 SXM datasheet: BF16 1979 TFLOPS with sparsity"),
    (r"A100", 312.0, "NVIDIA A100 datasheet: BF16 312 TFLOPS (624 with sparsity)"),
    (r"L40S", 362.0, "NVIDIA L40S datasheet: BF16 362.05 TFLOPS (733 with sparsity)"),
    (r"\bL4\b", 121.0, "NVIDIA L4 datasheet: BF16 242 TFLOPS with sparsity"),
    (r"\bA10\b", 125.0, "NVIDIA A10 datasheet: BF16 250 TFLOPS with sparsity"),
    (r"MI300X|MI325X", 1307.4, "AMD Instinct MI300X/MI325X datasheets: BF16 1307.4 TFLOPS dense"),
    (r"MI250X", 383.0, "AMD Instinct MI250X datasheet: BF16 383 TFLOPS"),
]


def peak_tflops_of(device_name: str | None) -> float | None:
    """The dense bf16/fp16 peak of the device called ``device_name``, or None for one the table lacks (or no name)."""
    if not device_name:
        return None
    return next((peak for pattern, peak, _ in PEAK_TFLOPS if re.search(pattern, device_name)), None)


# The modules of a vision-language model's image path (LLaVA-style: transformers' Llava, LlavaNext and their kin).
VISION_MODULES = ("vision_tower", "multi_modal_projector")


def flops_per_token(counts: dict[str, int], sequence_length: float) -> float:
    """Training FLOPs per token of the language model: 4 × frozen + 6 × trained matmul weights + 12 × layers ×
    attention width × length."""
    return (
        4 * counts["frozen_matmul_parameters"]
        + 6 * counts["trained_matmul_parameters"]
        + 12 * counts["layers"] * counts["attention_width"] * sequence_length
    )


def vision_flops_per_image_token(counts: dict[str, int]) -> float | None:
    """Training FLOPs of a vision-language model's image path (vision tower and projector) per image token; None for
    a model without one. The tower runs once per image position (taken as one per image token) over its own sequence
    (``vision_sequence_length``: an image's or tile's patches, with a class token where it has one). With a weight of
    the path trained, 4 × frozen + 6 × trained weights + 12 × layers × attention width × sequence, as the language
    model's; with none trained no gradient flows into it: its forward only, 2 × weights + 4 × layers × width ×
    sequence."""
    if "vision_layers" not in counts:
        return None
    frozen, trained = counts["vision_frozen_matmul_parameters"], counts["vision_trained_matmul_parameters"]
    attention = counts["vision_layers"] * counts["vision_attention_width"] * counts["vision_sequence_length"]
    if trained:
        return 4 * frozen + 6 * trained + 12 * attention
    return 2 * frozen + 4 * attention


def parameter_counts(model: Any) -> dict[str, int]:
    """The counts ``flops_per_token`` takes, of a (PEFT-wrapped or plain) transformers model: the weights of every
    module but embeddings, each once (a tied output head counts as the multiplication it is), split by
    ``requires_grad``, a mixture-of-experts model's expert weights (those of its ``experts`` modules, whole when
    sharded over ranks) as the share a token runs; the layers and attention width (heads × head size) from its text
    config. A vision-language model's image path (its ``VISION_MODULES``) is counted apart, in the ``vision_*``
    keys ``vision_flops_per_image_token`` takes."""
    import torch

    config = model.config.get_text_config()
    experts = getattr(config, "num_local_experts", None) or getattr(config, "num_experts", None)
    active_share = (getattr(config, "num_experts_per_tok", None) or experts) / experts if experts else 1.0
    weights = {(False, False): 0.0, (False, True): 0.0, (True, False): 0.0, (True, True): 0.0}  # (vision, trained)
    counted: set[int] = set()
    vision_positions = None
    for name, module in model.named_modules():
        parts = name.split(".")
        vision = any(part in VISION_MODULES for part in parts)
        if vision and vision_positions is None and isinstance(getattr(module, "num_positions", None), int):
            vision_positions = module.num_positions  # the tower's embeddings: patches (+ a class token)
        if isinstance(module, torch.nn.Embedding):
            continue
        share = active_share if "experts" in parts else 1.0
        for parameter in module.parameters(recurse=False):
            if id(parameter) in counted:
                continue
            counted.add(id(parameter))
            weights[vision, parameter.requires_grad] += parameter.numel() * share
    heads = config.num_attention_heads
    head_size = getattr(config, "head_dim", None) or config.hidden_size // heads
    counts = {
        "frozen_matmul_parameters": round(weights[False, False]),
        "trained_matmul_parameters": round(weights[False, True]),
        "layers": config.num_hidden_layers,
        "attention_width": heads * head_size,
    }
    vision_config = getattr(model.config, "vision_config", None)
    if vision_config is not None and (weights[True, False] or weights[True, True]):
        if vision_positions is None:
            vision_positions = (vision_config.image_size // vision_config.patch_size) ** 2
        counts.update(
            vision_frozen_matmul_parameters=round(weights[True, False]),
            vision_trained_matmul_parameters=round(weights[True, True]),
            vision_layers=vision_config.num_hidden_layers,
            vision_attention_width=vision_config.hidden_size,
            vision_sequence_length=vision_positions,
        )
    return counts


def config_parameter_counts(config: Any) -> dict[str, int]:
    """``parameter_counts`` of the causal LM ``config`` describes, fully trained, built on the meta device (no
    weights, no memory)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return parameter_counts(model)
