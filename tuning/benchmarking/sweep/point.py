"""A sweep's point as a process tree of its own (bench_train.py, under ``tuning.launch`` when it has several
processes), stopped gracefully then killed, and how it ended: its status, category and reason, read from its files,
else from its log's error marker, else from its exit code.
"""

import contextlib
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from tuning.benchmarking import report
from tuning.benchmarking.paths import RunPaths
from tuning.benchmarking.sweep.spec import flag_tokens
from tuning.utils.error_logging import TERMINATION_LOG_ENV
from tuning.utils.processes import parent_death_signal

STOP_GRACE_SECONDS = 30.0  # after a SIGTERM (timeout, Ctrl-C) a point gets this long to write its dump
POLL_SECONDS = 0.5
# tuning.utils.error_logging's marker line: its category, and its type= part (exception type and message).
ERROR_MARKER = re.compile(r"^TUNING_ERROR category=(?P<category>\w+) .*?type=(?P<message>.*)$", re.M)
ATTEMPT_HEADER = "\n=== bench_sweep: "  # starts each attempt's part of a point's log
POINT_MARKER_ENV = "TUNING_SWEEP_POINT"  # in every process of a Ray point: its scratch directory
UNSCHEDULABLE = "unschedulable"  # a point the cluster could not place within its bounded wait: never started


class PointProcess:
    """A point's process tree in a session of its own: output_dir ``stem``, dump ``stem.json``, output appended to
    ``stem.log``. bench_train.py, under ``tuning.launch`` (torchrun with the root cause's exit code; ``--standalone``
    picks a free port on the machine that runs it) when it has several processes, or with ``rendezvous`` (torchrun's
    flags naming the nodes and where they meet) as one node of a point across several. Stopped with SIGTERM to its root
    (which bench_train and tuning.launch handle gracefully), then SIGKILL to every process of its tree."""

    def __init__(
        self,
        flags: dict[str, Any],
        nproc: int,
        stem: str,
        bench_train: str,
        timeout: float | None,
        rendezvous: list[str] | None = None,
        **popen: Any,
    ):
        launcher = [sys.executable]
        if rendezvous is not None:  # one node of several: torchrun's node flags and where the nodes meet
            launcher += ["-m", "tuning.launch", *rendezvous, "--nproc_per_node", str(nproc)]
        elif nproc > 1:
            launcher += ["-m", "tuning.launch", "--standalone", "--nproc_per_node", str(nproc)]
        paths = RunPaths.from_stem(stem)
        # A stopped point starts again from scratch (docs/sweeps.md): a checkpoint at its stop would only cost time.
        flags = {"save_on_preemption": False, **flags, "output_dir": stem, "metrics_path": paths.dump}
        # The termination log names the root cause as the launcher saw it: a rank SIGKILLed leaves no report.
        env = {**(popen.pop("env", None) or os.environ), TERMINATION_LOG_ENV: paths.termination_log}
        with open(paths.log, "ab") as log:
            self.process = subprocess.Popen(
                [*launcher, bench_train, *flag_tokens(flags)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=parent_death_signal(signal.SIGTERM),  # no point outlives its sweep
                env=env,
                **popen,
            )
        self.deadline = time.monotonic() + timeout if timeout else math.inf
        self.kill_at = math.inf  # once stopped: the end of its grace
        self.timed_out = False

    def poll(self) -> int | None:
        """The exit status once the point has ended; also enforces the timeout and the grace after a stop."""
        if (code := self.process.poll()) is not None:
            return code
        if time.monotonic() > self.deadline and self.kill_at == math.inf:
            self.timed_out = True
            self.stop()
        if time.monotonic() > self.kill_at:
            with contextlib.suppress(psutil.NoSuchProcess):  # every process of its tree, the root last
                root = psutil.Process(self.process.pid)
                for process in [*root.children(recursive=True), root]:
                    with contextlib.suppress(psutil.NoSuchProcess):
                        process.kill()
        return None

    def stop(self) -> None:
        if self.kill_at == math.inf:
            self.kill_at = time.monotonic() + STOP_GRACE_SECONDS
            self.process.send_signal(signal.SIGTERM)  # a no-op once it has ended

    def wait(self) -> int:
        while (code := self.poll()) is None:
            time.sleep(POLL_SECONDS)
        return code


def end_leftovers(marker: str) -> dict[str, Any]:
    """Every process whose environment holds ``POINT_MARKER_ENV=marker`` killed, once the point's launcher has ended:
    torchrun's workers run in sessions of their own and outlive a launcher killed by SIGKILL. Returns the ranks of
    those workers (``ranks``, from their ``RANK``, sorted) and their node's rank in the job (``node_rank``, from
    their ``GROUP_RANK``; None without workers)."""
    ranks, node_rank = set(), None
    for process in psutil.process_iter(["environ"]):
        environ = process.info.get("environ") or {}  # None: another user's process
        if environ.get(POINT_MARKER_ENV) != marker:
            continue
        with contextlib.suppress(psutil.Error):
            process.kill()
            if environ.get("RANK", "").isdigit():
                ranks.add(int(environ["RANK"]))
                node_rank = int(environ.get("GROUP_RANK", "0"))
    return {"ranks": sorted(ranks), "node_rank": node_rank}


def point_outcome(paths: RunPaths, ended: dict[str, Any], point_timeout: float | None) -> dict[str, Any]:
    """Status and category from the point's files (the root cause across ranks: they name the category and
    rank), else from the TUNING_ERROR line of this attempt's part of its log (category, and its message as the
    reason), else from its exit code (and the log's last line as the reason). A point its executor could never place
    on the cluster is ``unschedulable``, with the executor's reason."""
    if unschedulable := ended.get("unschedulable"):
        return {"status": UNSCHEDULABLE, "category": None, "exit_code": None, "reason": unschedulable}
    runs, exit_code = report.load(report.run_files(Path(paths.dump))), ended["exit_code"]
    status = runs[0].status if runs else "killed" if exit_code < 0 else "error"
    cause = runs[0].root_cause if runs else None
    category, reason = (cause.category, cause.message) if cause else (None, None)
    if category is None and exit_code != 0:
        attempt_log = Path(paths.log).read_text(errors="replace").rpartition(ATTEMPT_HEADER)[2]
        if markers := list(ERROR_MARKER.finditer(attempt_log)):
            status, category = "error", markers[-1]["category"]
            reason = markers[-1]["message"].strip()
        elif reason is None and exit_code > 0:  # it ended before it could report: its last words are all there is
            last_line = attempt_log.strip().rsplit("\n", 1)[-1].rsplit("\r", 1)[-1]
            reason = f"exited {exit_code} without an error report; its log ends: {last_line}"
    if ended["timed_out"]:
        status, reason = "timeout", f"ran past --point_timeout {point_timeout:g}s"
    elif status in report.FINISHED_STATUSES and exit_code != 0:
        status, reason = "error", f"exited {exit_code} after its dump said {status}"
    return {"status": status, "category": category, "exit_code": exit_code, "reason": reason}
