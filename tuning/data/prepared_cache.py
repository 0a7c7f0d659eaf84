"""The processed-data cache: a run's training rows (tokenised, masked, trimmed), stored once under a key and reused by
every later run whose rows would be identical (``--data_cache_dir``; not the run-scoped directories of
``tuning.data.cache``, which hold one run's intermediate files and go with it).

The key covers everything the rows depend on: the data files (path, size, mtime and a hash of their bytes), the data
arguments and the data config (its sha256 and, parsed, its handlers and their arguments), the extra handlers' code,
the tokenizer (its vocabulary, special tokens and chat template, as its serialised form), ``max_seq_length``, the
masking and packing settings, and the data path's code (the sources of ``tuning.data`` and the versions of
``datasets``, ``tokenizers`` and ``transformers``). A change to any of them is another key: never a stale hit.

An entry is built in a private directory and published by one ``rename``: a directory named by its key is complete. A
file lock per key makes concurrent builders (jobs, torchrun ranks, sweep points on a shared filesystem) take turns: the
first builds, the others then find the entry. A builder that dies mid-write leaves only its private directory, which
the next builder on its host removes once its owner is gone (``tuning.data.cache``). The cache is bounded in size:
after a publish, the least recently used entries go until the rest fits.
"""

import dataclasses
import hashlib
import importlib.metadata
import inspect
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import datasets
from filelock import FileLock

from tuning.data.cache import new_cache_dir, remove_orphaned_caches
from tuning.data.data_config import DataConfig, load_and_validate_data_config
from tuning.data.data_processors import _expand, is_hub_dataset_id

logger = logging.getLogger(__name__)

CACHE_DIR_ENV = "TUNING_DATA_CACHE_DIR"  # the default of --data_cache_dir where the flag is not given
MAX_SIZE_ENV = "TUNING_DATA_CACHE_MAX_GB"
DEFAULT_MAX_SIZE_GB = 50.0
OFF = "none"
META_FILE = "meta.json"
SPLITS = ("train", "eval")
KEY_VERSION = 1
_HASH_CHUNK = 1 << 20
_CALL_STATE = ("truncation", "padding")
_code_version: str | None = None


def default_cache_dir() -> str:
    """``$TUNING_DATA_CACHE_DIR``, else ``tuning-bench/prepared-data`` beside ``datasets``' cache (under
    ``HF_HOME``, by default ``~/.cache/huggingface``)."""
    if os.environ.get(CACHE_DIR_ENV):
        return os.environ[CACHE_DIR_ENV]
    return os.path.join(os.path.dirname(datasets.config.HF_DATASETS_CACHE), "tuning-bench", "prepared-data")


def resolve_cache_dir(flag: str | None) -> str | None:
    """The cache's root for ``--data_cache_dir`` (None: the default), or None when it is off (``none``)."""
    root = flag or default_cache_dir()
    return None if root.strip().lower() == OFF else os.path.abspath(os.path.expanduser(root))


def max_size_bytes() -> int:
    return int(float(os.environ.get(MAX_SIZE_ENV) or DEFAULT_MAX_SIZE_GB) * (1 << 30))


def _sha256(text: str | bytes) -> str:
    return hashlib.sha256(text.encode("utf-8") if isinstance(text, str) else text).hexdigest()


def file_identity(path: str) -> dict[str, Any]:
    """A file's path, size, mtime and the blake2b hash of its bytes (an edit keeping size and mtime still shows)."""
    status = os.stat(path)
    digest = hashlib.blake2b()
    with open(path, "rb") as handle:
        while chunk := handle.read(_HASH_CHUNK):
            digest.update(chunk)
    return {
        "path": os.path.abspath(path),
        "size": status.st_size,
        "mtime_ns": status.st_mtime_ns,
        "blake2b": digest.hexdigest(),
    }


def code_version() -> str:
    """The hash of the data path's code: ``tuning/data``'s sources and the data libraries' versions."""
    global _code_version
    if _code_version is None:
        digest = hashlib.sha256()
        for source in sorted(Path(__file__).parent.glob("*.py")):
            digest.update(source.name.encode() + b"\0" + source.read_bytes() + b"\0")
        for package in ("datasets", "tokenizers", "transformers"):
            digest.update(f"{package}=={importlib.metadata.version(package)}\0".encode())
        _code_version = digest.hexdigest()
    return _code_version


