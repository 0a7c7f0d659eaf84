"""The GPU-only acceleration flags, each run for a few steps where what it needs is here, and its refusal checked where
it is not: ``--fast_kernels True True True`` and ``--fused_lora auto_gptq True`` (transformers' kernels integration:
the ``kernels`` library and a CUDA GPU), ``--auto_gptq triton_v2`` (transformers' GPTQ integration: gptqmodel,
optimum and a CUDA GPU; the tiny Llama is quantised to 4-bit GPTQ here first). ``benchmarks/gpu_device.sh`` runs it
after the GPU check; on CPU (its rehearsal, or here) every flag is refused and that is checked.

    python -m benchmarks.gpu_acceleration [--output gpu_acceleration.md] [--workdir DIR]

One Markdown row per flag (ran / refused / failed, with the reason); exit 0 when each flag ran where it can and was
refused, naming what is missing, where it cannot; 1 otherwise."""

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tuning.config.acceleration_configs.needs import gptq_missing, kernels_missing
from tuning.utils.tiny_model import SAMPLE_TRAIN_PATH, build_tiny_model

REPO_ROOT = Path(__file__).resolve().parents[1]
STEPS = 3
TIMEOUT_S = 150  # each job
LORA = ["--peft_method", "lora", "--target_modules", "q_proj", "v_proj"]


def _train_flags(model: str, output_dir: Path, dtype: str) -> list[str]:
    return [
        *("--model_name_or_path", model, "--training_data_path", SAMPLE_TRAIN_PATH, "--dataset_text_field", "output"),
        *("--output_dir", str(output_dir), "--max_steps", str(STEPS), "--per_device_train_batch_size", "2"),
        *("--logging_strategy", "steps", "--logging_steps", "1", "--save_strategy", "no", "--torch_dtype", dtype),
        *("--use_flash_attn", "False", "--trackers", "none"),
    ]


def _run(flags: list[str]) -> subprocess.CompletedProcess:
    command = [sys.executable, str(REPO_ROOT / "tuning" / "sft_trainer.py"), *flags]
    return subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=TIMEOUT_S)


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def _gptq_model(model: str, output_dir: Path) -> str:
    """The tiny Llama quantised to 4-bit GPTQ by transformers' own integration (calibrated on the sample data)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GPTQConfig

    from tuning.data.loading import load_records

    tokenizer = AutoTokenizer.from_pretrained(model)
    texts = [str(record["output"]) for record in load_records(SAMPLE_TRAIN_PATH)[:32]]
    config = GPTQConfig(bits=4, group_size=32, dataset=texts, tokenizer=tokenizer)
    quantised = AutoModelForCausalLM.from_pretrained(model, quantization_config=config, device_map="cuda:0")
    quantised.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    return str(output_dir)


def check(name: str, missing: list[str], flags: list[str], prepare=None) -> tuple[str, str, bool]:
    """(flag, outcome, as expected): the job's run when nothing is missing, else its refusal naming what is."""
    if missing:
        result = _run(flags)
        named = any(need.split(" (")[0] in result.stderr for need in missing)  # the first refused flag's needs
        refused = result.returncode == 1 and named
        return name, f"refused, missing {', '.join(missing)}: {_last_line(result.stderr)}", refused
    try:
        if prepare is not None:
            flags = prepare(flags)
        result = _run(flags)
    except Exception as error:  # the preparation (quantisation) or the job's timeout: a failed row, the check goes on
        return name, f"failed: {type(error).__name__}: {str(error)[:300]}", False
    if result.returncode != 0:
        return name, f"failed (exit {result.returncode}): {_last_line(result.stderr)}", False
    return name, f"ran {STEPS} steps", True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="gpu_acceleration.md", help="the table (%(default)s)")
    parser.add_argument("--workdir", type=Path, default=None, help="keep the models and job outputs here")
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="gpu-acceleration-"))
    try:
        model = build_tiny_model(str(workdir / "llama"))
        kernels = ["--fast_kernels", "True", "True", "True"]
        gptq = ["--auto_gptq", "triton_v2", "--fused_lora", "auto_gptq", "True"]

        def quantised(flags: list[str]) -> list[str]:
            return [*flags, "--model_name_or_path", _gptq_model(model, workdir / "gptq")]  # the last one given wins

        rows = [
            check(
                " ".join(kernels),
                kernels_missing(),
                [*_train_flags(model, workdir / "kernels", "bfloat16"), *LORA, *kernels],
            ),
            check(
                " ".join(gptq),
                sorted(set(gptq_missing() + kernels_missing())),
                [*_train_flags(model, workdir / "gptq-lora", "float16"), *LORA, *gptq],
                prepare=quantised,
            ),
        ]
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    table = ["| flags | outcome | as expected |", "|---|---|---|"]
    table += [f"| `{flags}` | {outcome.replace('|', '/')} | {'✓' if ok else '✗'} |" for flags, outcome, ok in rows]
    text = "\n".join(table)
    print(text)
    Path(args.output).write_text(text + "\n", encoding="utf-8")
    return 0 if all(ok for _, _, ok in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
