"""The Aim backend of the aim tracker, run in its helper process (``tuning.trackers.helper_child``): owns the job's Aim
run through Aim's public API only (``Repo``, ``Run``, ``Run.track``, run params)."""

import os
from importlib import metadata
from typing import Any

from aim import Repo, Run
from filelock import FileLock

CREATE_LOCK_NAME = ".aim-create.lock"


class AimBackend:
    def __init__(self):
        self.run: Any = None
        # Installed versions, as Aim's UI shows them (Aim's own pkg_resources listing crashes on setuptools >= 81);
        # listed now, while the job is still loading, not once training may have begun.
        self.packages = {
            dist.metadata["Name"]: dist.version for dist in metadata.distributions() if dist.metadata["Name"]
        }

    def open(self, options: dict[str, Any]) -> dict[str, Any]:
        repo = options["repo"]
        if not repo.startswith("aim://"):
            # Created once, under a file lock: jobs started together into a new repository would otherwise create it
            # at the same time, and those that find it half made fail ("out of date").
            os.makedirs(repo, exist_ok=True)
            with FileLock(os.path.join(repo, CREATE_LOCK_NAME)):
                if not Repo.exists(repo):
                    Repo.from_path(repo, init=True)
        self.run = Run(
            repo=repo,
            experiment=options["experiment"],
            system_tracking_interval=options["system_tracking_interval"],
            log_system_params=False,
            capture_terminal_logs=False,
        )
        self.run["__system_params"] = {
            "packages": self.packages,
            "executable": options["executable"],
            "arguments": options["arguments"],
        }
        self.run["status"] = "RUNNING"  # until close() records the job's outcome; a run left so never ended
        return {"run_hash": self.run.hash}

    def track(self, points: list[list]) -> None:
        """Track ``[value, name, step, epoch, context, time]`` points in order; a row of points that share step, epoch
        and context (a trainer log, a step's measurements) is one call to Aim (one write to its storage)."""
        together: dict[str, float] = {}
        shared: tuple | None = None
        for value, name, step, epoch, context, _time in points:
            if (step, epoch, context) != shared or name in together:
                if together:
                    self.run.track(together, step=shared[0], epoch=shared[1], context=shared[2])
                together, shared = {}, (step, epoch, context)
            together[name] = value
        if together:
            self.run.track(together, step=shared[0], epoch=shared[1], context=shared[2])

    def set_params(self, name: str, params: dict[str, Any]) -> None:
        for key, value in params.items():
            self.run.set((name, key), value, strict=False)

    def close(self, status: str) -> None:
        self.run["status"] = status
        self.run.close()
