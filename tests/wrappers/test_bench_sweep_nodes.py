"""bench_sweep's points across nodes on a real 2-node Ray cluster (Ray's own ``ray.cluster_utils.Cluster``, two
raylets on loopback, one CPU each), one cluster for the module. One sweep: a 3-node point the cluster cannot place, a
2-node × 1-process point whose node 1 loses its torchrun (a real SIGKILL) mid-run, and a 1-node point of the same grid
that runs after them. Another: a 2-node point whose driver is SIGTERMed mid-run, left for the next run to start anew."""

import json
import os
import shutil
import signal
import tempfile
from pathlib import Path

import psutil
import pytest
import yaml

from tests.helpers.bench import sweep_point_flags
from tests.helpers.training import BENCH_CALLBACKS, REPO_ROOT, Job, run_python, wait_until
from tuning.benchmarking import sweep
from tuning.benchmarking.sweep.point import POINT_MARKER_ENV, STOP_GRACE_SECONDS

pytestmark = pytest.mark.slow  # a Ray cluster, torchrun on two Ray nodes: not in make test-fast

BENCH_SWEEP = REPO_ROOT / "wrappers" / "bench_sweep.py"
PLACEMENT_TIMEOUT = 3
STOPPED_STEPS = 1000  # the SIGTERMed point's max_steps, never reached: slow steps (SlowSteps), a checkpoint each


def point_processes(temp: str) -> list[int]:
    """Processes of points run by the cluster whose temp dir is ``temp`` (their scratch directories are there)."""
    found = []
    for process in psutil.process_iter(["environ"]):
        if (process.info.get("environ") or {}).get(POINT_MARKER_ENV, "").startswith(temp):
            found.append(process.pid)
    return found


