"""tuning.launch: torchrun for Kubernetes pods, ending with the root cause's exit code and termination message.

    python -m tuning.launch [torchrun flags] tuning/sft_trainer.py [trainer flags]
    python -m tuning.launch [torchrun flags]    # container entrypoint: the job config from SFT_TRAINER_CONFIG_JSON_*

torchrun's own parser and elastic agent run the workers; this adds how the job ends (the exit code of the rank that
failed first, a termination log composed from the workers' lines) and the container entrypoint (docs/kubernetes.md).
Torch is imported only after the signal handlers are installed, hence the ``sft_trainer`` script here.
"""

import argparse
import json
import logging
import os
import re
import signal
import socket
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from tuning.benchmarking.placement import RAY_NODE_ID_ENV
from tuning.prologue import prologue
from tuning.utils.config_utils import CONFIG_BASE64_ENV, CONFIG_PATH_ENV, get_json_config
from tuning.utils.error_logging import (
    TERMINATION_LINE,
    TERMINATION_LOG_ENV,
    TERMINATION_LOG_MAX_BYTES,
    ErrorCategory,
    SignalInterrupt,
    UserInputError,
    exit_code_for,
    install_early_signal_handlers,
    one_line,
    run_with_error_reporting,
    write_termination_log,
)
from tuning.utils.prologue import prologue as ground_prologue

if TYPE_CHECKING:
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

logger = logging.getLogger(__name__)

SFT_TRAINER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sft_trainer.py")
LAUNCH_ARGS_KEY = "accelerate_launch_args"  # the job-config key fms-hf-tuning's container entrypoint reads
K8S_TERMINATION_MESSAGE_MAX_BYTES = 4096
OTHER_RANK_LINE_MAX_BYTES = 256  # the root cause's line keeps up to 1 KiB; other ranks share what is left
NPROC_NAMES = ("auto", "cpu", "gpu", "xpu")  # torchrun's --nproc_per_node words for "one per device"
_NO_SCRIPT = "\0"  # appended to argv to learn whether it named a script (no real path contains a NUL)
# A rank SIGKILLed while available memory was below this share of the host's is named host_oom.
LOW_MEMORY_PERCENT_ENV = "TUNING_HOST_OOM_AVAILABLE_PERCENT"
DEFAULT_LOW_MEMORY_PERCENT = 5.0
MEMORY_SAMPLE_SECONDS = 0.2
MEMORY_WINDOW_SECONDS = 10.0  # how long before the agent saw a rank gone its kill may have happened
CGROUP_MEMORY_EVENTS = "/sys/fs/cgroup/memory.events"  # cgroup v2: its oom_kill counts the container's OOM kills


class RankFailure(NamedTuple):
    rank: int
    exit_code: int  # as a shell sees it: 128+N for signal N
    line: str  # its termination-log line: its own, or one composed for a rank that wrote none


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _cgroup_oom_kills() -> int | None:
    """The kernel OOM killer's kills in this container's cgroup so far (None outside cgroup v2)."""
    try:
        for line in Path(CGROUP_MEMORY_EVENTS).read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        pass
    return None


def _low_memory_percent() -> float:
    raw = os.environ.get(LOW_MEMORY_PERCENT_ENV, "").strip()
    try:
        return float(raw) if raw else DEFAULT_LOW_MEMORY_PERCENT
    except ValueError:
        logger.warning("Ignoring %s=%r: it must be a number of percent", LOW_MEMORY_PERCENT_ENV, raw)
        return DEFAULT_LOW_MEMORY_PERCENT


class HostMemoryWatch:
    """Samples the host's available memory while the workers run. The kernel's OOM killer ends a rank with SIGKILL,
    and the memory it frees is available again by the time the agent notices, so the lowest level of the seconds
    before is what tells an OOM kill from any other ``kill -9``; the container's cgroup OOM-kill counter tells it
    where the pod's memory limit, not the host's memory, ran out."""

    def __init__(self) -> None:
        import psutil

        self.psutil = psutil
        self.total = psutil.virtual_memory().total
        self.samples: deque[tuple[float, int]] = deque(maxlen=int(2 * MEMORY_WINDOW_SECONDS / MEMORY_SAMPLE_SECONDS))
        self.cgroup_kills_at_start = _cgroup_oom_kills()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._sample, name="host-memory-watch", daemon=True)

    def __enter__(self) -> "HostMemoryWatch":
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stopped.set()
        self.thread.join()

    def _sample(self) -> None:
        while True:
            self.samples.append((time.time(), self.psutil.virtual_memory().available))
            if self.stopped.wait(MEMORY_SAMPLE_SECONDS):
                return

    def low_before(self, when: float) -> str | None:
        """Why memory counts as having run out before ``when`` (POSIX seconds), or None when it did not."""
        kills = _cgroup_oom_kills()
        if None not in (kills, self.cgroup_kills_at_start) and kills > self.cgroup_kills_at_start:
            return f"the container's cgroup counted {kills - self.cgroup_kills_at_start} OOM kill(s)"
        recent = [available for at, available in list(self.samples) if when - MEMORY_WINDOW_SECONDS <= at <= when + 1]
        lowest = min(recent, default=None)
        if lowest is not None and lowest < self.total * _low_memory_percent() / 100:
            return f"the host's available memory fell to {lowest / 2**30:.1f} GiB of {self.total / 2**30:.1f} GiB"
        return None


