"""Real MLflow for tests: an ``mlflow server`` on 127.0.0.1 and searches of a store."""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import free_port

MLFLOW_CLI = str(Path(sys.executable).with_name("mlflow"))
METADATA = {"gpu_model": "A100-80GB", "dataset_id": "my-amazing-dataset"}
METADATA_FILTER = "params.dataset_id = 'my-amazing-dataset'"


class MlflowServer:
    """A real ``mlflow server`` (sqlite store) on 127.0.0.1 in its own process group (it starts workers)."""

    def __init__(self, root: Path, startup_timeout: float = 180.0):
        root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.store = f"sqlite:///{root / 'mlflow.db'}"
        command = [MLFLOW_CLI, "server", "--backend-store-uri", self.store, "--host", "127.0.0.1"]
        command += ["--port", str(self.port), "--workers", "1", "--default-artifact-root", str(root / "artifacts")]
        self.process = subprocess.Popen(
            command,
            stdout=subprocess.DEVNULL,
            stderr=open(root / "server.log", "w"),  # noqa: SIM115 - closed when the server exits
            start_new_session=True,
        )
        deadline = time.monotonic() + startup_timeout
        while not self.accepts():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"mlflow server on port {self.port} did not start: {(root / 'server.log').read_text()}"
                )
            time.sleep(0.2)

    def accepts(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
            return True
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL the whole server, as a crashed or evicted server dies."""
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


def search(tracking_uri: str, filter_string: str = "") -> list:
    """Runs of every experiment in the store at ``tracking_uri`` matching ``filter_string``, as MLflow users search."""
    import mlflow

    mlflow.set_tracking_uri(tracking_uri)
    return mlflow.search_runs(search_all_experiments=True, filter_string=filter_string, output_format="list")


def history(tracking_uri: str, run_id: str, key: str) -> dict[int, float]:
    """A metric's values by step."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=tracking_uri)
    return {metric.step: metric.value for metric in client.get_metric_history(run_id, key)}
