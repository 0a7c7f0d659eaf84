"""Directories for tokenised data under ``HF_DATASETS_CACHE``, one per dataset, each naming its owner process.

A directory is removed when the call that made it ends (``removes_data_caches``), else when its process exits, and,
where the process was killed before either (SIGKILL, the OOM killer, a SIGTERM to a process without handlers), by the
next ``new_cache_dir`` on the same host once its owner is no longer alive. A directory whose owner this host cannot
judge (another host on a shared filesystem, another PID namespace) is left alone.
"""

import atexit
import functools
import json
import logging
import os
import shutil
import socket
import tempfile
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import psutil

PREFIX = "tuning-data-"
OWNER_FILE = "owner.json"
# create_time derives from the boot time, which the kernel may shift by a clock step: a margin for that.
_START_TIME_TOLERANCE_S = 1.0

logger = logging.getLogger(__name__)
_scopes = threading.local()  # per thread, a stack of lists: the directories made during each open call
_owned: set[str] = set()  # the directories of this process not removed yet
_Function = TypeVar("_Function", bound=Callable[..., Any])


def _pid_namespace() -> str | None:
    """The kernel's name of this process's PID namespace (Linux); PIDs compare only within one."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def _owner() -> dict[str, Any]:
    me = psutil.Process()
    return {"host": socket.gethostname(), "pid_namespace": _pid_namespace(), "pid": me.pid, "started": me.create_time()}


def _owner_is_gone(owner: dict[str, Any]) -> bool:
    """True only when ``owner`` ran on this host, in this PID namespace, and no process with its PID and start time
    lives now (a recycled PID has a later start time)."""
    here = _owner()
    if (owner.get("host"), owner.get("pid_namespace")) != (here["host"], here["pid_namespace"]):
        return False
    try:
        started = psutil.Process(owner["pid"]).create_time()
    except psutil.NoSuchProcess:
        return True
    return abs(started - owner["started"]) > _START_TIME_TOLERANCE_S


def remove_orphaned_caches(root: str) -> list[str]:
    """Remove the directories under ``root`` whose owner is no longer alive; returns their paths. A directory without
    a readable owner file (being created, or made by an earlier release) is left alone."""
    removed = []
    try:
        names = sorted(name for name in os.listdir(root) if name.startswith(PREFIX))
    except FileNotFoundError:
        return removed
    for name in names:
        path = os.path.join(root, name)
        try:
            with open(os.path.join(path, OWNER_FILE), encoding="utf-8") as handle:
                owner = json.load(handle)
            gone = _owner_is_gone(owner)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):  # not an owner file of ours
            continue
        if gone:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    if removed:
        logger.info("removed %d tokenised-data cache(s) of runs that ended without removing them", len(removed))
    return removed


def _remove(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)
    _owned.discard(path)


@atexit.register
def _remove_owned() -> None:
    for path in sorted(_owned):
        _remove(path)


def new_cache_dir(root: str) -> str:
    """A new directory under ``root`` owned by this process (after removing the orphaned ones there). It goes when the
    innermost ``removes_data_caches`` call of this thread ends, else at exit."""
    os.makedirs(root, exist_ok=True)
    remove_orphaned_caches(root)
    path = tempfile.mkdtemp(prefix=PREFIX, dir=root)
    _owned.add(path)
    with open(os.path.join(path, OWNER_FILE), "w", encoding="utf-8") as handle:
        json.dump(_owner(), handle)
    stack = getattr(_scopes, "stack", None)
    if stack:
        stack[-1].append(path)
    return path


def removes_data_caches(function: _Function) -> _Function:
    """Decorate a function that builds datasets: the directories ``new_cache_dir`` made during a call are removed
    when it returns or raises (the datasets must not outlive it)."""

    @functools.wraps(function)
    def scoped(*args: Any, **kwargs: Any) -> Any:
        stack = _scopes.__dict__.setdefault("stack", [])
        stack.append([])
        try:
            return function(*args, **kwargs)
        finally:
            for path in stack.pop():
                _remove(path)

    return scoped  # type: ignore[return-value]
