"""Loaded into every run of ``benchmarks/overhead.py`` (its folder goes on PYTHONPATH): attributes the training loop.

Comparing whole runs cannot resolve a 1 % difference on a machine whose speed drifts by 20 % between runs, so each
run also measures, in itself, what goes where. Every trainer callback's hooks are timed on the training thread (so a
callback's cost is known exactly, whatever the machine did meanwhile), and at train end the CPU time of the training
thread, of every other thread (in nanoseconds) and of child processes (the Aim writer) is taken from /proc. The
numbers go, as JSON, to ``$OVERHEAD_ATTRIBUTION_PATH``; without that variable none of this is installed (and the
variable is removed, so child processes do not time hooks). Every arm is instrumented the same way.
Hooks are keyed ``module.Class``; every hook is timed, also the empty ones a callback inherits (their time is mostly
the timing's own, ~1 µs a call: an overestimate, kept so that nothing of a callback's cost goes unseen). Each step's
end time is kept too, and at train end torch's peak CUDA memory (null without CUDA).

Helper processes (the Aim writer, the journal's writer) see ``$OVERHEAD_HELPER_SPELLS_DIR``: there, the start and
end of each spell of work on the messages of one read (``tuning.utils.pipe_messages.receive``) are appended to
``<pid>.jsonl`` as they happen (helpers end with ``os._exit``). Against the step end times, they show how much a
helper working on the other CPU slows the steps it overlaps.
"""

import importlib.abc
import importlib.machinery
import json
import os
import sys
import threading
import time


def _install(path: str, CallbackHandler: type) -> None:  # noqa: N803 (transformers' class, patched in place)
    import psutil

    hook_seconds: dict[str, float] = {}
    train_begin: dict[str, float] = {}  # the snapshot taken at on_train_begin
    step_ends: list[float] = []
    original_call_event = CallbackHandler.call_event

    def timed(key: str, hook):
        def run_hook(*args, **kwargs):
            start = time.perf_counter()
            try:
                return hook(*args, **kwargs)
            finally:
                hook_seconds[key] = hook_seconds.get(key, 0.0) + time.perf_counter() - start

        return run_hook

    def thread_cpu_seconds() -> dict[int, float]:
        """CPU time of each thread of this process, from the scheduler's nanosecond count where Linux keeps one
        (/proc/self/task/*/schedstat); psutil's per-thread times count 10 ms clock ticks, too coarse for threads that
        wake a few times a second."""
        try:
            seconds = {}
            for tid in os.listdir("/proc/self/task"):
                with open(f"/proc/self/task/{tid}/schedstat", encoding="ascii") as handle:
                    seconds[int(tid)] = int(handle.read().split()[0]) / 1e9
            return seconds
        except (OSError, ValueError, IndexError):
            return {thread.id: thread.user_time + thread.system_time for thread in psutil.Process().threads()}

    def cpu_snapshot() -> dict[str, float]:
        process = psutil.Process()
        training_thread = threading.main_thread().native_id
        threads = thread_cpu_seconds()
        children = 0.0
        for child in process.children(recursive=True):
            try:
                times = child.cpu_times()
                children += times.user + times.system
            except psutil.NoSuchProcess:
                continue
        return {
            "time": time.perf_counter(),
            "training_thread_cpu": threads.pop(training_thread, 0.0),
            "other_threads_cpu": sum(threads.values()),
            "children_cpu": children,
        }

    def cuda_peak_memory() -> dict[str, int | None]:
        """torch's peak memory on the current CUDA device so far, the same counters in every arm (None without)."""
        torch = sys.modules.get("torch")
        used = torch is not None and torch.cuda.is_initialized()
        return {
            "cuda_max_memory_allocated_bytes": torch.cuda.max_memory_allocated() if used else None,
            "cuda_max_memory_reserved_bytes": torch.cuda.max_memory_reserved() if used else None,
        }

    def call_event(self, event, args, state, control, **kwargs):
        for callback in self.callbacks:
            if not getattr(callback, "_overhead_timed", False):
                name = f"{type(callback).__module__}.{type(callback).__qualname__}"
                for hook in (attribute for attribute in dir(type(callback)) if attribute.startswith("on_")):
                    setattr(callback, hook, timed(name, getattr(callback, hook)))
                callback._overhead_timed = True
        if event == "on_step_end":
            step_ends.append(time.perf_counter())
        if event == "on_train_begin":
            train_begin.update(cpu_snapshot())
        if event == "on_train_end":
            end = cpu_snapshot()
            result = {key: end[key] - train_begin[key] for key in train_begin}
            result.update(steps=state.global_step, hook_seconds=dict(hook_seconds), step_ends=step_ends)
            result.update(cuda_peak_memory())
            with open(path, "w", encoding="utf-8") as handle:
                json.dump(result, handle)
        return original_call_event(self, event, args, state, control, **kwargs)

    CallbackHandler.call_event = call_event


def _record_spells(directory: str) -> None:
    from tuning.utils import pipe_messages

    receive = pipe_messages.receive

    def timed_receive(fd: int):
        with open(os.path.join(directory, f"{os.getpid()}.jsonl"), "a", buffering=1, encoding="utf-8") as spells:
            for messages in receive(fd):
                start = time.perf_counter()
                yield messages  # the helper handles them before it asks for more
                spells.write(f"[{start}, {time.perf_counter()}]\n")

    pipe_messages.receive = timed_receive


class _InstallOnImport(importlib.abc.MetaPathFinder):
    """Installs the timing when transformers' callback module is first imported, not at interpreter start: importing
    it here would import torch and transformers (~10 s on this VM) before the script's first line, which would delay
    what bench_train starts before its own heavy imports (the Aim writer) and misplace its work."""

    def __init__(self, path: str):
        self.path = path

    def find_spec(self, name, import_path, target=None):
        if name != "transformers.trainer_callback":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, import_path)
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            _install(self.path, module.CallbackHandler)

        spec.loader.exec_module = exec_module
        return spec


_path = os.environ.pop("OVERHEAD_ATTRIBUTION_PATH", None)
if _path:
    sys.meta_path.insert(0, _InstallOnImport(_path))
elif os.environ.get("OVERHEAD_HELPER_SPELLS_DIR"):
    _record_spells(os.environ["OVERHEAD_HELPER_SPELLS_DIR"])
