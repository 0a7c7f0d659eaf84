"""Under torchrun: ``python -m torch.distributed.run ... tests/helpers/resume_twice.py OUTPUT_DIR STEP FLAGS...``.
Two ``sft_trainer.train()`` runs of the same flags in the same ranks, to price one process start instead of two: the
first trains in ``OUTPUT_DIR/whole`` uninterrupted, checkpointing at step ``STEP`` (among others); the second resumes
in ``OUTPUT_DIR/resumed`` from a copy of that checkpoint only, with fresh model, optimizer and scheduler objects, as
a new process would. Each writes its ``training_logs.jsonl``."""

import os
import shutil
import sys

import torch.distributed as dist

from tuning import sft_trainer


def _train(flags: list[str], output_dir: str) -> None:
    argv = [*flags, "--output_dir", output_dir]  # the last --output_dir given wins
    args = sft_trainer.parse_arguments(sft_trainer.get_parser(), args=argv)
    sft_trainer.train(
        args.model_args,
        args.data_args,
        args.training_args,
        args.tune_config,
        fast_moe_config=args.fast_moe_config,
    )


def main() -> None:
    output_dir, step, flags = sys.argv[1], sys.argv[2], sys.argv[3:]
    whole, resumed = os.path.join(output_dir, "whole"), os.path.join(output_dir, "resumed")
    _train(flags, whole)
    if dist.get_rank() == 0:
        checkpoint = f"checkpoint-{step}"
        shutil.copytree(os.path.join(whole, checkpoint), os.path.join(resumed, checkpoint))
    dist.barrier()
    _train(flags, resumed)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
