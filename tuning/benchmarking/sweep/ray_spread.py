"""A sweep point across several Ray nodes (``nnodes`` > 1): a placement group of one bundle per node
(STRICT_SPREAD), a free port found on bundle 0's node, and one Ray task per bundle running the point's torchrun
(``tuning.launch``) as one node of the job, all meeting at a c10d rendezvous there. Its ending: every node's files
brought back, the root cause across the nodes (a node's own failure before the ``communication`` errors its peers
then saw), every task ended and the placement group removed, whatever happened. A point the cluster cannot place
within ``placement_timeout`` seconds is ``unschedulable``. Docs: docs/sweeps.md, "Points across nodes".
"""

import math
import socket
import time
from typing import Any

from tuning.benchmarking.paths import LOG_SUFFIX, TERMINATION_LOG_SUFFIX
from tuning.benchmarking.sweep.executor import Ended
from tuning.benchmarking.sweep.point import STOP_GRACE_SECONDS
from tuning.benchmarking.sweep.spec import Point
from tuning.utils.error_logging import TERMINATION_LINE, ErrorCategory, exit_code_for

RENDEZVOUS_TIMEOUT_SECONDS = 600  # how long the nodes' launchers wait for each other (torchrun's join_timeout)
PORT_LOOKUP_SECONDS = 120  # for the task that finds bundle 0's free port (a worker may have to start)


def free_port() -> tuple[str, int]:
    """A Ray task's body: this node's address and a port free on it now, for the rendezvous."""
    import ray

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        return ray.util.get_node_ip_address(), probe.getsockname()[1]


def node_flags(point: Point, node: int, address: str, port: int) -> list[str]:
    """torchrun's flags for one node of ``point``: every node joins the c10d rendezvous at ``address:port``, which
    bundle 0's launcher hosts (``is_host``: on loopback every node's address is the rendezvous's). Ranks follow the
    order the nodes join in; each rank's node is in the dump (``summary.rank_nodes``)."""
    return [
        f"--nnodes={point.nnodes}",
        "--rdzv_backend=c10d",
        f"--rdzv_endpoint={address}:{port}",
        f"--rdzv_id={point.id}",
        f"--rdzv_conf=is_host={int(node == 0)},join_timeout={RENDEZVOUS_TIMEOUT_SECONDS}",
    ]


