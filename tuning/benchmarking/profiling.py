"""A profile of a window of optimizer steps, and a CUDA memory snapshot at an out-of-memory failure.

``ProfileCallback`` (bench_train's ``--profile_steps A-B``; any ``train()`` caller may pass one) runs torch.profiler
on exactly steps A to B on every rank, through the profiler's schedule stepped at each optimizer step's end: nothing
is started before the step ahead of the window (its warm-up), so the steps outside it run as without a profiler. At
the window's end each rank writes into its own folder (``rank<N>/``): a gzipped Chrome/Perfetto trace, the
operators' table (``ops.txt``), with ``memory=True`` the profiler's memory timeline (HTML), and on a GPU a CUDA memory
snapshot of the window (``_record_memory_history`` → ``_dump_snapshot``) with the HTML ``torch.cuda._memory_viz``
draws. Its ``result`` (rank 0's, with every rank's files) is the dump's ``profile``. A file that cannot be written
costs the profile, never the run: the result says what is missing and why.

``OomSnapshot`` (``--oom_snapshot``): on a GPU, the allocator's history is recorded from train begin, bounded to the
last ``OOM_HISTORY_ENTRIES`` allocations and frees, and dumped when the allocator runs out of memory (its observer,
where torch has one) or else when the failure is reported.
"""

import logging
import os
import pickle
import re
from typing import Any

import torch
from transformers import TrainerCallback

from tuning.benchmarking.ranks import gather_objects
from tuning.utils.error_logging import UserInputError

logger = logging.getLogger(__name__)

TOP_OPS = 20  # operators in the dump's top_ops and in ops.txt, per device kind
WINDOW_HISTORY_ENTRIES = 200_000  # allocator events a window's CUDA memory snapshot keeps, at most
OOM_HISTORY_ENTRIES = 100_000  # allocator events the OOM snapshot keeps: the last steps' before the failure
TRACE, OPS_TABLE, MEMORY_TIMELINE = "trace.json.gz", "ops.txt", "memory_timeline.html"
MEMORY_SNAPSHOT, MEMORY_SNAPSHOT_HTML = "memory_snapshot.pickle", "memory_snapshot.html"
_WINDOW = re.compile(r"^\s*(\d+)\s*-\s*(\d+)\s*$")
_oom_recording = False  # an OomSnapshot records the allocator's history: a window's end hands it back


def _resume_oom_recording_or_stop() -> None:
    """After a window's snapshot: the allocator's recording goes back to an ``OomSnapshot``'s bound, or stops."""
    if _oom_recording:
        torch.cuda.memory._record_memory_history(max_entries=OOM_HISTORY_ENTRIES)
    else:
        torch.cuda.memory._record_memory_history(enabled=None)


def parse_window(text: str, max_steps: int | None = None) -> tuple[int, int]:
    """``A-B`` → (A, B): steps counted from 1, A at most B, B at most ``max_steps`` when the run's length is known
    (positive); a user error otherwise."""
    match = _WINDOW.match(str(text))
    if match is None:
        raise UserInputError(f"--profile_steps {text!r}: give the first and last optimizer step to profile, as A-B")
    first, last = int(match[1]), int(match[2])
    if first < 1 or first > last:
        raise UserInputError(f"--profile_steps {text}: the steps are counted from 1 and A must not exceed B")
    if max_steps is not None and max_steps > 0 and last > max_steps:
        raise UserInputError(f"--profile_steps {text} ends after the run's last step (--max_steps {max_steps})")
    return first, last


