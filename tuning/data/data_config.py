"""The data config (``--data_config_path``) of fms-hf-tuning v3.1.0: a YAML or JSON file listing datasets (their
files, folders, globs or Hub dataset ids, a ``datasets`` builder, a sampling ratio, a train/validation split and the
handlers that turn their rows into training rows) and the data processor's settings (seed, streaming, the stopping
strategy of sampling, a chat template).

Every fault is a ``UserInputError`` (a ``ValueError``) naming the file, the dataset and the key, raised before any
model work. The online data mixing processor (``type: odm``) needs fms-acceleration and is refused."""

import hashlib
import json
import logging
import os
from base64 import b64decode
from dataclasses import dataclass
from numbers import Real
from pathlib import Path
from typing import Any

from tuning.data.utils import get_extension
from tuning.utils.error_logging import UserInputError

logger = logging.getLogger(__name__)

STOPPING_STRATEGIES = ("all_exhausted", "first_exhausted")
SPLIT_NAMES = ("train", "validation")
_DATASET_KEYS = {"name", "data_paths", "builder", "sampling", "data_handlers", "split", "dataset_split_name", "shuffle"}
_PROCESSOR_KEYS = {
    "type",
    "sampling_stopping_strategy",
    "seed",
    "streaming",
    "chat_template",
    "chat_template_path",
    "chat_template_base64",
    "odm",
}


@dataclass
class DataHandlerConfig:
    """A handler by its registered name, and the keyword arguments of its ``map``/``filter`` call (``fn_kwargs``,
    ``batched``, ``remove_columns``, ``num_proc``...) or, for the column handlers, their own."""

    name: str
    arguments: dict | None


@dataclass
class DataSetConfig:
    name: str
    data_paths: list[str]
    builder: str | None = None  # a ``datasets`` builder name: json, parquet, arrow, csv, text...
    sampling: float | None = None
    data_handlers: list[DataHandlerConfig] | None = None
    split: dict[str, float] | None = None
    # fms-hf-tuning 3.2's: the split of the data to load (a Hub dataset's split name, or a slice such as train[:50%];
    # local files have one split, train), and whether a train/validation split shuffles the rows first.
    dataset_split_name: str | None = None
    shuffle: bool | None = True


@dataclass
class DataPreProcessorConfig:
    type: str | None = "default"
    sampling_stopping_strategy: str | None = "all_exhausted"
    seed: int | None = 42  # not None: the same config mixes and splits the same way every run
    streaming: bool | None = False
    chat_template: str | None = None
    chat_template_path: str | None = None
    odm: Any = None


@dataclass
class DataConfig:
    dataprocessor: DataPreProcessorConfig
    datasets: list[DataSetConfig]


