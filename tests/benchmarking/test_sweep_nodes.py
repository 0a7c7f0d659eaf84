"""tuning.benchmarking.sweep.ray_spread in process: how a point across nodes ends, from what its nodes' tasks
handed back (the real cluster's run: tests/wrappers/test_bench_sweep_nodes.py)."""

from pathlib import Path

from tuning.benchmarking.sweep import Sweep, grid
from tuning.benchmarking.sweep.ray_spread import SpreadPoint, merge_nodes, node_flags

(POINT,) = grid({"base": {}, "axes": {"nnodes": [2]}, "metadata": {}, "repeats": 1})
LOG, TERMINATION_LOG = f"{POINT.id}.log", f"{POINT.id}.termination-log"


def node(exit_code: int, line: str | None = None, ended_at: float = 0.0, **extra) -> dict:
    """A node task's return: its launcher's exit code and termination line, its files, when it ended."""
    files = {LOG: f"output of a node ending {exit_code}\n".encode()}
    if line is not None:
        files[TERMINATION_LOG] = f"{line}\n".encode()
    ending = {"exit_code": exit_code, "timed_out": False, "host": "host-a", "files": files}
    return {**ending, "node_id": "f00d" * 14, "ended_at": ended_at, **extra}


def test_a_node_s_own_failure_is_the_root_cause_over_the_communication_error_of_the_peer_that_lost_it():
    peer = node(206, "communication: rank 0: node 0 (host-a): RuntimeError: Connection closed by peer", ended_at=1.0)
    failed = node(1, "user_error: rank 1: node 1 (host-b): UserInputError: bad data", ended_at=2.0)
    ended = merge_nodes(POINT, [peer, failed])
    assert ended["exit_code"] == 1 and ended["host"] == "host-a"
    assert ended["files"][TERMINATION_LOG].decode().splitlines() == [
        "user_error: rank 1: node 1 (host-b): UserInputError: bad data",
        "communication: rank 0: node 0 (host-a): RuntimeError: Connection closed by peer",
    ]
    log = ended["files"][LOG].decode()
    assert log.index("--- bench_sweep: bundle 0 of 2 (host-a") < log.index("ending 206") < log.index("bundle 1 of 2")
    assert [(entry["bundle"], entry["exit_code"]) for entry in ended["nodes"]] == [(0, 206), (1, 1)]


def test_a_launcher_killed_or_a_task_lost_is_named_by_what_its_task_saw_and_a_stopped_node_comes_last():
    killed = node(-9, leftovers={"ranks": [3], "node_rank": 1}, ended_at=5.0)
    stopped = {"exit_code": 143, "timed_out": False, "host": None, "files": {}, "cancelled": True}
    ended = merge_nodes(POINT, [stopped, killed])
    first, second = ended["files"][TERMINATION_LOG].decode().splitlines()
    assert first.startswith("interrupted: rank 3: node 1 (host-a, Ray node f00df00df00d): its launcher was killed")
    assert second.startswith("interrupted: the node of bundle 0 (?, Ray node ?): stopped by bench_sweep 30s after")
    assert ended["exit_code"] == 137
    lost = {"exit_code": 137, "timed_out": False, "host": None, "files": {}, "lost": "The node died."}
    peer = node(206, "communication: rank 0: node 0 (host-a): RuntimeError: Connection reset by peer")
    ended = merge_nodes(POINT, [peer, lost])
    assert ended["files"][TERMINATION_LOG].decode().startswith("interrupted: the node of bundle 1 (?, Ray node ?)")


def test_a_point_whose_nodes_all_ended_well_has_no_termination_log_and_meets_at_bundle_0():
    ended = merge_nodes(POINT, [node(0), node(0)])
    assert ended["exit_code"] == 0 and TERMINATION_LOG not in ended["files"]
    assert [entry["termination"] for entry in ended["nodes"]] == [None, None]
    flags = node_flags(POINT, 1, "10.0.0.1", 29400)
    assert "--rdzv_endpoint=10.0.0.1:29400" in flags and "--nnodes=2" in flags
    assert any(flag.startswith("--rdzv_conf=is_host=0,") for flag in flags)


def test_a_point_whose_rendezvous_cannot_be_set_up_is_a_communication_error_retried_as_transient(tmp_path):
    """The task finding bundle 0's free port failed or timed out: the point ends as ``communication`` (206), which
    the sweep retries, and its log says why."""
    spread = object.__new__(SpreadPoint)  # its ending only: no cluster, no placement group
    spread.point = POINT
    ended = spread.not_started(TimeoutError("Get timed out: some object(s) not ready."))
    line = "communication: no rendezvous on bundle 0's node: Get timed out: some object(s) not ready."
    assert ended["exit_code"] == 206 and ended["files"][TERMINATION_LOG].decode() == f"{line}\n"
    sweep = Sweep([POINT], tmp_path, retries=1, point_timeout=None, bench_train=Path("bench_train.py"))
    (tmp_path / "points").mkdir()
    outcome = sweep.outcome(POINT, ended)
    assert (outcome["status"], outcome["category"], outcome["exit_code"]) == ("error", "communication", 206)
