"""tuning.launch's line for a rendezvous that timed out, in-process on the exceptions torch's agent raises (the
static rendezvous' node 0 end to end: tests/test_launch.py)."""

import pytest
from torch.distributed import DistNetworkError, DistStoreError
from torch.distributed.elastic.rendezvous import RendezvousTimeoutError
from torch.distributed.run import get_args_parser

from tuning.benchmarking.placement import RAY_NODE_ID_ENV
from tuning.launch import rendezvous_timeout

STATIC = ["--nnodes=2", "--master_addr=10.0.0.1", "--master_port=29500", "--rdzv_conf=timeout=30"]
C10D = ["--nnodes=2:3", "--rdzv_backend=c10d", "--rdzv_endpoint=10.0.0.1:29400", "--rdzv_conf=join_timeout=45,x=1"]


@pytest.mark.parametrize(
    ("flags", "exc", "reason"),
    [
        (  # node 1: node 0, the rendezvous' host, never came up
            [*STATIC, "--node_rank=1"],
            DistNetworkError(
                "The client socket has timed out after 30000ms while trying to connect to (10.0.0.1, 29500)."
            ),
            "node 1 (HOST): node 0 never opened the rendezvous at 10.0.0.1:29500 within 30 s",
        ),
        (  # c10d: torch's error says nothing more; the node's rank is the rendezvous' to give
            C10D,
            RendezvousTimeoutError(),
            "node (HOST): fewer than the 2 nodes needed joined the rendezvous at 10.0.0.1:29400 within 45 s "
            "(RendezvousTimeoutError)",
        ),
        (  # the default timeout
            ["--nnodes=3", "--node_rank=0", "--master_addr=h", "--master_port=1"],
            DistStoreError("Timed out after 601 seconds waiting for clients. 2/3 clients joined."),
            "node 0 (HOST): only 2 of 3 nodes joined the rendezvous at h:1 within 600 s",
        ),
    ],
)
def test_a_rendezvous_timeout_names_the_node_and_who_never_joined(flags, exc, reason, monkeypatch):
    monkeypatch.setattr("socket.gethostname", lambda: "HOST")
    monkeypatch.delenv(RAY_NODE_ID_ENV, raising=False)
    args = get_args_parser().parse_args([*flags, "train.py"])
    assert rendezvous_timeout(exc, args) == f"communication: {reason}"


def test_other_errors_are_not_a_rendezvous_timeout():
    args = get_args_parser().parse_args([*STATIC, "train.py"])
    assert rendezvous_timeout(DistNetworkError("Address already in use"), args) is None
    assert rendezvous_timeout(RuntimeError("timed out"), args) is None