def tokenizer_identity(tokenizer) -> dict[str, Any]:
    """What tokenising depends on: the serialised tokenizer (vocabulary, merges, normalisation, added tokens) or,
    for a slow one, its vocabulary; the special tokens and the chat template."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        # Less the truncation and padding state, which each call of the tokenizer sets and no row depends on.
        state = {name: value for name, value in json.loads(backend.to_str()).items() if name not in _CALL_STATE}
        serialised = json.dumps(state, sort_keys=True)
    else:
        serialised = json.dumps(sorted(tokenizer.get_vocab().items()))
    return {
        "class": type(tokenizer).__name__,
        "serialised_sha256": _sha256(serialised),
        # Not the pad token: rows are not padded here (train() sets one where the tokenizer lacks it).
        "special_tokens": {
            name: str(getattr(tokenizer, name, None)) for name in ("bos_token", "eos_token", "unk_token")
        },
        "added_tokens": sorted(str(token) for token in tokenizer.get_added_vocab()),
        "chat_template_sha256": _sha256(json.dumps(tokenizer.chat_template, sort_keys=True, default=str)),
        "model_max_length": tokenizer.model_max_length,
        "padding_side": tokenizer.padding_side,
        "truncation_side": tokenizer.truncation_side,
    }


def _handler_identity(handler: Any) -> dict[str, Any]:
    """An extra data handler by its code: its function's source where Python has it, else its qualified name."""
    function = getattr(handler, "op", handler)
    try:
        code = inspect.getsource(function)
    except (OSError, TypeError):
        code = f"{getattr(function, '__module__', '')}.{getattr(function, '__qualname__', repr(function))}"
    fields = {name: str(value) for name, value in getattr(handler, "__dict__", {}).items() if name != "op"}
    return {"code_sha256": _sha256(code), "fields": fields}


def _data_paths(data_args, config: DataConfig | None) -> list[str] | None:
    """The data paths the run reads (None: one is a Hub dataset id, whose revision is not known offline)."""
    if config is not None:
        paths = [path for dataset in config.datasets for path in dataset.data_paths]
    else:
        paths = [path for path in (data_args.training_data_path, data_args.validation_data_path) if path]
    if any(is_hub_dataset_id(path) for path in paths):
        return None
    return paths


# DataArguments fields that do not change the rows.
_NOT_IN_KEY = {"data_cache_dir", "dataset_num_proc", "num_train_dataset_shards", "num_eval_dataset_shards"}


def cache_key(data_args, train_args, tokenizer, max_length: int, additional_data_handlers: dict | None) -> dict | None:
    """The key's parts, or None when the rows cannot be keyed (a Hub dataset id, streaming): not cached."""
    parsed = load_and_validate_data_config(data_args.data_config_path) if data_args.data_config_path else None
    paths = _data_paths(data_args, parsed)
    if paths is None or (parsed is not None and parsed.dataprocessor.streaming):
        return None
    config = None
    if parsed is not None:
        config = {
            "sha256": _sha256(Path(data_args.data_config_path).read_bytes()),
            "parsed": json.dumps(dataclasses.asdict(parsed), sort_keys=True, default=str),
        }
    arguments = {
        name: value for name, value in sorted(dataclasses.asdict(data_args).items()) if name not in _NOT_IN_KEY
    }
    return {
        "version": KEY_VERSION,
        "code": code_version(),
        "files": [file_identity(file) for path in paths for file in _expand(path)],
        "data_arguments": json.dumps(arguments, sort_keys=True, default=str),
        "data_config": config,
        "handlers": {
            name: _handler_identity(handler) for name, handler in sorted((additional_data_handlers or {}).items())
        },
        "tokenizer": tokenizer_identity(tokenizer),
        "max_seq_length": max_length,
        "packing": bool(train_args.packing),
        "eval_strategy_no": str(train_args.eval_strategy) in ("no", "IntervalStrategy.NO"),
    }


def key_digest(parts: dict[str, Any]) -> str:
    return _sha256(json.dumps(parts, sort_keys=True, default=str))


