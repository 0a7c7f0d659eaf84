"""Where each rank of a run ran: its host, its node's rank in the job (torchrun's ``GROUP_RANK``) and, in a Ray
sweep, its Ray node's id (``RAY_NODE_ID_ENV``, which the sweep's Ray tasks set for every process of a point). Rank 0
gathers every rank's as training begins into the dump's ``summary.rank_nodes`` (docs/dump-schema.md). Imports nothing
heavy: the sweep's Ray tasks use it too.
"""

import os
import socket
from typing import Any

RAY_NODE_ID_ENV = "TUNING_RAY_NODE_ID"


def rank_place() -> dict[str, Any]:
    """This process's place: ``host``, ``node_rank`` (0 outside torchrun) and ``ray_node_id`` (None outside a Ray
    sweep)."""
    group_rank = os.environ.get("GROUP_RANK", "0")
    return {
        "host": socket.gethostname(),
        "node_rank": int(group_rank) if group_rank.isdigit() else 0,
        "ray_node_id": os.environ.get(RAY_NODE_ID_ENV),
    }