@pytest.fixture(scope="module")
def ray_cluster() -> dict:
    """The module's one 2-node cluster: its address and the short temp dir of its processes (Ray's sockets live
    there; the points' scratch directories too). Its processes get this checkout on their path."""
    from ray.cluster_utils import Cluster

    temp = tempfile.mkdtemp(prefix="bn", dir="/tmp")
    env = {"PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "TMPDIR": temp}
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
        try:
            cluster.add_node(num_cpus=1)
            cluster.wait_for_nodes()
        except BaseException:
            cluster.shutdown()
            shutil.rmtree(temp, ignore_errors=True)
            raise
    try:
        yield {"address": cluster.address, "temp": temp}
    finally:
        cluster.shutdown()
        shutil.rmtree(temp, ignore_errors=True)


def sweep_command(spec: Path, out: Path, address: str) -> list[str]:
    """The driver's command line after ``python``: the sweep on the module's cluster."""
    command = [str(BENCH_SWEEP), str(spec), "--output_dir", str(out), "--executor", "ray"]
    return [*command, "--ray_address", address, "--placement_timeout", str(PLACEMENT_TIMEOUT)]


def rerun_plan(points: list[sweep.Point], out: Path) -> list[str]:
    """What the same command would run next in ``out``, as --dry_run prints it."""
    return sweep.Sweep(points, out, 1, None, BENCH_SWEEP.with_name("bench_train.py")).plan(rerun_failed=False)


def cluster_state(address: str, names: set[str]) -> tuple[dict, set[str]]:
    """The cluster's placement groups named ``names`` (a point's group bears its id), removed ones included, and the
    ids of its live nodes."""
    import ray

    ray.init(address=address, log_to_driver=False)
    try:
        groups = {key: group for key, group in ray.util.placement_group_table().items() if group["name"] in names}
        return groups, {node["NodeID"] for node in ray.nodes() if node["Alive"]}
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def ray_nodes_sweep(ray_cluster, tiny_model, tmp_path_factory) -> dict:
    """The grid ``nnodes: [3, 2, 1]`` on the 2-node cluster: the points, their placement groups after the sweep, and
    the plan of its rerun."""
    tmp = tmp_path_factory.mktemp("sweep-nodes")
    kill = f"{BENCH_CALLBACKS}:SigkillsNode1LauncherInStep3"  # a no-op on one node
    base = sweep_point_flags(tiny_model, max_steps=3, tracker="none", callbacks=kill)
    spec = tmp / "sweep.yaml"
    spec.write_text(yaml.safe_dump({"base": base, "axes": {"nnodes": [3, 2, 1]}}))
    out = tmp / "sweep"
    result = run_python(*sweep_command(spec, out, ray_cluster["address"]), timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    points = sweep.grid(sweep.load_spec(str(spec)))
    plan = rerun_plan(points, out)
    groups, nodes = cluster_state(ray_cluster["address"], {point.id for point in points})
    lines = [json.loads(line) for line in (out / "sweep_state.jsonl").read_text().splitlines()]
    return {
        "out": out,
        "lines": {line["axes"]["nnodes"]: line for line in lines},
        "order": [line["axes"]["nnodes"] for line in lines],
        "groups": groups,
        "nodes": nodes,
        "plan": plan,
        "temp": ray_cluster["temp"],
    }


def dump_of(out: Path, line: dict) -> dict:
    return json.loads((out / line["metrics_path"]).read_text())


def test_a_point_on_two_ray_nodes_runs_a_rank_on_each_and_a_lost_node_is_its_root_cause(ray_nodes_sweep):
    """The 2-node point trained across both Ray nodes (rank 0's dump, handed back by its node, says where each rank
    ran) until node 1's torchrun was SIGKILLed: the root cause is node 1 and its rank (interrupted, exit 137), not
    the communication error node 0 then saw; every node's part of the log and the peer's failure are kept."""
    out, line = ray_nodes_sweep["out"], ray_nodes_sweep["lines"][2]
    assert (line["status"], line["category"], line["exit_code"]) == ("interrupted", "interrupted", 137), line
    assert line["reason"].startswith("node 1 (") and "its launcher was killed by signal 9" in line["reason"]
    assert [entry["bundle"] for entry in line["nodes"]] == [0, 1]
    assert {entry["ray_node_id"] for entry in line["nodes"]} == ray_nodes_sweep["nodes"]  # a bundle on each node
    codes = sorted((entry["exit_code"], entry["termination"]) for entry in line["nodes"])
    assert [code for code, _ in codes] == [137, 206]  # the peer on node 0 lost rank 1: a communication error
    assert codes[1][1].startswith("communication: rank 0: node 0 (") and codes[0][1].startswith("interrupted: rank")

    dump = dump_of(out, line)
    places = dump["summary"]["rank_nodes"]
    assert len(places) == dump["world_size"] == 2
    assert {place["ray_node_id"] for place in places} == ray_nodes_sweep["nodes"]  # one rank on each Ray node
    killed_rank = next(rank for rank, place in enumerate(places) if place["node_rank"] == 1)
    nodes = dump["summary"]["nodes"]  # by node; killed before training's end, so without the figures gathered there
    assert [node["ranks"] for node in nodes] == [[1 - killed_rank], [killed_rank]]
    assert {node["ray_node_id"] for node in nodes} == ray_nodes_sweep["nodes"] and nodes[1]["tokens_per_second"] is None
    assert f"rank {killed_rank}: node 1 (" in (out / "points" / f"{line['point']}.termination-log").read_text()
    log = (out / "points" / f"{line['point']}.log").read_text(errors="replace")
    assert "--- bench_sweep: bundle 0 of 2" in log and "--- bench_sweep: bundle 1 of 2" in log


def test_a_point_the_cluster_cannot_place_is_unschedulable_and_the_sweep_goes_on(ray_nodes_sweep):
    """3 nodes on a 2-node cluster: unschedulable after the bounded wait, then the 2-node and the 1-node points ran;
    every placement group is removed, no process of a point is left, and the rerun has nothing to run."""
    line = ray_nodes_sweep["lines"][3]
    assert (line["status"], line["exit_code"]) == ("unschedulable", None)
    assert f"no 3 nodes with {{'CPU': 1}} each within --placement_timeout {PLACEMENT_TIMEOUT}s" in line["reason"]
    assert ray_nodes_sweep["order"] == [3, 2, 1]
    one = ray_nodes_sweep["lines"][1]
    assert (one["status"], one["exit_code"]) == ("ok", 0)
    dump = dump_of(ray_nodes_sweep["out"], one)
    assert dump["training_steps"] == 3 and dump["summary"]["rank_nodes"][0]["ray_node_id"] in ray_nodes_sweep["nodes"]
    assert len(ray_nodes_sweep["groups"]) == 2  # the 3-node point's and the 2-node point's
    assert {group["state"] for group in ray_nodes_sweep["groups"].values()} == {"REMOVED"}
    assert not point_processes(ray_nodes_sweep["temp"])
    assert ray_nodes_sweep["plan"][-1] == "3 points, 0 to run"


def test_a_sigterm_to_the_driver_stops_a_point_on_two_nodes_whole_and_leaves_it_to_be_run_anew(
    ray_cluster, tiny_model, tmp_path
):
    """The driver SIGTERMed while a 2-node point trains past a checkpoint: it exits 143, as with one-node points;
    both nodes' ranks stopped (no process of the point left), its placement group removed, its scratch directories
    removed on both nodes with the checkpoints in them (points do not resume: docs/sweeps.md), and no state line,
    so the same command's plan runs it again. Nothing is left to resume from: a Ray point's output_dir is a fresh
    scratch directory (mkdtemp) of its task, and the only ones that held this point's checkpoints are gone. (A 2-node
    point's ranks on both nodes and its dump handed back: the ray_nodes_sweep tests; nodes that all ended well make
    an ok point: tests/benchmarking/test_sweep_nodes.py.)"""
    temp = Path(ray_cluster["temp"])
    slow = f"{BENCH_CALLBACKS}:SlowSteps"
    base = sweep_point_flags(tiny_model, max_steps=STOPPED_STEPS, save_strategy="steps", tracker="none", callbacks=slow)
    spec, out = tmp_path / "sweep.yaml", tmp_path / "sweep"
    # save_steps as an axis: a point id (and placement group name) of its own, not the other sweep's 2-node point's
    spec.write_text(yaml.safe_dump({"base": base, "axes": {"nnodes": [2], "save_steps": [1]}}))
    points = sweep.grid(sweep.load_spec(str(spec)))
    (point,) = points
    command = sweep_command(spec, out, ray_cluster["address"])

    def trained_past_a_checkpoint() -> bool:
        checkpoints = temp.glob(f"bench-sweep-*/{point.id}/checkpoint-*/trainer_state.json")
        return any(True for _ in checkpoints) and any(True for _ in temp.glob(f"bench-sweep-*/{point.id}.journal*"))

    driver = Job(command, log_dir=tmp_path / "driver")
    wait_until(trained_past_a_checkpoint, driver, "the 2-node point past its first checkpoint", 300)
    assert len(list(temp.glob(f"bench-sweep-*/{point.id}.log"))) == 2  # a scratch directory on each node
    driver.send_signal(signal.SIGTERM)
    stderr = driver.finish(timeout=STOP_GRACE_SECONDS)  # within the grace: the ranks stopped at a step, none killed
    assert driver.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert "stopped by signal 15" in stderr
    wait_until(lambda: not point_processes(str(temp)), None, "no process of the point left after SIGTERM", 30)
    assert not list(temp.glob("bench-sweep-*"))  # the scratch directories, checkpoints and all
    assert not (out / "sweep_state.jsonl").exists() or not (out / "sweep_state.jsonl").read_text().strip()
    groups, _ = cluster_state(ray_cluster["address"], {point.id})
    assert [group["state"] for group in groups.values()] == ["REMOVED"]
    plan = rerun_plan(points, out)
    assert plan[-1] == "1 points, 1 to run", plan  # the same command runs it again
