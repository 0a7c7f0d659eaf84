"""Error reporting shared by sft_trainer and every wrapper: classification, exit codes, termination log, report.

Every failure gets a stable category and exit code, one termination-log line, one greppable ``TUNING_ERROR`` stderr
line and, for wrappers, a JSON report (docs/errors.md). Imports neither torch nor
transformers, so a supervisor can use it cheaply: torch exceptions are recognised by class name.
"""

import errno
import logging
import os
import re
import signal
import socket
import sys
import traceback
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

# The ground floor's names, all re-exported here: their public home (fms-hf-tuning's exit codes, exception types).
from tuning.errors import (  # noqa: F401
    DEFAULT_EXIT_CODES,
    EXIT_CODE_ENV_PREFIX,
    INTERNAL_ERROR_EXIT_CODE,
    USER_ERROR_EXIT_CODE,
    ErrorCategory,
    InputFileNotFoundError,
    InputKeyError,
    SignalInterrupt,
    StorageError,
    TrainingInterrupted,
    TrainingStalled,
    UserInputError,
    exit_code_for,
)

logger = logging.getLogger(__name__)


_C = ErrorCategory


def _qualified_name(cls: type) -> str:
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


_PRIORITY = list(ErrorCategory)

# Matched against the qualified names of an exception's classes (its MRO), so torch need not be imported.
_TYPE_CATEGORIES = {
    _C.GPU_OOM: {"torch.OutOfMemoryError", "torch.cuda.OutOfMemoryError"},
    _C.HOST_OOM: {"MemoryError"},
    _C.DEVICE_ERROR: {"torch.AcceleratorError"},
    _C.COMMUNICATION: {"torch.distributed.DistError", "torch.distributed.elastic.rendezvous.api.RendezvousError"},
    _C.HANG: {_qualified_name(TrainingStalled)},
    _C.STORAGE: {_qualified_name(StorageError)},
    _C.INTERRUPTED: {
        "KeyboardInterrupt",
        _qualified_name(TrainingInterrupted),
        _qualified_name(SignalInterrupt),
        "torch.distributed.elastic.multiprocessing.api.SignalException",
    },
    # ValueError also covers json.JSONDecodeError, HF argument validation and huggingface_hub's HFValidationError.
    _C.USER_ERROR: {
        "argparse.ArgumentError",
        "argparse.ArgumentTypeError",
        "FileNotFoundError",
        "IsADirectoryError",
        "NotADirectoryError",
        "PermissionError",
        "ValueError",
        "TypeError",
    },
}

# Matched (case-insensitively) against the message of every exception of the chain.
_MESSAGE_PATTERNS = [
    (category, re.compile(pattern, re.I))
    for category, pattern in (
        (
            _C.GPU_OOM,
            r"(CUDA|HIP|XPU) out of memory|MPS backend out of memory|(CUDA|HIP) error: out of memory"
            r"|Cuda failure '?out of memory|cudaErrorMemoryAllocation|CUBLAS_STATUS_ALLOC_FAILED"
            r"|CUDNN_STATUS_ALLOC_FAILED",
        ),
        (_C.HOST_OOM, r"DefaultCPUAllocator|Cannot allocate memory|std::bad_alloc"),
        (
            _C.DEVICE_ERROR,
            r"illegal memory access|illegal instruction was encountered|ECC error|unspecified launch failure"
            r"|launch timed out|fallen off the bus|uncorrectable NVLink|CUDA error: unknown error"
            r"|CUBLAS_STATUS_EXECUTION_FAILED|CUBLAS_STATUS_INTERNAL_ERROR|CUDNN_STATUS_EXECUTION_FAILED",
        ),
        (
            _C.COMMUNICATION,
            r"nccl[\s_-]*(error|timeout|warn|communicator|operation)|nccl\w*Error|collective operation timeout"
            r"|watchdog\b.{0,80}\b(timeout|timed out|stuck)|rendezvous|TCPStore"
            r"|(client|server) socket has (timed out|failed)",
        ),
        # Peer and socket failures only count as communication when gloo or c10d raised them: the same words come
        # from a failed download too.
        (_C.COMMUNICATION, r"(?s)\A(?=.*(gloo|c10d))(?=.*(closed by peer|reset by peer|broken pipe|timed out))"),
        (_C.STORAGE, r"No space left on device|Disk quota exceeded"),
        (
            _C.USER_ERROR,
            r"is not a valid model identifier|is not a local folder|does not appear to have a file named"
            r"|Can't load (the )?(tokenizer|config|configuration|model)|Incorrect path_or_model_id",
        ),
    )
]
# A "device-side assert triggered" is a deterministic kernel check (usually an index out of range from a data,
# tokenizer or model mismatch) that fails the same way on healthy hardware: internal, not device_error.
_DEVICE_ASSERT = re.compile(r"device-side assert", re.I)
# An OSError of these is the storage's fault whatever its message says.
_STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})

