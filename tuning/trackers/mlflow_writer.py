"""The MLflow backend of the mlflow tracker, run in its helper process (``tuning.trackers.helper_child``): owns the
job's MLflow run through ``mlflow.MlflowClient``, with the metric and param names of docs/trackers.md's MLflow
section.
"""

import contextlib
import hashlib
import itertools
import json
import logging
import os
import re
import time
from collections.abc import Iterator
from typing import Any

import mlflow
from filelock import FileLock
from mlflow.entities import Metric, Param
from mlflow.exceptions import MlflowException

logger = logging.getLogger(__name__)

# MLflow's documented limits: param values, keys, and entries per log_batch call.
MAX_PARAM_VALUE_LENGTH = 6000
MAX_KEY_LENGTH = 250
MAX_PARAMS_PER_BATCH = 100
MAX_METRICS_PER_BATCH = 1000
UNPREFIXED_GROUPS = ("experiment_metadata", "hparams")

_INVALID_KEY_CHARACTERS = re.compile(r"[^\w.\- /]")


def metric_key(name: str, context: dict[str, Any] | None = None) -> str:
    """A series' MLflow metric key: its name, then ``/key_value`` per context entry."""
    parts = [name, *(f"{key}_{value}" for key, value in sorted((context or {}).items()))]
    return valid_key("/".join(parts))


def valid_key(key: str) -> str:
    """``key`` with the characters MLflow refuses replaced; a longer one than MLflow takes ends in a digest of the
    whole, so that two keys alike in their first characters stay apart."""
    key = _INVALID_KEY_CHARACTERS.sub("_", key)
    if len(key) <= MAX_KEY_LENGTH:
        return key
    return f"{key[: MAX_KEY_LENGTH - 9]}.{hashlib.sha1(key.encode()).hexdigest()[:8]}"


def _leaves(params: dict[str, Any], prefix: str) -> Iterator[tuple[str, Any]]:
    """``(dotted name, value)`` of every value of nested ``params`` that is not a non-empty dict."""
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            yield from _leaves(value, f"{name}.")
        else:
            yield name, value


def param_text(value: Any) -> str:
    """A param value as MLflow stores it, text: lists, dicts and null as JSON (``null``, never ``None``), other
    values as ``str`` gives them (``True``, ``0.001``)."""
    return json.dumps(value) if value is None or isinstance(value, list | dict) else str(value)


def flatten(params: dict[str, Any], prefix: str = "") -> tuple[dict[str, str], list[str]]:
    """Nested params as MLflow params: dotted keys, string values within MLflow's length limit (longer ones
    continued in ``key.part2``, ...). Names that come out as one key (``{"a": {"b": 1}, "a.b": 2}``, ``x:y`` and
    ``x_y``) all stay: the second gets ``key-2``, the third ``key-3``, ... Returns the params and those names."""
    flat: dict[str, str] = {}
    renamed: list[str] = []
    for name, value in _leaves(params, prefix):
        text = param_text(value)
        starts = range(0, len(text), MAX_PARAM_VALUE_LENGTH)
        chunks = [text[start : start + MAX_PARAM_VALUE_LENGTH] for start in starts] or [""]
        for suffix in itertools.chain([""], (f"-{number}" for number in itertools.count(2))):
            parts = [f"{name}{suffix}", *(f"{name}{suffix}.part{index + 1}" for index in range(1, len(chunks)))]
            keys = [valid_key(part) for part in parts]
            if not any(key in flat for key in keys):
                break
        if suffix:
            renamed.append(name)
        flat.update(zip(keys, chunks, strict=True))
    return flat, renamed


class MlflowBackend:
    def __init__(self):
        self.client: Any = None
        self.run_id: str | None = None
        self.params: dict[str, str] = {}  # what the run holds already: MLflow params cannot change
        self.last_steps: dict[str, int] = {}  # per key, for points without a step
        self.warned_of_renames = False  # colliding param names are reported once per run

    def open(self, options: dict[str, Any]) -> dict[str, Any]:
        tracking_uri = options["tracking_uri"] or mlflow.get_tracking_uri()
        if tracking_uri.startswith("file:"):  # v3.1.0 users' file stores: MLflow 3 opens them only when opted in
            os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
        database = tracking_uri.removeprefix("sqlite:///") if tracking_uri.startswith("sqlite:///") else ""
        if database:
            os.makedirs(os.path.dirname(os.path.abspath(database)), exist_ok=True)
        # Jobs started together take turns: the client's constructor creates and migrates a new sqlite database, and
        # two migrations at once leave it half made for good.
        with FileLock(f"{database}.lock") if database else contextlib.nullcontext():
            self.client = mlflow.MlflowClient(tracking_uri=tracking_uri)
            experiment_id = self._experiment_id(options["experiment"])
        tags = {"mlflow.source.name": options["source"], "mlflow.source.type": "LOCAL"}
        run = self.client.create_run(experiment_id, tags=tags)
        self.run_id = run.info.run_id
        return {
            "run_id": self.run_id,
            "run_uri": f"runs:/{self.run_id}",
            "experiment_id": experiment_id,
            "tracking_uri": tracking_uri,
        }

    def _experiment_id(self, name: str | None) -> str:
        if name is None:
            return "0"  # MLflow's Default experiment
        experiment = self.client.get_experiment_by_name(name)
        if experiment is not None:
            return experiment.experiment_id
        try:
            return self.client.create_experiment(name)
        except MlflowException:  # created by a job started at the same time: read it again
            return self.client.get_experiment_by_name(name).experiment_id

    def track(self, points: list[list]) -> None:
        metrics = []
        for value, name, step, _epoch, context, at in points:
            key = metric_key(name, context)
            step = self.last_steps.get(key, -1) + 1 if step is None else int(step)  # without one: count on, as Aim
            self.last_steps[key] = step
            metrics.append(Metric(key, value, int(at * 1000), step))
        for start in range(0, len(metrics), MAX_METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[start : start + MAX_METRICS_PER_BATCH])

    def set_params(self, name: str, params: dict[str, Any]) -> None:
        """Params are immutable in MLflow: a key the run holds already keeps its first value."""
        bare = name in UNPREFIXED_GROUPS
        flat, renamed = flatten(params, "" if bare else f"{name}.")
        if renamed and not self.warned_of_renames:
            self.warned_of_renames = True
            logger.warning(
                "MLflow params %s came out under the key of another param once flattened; kept with a suffix "
                "(key-2, ...). Other such params of this run are renamed without a warning",
                ", ".join(map(repr, renamed)),
            )
        new = []
        for key, value in flat.items():
            if bare and self.params.get(key, value) != value:
                key = valid_key(f"{name}.{key}")  # the bare key holds another group's value
            if key not in self.params:
                self.params[key] = value
                new.append(Param(key, value))
        for start in range(0, len(new), MAX_PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=new[start : start + MAX_PARAMS_PER_BATCH])

    def close(self, status: str) -> None:
        self.client.set_terminated(self.run_id, status, int(time.time() * 1000))