def _rank_failure(rank: int, exitcode: int, line: str | None, low_memory: str | None = None) -> RankFailure:
    """``exitcode`` as torch's agent records it: -N for a process ended by signal N; ``low_memory`` says why memory
    had run out when it ended (a SIGKILL then is the kernel's OOM killer)."""
    if line is None and exitcode == -signal.SIGKILL and low_memory:
        line = f"{ErrorCategory.HOST_OOM}: rank {rank}: killed by SIGKILL while memory ran out ({low_memory})"
        return RankFailure(rank, exit_code_for(ErrorCategory.HOST_OOM), line)
    if line is None and exitcode < 0:
        line = (
            f"{ErrorCategory.INTERRUPTED}: rank {rank}: killed by {_signal_name(-exitcode)}, without an error report "
            "of its own (kill -9, the kernel's OOM killer, a crash)"
        )
        return RankFailure(rank, 128 - exitcode, line)
    if line is None:
        category = next((c for c in ErrorCategory if exit_code_for(c) == exitcode), ErrorCategory.INTERNAL)
        return RankFailure(rank, exitcode, f"{category}: rank {rank}: exited with code {exitcode}, without a report")
    if exitcode > 0:
        return RankFailure(rank, exitcode, line)
    try:  # it wrote its report, then a signal ended it (e.g. the agent's SIGKILL): the report's category decides
        return RankFailure(rank, exit_code_for(TERMINATION_LINE.match(line)["category"]), line)
    except ValueError:
        return RankFailure(rank, 128 - exitcode, line)


def read_rank_lines(path: str) -> dict[int, tuple[int, str]]:
    """Each rank's last line in the workers' termination log (the latest attempt's, with restarts), with its
    position in the file: the order in which the ranks wrote them."""
    if not os.path.exists(path):
        return {}
    lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
    matches = ((position, line, TERMINATION_LINE.match(line)) for position, line in enumerate(lines))
    return {int(match["rank"] or 0): (position, line) for position, line, match in matches if match}


def failures_in_order(
    failures: Mapping[int, "ProcessFailure"], rank_lines: dict[int, tuple[int, str]], memory: HostMemoryWatch
) -> list[RankFailure]:
    """The failed ranks of torch's ``ChildFailedError.failures`` (global rank → ``ProcessFailure``), root cause first.

    By the second torch's agent saw each end; within one, ranks that wrote a line in the order they wrote it (peers
    fail only after the root cause reported). A rank killed without a line by another signal than the agent's SIGTERM
    (SIGKILL, SIGSEGV) comes before them, one stopped by that SIGTERM or that exited without a line after them.
    """

    def order(item: tuple[int, "ProcessFailure"]) -> tuple[int, int, int]:
        rank, failure = item
        if rank in rank_lines:
            return failure.timestamp, 0, rank_lines[rank][0]
        killed_from_outside = failure.exitcode < 0 and -failure.exitcode != signal.SIGTERM
        return failure.timestamp, -1 if killed_from_outside else 1, 0

    return [
        _rank_failure(rank, failure.exitcode, rank_lines.get(rank, (0, None))[1], memory.low_before(failure.timestamp))
        for rank, failure in sorted(failures.items(), key=order)
    ]


def spans_nodes(args: argparse.Namespace) -> bool:
    """Whether the job may run on more than one node (``--nnodes N`` or ``MIN:MAX``, also from ``PET_NNODES``)."""
    return any(part.strip().isdigit() and int(part) > 1 for part in str(args.nnodes).split(":"))