TERMINATION_LOG_ENV = "TERMINATION_LOG_FILE"
K8S_TERMINATION_LOG = "/dev/termination-log"
# Kubernetes keeps at most 4 KiB of the termination log and every rank of a pod may append a line.
TERMINATION_LOG_MAX_BYTES = 1024
ERROR_MARKER = "TUNING_ERROR"
# ``<category>: [rank N: ]<reason>``, as ``termination_line`` writes it; without a rank the job had one process.
TERMINATION_LINE = re.compile(r"^(?P<category>[a-z_]+): (?:rank (?P<rank>\d+): )?(?P<reason>.*)")
_MARKER_MESSAGE_MAX_BYTES = 300

_last_global_step: int | None = None
_stop_signal: int | None = None


def _safe_str(exc: BaseException) -> str:
    """str(exc); a broken ``__str__`` must not become a second error while reporting the first."""
    try:
        return str(exc)
    except Exception:
        return f"<unprintable {type(exc).__name__}>"


def _chain(exc: BaseException, seen: set[int] | None = None) -> Iterator[BaseException]:
    """The exception, its cause, context (unless hidden by ``from None``) and a group's members, each once."""
    seen = set() if seen is None else seen
    if id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        members = exc.exceptions if isinstance(exc, BaseExceptionGroup) else ()
        for link in (exc.__cause__, None if exc.__suppress_context__ else exc.__context__, *members):
            if link is not None:
                yield from _chain(link, seen)


def _categories(exc: BaseException) -> set[ErrorCategory]:
    """Every category a single exception (not its chain) gives evidence of."""
    if isinstance(exc, UserInputError):  # our code decided; a value quoted in its message is no evidence
        return {_C.USER_ERROR}
    if isinstance(exc, SystemExit):
        # argparse exits with 2 after printing its usage error; other exits carry no diagnosis.
        return {_C.USER_ERROR} if exc.code == 2 else set()
    names = {_qualified_name(cls) for cls in type(exc).__mro__}
    found = {category for category, types in _TYPE_CATEGORIES.items() if names & types}
    if isinstance(exc, OSError) and exc.errno in _STORAGE_ERRNOS:
        found.add(_C.STORAGE)
    text = _safe_str(exc)
    found.update(category for category, pattern in _MESSAGE_PATTERNS if pattern.search(text))
    if _DEVICE_ASSERT.search(text):
        found.discard(_C.DEVICE_ERROR)
    return found


def _diagnose(exc: BaseException) -> tuple[ErrorCategory, BaseException]:
    """The category of a failure and the exception in its chain that decided it (the first of the highest priority)."""
    evidence = [(category, link) for link in _chain(exc) for category in _categories(link)]
    return min(evidence, key=lambda found: _PRIORITY.index(found[0]), default=(_C.INTERNAL, exc))


def classify(exc: BaseException) -> ErrorCategory:
    """The category of a failure, judged from the types and messages of its whole exception chain."""
    return _diagnose(exc)[0]


def _signal_number(exc: BaseException) -> int | None:
    if isinstance(exc, KeyboardInterrupt):
        return signal.SIGINT
    signum = getattr(exc, "signum", getattr(exc, "sigval", None))  # ours, or torch elastic's SignalException
    return None if signum is None else int(signum)


def one_line(text: object, max_bytes: int | None = None) -> str:
    """``str(text)`` with its whitespace (newlines included) collapsed to single spaces: a message fit for one line
    of a log or report; cut to ``max_bytes`` of UTF-8 (ending "...") when given."""
    line = " ".join(str(text).split())
    data = line.encode("utf-8", "replace")
    if max_bytes is None or len(data) <= max_bytes:
        return line
    return data[: max_bytes - 3].decode("utf-8", "ignore") + "..."


