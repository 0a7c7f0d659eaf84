"""Under torchrun: ``python -m torch.distributed.run ... tests/helpers/train_in_turn.py FLAGS [--then FLAGS]...``.
Several ``sft_trainer.train()`` jobs, one after another in the same ranks, each parsed from its own sft_trainer
flags: one process start for them all (what a torchrun test pays most for). Each job builds its own model,
optimizer and scheduler, as a new process would; a job with ``--resume_from_checkpoint`` (or an output_dir holding a
checkpoint) reads only its files; a job with ``--save_model_dir`` saves there at its end, as the CLI's main() does."""

import sys

from tuning.utils.prologue import pause_collector

pause_collector()  # as a training script's prologue does, until the first train() begins

import torch.distributed as dist  # noqa: E402

from tuning import sft_trainer  # noqa: E402

SEPARATOR = "--then"


def jobs(argv: list[str]) -> list[list[str]]:
    """``argv`` cut at each ``--then``."""
    cut, current = [], []
    for argument in argv:
        if argument == SEPARATOR:
            cut.append(current)
            current = []
        else:
            current.append(argument)
    return [*cut, current]


def main() -> None:
    for flags in jobs(sys.argv[1:]):
        args = sft_trainer.parse_arguments(sft_trainer.get_parser(), args=flags)
        trainer, _, _ = sft_trainer.train(
            args.model_args,
            args.data_args,
            args.training_args,
            args.tune_config,
            fast_moe_config=args.fast_moe_config,
        )
        if args.training_args.save_model_dir:
            sft_trainer.save(args.training_args.save_model_dir, trainer)
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