class SpreadPoint:
    """One point over ``point.nnodes`` Ray nodes, driven by ``poll`` from the executor's loop: placed, started, then
    ended as one. ``run_node`` is the Ray remote function of ``ray_executor.run_point_on_node``; ``task_args`` its
    arguments after the point's own (bench_train, the directory, the timeout)."""

    def __init__(self, ray: Any, point: Point, run_node: Any, task_args: tuple, gpus: float, placement_timeout: float):
        from ray.util.placement_group import placement_group

        self.ray, self.point, self.run_node, self.task_args = ray, point, run_node, task_args
        self.bundle = {"CPU": point.nproc, **({"GPU": point.nproc} if gpus else {})}
        self.group = placement_group([self.bundle] * point.nnodes, strategy="STRICT_SPREAD", name=point.id)
        self.placed = self.group.ready()
        self.placement_timeout = placement_timeout
        self.place_by = time.monotonic() + placement_timeout
        self.tasks: list[Any] = []  # by bundle
        self.results: dict[int, Ended] = {}
        self.cancel_at: float | None = None  # once a node failed: when the others still running are cancelled

    def poll(self) -> Ended | None:
        """How the point ended, once it has; None while it is being placed or runs."""
        if not self.tasks:
            if not self.ray.wait([self.placed], timeout=0)[0]:
                if time.monotonic() < self.place_by:
                    return None
                self.remove()
                reason = (
                    f"no {self.point.nnodes} nodes with {self.bundle} each within --placement_timeout "
                    f"{self.placement_timeout:g}s (STRICT_SPREAD: one node per bundle)"
                )
                return {"unschedulable": reason, "exit_code": None, "timed_out": False, "host": None}
            try:
                self.start()
            except self.ray.exceptions.RayError as exc:  # the port task failed or timed out: no rendezvous
                self.cancel()
                self.remove()
                return self.not_started(exc)
            return None
        for node, task in enumerate(self.tasks):
            if node not in self.results and self.ray.wait([task], timeout=0)[0]:
                self.results[node] = self.result(node, task)
                if self.results[node]["exit_code"] != 0 and self.cancel_at is None:
                    self.cancel_at = time.monotonic() + STOP_GRACE_SECONDS
        if len(self.results) < len(self.tasks):
            if self.cancel_at is not None and time.monotonic() > self.cancel_at:  # its peers did not notice
                self.cancel()
            return None
        self.remove()
        return merge_nodes(self.point, [self.results[node] for node in range(len(self.tasks))])

    def start(self) -> None:
        """The rendezvous found on bundle 0's node, then a task per bundle, each pinned to its bundle."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

        nodes = self.ray.util.placement_group_table(self.group)["bundles_to_node_id"]
        on_first = NodeAffinitySchedulingStrategy(nodes[0], soft=False)
        port_task = self.ray.remote(num_cpus=0, max_retries=0, scheduling_strategy=on_first)(free_port)
        address, port = self.ray.get(port_task.remote(), timeout=PORT_LOOKUP_SECONDS)
        flags, nproc, name = self.point.flags, self.point.nproc, self.point.id
        for node in range(self.point.nnodes):
            strategy = PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=node)
            resources = {"num_cpus": self.bundle["CPU"], "num_gpus": self.bundle.get("GPU", 0)}
            task = self.run_node.options(
                name=f"bench_sweep {name} bundle {node}", scheduling_strategy=strategy, **resources
            )
            self.tasks.append(
                task.remote(flags, nproc, name, *self.task_args, node_flags(self.point, node, address, port))
            )

    def not_started(self, exc: Exception) -> Ended:
        """The ending of a point whose rendezvous could not be set up: ``communication`` (retried as transient)."""
        line = f"{ErrorCategory.COMMUNICATION}: no rendezvous on bundle 0's node: {' '.join(str(exc).split())[:500]}"
        name = self.point.id
        files = {f"{name}{TERMINATION_LOG_SUFFIX}": f"{line}\n", f"{name}{LOG_SUFFIX}": f"bench_sweep: {line}\n"}
        exit_code = exit_code_for(ErrorCategory.COMMUNICATION)
        encoded = {file: text.encode() for file, text in files.items()}
        return {"exit_code": exit_code, "timed_out": False, "host": None, "files": encoded}

    def result(self, node: int, task: Any) -> Ended:
        try:
            return self.ray.get(task)
        except self.ray.exceptions.TaskCancelledError:  # by cancel(), once another node had failed
            return {"exit_code": 128 + 15, "timed_out": False, "host": None, "files": {}, "cancelled": True}
        except self.ray.exceptions.RayError as exc:  # its worker or its node died
            reason = " ".join(str(exc).split())[:500]
            return {"exit_code": 128 + 9, "timed_out": False, "host": None, "files": {}, "lost": reason}

    def cancel(self) -> None:
        """Every task still running cancelled: each stops its node's launcher (SIGTERM, then SIGKILL after the
        grace) and hands back what it has."""
        for node, task in enumerate(self.tasks):
            if node not in self.results:
                self.ray.cancel(task)
        self.cancel_at = float("inf")

    def remove(self) -> None:
        from ray.util.placement_group import remove_placement_group

        remove_placement_group(self.group)


def node_line(bundle: int, ended: Ended) -> str:
    """A node's root cause as one termination line naming the node: its launcher's line (which names its node, host
    and Ray node), or what its task saw (a launcher killed by a signal, a task or node lost, the node stopped by the
    sweep), naming the node by its rank in the job where its workers said it, else by its bundle."""
    log = next((data for name, data in ended.get("files", {}).items() if name.endswith(TERMINATION_LOG_SUFFIX)), b"")
    first = (log.decode(errors="replace").splitlines() or [""])[0]
    if TERMINATION_LINE.match(first):
        return first
    leftovers = ended.get("leftovers") or {}
    ranks, node_rank = leftovers.get("ranks") or [], leftovers.get("node_rank")
    node = f"node {node_rank}" if node_rank is not None else f"the node of bundle {bundle}"
    where = f"{node} ({ended.get('host') or '?'}, Ray node {(ended.get('node_id') or '?')[:12]})"
    rank = f"rank {ranks[0]}: " if ranks else ""
    if ended.get("cancelled"):
        stopped = f"stopped by bench_sweep {STOP_GRACE_SECONDS:g}s after another node failed"
        return f"{ErrorCategory.INTERRUPTED}: {where}: {stopped}"
    if lost := ended.get("lost"):
        return f"{ErrorCategory.INTERRUPTED}: {where}: its Ray task or node was lost: {lost}"
    code = ended["exit_code"]
    if code < 0:
        ended_by = f"its launcher was killed by signal {-code}, its rank(s) {ranks} with it"
        return f"{ErrorCategory.INTERRUPTED}: {rank}{where}: {ended_by}"
    return f"{ErrorCategory.INTERNAL}: {rank}{where}: its launcher exited {code} without a termination line"


def exit_code_of(ended: Ended) -> int:
    """A node's exit status as a shell sees it (128+N for a launcher killed by signal N)."""
    return 128 - ended["exit_code"] if ended["exit_code"] < 0 else ended["exit_code"]