def termination_log_path(log_file: str | None = None) -> str | None:
    """``TERMINATION_LOG_FILE``, else ``log_file``, else Kubernetes' default file when it exists and is writable."""
    kubernetes = os.path.isfile(K8S_TERMINATION_LOG) and os.access(K8S_TERMINATION_LOG, os.W_OK)
    return os.environ.get(TERMINATION_LOG_ENV) or log_file or (K8S_TERMINATION_LOG if kubernetes else None)


def write_termination_log(text: str, log_file: str | None = None, *, replace: bool = False) -> str | None:
    """Append ``text`` to the termination log as one line of at most 1 KiB (``replace``: make ``text`` the whole
    file); return the path, or None if none was written. Never raises: it must not mask the error being reported."""
    path = termination_log_path(log_file)
    if path is None:
        return None
    try:
        # One write of a short line in append mode: lines of ranks sharing the file do not interleave.
        with open(path, "w" if replace else "a", encoding="utf-8", errors="replace") as handle:
            handle.write(text if replace else one_line(text, TERMINATION_LOG_MAX_BYTES - 1) + "\n")
    except Exception as exc:
        logger.warning("Could not write the termination log %s: %s", path, exc)
        return None
    return path


def _message(exc: BaseException) -> str:
    # After argparse's exit, the message it printed is still in the error() frame of the traceback.
    for frame, _ in traceback.walk_tb(exc.__traceback__ if isinstance(exc, SystemExit) else None):
        if frame.f_code.co_name == "error" and frame.f_globals.get("__name__") == "argparse":
            return str(frame.f_locals.get("message", ""))
    return _safe_str(exc)


