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
import math
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
from tuning.data.data_config import DataConfig, job_data_config, job_data_config_sha256
from tuning.data.data_processors import is_hub_dataset_id
from tuning.data.loading import expand_data_path
from tuning.utils.error_logging import UserInputError, one_line

logger = logging.getLogger(__name__)

CACHE_DIR_ENV = "TUNING_DATA_CACHE_DIR"  # the default of --data_cache_dir where the flag is not given
MAX_SIZE_ENV = "TUNING_DATA_CACHE_MAX_GB"
DEFAULT_MAX_SIZE_GB = 50.0
OFF = "none"
META_FILE = "meta.json"
SPLITS = ("train", "eval")
KEY_VERSION = 2
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


class CacheUnusable(Exception):
    """The cache cannot serve this run (its directory unwritable or full, a damaged entry that cannot be removed, a
    bad size limit): the run prepares its rows without it, and says why in one warning."""


class DamagedEntry(Exception):
    """A published entry that is not what was published (a file missing, cut short or changed; ``meta.json``
    unreadable): never read."""


def size_limit_problem(value: Any) -> str | None:
    """What is wrong with a size limit in GB (a finite number, at least 0), or None."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return f"{value!r} is not a number of GB"
    if not math.isfinite(number) or number < 0:
        return f"{value!r} is not a finite number of GB, at least 0"
    return None


def max_size_bytes(flag: float | None = None) -> int:
    """The cache's size limit: ``--data_cache_max_gb`` (``flag``), else ``$TUNING_DATA_CACHE_MAX_GB``, else 50 GB.
    ``CacheUnusable`` naming the variable when it is not a finite number, at least 0 (the flag is checked before
    any work, by ``check_data_cache_flags``)."""
    value = flag if flag is not None else os.environ.get(MAX_SIZE_ENV) or DEFAULT_MAX_SIZE_GB
    if flag is None and (problem := size_limit_problem(value)):
        raise CacheUnusable(f"{MAX_SIZE_ENV}={os.environ.get(MAX_SIZE_ENV)}: {problem}")
    return int(float(value) * (1 << 30))


def check_data_cache_flags(data_args) -> None:
    """Before any work: ``--data_cache_max_gb`` is a finite number of GB, at least 0 (``UserInputError``)."""
    flag = getattr(data_args, "data_cache_max_gb", None)
    if flag is not None and (problem := size_limit_problem(flag)):
        raise UserInputError(f"--data_cache_max_gb: {problem}")


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
_NOT_IN_KEY = {
    "data_cache_dir",
    "data_cache_max_gb",
    "dataset_num_proc",
    "num_train_dataset_shards",
    "num_eval_dataset_shards",
}


def cache_key(data_args, train_args, tokenizer, max_length: int, additional_data_handlers: dict | None) -> dict | None:
    """The key's parts, or None when the rows cannot be keyed (a Hub dataset id, streaming): not cached."""
    parsed = job_data_config(data_args)
    paths = _data_paths(data_args, parsed)
    if paths is None or (parsed is not None and parsed.dataprocessor.streaming):
        return None
    config = None
    if parsed is not None:
        config = {
            "sha256": job_data_config_sha256(data_args),
            "parsed": json.dumps(dataclasses.asdict(parsed), sort_keys=True, default=str),
        }
    arguments = {
        name: value for name, value in sorted(dataclasses.asdict(data_args).items()) if name not in _NOT_IN_KEY
    }
    return {
        "version": KEY_VERSION,
        "code": code_version(),
        "files": [file_identity(file) for path in paths for file in expand_data_path(path)],
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


def _file_checksums(folder: Path) -> dict[str, dict[str, Any]]:
    """Every file under ``folder`` but ``meta.json``: its path relative to ``folder``, size and sha256."""
    checksums = {}
    for file in sorted(folder.rglob("*")):
        if file.is_file() and file.name != META_FILE:
            digest = hashlib.sha256()
            with open(file, "rb") as handle:
                while chunk := handle.read(_HASH_CHUNK):
                    digest.update(chunk)
            checksums[str(file.relative_to(folder))] = {"bytes": file.stat().st_size, "sha256": digest.hexdigest()}
    return checksums


def _features(dataset) -> str:
    return json.dumps(dataset.features.to_dict(), sort_keys=True, default=str)


def _load(entry: Path):
    """The rows of a published entry once verified against what was published (its files' sizes and sha256, each
    split's row count and features); None when there is no entry (or it was evicted meanwhile); ``DamagedEntry``
    saying what differs when it is not what was published."""
    if not entry.is_dir():
        return None
    try:
        meta = json.loads((entry / META_FILE).read_text(encoding="utf-8"))
        published, splits = meta["files"], meta["splits"]
        for name, expected in published.items():
            file = entry / name
            if not file.is_file():
                raise DamagedEntry(f"{name} is missing")
            if file.stat().st_size != expected["bytes"]:
                raise DamagedEntry(f"{name} is {file.stat().st_size} bytes, {expected['bytes']} were published")
        if _file_checksums(entry) != published:
            raise DamagedEntry("a file's sha256 differs from the one published")
        rows = tuple(datasets.load_from_disk(str(entry / split)) if split in splits else None for split in SPLITS)
        for split, dataset in zip(SPLITS, rows, strict=True):
            if dataset is not None and (dataset.num_rows, _features(dataset)) != (
                meta["rows"][split],
                meta["features"][split],
            ):
                raise DamagedEntry(f"its {split} rows differ from those published")
    except DamagedEntry:
        raise
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        if not entry.is_dir():  # evicted meanwhile
            return None
        raise DamagedEntry(f"{type(exc).__name__}: {one_line(exc)}") from None
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
    max_gb: float | None = None,
) -> tuple[tuple | None, Preparation]:
    """The rows (train, eval) from the cache under ``root`` or from ``build`` (then stored), and how they came. The
    cache never fails the run: where it cannot serve (``CacheUnusable``), one warning says why and the rows are
    built without it (``uncached``)."""
    started = time.perf_counter()
    if root is None:
        return build(), Preparation("off", seconds=time.perf_counter() - started)
    parts = key_parts()
    if parts is None:
        return build(), Preparation("bypass", cache_dir=root, seconds=time.perf_counter() - started)
    key = key_digest(parts)
    built: list = []  # what build() returned, so that a cache failing after it does not build twice

    def build_once():
        built.append(build())
        return built[0]

    try:
        rows, status = _load_or_build(Path(root), key, parts, build_once, max_size_bytes(max_gb))
    except CacheUnusable as exc:
        logger.warning("processed-data cache %s: %s: the data is prepared without the cache", root, exc)
        rows, status = (built[0] if built else build()), "uncached"
    seconds = time.perf_counter() - started
    if status != "bypass":
        logger.info("processed-data cache %s: %s, key %s (%.1f s)", root, status, key, seconds)
    return rows, Preparation(status, key, root, seconds)