def on_node(failure: RankFailure, local_rank: int, args: argparse.Namespace) -> RankFailure:
    """A failure of a job across nodes, its line naming the node it happened on: the node's rank in the job (ranks
    are numbered node by node, ``--nproc_per_node`` each), this host and, in a Ray sweep, its Ray node. A node's
    launcher sees its own workers only: a peer lost on another node is a ``communication`` error here, that node's
    pod names the cause."""
    if not (match := TERMINATION_LINE.match(failure.line)):
        return failure
    per_node = str(args.nproc_per_node)
    node = f"node {(failure.rank - local_rank) // int(per_node)} " if per_node.isdecimal() else "node "
    rank = f"rank {match['rank']}: " if match["rank"] is not None else ""
    return failure._replace(line=f"{match['category']}: {rank}{this_node(node)}: {match['reason']}")


def this_node(node: str) -> str:
    """``node`` ("node N " or "node ") with this host and, in a Ray sweep, its Ray node."""
    ray_node = os.environ.get(RAY_NODE_ID_ENV)
    return f"{node}({socket.gethostname()}{f', Ray node {ray_node[:12]}' if ray_node else ''})"


def rendezvous_timeout(exc: BaseException, args: argparse.Namespace) -> str | None:
    """The termination line for a rendezvous that timed out before every node joined, or None for any other error.

    torch's agent raises it from ``run`` before starting a worker: ``RendezvousTimeoutError`` (c10d, etcd: after
    ``--rdzv_conf join_timeout=S``), or, for the static rendezvous the operators' ``PET_MASTER_*`` variables give
    (``--rdzv_conf timeout=S``), the TCP store's own timeout: node 0, its host, counts the nodes that joined
    ("Timed out after 601 seconds waiting for clients. 1/2 clients joined."); another node never reached it."""
    from torch.distributed import DistNetworkError, DistStoreError
    from torch.distributed.elastic.rendezvous import RendezvousTimeoutError
    from torch.distributed.run import get_rdzv_endpoint

    timed_out = isinstance(exc, (DistStoreError, DistNetworkError)) and "timed out" in str(exc).lower()
    if not (timed_out or isinstance(exc, RendezvousTimeoutError)):
        return None
    static = args.rdzv_backend == "static"
    conf = dict(item.partition("=")[::2] for item in str(args.rdzv_conf).split(",") if "=" in item)
    seconds = conf.get("timeout" if static else "join_timeout", "600").strip()
    where = f"the rendezvous at {get_rdzv_endpoint(args)} within {seconds} s"
    if joined := re.search(r"(\d+)/(\d+) clients joined", str(exc)):
        reason = f"only {joined[1]} of {joined[2]} nodes joined {where}"
    elif static and str(args.node_rank) != "0" and isinstance(exc, DistNetworkError):
        reason = f"node 0 never opened {where}"
    else:
        said = f": {one_line(exc)}" if str(exc) else ""
        needed = str(args.nnodes).partition(":")[0]  # MIN of MIN:MAX: the rendezvous closes once that many joined
        reason = f"fewer than the {needed} nodes needed joined {where} ({type(exc).__name__}{said})"
    node = this_node(f"node {args.node_rank} " if static else "node ")
    return f"{ErrorCategory.COMMUNICATION}: {node}: {reason}"


def termination_message(failures: list[RankFailure]) -> str:
    """The pod's termination log: the root cause's line, then one line per other failed rank while within 4 KiB."""
    root, *others = failures
    text = one_line(root.line, TERMINATION_LOG_MAX_BYTES - 1) + "\n"
    for failure in others:
        line = one_line(failure.line, OTHER_RANK_LINE_MAX_BYTES - 1) + "\n"
        if len((text + line).encode()) > K8S_TERMINATION_MESSAGE_MAX_BYTES:
            break
        text += line
    return text


def _process_count(job_config: dict) -> int:
    launch_args = job_config.get(LAUNCH_ARGS_KEY) or {}
    if not isinstance(launch_args, dict):
        raise UserInputError(f"{LAUNCH_ARGS_KEY} in the job config must be an object, got {type(launch_args).__name__}")
    if ignored := sorted(set(launch_args) - {"num_processes"}):
        names = ", ".join(f"{LAUNCH_ARGS_KEY}.{key}" for key in ignored)
        logger.warning("tuning.launch ignores %s; give torchrun flags instead", names)
    count = launch_args.get("num_processes")
    if count is None:
        import torch

        return torch.cuda.device_count() or 1
    if isinstance(count, bool) or not str(count).isdigit() or int(count) < 1:
        raise UserInputError(f"{LAUNCH_ARGS_KEY}.num_processes must be a positive integer, got {count!r}")
    return int(count)