def build_error_report(
    exc: BaseException,
    *,
    global_step: int | None = None,
    category: ErrorCategory | str | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A failure as a JSON-ready dict (docs/errors.md's report table). ``category`` overrides the classification (e.g.
    ``hang`` from a watchdog); ``extra`` adds caller keys, which may not shadow the stable ones."""
    found, culprit = _diagnose(exc)
    if category is not None and ErrorCategory(category) is not found:
        found, culprit = ErrorCategory(category), exc
    signum = _signal_number(culprit) if found is _C.INTERRUPTED else None
    report: dict[str, Any] = {
        "category": found.value,
        "exit_code": exit_code_for(found, signum),
        "exception_type": _qualified_name(type(culprit)),
        "message": _message(culprit),
        "rank": int(os.environ.get("RANK", 0)),
        "local_rank": int(os.environ.get("LOCAL_RANK", 0)),
        "world_size": int(os.environ.get("WORLD_SIZE", 1)),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "global_step": global_step,
        "timestamp": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "traceback": "".join(traceback.format_exception(exc)),
    }
    if clash := report.keys() & (extra or {}).keys():
        raise ValueError(f"extra keys {sorted(clash)} would shadow stable report keys")
    return report | (extra or {})


def _summary(report: dict[str, Any]) -> str:
    short_type = report["exception_type"].rsplit(".", 1)[-1]
    return f"{short_type}: {report['message']}" if report["message"] else short_type


def termination_line(report: dict[str, Any]) -> str:
    """``<category>: <reason>`` for the termination log; the rank is named when there are several."""
    rank = f"rank {report['rank']}: " if report["world_size"] > 1 else ""
    return f"{report['category']}: {rank}{_summary(report)}"


def error_marker(report: dict[str, Any]) -> str:
    """One stderr line that log scrapers can grep for ``TUNING_ERROR``; a process that is no rank (the launcher)
    names its role instead of a rank."""
    step = "-" if report["global_step"] is None else report["global_step"]
    first_line = _summary(report).splitlines()[0]
    return (
        f"{ERROR_MARKER} category={report['category']} rank={report.get('role') or report['rank']} step={step} "
        f"exit_code={report['exit_code']} type={one_line(first_line, _MARKER_MESSAGE_MAX_BYTES)}"
    )


def marker_cuts(report: dict[str, Any]) -> bool:
    """Whether ``error_marker`` shows less than the whole message (a long or several-line one)."""
    summary = _summary(report)
    return "\n" in summary.strip() or len(one_line(summary).encode("utf-8", "replace")) > _MARKER_MESSAGE_MAX_BYTES


def print_own_line(text: str) -> None:
    """Print ``text`` to stderr on a line of its own, in one write: a progress bar may have left the line open."""
    line = f"\n{text}\n"
    try:
        sys.stderr.write(line)
        sys.stderr.flush()
    except RuntimeError:  # a signal handler reporting while the main thread was writing to stderr: skip its buffer
        os.write(2, line.encode("utf-8", "replace"))


def print_error_marker(report: dict[str, Any]) -> None:
    print_own_line(error_marker(report))


def last_global_step() -> int | None:
    """The optimizer step reached last in this process (None before training)."""
    return _last_global_step


def record_global_step(step: int) -> None:
    """Note the optimizer step reached, for the reports of later failures (``GracefulStopCallback`` does)."""
    global _last_global_step
    _last_global_step = step


def stop_signal() -> int | None:
    """The signal that is stopping the current training early, if any: trackers end their runs as interrupted."""
    return _stop_signal


def record_stop_signal(signum: int | None) -> None:
    """Note the signal that stops training early (``GracefulStopCallback`` does; None when training begins)."""
    global _stop_signal
    _stop_signal = signum


# For the early signal handlers: "starting" (before run_with_error_reporting), "running" (inside its function) or
# "reporting" (the process reports how it ended).
_phase = "starting"
_signals_ignored_while_reporting: set[int] = set()


def _on_stop_signal(signum: int, frame: Any) -> None:
    if _phase == "running":
        raise SignalInterrupt(signum)
    if _phase == "starting":
        # Report here and end the process at once: an exception raised into a library's module-level import code can
        # be replaced on its way out (numpy's lazy attributes, imported again half-initialised, recurse) and end the
        # process with another exit status. Nothing of the run needs cleaning yet; an early tracker helper exits by
        # itself when this process is gone.
        code = _report_failure(SignalInterrupt(signum))
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    if signum in _signals_ignored_while_reporting:
        signal.signal(signum, signal.SIG_DFL)
        signal.raise_signal(signum)
    _signals_ignored_while_reporting.add(signum)


def install_early_signal_handlers() -> None:
    """Handle SIGTERM and SIGINT from a script's first lines, before its heavy imports (from the main thread).

    While importing, a signal ends the script at once as ``interrupted``; inside ``run_with_error_reporting`` it
    raises ``SignalInterrupt`` (so ``on_error`` runs too); ``GracefulStopCallback`` takes over during training. Once
    the function has ended, a first signal is ignored so that the report is not cut short (torchrun signals every
    worker once one has exited); a second gets the default action.
    """
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _on_stop_signal)


def _report_failure(
    exc: BaseException,
    on_error: Callable[[dict[str, Any]], None] | None = None,
    global_step: Callable[[], int | None] = last_global_step,
    role: str | None = None,
) -> int:
    """Report ``exc`` (termination log, traceback, marker, ``on_error``) and return its exit code."""
    global _phase
    _phase = "reporting"
    if isinstance(exc, SystemExit) and exc.code in (0, None):
        return 0
    report = build_error_report(exc, global_step=global_step(), extra={"role": role} if role else None)
    write_termination_log(termination_line(report))
    # A rejected input or a requested stop needs its message, not a traceback; argparse printed its own.
    if not isinstance(exc, UserInputError | SystemExit | TrainingInterrupted | SignalInterrupt):
        traceback.print_exception(exc, file=sys.stderr)
    elif marker_cuts(report):  # no traceback holds the message: the whole of it, on a line of its own
        print_own_line(one_line(_summary(report)))
    print_error_marker(report)
    if on_error is not None:
        try:
            on_error(report)
        except Exception:  # a failing hook must not change how the run ends
            logger.exception("on_error hook failed")
    return report["exit_code"]


def run_with_error_reporting(
    fn: Callable[[], Any],
    *,
    on_error: Callable[[dict[str, Any]], None] | None = None,
    global_step: Callable[[], int | None] = last_global_step,
    role: str | None = None,
) -> int:
    """``sys.exit(run_with_error_reporting(main))``: fn's int result (0 for anything else); on any failure but
    ``SystemExit(0)``, the termination-log line, traceback and marker, the report to ``on_error`` (a wrapper's report
    file) and the category's exit code. ``role``: a process that is not a rank (``launcher``), named in its marker
    and report instead of rank 0."""
    global _phase
    _phase = "running"
    try:
        result = fn()
    except BaseException as exc:
        return _report_failure(exc, on_error, global_step, role)
    _phase = "reporting"
    _end_process_group()
    return result if isinstance(result, int) else 0


def _end_process_group() -> None:
    """A job that ends well leaves torch.distributed's process group destroyed, not to the interpreter's exit, where
    its backend's threads may be torn down mid-flight (a rank then aborts after its work is done). Every rank ends
    here once the job's work is done, so none waits on another."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