class _Where:
    """Names the place of a fault: the file, the dataset, the key."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, message: str, dataset: str | None = None, key: str | None = None) -> UserInputError:
        parts = [f"data config {self.source}"]
        if dataset is not None:
            parts.append(f"dataset {dataset}")
        if key is not None:
            parts.append(f"key '{key}'")
        return UserInputError(f"{': '.join(parts)}: {message}")


def _is_ratio(value: Any) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool) and 0.0 <= value <= 1.0


def _handler_config(raw: Any, where: _Where, dataset: str, index: int) -> DataHandlerConfig:
    key = f"data_handlers[{index}]"
    if not isinstance(raw, dict):
        raise where.fail(f"a handler is a mapping with 'name' and 'arguments', got {raw!r}", dataset, key)
    if not isinstance(raw.get("name"), str):
        raise where.fail("a handler needs a 'name' (a string)", dataset, key)
    arguments = raw.get("arguments", {})
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise where.fail(f"handler '{raw['name']}': 'arguments' must be a mapping", dataset, f"{key}.arguments")
    if unknown := sorted(set(raw) - {"name", "arguments"}):
        raise where.fail(f"unknown key(s) {unknown} (a handler has 'name' and 'arguments')", dataset, key)
    return DataHandlerConfig(name=raw["name"], arguments=dict(arguments))


def _dataset_config(raw: Any, where: _Where, index: int) -> DataSetConfig:
    if not isinstance(raw, dict):
        raise where.fail(f"each entry of 'datasets' is a mapping, got {raw!r}", f"#{index}")
    name = raw.get("name", "")
    if not isinstance(name, str):
        raise where.fail("the dataset name must be a string", f"#{index}", "name")
    label = f"'{name}'" if name else f"#{index}"
    if unknown := sorted(set(raw) - _DATASET_KEYS):
        raise where.fail(f"unknown key(s) {unknown}; a dataset has {sorted(_DATASET_KEYS)}", label)
    paths = raw.get("data_paths")
    if paths is None:
        raise where.fail("data_paths should be specified for each dataset", label, "data_paths")
    if isinstance(paths, str):
        paths = [paths]
    if not isinstance(paths, list) or not paths or not all(isinstance(path, str) and path for path in paths):
        raise where.fail(f"a list of files, folders, globs or Hub dataset ids, got {paths!r}", label, "data_paths")
    # Relative paths are read from where the job runs, as fms-hf-tuning reads them.
    data_paths = [os.path.abspath(path) if os.path.exists(path) else path for path in paths]
    config = DataSetConfig(name=name, data_paths=data_paths)
    builder = raw.get("builder")
    if builder is not None and not isinstance(builder, str):
        raise where.fail(f"a datasets builder name (json, parquet, arrow, csv...), got {builder!r}", label, "builder")
    config.builder = builder
    sampling = raw.get("sampling")
    if sampling is not None:
        if not _is_ratio(sampling):
            raise where.fail(f"sampling ratio: {sampling!r} should be float and in range [0.0,1.0]", label, "sampling")
        config.sampling = float(sampling)
    handlers = raw.get("data_handlers")
    if handlers is not None:
        if not isinstance(handlers, list):
            raise where.fail("a list of handlers", label, "data_handlers")
        config.data_handlers = [_handler_config(handler, where, label, i) for i, handler in enumerate(handlers)]
    split = raw.get("split")
    if split is not None:
        if not isinstance(split, dict):
            raise where.fail("split must be a mapping of split name to ratio", label, "split")
        for key, value in split.items():
            if key not in SPLIT_NAMES:
                raise where.fail(f"unknown split '{key}'; the splits are {list(SPLIT_NAMES)}", label, "split")
            if not _is_ratio(value):
                raise where.fail(f"ratio for '{key}' must be a float in [0.0, 1.0], got {value!r}", label, "split")
        total = sum(split.values())
        if not 0 < total <= 1.0 + 1e-9:
            raise where.fail(f"train + validation must be in (0, 1], got {total}", label, "split")
        config.split = {key: float(value) for key, value in split.items()}
    split_name = raw.get("dataset_split_name")
    if split_name is not None:
        if not isinstance(split_name, str) or not split_name.strip():
            raise where.fail(
                f"a split name (train, or a slice: train[:50%]), got {split_name!r}", label, "dataset_split_name"
            )
        config.dataset_split_name = split_name
    shuffle = raw.get("shuffle", True)
    if not isinstance(shuffle, bool):
        raise where.fail(f"shuffle: {shuffle!r} should be a bool", label, "shuffle")
    config.shuffle = shuffle
    return config


def _read_chat_template_path(path: str, where: _Where) -> tuple[str, str]:
    resolved = os.path.abspath(os.path.expanduser(os.path.expandvars(path)))
    if not os.path.isfile(resolved):
        what = "is not a file" if os.path.exists(resolved) else "does not exist"
        raise where.fail(f"{path} {what} (resolved to {resolved})", "dataprocessor", "chat_template_path")
    try:
        with open(resolved, encoding="utf-8") as handle:
            return handle.read(), resolved
    except (OSError, UnicodeDecodeError) as exc:
        raise where.fail(f"cannot read {resolved}: {exc}", "dataprocessor", "chat_template_path") from exc


def _processor_config(raw: Any, where: _Where) -> DataPreProcessorConfig:
    fail = where.fail
    if not isinstance(raw, dict):
        raise fail("dataprocessor in data_config needs to be a mapping", "dataprocessor")
    if unknown := sorted(set(raw) - _PROCESSOR_KEYS):
        raise fail(f"unknown key(s) {unknown}; it has {sorted(_PROCESSOR_KEYS)}", "dataprocessor")
    config = DataPreProcessorConfig()
    kind = raw.get("type", "default")
    if kind == "odm" or raw.get("odm") is not None:
        raise fail(
            "online data mixing (odm) needs fms-acceleration and is not supported by tuning-bench",
            "dataprocessor",
            "type",
        )
    if kind != "default":
        raise fail(f"unknown dataprocessor type {kind!r}; the type is 'default'", "dataprocessor", "type")
    strategy = raw.get("sampling_stopping_strategy", config.sampling_stopping_strategy)
    if strategy not in STOPPING_STRATEGIES:
        raise fail(f"{strategy!r}: one of {list(STOPPING_STRATEGIES)}", "dataprocessor", "sampling_stopping_strategy")
    config.sampling_stopping_strategy = strategy
    seed = raw.get("seed", config.seed)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise fail(f"seed should be int, got {seed!r}", "dataprocessor", "seed")
    config.seed = seed
    streaming = raw.get("streaming", False)
    if not isinstance(streaming, bool):
        raise fail(f"streaming: {streaming!r} should be a bool", "dataprocessor", "streaming")
    config.streaming = streaming
    templates = [key for key in ("chat_template", "chat_template_path", "chat_template_base64") if raw.get(key)]
    if len(templates) > 1:
        raise fail(
            "Only one of 'chat_template', 'chat_template_path', or 'chat_template_base64' may be specified",
            "dataprocessor",
            templates[1],
        )
    for key in templates:
        if not isinstance(raw[key], str):
            raise fail("a string", "dataprocessor", key)
    if "chat_template" in templates:
        config.chat_template = raw["chat_template"]
    elif "chat_template_path" in templates:
        config.chat_template, config.chat_template_path = _read_chat_template_path(raw["chat_template_path"], where)
    elif "chat_template_base64" in templates:
        try:
            config.chat_template = b64decode(raw["chat_template_base64"], validate=True).decode("utf-8")
        except (ValueError, UnicodeDecodeError) as exc:
            raise fail(f"not base64 of a UTF-8 template: {exc}", "dataprocessor", "chat_template_base64") from exc
    return config


def validate_data_config(raw: dict, source: str = "<data config>") -> DataConfig:
    """The ``DataConfig`` of an already parsed config mapping; ``source`` names it in errors."""
    where = _Where(source)
    if not isinstance(raw, dict):
        raise where.fail(f"a mapping with 'datasets' (and 'dataprocessor'), got {type(raw).__name__}")
    if unknown := sorted(set(raw) - {"datasets", "dataprocessor"}):
        raise where.fail(f"unknown top-level key(s) {unknown}; a data config has 'dataprocessor' and 'datasets'")
    if "datasets" not in raw:
        raise where.fail("datasets should be provided in data config", key="datasets")
    if not isinstance(raw["datasets"], list) or not raw["datasets"]:
        raise where.fail("datasets should be provided as a non-empty list", key="datasets")
    datasets = [_dataset_config(dataset, where, index) for index, dataset in enumerate(raw["datasets"])]
    names = [dataset.name for dataset in datasets if dataset.name]
    if duplicated := sorted({name for name in names if names.count(name) > 1}):
        raise where.fail(f"dataset names must be unique: {duplicated} repeated", key="name")
    raw_processor = raw.get("dataprocessor")
    processor = DataPreProcessorConfig() if raw_processor is None else _processor_config(raw_processor, where)
    return DataConfig(dataprocessor=processor, datasets=datasets)


def load_and_validate_data_config(data_config_file: str) -> DataConfig:
    """Read and check a ``.yaml``/``.yml``/``.json`` data config."""
    return _parse_data_config(data_config_file, _read_data_config(data_config_file))


def _read_data_config(data_config_file: str) -> bytes:
    where = _Where(data_config_file)
    if not os.path.isfile(data_config_file):
        raise where.fail("file not found")
    if get_extension(data_config_file) not in (".yaml", ".yml", ".json"):
        raise where.fail("a data config is a .yaml, .yml or .json file")
    return Path(data_config_file).read_bytes()


def _parse_data_config(data_config_file: str, content: bytes) -> DataConfig:
    import yaml

    try:
        text = content.decode("utf-8")
        raw = json.loads(text) if get_extension(data_config_file) == ".json" else yaml.safe_load(text)
    except (yaml.YAMLError, ValueError, UnicodeDecodeError) as exc:
        raise _Where(data_config_file).fail(f"not valid YAML/JSON: {exc}") from exc
    return validate_data_config(raw, data_config_file)


# A job's data config is read once: the first step of its start that asks for it (the dump's configuration, the
# checks, the vision test, the dump's description, the cache key, the data preparation) reads the file, and the job's
# DataArguments carry those bytes and their parse to the others, so that all of them see the one reading even if the
# file is replaced meanwhile. train() drops it when it ends: arguments handed to train() again read the file again.
_JOB_DATA_CONFIG = "_tuning_data_config"


@dataclass
class _JobDataConfig:
    path: str
    content: bytes
    config: DataConfig | None = None


def _job_data_config(data_args) -> _JobDataConfig:
    held = vars(data_args).get(_JOB_DATA_CONFIG)
    if held is None or held.path != data_args.data_config_path:
        held = _JobDataConfig(data_args.data_config_path, _read_data_config(data_args.data_config_path))
        vars(data_args)[_JOB_DATA_CONFIG] = held
    return held


def job_data_config(data_args) -> DataConfig | None:
    """The checked data config of ``data_args.data_config_path`` (None without one), read once per job: every later
    call with these arguments (or a shallow copy of them) gets the same object, which callers read and never change."""
    if not data_args.data_config_path:
        return None
    held = _job_data_config(data_args)
    if held.config is None:
        held.config = _parse_data_config(held.path, held.content)
    return held.config


def job_data_config_sha256(data_args) -> str | None:
    """The sha256 (hex) of the data config's bytes as the job read them; None without one, or where it cannot be
    read (the checks name that fault)."""
    if not data_args.data_config_path:
        return None
    try:
        return hashlib.sha256(_job_data_config(data_args).content).hexdigest()
    except (OSError, UserInputError):
        return None


def forget_job_data_config(data_args) -> None:
    """The end of a job: the next one with these arguments reads the data config file again."""
    vars(data_args).pop(_JOB_DATA_CONFIG, None)
