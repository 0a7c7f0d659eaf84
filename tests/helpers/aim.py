"""Real Aim for tests: an ``aim server`` on 127.0.0.1 and reads of a local repo."""

import atexit
import functools
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.helpers.server import ServerProcess

AIM_CLI = str(Path(sys.executable).with_name("aim"))
METADATA = {"gpu_model": "A100-80GB", "dataset_id": "my-amazing-dataset"}
METADATA_QUERY = 'run.experiment_metadata.dataset_id == "my-amazing-dataset"'


class AimServer(ServerProcess):
    """A real ``aim server`` on 127.0.0.1 (it forks uvicorn, which owns the socket), serving an existing repo."""

    name = "aim server"

    def __init__(self, repo: Path, startup_timeout: float = 90.0):
        self.repo = repo
        existing_repo(repo)

        def command(port: int) -> list[str]:
            return [AIM_CLI, "server", "-y", "--repo", str(repo), "--host", "127.0.0.1", "--port", str(port)]

        super().__init__(command, startup_timeout)
        self.url = f"aim://127.0.0.1:{self.port}"


@functools.cache
def _initialized_repo() -> Path:
    """One repo made by ``aim init`` per test process (Aim runs its database migrations in a subprocess of its own
    when it creates a repo), removed when the process ends."""
    folder = Path(tempfile.mkdtemp(prefix="aim-init-"))
    atexit.register(shutil.rmtree, folder, True)
    subprocess.run([AIM_CLI, "init", "--repo", str(folder)], check=True, capture_output=True)
    return folder


def existing_repo(path: Path) -> Path:
    """An Aim repo at ``path`` as ``aim init`` leaves it, copied: runs land in a repo that exists already, as a team's
    do. Creating a new repo is proved on its own (tests/trackers/test_aim_tracker.py's ``new`` repos)."""
    shutil.copytree(_initialized_repo(), path, dirs_exist_ok=True)
    return path


def reindex_repo(repo: Path) -> None:
    """``aim storage --repo REPO reindex -y``, Aim's own command, run in this process: its import is paid once per test
    process instead of once per read."""
    from aim.cli.cli import cli_entry_point

    cli_entry_point.main(["storage", "--repo", str(repo), "reindex", "-y"], standalone_mode=False)


def read_runs(repo: Path, query: str = "True", reindex: bool = True) -> list[dict]:
    """Runs matching ``query`` in a local repo, after rebuilding its index (SDK reads see nothing otherwise; a caller
    querying a repo nothing writes to any more passes ``reindex=False`` after its first query)."""
    from aim import Repo

    if reindex:
        reindex_repo(repo)
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
