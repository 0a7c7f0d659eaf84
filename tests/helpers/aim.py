"""Real Aim for tests: an ``aim server`` on 127.0.0.1 and reads of a local repo."""

import json
import subprocess
import sys
from pathlib import Path

from tests.helpers.server import ServerProcess

AIM_CLI = str(Path(sys.executable).with_name("aim"))
METADATA = {"gpu_model": "A100-80GB", "dataset_id": "my-amazing-dataset"}
METADATA_QUERY = 'run.experiment_metadata.dataset_id == "my-amazing-dataset"'


class AimServer(ServerProcess):
    """A real ``aim server`` on 127.0.0.1 (it forks uvicorn, which owns the socket)."""

    name = "aim server"

    def __init__(self, repo: Path, startup_timeout: float = 90.0):
        self.repo = repo
        repo.mkdir(parents=True, exist_ok=True)

        def command(port: int) -> list[str]:
            return [AIM_CLI, "server", "-y", "--repo", str(repo), "--host", "127.0.0.1", "--port", str(port)]

        super().__init__(command, startup_timeout)
        self.url = f"aim://127.0.0.1:{self.port}"


def read_runs(repo: Path, query: str = "True", reindex: bool = True) -> list[dict]:
    """Runs matching ``query`` in a local repo, after rebuilding its index (SDK reads see nothing otherwise; a caller
    querying a repo nothing writes to any more passes ``reindex=False`` after its first query)."""
    from aim import Repo

    if reindex:
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
