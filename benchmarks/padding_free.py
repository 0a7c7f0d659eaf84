"""Padded against padding-free training (``--padding_free huggingface``) on the same data: tokens/s of each, from
``train()`` runs alternated round by round (the first round a warm-up, left out). Tokens are the examples' own
(no padding), counted over whole epochs, so the two arms count the same work.

    python -m benchmarks.padding_free --workdir /tmp/padding-free            # the tiny model, the sample data, CPU
    python -m benchmarks.padding_free --model_dir M --data_path D --torch_dtype bfloat16 --use_flash_attn True

Prints one Markdown table; ``--json`` writes the figures (``benchmarks/gpu_check.py`` runs it on the GPU).
"""

import argparse
import json
import statistics
import time
from pathlib import Path

from tuning.config.acceleration_configs import AttentionAndDistributedPackingConfig
from tuning.config.configs import DataArguments, ModelArguments, TrainingArguments
from tuning.sft_trainer import train
from tuning.utils.tiny_model import SAMPLE_TRAIN_PATH, build_tiny_model

RESPONSE_TEMPLATE = "\n### Response:"  # the sample data's
ARMS = {"padded": None, "padding_free": AttentionAndDistributedPackingConfig(padding_free=["huggingface"])}


def run_once(args: argparse.Namespace, arm: str, output_dir: Path) -> float:
    """Tokens/s of one run of ``arm``: the examples' tokens of the epochs it trained, over ``train_runtime``."""
    model_args = ModelArguments(args.model_dir, torch_dtype=args.torch_dtype, use_flash_attn=args.use_flash_attn)
    data_args = DataArguments(args.data_path, dataset_text_field="output", response_template=RESPONSE_TEMPLATE)
    train_args = TrainingArguments(
        output_dir=str(output_dir),
        max_steps=args.max_steps,
        per_device_train_batch_size=args.batch_size,
        logging_strategy="steps",
        logging_steps=args.max_steps,
        save_strategy="no",
        report_to="none",
        bf16=args.torch_dtype == "bfloat16",
        seed=args.seed,
        trackers=["none"],
    )
    trainer, *_ = train(model_args, data_args, train_args, attention_and_distributed_packing_config=ARMS[arm])
    lengths = [len(row["input_ids"]) for row in trainer.train_dataset]
    examples = args.max_steps * args.batch_size
    if examples % len(lengths):
        raise SystemExit(f"--max_steps × --batch_size ({examples}) must be whole epochs of {len(lengths)} examples")
    return sum(lengths) * (examples // len(lengths)) / trainer.state.log_history[-1]["train_runtime"]


def measure(args: argparse.Namespace) -> dict:
    """Per arm the tokens/s of each measured round and their median; padding-free ÷ padded as the median of the
    per-round ratios."""
    figures: dict[str, list[float]] = {arm: [] for arm in ARMS}
    for round_index in range(args.rounds + 1):
        for arm in ARMS:
            tokens_per_second = run_once(args, arm, Path(args.workdir) / f"{arm}-{round_index}")
            if round_index:  # round 0 warms caches and kernels
                figures[arm].append(tokens_per_second)
    ratios = [free / padded for free, padded in zip(figures["padding_free"], figures["padded"], strict=True)]
    return {
        "tokens_per_second": {arm: statistics.median(values) for arm, values in figures.items()},
        "runs": figures,
        "ratio": statistics.median(ratios),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", required=True, help="a folder for the runs (and the tiny model when built)")
    parser.add_argument("--model_dir", default=None, help="the model; default: the tiny model, built in --workdir")
    parser.add_argument("--data_path", default=SAMPLE_TRAIN_PATH, help="JSON lines with 'output' (%(default)s)")
    parser.add_argument("--max_steps", type=int, default=48, help="steps of every run: whole epochs (%(default)s)")
    parser.add_argument("--batch_size", type=int, default=8, help="per-device batch size (%(default)s)")
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds of both arms (%(default)s)")
    parser.add_argument("--torch_dtype", default="float32", help="%(default)s")
    parser.add_argument("--use_flash_attn", type=lambda text: text.lower() == "true", default=False)
    parser.add_argument("--seed", type=int, default=42, help="%(default)s")
    parser.add_argument("--json", default=None, help="write the figures here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    started = time.perf_counter()
    if args.model_dir is None:
        args.model_dir = build_tiny_model(str(Path(args.workdir) / "model"))
    results = measure(args)
    results["seconds"] = time.perf_counter() - started
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2), encoding="utf-8")
    tokens = results["tokens_per_second"]
    print("| arm | tokens/s (median) | runs |\n|---|---|---|")
    for arm, values in results["runs"].items():
        print(f"| {arm} | {tokens[arm]:.0f} | {', '.join(f'{value:.0f}' for value in values)} |")
    print(f"padding-free ÷ padded: {results['ratio']:.3f}× ({args.rounds} rounds, {results['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
