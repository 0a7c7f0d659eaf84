"""The memory estimate against the measured peak: for each case, ``estimate_memory`` (config only, fake tensors) and
a real two-step ``train()`` run with ``PeakTensorMeter`` (CPU: torch's tracker over the real steps; GPU:
``max_memory_allocated``), on rows long enough to fill ``--max_seq_length``; and the Llama-3-8B-shaped config
estimated alone (seconds, peak host memory).

    python -m benchmarks.memory_estimate --workdir /tmp/memory-estimate          # the tiny models, CPU
    python -m benchmarks.memory_estimate --workdir W --only 8b                    # the 8B-shaped estimate only

Prints one Markdown table; ``--json`` writes the figures.
"""

import argparse
import json
import resource
import time
from pathlib import Path

from tuning.benchmarking.memory import PeakTensorMeter, estimate_memory
from tuning.sft_trainer import get_parser, parse_arguments, train
from tuning.utils.tiny_model import build_tiny_model, build_tiny_moe, build_tiny_vision_model

RESPONSE_TEMPLATE = "\n### Response:"
# Llama-3-8B's public shape.
LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "dtype": "bfloat16",
    "bos_token_id": 128000,
    "eos_token_id": 128001,
}
# (name, model kind, batch size, sequence length, extra flags)
CASES = [
    (f"{method} gc={gc} {batch}x{length}", "llama", batch, length, [*peft, "--gradient_checkpointing", str(gc)])
    for method, peft in (("full", []), ("lora", ["--peft_method", "lora"]))
    for gc in (False, True)
    for batch, length in ((2, 64), (4, 128))
] + [
    ("moe --fast_moe 1 bf16 4x128", "moe", 4, 128, ["--fast_moe", "1", "--torch_dtype", "bfloat16"]),
    ("padding-free lora 4x128", "llama", 4, 128, ["--peft_method", "lora", "--padding_free", "huggingface"]),
    ("llava lora 4x128", "llava", 4, 128, ["--peft_method", "lora", "--dataset_image_field", "images"]),
    (
        "llava full gc=True 2x64",
        "llava",
        2,
        64,
        ["--gradient_checkpointing", "True", "--dataset_image_field", "images"],
    ),
]


def write_llama3_8b_config(directory: Path) -> str:
    """A config-only model directory of Llama-3-8B's shape (no weights, no tokenizer)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(LLAMA3_8B), encoding="utf-8")
    return str(directory)


def long_rows(path: Path, rows: int = 40) -> str:
    """Rows longer than any case's sequence length, so that every batch is full."""
    with path.open("w", encoding="utf-8") as handle:
        for row in range(rows):
            words = " ".join(f"The green cat rests quietly in the sun number {n}." for n in range(row, row + 80))
            handle.write(json.dumps({"output": f"### Input: go\n\n### Response: {words}"}) + "\n")
    return str(path)


def long_image_rows(folder: Path, rows: int = 16) -> str:
    """A LLaVA conversation per row, one 32x32 image and an answer longer than any case's sequence (the labels are the
    answer's tokens: nearly every token, as the estimate assumes), the images beside the data file."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for row in range(rows):
        Image.new("RGB", (32, 32), (30 * row % 256, 90, 200)).save(folder / f"image-{row}.png")
        words = " ".join(f"The green cat rests quietly in the sun number {n}." for n in range(row, row + 40))
        question = [{"type": "image", "text": None}, {"type": "text", "text": f"What is in picture {row}?"}]
        answer = [{"type": "text", "text": words, "image": None}]
        messages = [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        lines.append(json.dumps({"messages": messages, "images": [f"image-{row}.png"]}))
    (folder / "train.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(folder / "train.jsonl")


def job_args(model: str, data: str, output_dir: str, batch: int, length: int, extra: list[str], dtype="float32"):
    """The case's parsed arguments; text rows (``long_rows``) unless ``extra`` names an image field."""
    text = [] if "--dataset_image_field" in extra else ["--dataset_text_field", "output"]
    text += [] if text == [] else ["--response_template", RESPONSE_TEMPLATE]
    argv = [
        *("--model_name_or_path", model, "--training_data_path", data, *text),
        *("--output_dir", output_dir, "--max_steps", "2"),
        *("--per_device_train_batch_size", str(batch), "--max_seq_length", str(length), "--save_strategy", "no"),
        *("--torch_dtype", dtype, "--use_flash_attn", "False", "--trackers", "none", *extra),
    ]
    return parse_arguments(get_parser(), args=argv)


def measure(args) -> int:
    meter = PeakTensorMeter()
    train(
        args.model_args,
        args.data_args,
        args.training_args,
        args.tune_config,
        fast_moe_config=args.fast_moe_config,
        attention_and_distributed_packing_config=args.attention_and_distributed_packing_config,
        additional_callbacks=[meter],
        trackers=[],
    )
    return meter.peak_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", default="/tmp/memory-estimate")
    parser.add_argument("--only", choices=("tiny", "8b"), default=None)
    parser.add_argument("--json", default=None)
    options = parser.parse_args()
    work = Path(options.workdir)
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    if options.only != "8b":
        data = long_rows(work / "long.jsonl")
        models = {
            "llama": build_tiny_model(str(work / "llama")),
            "moe": build_tiny_moe(str(work / "moe")),
            "llava": build_tiny_vision_model(str(work / "llava"), "llava"),
        }
        images = long_image_rows(work / "images")
        for index, (name, kind, batch, length, extra) in enumerate(CASES):
            output_dir = str(work / "out" / f"case-{index}")  # each its own: a finished job's directory trains nothing
            args = job_args(models[kind], images if kind == "llava" else data, output_dir, batch, length, extra)
            estimate = estimate_memory(args)
            measured = measure(args)
            predicted = estimate["peak_bytes_per_device"]
            rows.append({"case": name, "estimate": predicted, "measured": measured, "ratio": predicted / measured})
            print(f"| {name} | {predicted / 2**20:.2f} | {measured / 2**20:.2f} | {predicted / measured:.3f} |")
    if options.only != "tiny":
        model = write_llama3_8b_config(work / "llama3-8b")
        args = job_args(model, long_rows(work / "long.jsonl"), str(work / "out"), 1, 2048, ["--peft_method", "lora"])
        args.model_args.torch_dtype = "bfloat16"
        began = time.time()
        estimate = estimate_memory(args)
        host_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        rows.append({"case": "llama3-8b lora 1x2048", "estimate": estimate, "host_peak_bytes": host_peak})
        print(
            f"| llama3-8b lora bf16 1x2048 | {(estimate['peak_bytes_per_device'] or 0) / 2**30:.2f} GiB | "
            f"{time.time() - began:.1f} s | host peak {host_peak / 2**30:.2f} GiB | {estimate['not_estimated'] or ''}"
        )
    if options.json:
        Path(options.json).write_text(json.dumps(rows, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
