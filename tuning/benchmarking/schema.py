"""The benchmark dump's schema: one definition for the writer (bench_train), the journal rebuild and readers.

The schema is plain data in a small JSON-Schema subset (``type`` with a list for nullable values, ``properties``,
``required``, ``items``, ``enum``), so a reader can also feed it to any JSON-Schema validator. ``validate_dump`` checks
a dump without third-party packages. Keys may be added in later versions; renaming or dropping one bumps
``SCHEMA_VERSION``.
"""

from typing import Any

SCHEMA_VERSION = 1
STATUSES = ("ok", "error", "stopped")
STOP_REASONS = ("stop_after_seconds", "auto_stop")

# Series the summary is computed from; every writer uses these names.
STEP_TIME = "step_time_seconds"  # wall time of one optimizer step, from the end of the previous one
STEP_TOKENS = "step_tokens"  # non-padding tokens of one optimizer step, summed over all ranks
STEP_SAMPLES = "step_samples"  # samples of one optimizer step, all ranks (the global batch size)
TOKENS_PER_SECOND = "tokens_per_second"  # STEP_TOKENS / STEP_TIME, per step
PROCESS_RSS = "process_rss_bytes"
MODEL_LOAD_TIME = "model_load_time"

_NUMBER = {"type": ["number", "null"]}  # null stands for a value that was NaN or infinite
_SERIES_KEYS = {"name": {"type": "string"}, "context": {"type": "object"}}

_METRIC = {
    "type": "object",
    "required": ["name", "context", "steps", "values", "timestamps"],
    "properties": {
        **_SERIES_KEYS,
        "steps": {"type": "array", "items": {"type": ["integer", "null"]}},
        "values": {"type": "array", "items": _NUMBER},
        "timestamps": {"type": "array", "items": {"type": "number"}},
    },
}

_AGGREGATE = {
    "type": "object",
    "required": ["name", "context", "min", "avg", "max", "count"],
    "properties": {**_SERIES_KEYS, "min": _NUMBER, "avg": _NUMBER, "max": _NUMBER, "count": {"type": "integer"}},
}

_CUDA_DEVICE = {
    "type": "object",
    "required": ["device", "max_memory_allocated_bytes", "max_memory_reserved_bytes"],
    "properties": {
        "device": {"type": "integer"},
        "max_memory_allocated_bytes": {"type": "integer"},
        "max_memory_reserved_bytes": {"type": "integer"},
    },
}

_SUMMARY_NUMBERS = (
    "train_runtime",
    "model_load_time",
    "tokens_per_second",
    "samples_per_second",
    "step_time_p50",
    "step_time_p90",
)

_SUMMARY = {
    "type": "object",
    "required": [*_SUMMARY_NUMBERS, "measured_steps", "peak_rss_bytes", "cuda"],
    "properties": {
        **{key: _NUMBER for key in _SUMMARY_NUMBERS},
        "measured_steps": {"type": "integer"},
        "peak_rss_bytes": {"type": ["integer", "null"]},
        "cuda": {"type": ["array", "null"], "items": _CUDA_DEVICE},
    },
}

_VERSION = {"type": ["string", "null"]}
_ENVIRONMENT = {
    "type": "object",
    "required": ["python", "torch", "transformers", "trl", "peft", "aim", "cuda", "cuda_driver", "gpus"],
    "properties": {
        **{key: _VERSION for key in ("python", "torch", "transformers", "trl", "peft", "aim", "cuda", "cuda_driver")},
        "gpus": {"type": "array", "items": {"type": "string"}},
    },
}

# The error-reporting module's report (see tuning.utils.error_logging), or the note a rebuild writes when the run
# died without one: then only the keys below are known.
_ERROR = {
    "type": ["object", "null"],
    "required": ["category", "message", "global_step"],
    "properties": {
        "category": {"type": ["string", "null"]},
        "message": {"type": "string"},
        "global_step": {"type": ["integer", "null"]},
    },
}

