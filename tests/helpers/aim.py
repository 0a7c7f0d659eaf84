"""Real Aim for tests: an ``aim server`` on 127.0.0.1 and reads of a local repo."""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import free_port

AIM_CLI = str(Path(sys.executable).with_name("aim"))
METADATA = {"gpu_model": "A100-80GB", "dataset_id": "my-amazing-dataset"}
METADATA_QUERY = 'run.experiment_metadata.dataset_id == "my-amazing-dataset"'


class AimServer:
    """A real ``aim server`` on 127.0.0.1 in its own process group (it forks uvicorn, which owns the socket)."""

    def __init__(self, repo: Path, startup_timeout: float = 90.0):
        self.repo, self.port = repo, free_port()
        self.url = f"aim://127.0.0.1:{self.port}"
        repo.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [AIM_CLI, "server", "-y", "--repo", str(repo), "--host", "127.0.0.1", "--port", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + startup_timeout
        while not self.accepts():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"aim server on port {self.port} did not start")
            time.sleep(0.2)

    def accepts(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
            return True
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL the whole server, as a crashed or evicted server dies: nothing gets flushed or closed."""
        self._signal(signal.SIGKILL)

    def stop(self) -> None:
        self._signal(signal.SIGTERM)

    def _signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, sig)
        self.process.wait(timeout=30)
        deadline = time.monotonic() + 10
        while self.accepts() and time.monotonic() < deadline:
            time.sleep(0.1)


def read_runs(repo: Path, query: str = "True") -> list[dict]:
    """Runs matching ``query`` in a local repo, after rebuilding its index (SDK reads see nothing otherwise)."""
    from aim import Repo

    subprocess.run([AIM_CLI, "storage", "--repo", str(repo), "reindex", "-y"], check=True, capture_output=True)
    runs = []
    for found in Repo(str(repo)).query_runs(query, report_mode=0).iter_runs():
        run = found.run
        metrics = {}
        for metric in run.metrics():
            key = (metric.name, json.dumps(metric.context.to_dict(), sort_keys=True))
            metrics[key] = {step: value for step, (value, _epoch, _time) in metric.data.items()}
        runs.append(
            {
                "hash": run.hash,
                "experiment": run.experiment,
                "params": run[...],
                "metrics": metrics,
                "active": run.active,
            }
        )
    return runs


def series(run: dict, name: str, context: dict | None = None) -> dict:
    return run["metrics"].get((name, json.dumps(context or {}, sort_keys=True)), {})