def torchrun_args(argv: list[str], scratch: str) -> argparse.Namespace:
    """torchrun's own parser on ``argv``; given no script, the container entrypoint's command, the job config
    handed to the workers as a file in ``scratch`` (an environment variable has a size limit: exec fails with
    "Argument list too long" past 128 KiB)."""
    from torch.distributed.run import get_args_parser

    parser = get_args_parser()
    parser.prog = "tuning.launch"
    if parser.parse_args([*argv, _NO_SCRIPT]).training_script != _NO_SCRIPT:
        return checked(parser.parse_args(argv))
    job_config = get_json_config()
    if not job_config:
        raise UserInputError(
            f"give the script to run (e.g. tuning/sft_trainer.py), or set {CONFIG_PATH_ENV} or "
            f"{CONFIG_BASE64_ENV} to run tuning/sft_trainer.py on that job config"
        )
    processes = _process_count(job_config)
    if LAUNCH_ARGS_KEY in job_config:  # the trainer reads the job config named by the environment, without this key
        del job_config[LAUNCH_ARGS_KEY]
        config_path = Path(scratch) / "job-config.json"
        config_path.write_text(json.dumps(job_config), encoding="utf-8")
        os.environ.pop(CONFIG_BASE64_ENV, None)  # it would win over the file
        os.environ[CONFIG_PATH_ENV] = str(config_path)
    # The count first: a --nproc_per_node typed on the command line still wins.
    return checked(parser.parse_args([f"--nproc_per_node={processes}", *argv, SFT_TRAINER]))


def checked(args: argparse.Namespace) -> argparse.Namespace:
    """torchrun's arguments that its agent would only fail on after starting (an ``AssertionError`` for a count
    of 0, every worker exiting 2 for a missing script) rejected first, as user errors."""
    count = str(args.nproc_per_node)
    if count not in NPROC_NAMES and not (count.isdecimal() and int(count) > 0):
        raise UserInputError(
            f"--nproc_per_node must be a positive integer or one of {', '.join(NPROC_NAMES)}, got {count!r}"
        )
    script = args.training_script
    if not (args.module or args.no_python or os.path.isfile(script)):
        raise UserInputError(f"the script to run, {script}, is not a file")
    return args


def launch(args: argparse.Namespace, scratch: str) -> int:
    """Run torchrun with ``args``; return the pod's exit code, having written its termination log. ``scratch``: a
    directory for the workers' termination log, removed after the run."""
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import run

    pod_log = os.environ.get(TERMINATION_LOG_ENV)
    # The workers append their lines to a file of their own; the launcher's go to the pod's log.
    workers_log = os.environ[TERMINATION_LOG_ENV] = os.path.join(scratch, "termination-log")
    try:
        with HostMemoryWatch() as memory:
            run(args)
        return 0
    except ChildFailedError as exc:
        failed = failures_in_order(exc.failures, read_rank_lines(workers_log), memory)
        if spans_nodes(args):
            failed = [on_node(failure, exc.failures[failure.rank].local_rank, args) for failure in failed]
    except SignalException as exc:
        # The agent has forwarded it and waited for the workers: the job ends as interrupted, in one line.
        raise SignalInterrupt(exc.sigval) from exc
    except Exception as exc:
        if not (line := rendezvous_timeout(exc, args)):
            raise
        # No worker started: the node's own line, as a failure of no rank.
        failed = [RankFailure(-1, exit_code_for(ErrorCategory.COMMUNICATION), line)]
    finally:
        install_early_signal_handlers()  # instead of the agent's, which raise into whatever runs next
        if pod_log is None:
            os.environ.pop(TERMINATION_LOG_ENV, None)
        else:
            os.environ[TERMINATION_LOG_ENV] = pod_log
    write_termination_log(termination_message(failed), replace=True)
    root = failed[0]
    more = f"; {len(failed) - 1} more rank(s) failed after it" if len(failed) > 1 else ""
    print(f"tuning.launch: exit {root.exit_code}, root cause: {root.line}{more}", file=sys.stderr, flush=True)
    return root.exit_code


def main(argv: list[str] | None = None) -> int:
    """``python -m tuning.launch`` and the ``tuning-launch`` console script. The scripts' prologue without the
    trackers' helpers: the workers start their own."""
    argv = sys.argv[1:] if argv is None else argv
    ground_prologue(argv)

    def launch_job() -> int:
        with tempfile.TemporaryDirectory(prefix="tuning-launch-") as scratch:
            return launch(torchrun_args(argv, scratch), scratch)

    return run_with_error_reporting(launch_job, role="launcher")


def sft_trainer_main() -> int:
    """The ``sft_trainer`` console script: the scripts' prologue first (signal handling, the trackers' helpers), then
    the trainer's heavy imports."""
    early_helpers = prologue(sys.argv[1:])
    from tuning.sft_trainer import main as trainer_main

    return trainer_main(early_helpers)


if __name__ == "__main__":
    sys.exit(main())