def root_order(entry: dict[str, Any], ended: list[Ended]) -> tuple[bool, bool, float]:
    """A failed node's place in the order of causes: a node's own failure before the ``communication`` errors of
    the peers that lost it, those before the nodes the sweep stopped, then by when its task saw its launcher end."""
    category = TERMINATION_LINE.match(entry["termination"])["category"]
    result = ended[entry["bundle"]]
    return bool(result.get("cancelled")), category == ErrorCategory.COMMUNICATION, result.get("ended_at") or math.inf


def merge_nodes(point: Point, ended: list[Ended]) -> Ended:
    """The point's ending from its nodes' (bundle order): every node's files (rank 0's dump, the ranks' reports and
    journals; the logs one after the other under a header each), the exit code and termination log of the root cause
    (the failed node whose category is not ``communication``, else the one that ended first), and a ``nodes`` entry
    per node for the state line."""
    files: dict[str, bytes] = {}
    log_name, termination_name = f"{point.id}{LOG_SUFFIX}", f"{point.id}{TERMINATION_LOG_SUFFIX}"
    nodes = []
    for node, result in enumerate(ended):
        line = node_line(node, result) if result["exit_code"] != 0 else None
        nodes.append(
            {
                "bundle": node,
                "host": result.get("host"),
                "ray_node_id": result.get("node_id"),
                "exit_code": exit_code_of(result),
                "termination": line,
            }
        )
        header = (
            f"--- bench_sweep: bundle {node} of {len(ended)} ({result.get('host')}, Ray node {result.get('node_id')})"
        )
        node_files = dict(result.get("files") or {})
        files[log_name] = files.get(log_name, b"") + f"{header}\n".encode() + node_files.pop(log_name, b"")
        node_files.pop(termination_name, None)
        files.update(node_files)
    failed = sorted((entry for entry in nodes if entry["exit_code"] != 0), key=lambda entry: root_order(entry, ended))
    root = failed[0] if failed else None
    if root is not None:
        others = [entry["termination"] for entry in failed[1:]]
        files[termination_name] = "\n".join([root["termination"], *others]).encode() + b"\n"
    return {
        "exit_code": root["exit_code"] if root else 0,
        "timed_out": any(result["timed_out"] for result in ended),
        "host": nodes[0]["host"],
        "files": files,
        "nodes": nodes,
    }
