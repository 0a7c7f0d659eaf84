"""Runs IBM ado's sfttrainer actuator, unmodified, on this package: its ``launch_finetune`` (``finetune.py``) starts
its ``scripts/wrapper_sfttrainer.py``, which picks its thin wrapper for ``--fms_hf_tuning_version`` (its
``tuning_versions/at_least_*.py``) and calls ``tuning.sft_trainer.train()`` with ``fast_moe_config``, on a tiny
GraniteMoe built here (``tuning.utils.tiny_model``), on CPU, with ado's own Aim callback (an ephemeral Aim repo).
Full fine-tuning on the sample data with its response template; ``--ranks 2`` takes ado's DDP backend (its
``accelerate launch --num_processes 2``), so ``--fast_moe 2`` shards the experts over the two ranks.

    python benchmarks/ado_check.py /path/to/ado [--fms_hf_tuning_version 3.1.0] [--fast_moe 1] [--ranks 1]

Run it with a python that has this package's requirements and ado's actuator's: ``ado-core`` (ado's plugin imports
its ``orchestrator`` package: ``ado-core<2`` has it, 2.x renamed it ``ado``), ``aim`` and ``jwt``. Nothing of ado is
copied here: the path names a checkout (its ``plugins/actuators/sfttrainer`` is put on ``PYTHONPATH``). Prints the
command's outcome and the metrics ado extracted; exit 0 when ado's run finished, 1 when it failed (its error
printed). docs/cli-and-api.md records the last result."""

import argparse
import dataclasses
import os
import shutil
import sys
import tempfile
import traceback
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
PLUGIN = Path("plugins", "actuators", "sfttrainer")
RESPONSE_TEMPLATE = "\n### Response:"  # the sample data's


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ado", type=Path, help="an IBM ado checkout (holding plugins/actuators/sfttrainer)")
    parser.add_argument("--fms_hf_tuning_version", default="3.1.0", help="what ado is told it runs (%(default)s)")
    parser.add_argument("--fast_moe", type=int, default=1, help="ado's fast_moe parameter, the EP degree (%(default)s)")
    parser.add_argument("--max_steps", type=int, default=2, help="(%(default)s)")
    parser.add_argument(
        "--ranks", type=int, default=1, help="processes: above 1, ado's DDP backend (`accelerate launch`) (%(default)s)"
    )
    parser.add_argument("--workdir", type=Path, default=None, help="keep the model and outputs in this folder")
    return parser.parse_args(argv)


def _child_environment(plugin: Path, workdir: Path) -> None:
    """What ado's launch hands its child (``python wrapper_sfttrainer.py``, or ``accelerate launch ...`` for
    several ranks): this python's, first on PATH (an ``accelerate`` command on this python is written to
    ``workdir/bin``, as its environment may have none), ado's plugin and this checkout importable, nothing
    downloaded."""
    bin_dir = workdir / "bin"
    bin_dir.mkdir(exist_ok=True)
    accelerate = bin_dir / "accelerate"
    accelerate.write_text(
        f"#!{sys.executable}\nimport sys\nfrom accelerate.commands.accelerate_cli import main\nsys.exit(main())\n"
    )
    accelerate.chmod(0o755)
    os.environ["PATH"] = os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    paths = [str(plugin), str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    os.environ["PYTHONPATH"] = os.pathsep.join(paths)
    sys.path[:0] = [str(plugin), str(REPO_ROOT)]
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


def run(args: argparse.Namespace, workdir: Path) -> int:
    plugin = args.ado.resolve() / PLUGIN
    if not plugin.is_dir():
        print(f"ado_check: {args.ado} holds no {PLUGIN}", file=sys.stderr)
        return 1
    _child_environment(plugin, workdir)
    from tuning.utils.tiny_model import SAMPLE_TRAIN_PATH, build_tiny_moe

    model = build_tiny_moe(str(workdir / "tiny-moe"))
    from ado_actuators.sfttrainer.wrapper_fms_hf_tuning import finetune

    fine_tune_args = finetune.FineTuneArgs(
        hf_home=str(workdir / "hf_home"),
        fms_hf_tuning_version=args.fms_hf_tuning_version,
        number_gpus=args.ranks if args.ranks > 1 else 0,  # 0: ado runs `python wrapper_sfttrainer.py`
        gradient_accumulation_steps=1,
        max_steps=args.max_steps,
        model_name_or_path=model,
        per_device_train_batch_size=2,
        torch_dtype="float32",
        max_seq_length=128,
        training_data_path=SAMPLE_TRAIN_PATH,
        output_dir=str(workdir / "output"),
        use_flash_attn=False,
        fast_moe=[args.fast_moe],
        peft_method=None,  # full fine-tuning (ado's default is prompt tuning)
        dataset_text_field="output",
        # v3.1.0 refuses a text field with no response template unless packing or padding-free is on
        response_template=RESPONSE_TEMPLATE,
    )
    print(f"ado_check: ado's launch_finetune with {dataclasses.asdict(fine_tune_args)}", flush=True)
    try:
        metrics = finetune.launch_finetune(
            args=fine_tune_args,
            aim_metadata={"metadata": {"experiment": "ado_check", "entity": "tiny-moe"}},
            count_dataset_tokens=False,
            distributed_settings=finetune.DistributedSettings(backend="DDP" if args.ranks > 1 else None),
            multi_node=None,
        )
    except Exception:  # ado's own report of the failure, printed whole
        traceback.print_exc()
        print("ado_check: FAILED (ado's launch_finetune raised, above)")
        return 1
    print(f"ado_check: OK, ado extracted {metrics}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
        return run(args, args.workdir)
    workdir = Path(tempfile.mkdtemp(prefix="ado-check-"))
    try:
        return run(args, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