DUMP_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": [
        "schema_version",
        "status",
        "stop_reason",
        "run_hash",
        "experiment",
        "metadata",
        "host",
        "rank",
        "world_size",
        "start_time",
        "stop_time",
        "training_steps",
        "warmup_steps",
        "summary",
        "metrics",
        "aggregates",
        "environment",
        "error",
        "aim_degraded_reason",
        "mlflow_run_id",
        "mlflow_degraded_reason",
        "rebuilt_from_journal",
    ],
    "properties": {
        "schema_version": {"type": "integer", "enum": [SCHEMA_VERSION]},
        "status": {"type": "string", "enum": list(STATUSES)},
        "stop_reason": {"type": ["string", "null"], "enum": [*STOP_REASONS, None]},
        "run_hash": {"type": ["string", "null"]},
        "experiment": {"type": ["string", "null"]},
        "metadata": {"type": "object"},
        "host": {"type": "string"},
        "rank": {"type": "integer"},
        "world_size": {"type": "integer"},
        "start_time": {"type": "string"},
        "stop_time": {"type": "string"},
        "training_steps": {"type": "integer"},
        "warmup_steps": {"type": "integer"},
        "summary": _SUMMARY,
        "metrics": {"type": "array", "items": _METRIC},
        "aggregates": {"type": "array", "items": _AGGREGATE},
        "environment": _ENVIRONMENT,
        "error": _ERROR,
        "aim_degraded_reason": {"type": ["string", "null"]},
        "mlflow_run_id": {"type": ["string", "null"]},
        "mlflow_degraded_reason": {"type": ["string", "null"]},
        "rebuilt_from_journal": {"type": "boolean"},
    },
}

_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "number": (int, float),
    "integer": (int,),
    "boolean": (bool,),
    "null": (type(None),),
}


def _type_matches(value: Any, name: str) -> bool:
    # bool is an int subclass in Python but never a JSON number.
    if isinstance(value, bool) and name in ("number", "integer"):
        return False
    return isinstance(value, _TYPES[name])


def _check(value: Any, schema: dict[str, Any], path: str, problems: list[str]) -> None:
    types = schema.get("type")
    if types is not None:
        types = [types] if isinstance(types, str) else types
        if not any(_type_matches(value, name) for name in types):
            problems.append(f"{path}: expected {' or '.join(types)}, got {type(value).__name__}")
            return
    if "enum" in schema and value not in schema["enum"]:
        problems.append(f"{path}: {value!r} is not one of {schema['enum']}")
    if isinstance(value, dict):
        problems.extend(f"{path}: missing key {key!r}" for key in schema.get("required", ()) if key not in value)
        for key, subschema in schema.get("properties", {}).items():
            if key in value:
                _check(value[key], subschema, f"{path}.{key}", problems)
    if isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            _check(item, schema["items"], f"{path}[{index}]", problems)


def validate(value: Any, schema: dict[str, Any]) -> list[str]:
    """Every way ``value`` departs from ``schema`` (empty when it conforms), as ``$.path: problem`` lines."""
    problems: list[str] = []
    _check(value, schema, "$", problems)
    return problems


def validate_dump(dump: Any) -> list[str]:
    """Problems of a benchmark dump against ``DUMP_SCHEMA``, plus the cross-field rules a schema cannot say."""
    problems = validate(dump, DUMP_SCHEMA)
    if problems:
        return problems
    if (dump["status"] == "error") != (dump["error"] is not None):
        problems.append("$.error: must be set exactly when status is 'error'")
    if (dump["status"] == "stopped") != (dump["stop_reason"] is not None):
        problems.append("$.stop_reason: must be set exactly when status is 'stopped'")
    for index, metric in enumerate(dump["metrics"]):
        lengths = {len(metric["steps"]), len(metric["values"]), len(metric["timestamps"])}
        if len(lengths) > 1:
            problems.append(f"$.metrics[{index}]: steps, values and timestamps differ in length")
    return problems