@dataclasses.dataclass
class Preparation:
    """How a run's rows were prepared, for the dump: ``status`` hit, miss (built and stored), off (``none``) or
    bypass (not cacheable: a Hub dataset, streaming); the key; the seconds preparing took."""

    status: str
    key: str | None = None
    cache_dir: str | None = None
    seconds: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _load(entry: Path):
    """The rows of a published entry, or None when it is not (or no longer) there."""
    try:
        meta = json.loads((entry / META_FILE).read_text(encoding="utf-8"))
        rows = tuple(
            datasets.load_from_disk(str(entry / split)) if split in meta["splits"] else None for split in SPLITS
        )
    except (OSError, ValueError, KeyError):  # evicted meanwhile, or not ours
        return None
    os.utime(entry / META_FILE)  # the entry's last use, for eviction
    return rows


def _directory_size(path: Path) -> int:
    return sum(file.stat().st_size for file in path.rglob("*") if file.is_file())


def evict(root: Path, limit: int, keep: str | None = None) -> list[str]:
    """Remove the least recently used entries until the cache holds at most ``limit`` bytes (``keep`` stays);
    each is renamed away first, so that no reader finds half an entry."""
    entries = []
    for meta in root.glob(f"*/{META_FILE}"):
        try:
            size = json.loads(meta.read_text(encoding="utf-8"))["bytes"]
            entries.append((meta.stat().st_mtime, meta.parent, int(size)))
        except (OSError, ValueError, KeyError):
            continue
    total, removed = sum(size for _, _, size in entries), []
    for _, entry, size in sorted(entries, key=lambda item: item[0]):
        if total <= limit:
            break
        if entry.name == keep:
            continue
        doomed = root / f".evicted-{entry.name}-{uuid.uuid4().hex}"
        try:
            entry.rename(doomed)
        except OSError:
            continue
        shutil.rmtree(doomed, ignore_errors=True)
        total -= size
        removed.append(entry.name)
    if removed:
        logger.info("processed-data cache %s: evicted %d least recently used entr(ies)", root, len(removed))
    return removed


def load_or_build(
    root: str | None,
    key_parts: Callable[[], dict | None],
    build: Callable[[], tuple | None],
) -> tuple[tuple | None, Preparation]:
    """The rows (train, eval) from the cache under ``root`` or from ``build`` (then stored), and how they came."""
    started = time.perf_counter()
    if root is None:
        return build(), Preparation("off", seconds=time.perf_counter() - started)
    parts = key_parts()
    if parts is None:
        return build(), Preparation("bypass", cache_dir=root, seconds=time.perf_counter() - started)
    key = key_digest(parts)
    folder = Path(root)
    entry = folder / key
    rows = _load(entry)
    status = "hit"
    if rows is None:
        folder.mkdir(parents=True, exist_ok=True)
        with FileLock(str(folder / f".{key}.lock")):
            rows = _load(entry)  # another builder may have published it while this one waited
            if rows is None:
                built = build()
                if built is None:
                    return None, Preparation("bypass", key, root, time.perf_counter() - started)
                _publish(folder, key, parts, built)
                rows, status = _load(entry), "miss"
        if status == "miss":
            evict(folder, max_size_bytes(), keep=key)
    seconds = time.perf_counter() - started
    logger.info("processed-data cache %s: %s, key %s (%.1f s)", root, status, key, seconds)
    return rows, Preparation(status, key, root, seconds)


def _publish(folder: Path, key: str, parts: dict, rows: tuple) -> None:
    """Write ``rows`` to a private directory of this process, then rename it to ``key``: complete or absent."""
    remove_orphaned_caches(str(folder))  # the private directories of builders that died
    private = Path(new_cache_dir(str(folder)))
    splits = []
    for name, dataset in zip(SPLITS, rows, strict=True):
        if dataset is not None:
            dataset.save_to_disk(str(private / name))
            splits.append(name)
    meta = {"key": key, "parts": parts, "splits": splits, "created": time.time(), "bytes": _directory_size(private)}
    (private / META_FILE).write_text(json.dumps(meta, indent=1, default=str), encoding="utf-8")
    try:
        os.rename(private, folder / key)
    except OSError:  # published meanwhile by a builder the lock did not hold off (a filesystem without locks)
        shutil.rmtree(private, ignore_errors=True)
