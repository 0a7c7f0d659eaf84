"""The ground-floor part of a training script's first lines, run before it imports torch: the script's own folder off
``sys.path`` and the SIGTERM/Ctrl-C handlers; the garbage collector's policy for the heavy imports that follow
(``pause_collector``) and for the exit. Imports nothing heavy. Scripts call ``tuning.prologue.prologue``, which
runs this and then starts the trackers' helper processes (a floor above the trackers); a script that still calls
this one directly keeps its signal handling, and its trackers start their helpers when they are built."""

import atexit
import contextlib
import gc
import os
import sys
from collections.abc import Iterator

_collector_paused = False


def pause_collector() -> None:
    """Turn Python's cyclic garbage collector off for the heavy imports that follow (torch, transformers, peft, TRL):
    they build about a million objects, which the collections that allocation counts trigger would walk again and
    again, a large share of a job's start-up CPU. ``resume_collector``, which ``train()`` calls first, turns it back
    on."""
    global _collector_paused
    if gc.isenabled():
        gc.disable()
        _collector_paused = True


def resume_collector() -> None:
    """Undo ``pause_collector``, where it paused the collector: the objects alive now (the libraries' modules,
    classes and functions, the run's arguments, and whatever garbage the imports left: a few MiB, held to the end)
    are first moved out of the collector's sight (``gc.freeze()``), so that the training's collections (accelerate's
    full ``gc.collect()`` at the end of each ``train()`` among them) walk only what the job builds. Otherwise a no-op:
    a program that calls ``train()`` without the prologue keeps its collector as it was."""
    global _collector_paused
    if _collector_paused:
        _collector_paused = False
        gc.freeze()
        gc.enable()


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """``pause_collector`` and ``resume_collector`` around a block of heavy imports, for a process that is not a
    training script (a sweep's driver reading bench_train's parser): the same freeze at its end. Inside a pause
    already under way, nothing of its own."""
    pausing = gc.isenabled()
    if pausing:
        gc.disable()
    try:
        yield
    finally:
        if pausing:
            gc.freeze()
            gc.enable()


def prologue(argv: list[str], script: str | None = None) -> None:
    """1. ``script``'s own folder off ``sys.path`` (given by a script inside the package, run by its path: its folder
    would shadow top-level packages such as ``datasets``' own imports with ``tuning/data``, ``tuning/config``...);
    2. SIGTERM and Ctrl-C handlers, so that a signal while torch loads still ends the job as ``interrupted``;
    3. the process's last act at exit: ``gc.freeze()``, registered before any other exit handler so that it runs after
    all of them. Python's final garbage collections then skip the objects still alive instead of walking the
    hundreds of thousands that torch and transformers made (about a second of CPU per process), only to free memory
    the operating system takes back anyway; objects without a reference cycle are still freed, finalizers and all.
    ``argv`` is the script's command line (unused here; kept for the scripts that call this directly)."""
    atexit.register(gc.freeze)
    if script is not None:
        here = os.path.dirname(os.path.abspath(script))
        sys.path[:] = [path for path in sys.path if os.path.abspath(path or ".") != here]
    from tuning.utils.error_logging import install_early_signal_handlers

    install_early_signal_handlers()