def _read(entry: Path):
    """The entry's rows, or None when it is absent or damaged (then it is removed first: ``CacheUnusable`` when it
    cannot be)."""
    try:
        return _load(entry)
    except DamagedEntry as exc:
        logger.warning("processed-data cache entry %s is damaged (%s): it is removed and built again", entry, exc)
        doomed = entry.parent / f".damaged-{entry.name}-{uuid.uuid4().hex}"
        try:
            entry.rename(doomed)
        except OSError as error:
            if entry.exists():
                raise CacheUnusable(
                    f"entry {entry.name} is damaged ({exc}) and cannot be removed ({one_line(error)})"
                ) from None
            return None  # removed meanwhile by another run
        shutil.rmtree(doomed, ignore_errors=True)
        return None


def _load_or_build(folder: Path, key: str, parts: dict, build: Callable[[], tuple | None], limit: int):
    """``load_or_build``'s work: ``(rows, status)``; ``CacheUnusable`` where the directory cannot serve."""
    entry = folder / key
    rows = _read(entry)
    if rows is not None:
        return rows, "hit"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(folder / f".{key}.lock"))
        lock.acquire()
    except OSError as exc:
        raise CacheUnusable(f"the directory cannot be written ({one_line(exc)})") from None
    try:
        rows = _read(entry)  # another builder may have published it while this one waited
        if rows is not None:
            return rows, "hit"
        rows = build()
        if rows is None:
            return None, "bypass"
        try:
            _publish(folder, key, parts, rows)
            published = _load(entry)
        except (OSError, DamagedEntry) as exc:
            raise CacheUnusable(f"the entry could not be stored ({one_line(exc)})") from None
    finally:
        lock.release()
    evict(folder, limit, keep=key)
    return published, "miss"


def _publish(folder: Path, key: str, parts: dict, rows: tuple) -> None:
    """Write ``rows`` to a private directory of this process, with ``meta.json`` (the key's parts, each split's row
    count and features, each file's size and sha256) written last; then rename it to ``key``: complete or absent.
    ``OSError`` when it cannot be written (nothing is left of it then)."""
    remove_orphaned_caches(str(folder))  # the private directories of builders that died
    private = Path(new_cache_dir(str(folder)))
    try:
        splits = {}
        for name, dataset in zip(SPLITS, rows, strict=True):
            if dataset is not None:
                dataset.save_to_disk(str(private / name))
                splits[name] = dataset
        meta = {
            "key": key,
            "parts": parts,
            "splits": list(splits),
            "rows": {name: dataset.num_rows for name, dataset in splits.items()},
            "features": {name: _features(dataset) for name, dataset in splits.items()},
            "files": _file_checksums(private),
            "created": time.time(),
            "bytes": _directory_size(private),
        }
        (private / META_FILE).write_text(json.dumps(meta, indent=1, default=str), encoding="utf-8")
        os.rename(private, folder / key)
    except OSError:
        shutil.rmtree(private, ignore_errors=True)
        if not (folder / key).is_dir():
            raise
        # else published meanwhile by a builder the lock did not hold off (a filesystem without locks)
