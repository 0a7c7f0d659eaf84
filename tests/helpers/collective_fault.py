"""A worker for tuning.launch's tests across nodes, built on ``run_with_error_reporting`` as the trainer's scripts
are, at a fraction of their start-up: it joins the job's process group (gloo), all-reduces its rank, then node 1's
ranks (torchrun's GROUP_RANK) fail with a user error while node 0's wait in the next all-reduce and lose them.

    python -m tuning.launch --nnodes 2 ... tests/helpers/collective_fault.py
"""

import os
import sys

from tuning.errors import UserInputError
from tuning.utils.error_logging import run_with_error_reporting


def main() -> int:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    ranks = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(ranks)  # every rank of the job took part: 0 + 1 + ...
    print(f"rank {dist.get_rank()} of {dist.get_world_size()} on node {os.environ['GROUP_RANK']}: sum {ranks.item():g}")
    if os.environ["GROUP_RANK"] == "1":
        raise UserInputError("the data of node 1 is not what this job expects (injected by the test)")
    dist.all_reduce(ranks)
    return 0


if __name__ == "__main__":
    sys.exit(run_with_error_reporting(main))
