"""Processes that die with the one that started them (Linux's ``PR_SET_PDEATHSIG``): a sweep's point when its driver
is SIGKILLed, and the processes a ``datasets`` ``map`` forks (its workers and its manager) when their run is.
Elsewhere than Linux nothing is set: such children end as their parents end them."""

import contextlib
import ctypes
import functools
import os
import signal
import sys
from collections.abc import Callable, Iterator
from typing import Any

PR_SET_PDEATHSIG, PR_GET_PDEATHSIG = 1, 2  # prctl(2)
_dying_with: int | None = None  # while set (this process's PID): the children it forks die with it
_hook_registered = False


def parent_death_signal(signum: int) -> Callable[[], Any] | None:
    """The call that makes the calling process receive ``signum`` when its parent dies, or None off Linux. Looked up
    here, before a fork, so that a child (a ``preexec_fn``) only calls it."""
    if not sys.platform.startswith("linux"):
        return None
    return functools.partial(ctypes.CDLL(None, use_errno=True).prctl, PR_SET_PDEATHSIG, signum)


def _after_fork_in_child() -> None:
    """``os.register_at_fork``'s child hook: inside ``children_die_with_this_process``, SIGKILL on the parent's death,
    and exit now if the parent is gone already."""
    if _dying_with is None or (watch := parent_death_signal(signal.SIGKILL)) is None:
        return
    watch()
    if os.getppid() != _dying_with:
        os._exit(1)


@contextlib.contextmanager
def children_die_with_this_process() -> Iterator[None]:
    """While inside, every child this process forks (``os.fork``: ``datasets``' ``num_proc`` workers and the manager
    it starts) is SIGKILLed by the kernel when this process dies, so that a SIGKILLed run leaves none behind. Children
    started by ``subprocess`` (fork + exec) are not touched."""
    global _dying_with, _hook_registered
    if not _hook_registered:
        os.register_at_fork(after_in_child=_after_fork_in_child)
        _hook_registered = True
    previous, _dying_with = _dying_with, os.getpid()
    try:
        yield
    finally:
        _dying_with = previous
