"""Real MLflow for tests: an ``mlflow server`` on 127.0.0.1 and searches of a store."""

import sys
from pathlib import Path

from tests.helpers.server import ServerProcess

MLFLOW_CLI = str(Path(sys.executable).with_name("mlflow"))
METADATA = {"gpu_model": "A100-80GB", "dataset_id": "my-amazing-dataset"}
METADATA_FILTER = "params.dataset_id = 'my-amazing-dataset'"


class MlflowServer(ServerProcess):
    """A real ``mlflow server`` (sqlite store) on 127.0.0.1 (it starts workers). Without MLflow's job execution
    (GenAI jobs, nothing of tracking): it would start six Huey consumer processes, 16 s of CPU per server."""

    name = "mlflow server"

    def __init__(self, root: Path, startup_timeout: float = 180.0):
        root.mkdir(parents=True, exist_ok=True)
        self.store = f"sqlite:///{root / 'mlflow.db'}"

        def command(port: int) -> list[str]:
            serve = [MLFLOW_CLI, "server", "--backend-store-uri", self.store, "--host", "127.0.0.1"]
            return [*serve, "--port", str(port), "--workers", "1", "--default-artifact-root", str(root / "artifacts")]

        jobs_off = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        super().__init__(command, startup_timeout, log_path=root / "server.log", env=jobs_off)
        self.url = f"http://127.0.0.1:{self.port}"


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