def _write_text(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {getattr(exc, 'strerror', None) or exc}"


def top_ops(averages: Any, key: str, limit: int = TOP_OPS) -> list[dict[str, Any]]:
    """The ``limit`` operators with the most self time by ``key`` (``self_cpu_time_total`` or
    ``self_device_time_total``), from the profiler's ``key_averages()``."""
    ranked = sorted(averages, key=lambda op: getattr(op, key), reverse=True)
    return [
        {
            "name": op.key,
            "calls": op.count,
            "self_cpu_us": op.self_cpu_time_total,
            "cpu_total_us": op.cpu_time_total,
            "self_device_us": op.self_device_time_total,
        }
        for op in ranked[:limit]
        if getattr(op, key) > 0
    ]


def memory_snapshot(path: str) -> dict[str, str | None]:
    """The CUDA allocator's recorded history into ``path`` (a pickle) and the HTML ``torch.cuda._memory_viz`` draws of
    it beside; the paths written, and ``missing`` (why one is not) or None."""
    written: dict[str, str | None] = {"memory_snapshot": None, "memory_snapshot_html": None, "missing": None}
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        torch.cuda.memory._dump_snapshot(path)
        written["memory_snapshot"] = path
        from torch.cuda import _memory_viz

        with open(path, "rb") as handle:
            html = _memory_viz.trace_plot(pickle.load(handle))
        html_path = path.removesuffix(".pickle") + ".html"
        _write_text(html_path, html)
        written["memory_snapshot_html"] = html_path
    except Exception as exc:  # noqa: BLE001 - a snapshot that cannot be written costs the snapshot, never the run
        written["missing"] = f"memory snapshot: {_reason(exc)}"
    return written


class ProfileCallback(TrainerCallback):
    """torch.profiler on optimizer steps ``steps`` (``"A-B"`` or ``(A, B)``) on every rank, its files in
    ``output_dir/rank<N>/``; ``memory``: the memory timeline too. ``result`` once the window is over (or training
    ends): this rank's files and top operators, and on rank 0 every rank's files (``traces``). ``on_result(result)``,
    when given, receives it on rank 0 at train end (bench_train journals it as the dump's ``profile``)."""

    def __init__(self, steps: str | tuple[int, int], output_dir: str, memory: bool = False, on_result: Any = None):
        self.first, self.last = parse_window(steps) if isinstance(steps, str) else steps
        self.output_dir = output_dir
        self.memory = memory
        self.on_result = on_result
        self.result: dict[str, Any] | None = None
        self._profiler: torch.profiler.profile | None = None
        self._rank = 0
        self._device: torch.device | None = None
        self._warmup = min(1, self.first - 1)  # the profiler's warm-up: the step ahead of the window, if any
        self._files: dict[str, Any] = {}
        self._step = 0  # the last optimizer step ended

    def on_train_begin(self, args, state, control, **kwargs):
        self._rank, self._device = args.process_index, args.device
        self._files = {"rank": self._rank, "trace": None, "table": None, "missing": None}
        if state.global_step >= self.first:
            self._files["missing"] = f"the run resumed at step {state.global_step}, after the window's first step"
        elif state.global_step == self.first - self._warmup - 1:
            self._start(state.global_step)

    def on_step_end(self, args, state, control, **kwargs):
        self._step = state.global_step
        if self._profiler is not None:
            self._profiler.step()
            if state.global_step >= self.last:
                self._profiler = None
        elif state.global_step == self.first - self._warmup - 1 and self.result is None:
            self._start(state.global_step)

    def _start(self, step: int) -> None:
        """Start the profiler after ``step``, so that its next step (warm-up, or the window's first) is traced."""
        folder = os.path.join(self.output_dir, f"rank{self._rank}")
        cuda = self._device is not None and self._device.type == "cuda"
        activities = [torch.profiler.ProfilerActivity.CPU]
        if cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        # Its step numbers are the optimizer steps: ProfilerStep#N in the trace is step N.
        self._profiler = torch.profiler.profile(
            activities=activities,
            schedule=torch.profiler.schedule(
                wait=self.first - self._warmup, warmup=self._warmup, active=self.last - self.first + 1, repeat=1
            ),
            on_trace_ready=lambda profiler: self._write(profiler, folder, cuda),
            profile_memory=self.memory,
            record_shapes=self.memory,
            with_stack=self.memory,
        )
        self._profiler.step_num = step
        self._profiler.start()
        self._profiler.step()
        if cuda:
            torch.cuda.memory._record_memory_history(max_entries=WINDOW_HISTORY_ENTRIES)

    def _write(self, profiler: torch.profiler.profile, folder: str, cuda: bool) -> None:
        """The window is over: this rank's files, each one's failure noted rather than raised."""
        files = self._files
        files["steps"] = [self.first, min(self._step, self.last)]
        problems = []
        try:
            os.makedirs(folder, exist_ok=True)
            trace = os.path.join(folder, TRACE)
            profiler.export_chrome_trace(trace)  # gzipped, by its name
            files["trace"] = trace
        except Exception as exc:  # noqa: BLE001 - no room for the trace costs the trace, never the run
            problems.append(f"trace: {_reason(exc)}")
        averages = profiler.key_averages()
        ops = {"cpu": top_ops(averages, "self_cpu_time_total")}
        tables = [averages.table(sort_by="self_cpu_time_total", row_limit=TOP_OPS)]
        if cuda:
            ops["cuda"] = top_ops(averages, "self_device_time_total")
            tables.append(averages.table(sort_by="self_device_time_total", row_limit=TOP_OPS))
        files["top_ops"] = ops
        try:
            _write_text(os.path.join(folder, OPS_TABLE), "\n\n".join(tables))
            files["table"] = os.path.join(folder, OPS_TABLE)
        except OSError as exc:
            problems.append(f"table: {_reason(exc)}")
        if self.memory:
            try:
                device = f"cuda:{self._device.index or 0}" if cuda else "cpu"
                profiler.export_memory_timeline(os.path.join(folder, MEMORY_TIMELINE), device=device)
                files["memory_timeline"] = os.path.join(folder, MEMORY_TIMELINE)
            except Exception as exc:  # noqa: BLE001
                problems.append(f"memory timeline: {_reason(exc)}")
        if cuda:
            snapshot = memory_snapshot(os.path.join(folder, MEMORY_SNAPSHOT))
            _resume_oom_recording_or_stop()
            problems += [snapshot.pop("missing")] if snapshot["missing"] else []
            files.update(snapshot)
        files["missing"] = "; ".join(problems) or None
        if problems:
            logger.warning("rank %d: the profile of steps %s is incomplete: %s", self._rank, files["steps"], problems)

    def on_train_end(self, args, state, control, **kwargs):
        self.close()
        everyone = gather_objects({key: value for key, value in self._files.items() if key != "top_ops"})
        self.result = self._result(everyone)
        if self.on_result is not None and self._rank == 0:
            self.on_result(self.result)

    def close(self) -> None:
        """Stop a window the run ended inside (its steps so far are written); note a window it never reached. Also
        the way out when training failed."""
        if self._profiler is not None:
            profiler, self._profiler = self._profiler, None
            profiler.stop()
        if self._files and "steps" not in self._files and self._files.get("missing") is None:
            self._files["missing"] = f"the run ended at step {self._step}, before the window"

    def own_result(self) -> dict[str, Any] | None:
        """This rank's result alone, without gathering the other ranks' (a run that failed); None before training."""
        return self._result([self._files]) if self._files else None

    def _result(self, everyone: list[dict[str, Any]]) -> dict[str, Any]:
        traces = [{key: value for key, value in files.items() if key != "top_ops"} for files in everyone]
        return {
            "steps": [self.first, self.last],
            "profiled_steps": self._files.get("steps"),
            "top_ops": self._files.get("top_ops"),
            "traces": traces,
            "missing": self._files.get("missing"),
        }


PATH_KEYS = ("trace", "table", "memory_timeline", "memory_snapshot", "memory_snapshot_html")


def relative_paths(value: Any, start: str) -> Any:
    """``value`` (a ``result`` or a snapshot's files) with its files' paths relative to the folder ``start`` (the
    dump's): a run's folder can move with its dump."""
    if isinstance(value, list):
        return [relative_paths(item, start) for item in value]
    if not isinstance(value, dict):
        return value
    return {
        key: os.path.relpath(item, start) if key in PATH_KEYS and isinstance(item, str) else relative_paths(item, start)
        for key, item in value.items()
    }


class OomSnapshot(TrainerCallback):
    """``--oom_snapshot``: from train begin, record the CUDA allocator's last ``OOM_HISTORY_ENTRIES`` events, and
    write a snapshot at ``path`` when memory runs out (``take``; the allocator's own observer where torch has one)."""

    def __init__(self, path: str):
        self.path = path
        self.taken: dict[str, str | None] | None = None
        self.recording = False

    def on_train_begin(self, args, state, control, **kwargs):
        self.start(args.device)

    def start(self, device: torch.device) -> None:
        if device.type != "cuda":
            logger.warning("--oom_snapshot: no CUDA device, no allocator to record: no snapshot at an OOM")
            return
        global _oom_recording
        torch.cuda.memory._record_memory_history(max_entries=OOM_HISTORY_ENTRIES)
        self.recording = _oom_recording = True
        attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
        if attach is not None:
            attach(lambda *_: self.take())

    def take(self) -> dict[str, str | None]:
        """The snapshot (taken once: the observer's, at the failure, else now), or why there is none."""
        if self.taken is None:
            if not self.recording:
                self.taken = {"memory_snapshot": None, "memory_snapshot_html": None}
                self.taken["missing"] = "no CUDA device was recording: a memory snapshot needs one"
            else:
                self.taken = memory_snapshot(self.path)
        return self.taken
