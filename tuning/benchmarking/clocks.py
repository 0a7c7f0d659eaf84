"""Which clock dates a run's times, and how two of them are compared (docs/benchmarking.md, "Clocks").

Every time a journal holds is a POSIX timestamp on this host's wall clock (``time.time()``'s scale). Its one time
that is not read from ``time.time()`` is a process's start, which happened before any of the process's code ran: on
Linux the kernel's start time of the process (``/proc/self/stat``, clock ticks since boot) put on the wall clock by
the boot time that ``time.time()`` and ``CLOCK_BOOTTIME`` read together give, so that it is at most one tick early;
elsewhere psutil's ``create_time()``. ``process_start`` says which, and how early it may be (its precision), for the
start record; ``segment_gap`` compares a restart's start with the previous segment's stop within that precision.
"""

import os
import time
from typing import Any, NamedTuple

PROC_STAT_STARTTIME = "proc_stat_starttime"  # /proc/self/stat's start time on the wall clock, via CLOCK_BOOTTIME
PSUTIL_CREATE_TIME = "psutil_create_time"  # psutil.Process().create_time()
RECORD_OPENED = "record_opened"  # no process start given: time.time() when the run record opened its journal
# How early psutil's create_time() may be: on Linux it counts from /proc/stat's btime, a whole number of seconds.
# Journals written before ``start_clock`` dated their starts so.
PSUTIL_PRECISION_S = 1.0
_BOOT_TIME_READINGS = 5  # pairs of readings; the tightest bracket of time.time() by CLOCK_BOOTTIME is kept
_STARTTIME_FIELD = 22  # /proc/PID/stat's field (1-based, as proc(5) numbers them): start time in clock ticks


class ProcessStart(NamedTuple):
    """A process's start: ``time`` on the wall clock, dated by ``source``, at most ``precision_seconds`` before the
    process began (never after it)."""

    time: float
    source: str
    precision_seconds: float

    def clock(self) -> dict[str, Any]:
        """The start record's (and the dump's) ``start_clock``."""
        return {"source": self.source, "precision_seconds": self.precision_seconds}


def boot_time() -> tuple[float, float]:
    """(the wall-clock time at which ``CLOCK_BOOTTIME`` was 0, its uncertainty in seconds): ``time.time()`` read
    between two readings of ``CLOCK_BOOTTIME``, the tightest of a few such brackets. Unlike /proc/stat's ``btime``,
    it keeps the boot's fraction of a second, and it follows the wall clock as it is now (after any step)."""
    readings = []
    for _ in range(_BOOT_TIME_READINGS):
        before = time.clock_gettime(time.CLOCK_BOOTTIME)
        wall = time.time()
        after = time.clock_gettime(time.CLOCK_BOOTTIME)
        readings.append((after - before, wall - (before + after) / 2))
    width, boot = min(readings)
    return boot, width / 2


def _proc_start() -> ProcessStart:
    with open("/proc/self/stat", encoding="ascii", errors="replace") as handle:
        stat = handle.read()
    # Fields after the command name, which is in parentheses and may itself hold spaces and parentheses.
    after_name = stat.rpartition(")")[2].split()
    ticks = int(after_name[_STARTTIME_FIELD - 3])
    tick = 1.0 / os.sysconf("SC_CLK_TCK")
    boot, uncertainty = boot_time()
    return ProcessStart(boot + ticks * tick, PROC_STAT_STARTTIME, tick + uncertainty)


def process_start() -> ProcessStart:
    """This process's start (docs/benchmarking.md, "Clocks"): the kernel's, to its clock tick, where /proc and
    ``CLOCK_BOOTTIME`` exist; psutil's ``create_time()`` elsewhere."""
    try:
        return _proc_start()
    except (OSError, ValueError, IndexError, AttributeError):  # no /proc, no CLOCK_BOOTTIME (not Linux)
        import psutil

        return ProcessStart(psutil.Process().create_time(), PSUTIL_CREATE_TIME, PSUTIL_PRECISION_S)


def start_precision(start_record: dict[str, Any]) -> float:
    """How early a ``start`` record's time may be: its ``start_clock``'s precision; a journal written before the key
    dated its starts with psutil's ``create_time()``."""
    clock = start_record.get("start_clock") or {}
    precision = clock.get("precision_seconds")
    return PSUTIL_PRECISION_S if precision is None else precision


class Gap(NamedTuple):
    """The time between a segment's stop and the next segment's start: ``seconds`` (never negative), ``note`` (why it
    was set to 0, or None), ``disagree`` (the two clocks disagree by more than the start's precision)."""

    seconds: float
    note: str | None
    disagree: bool


def segment_gap(previous_stop: float, start: float, precision: float) -> Gap:
    """A restart began after its previous process's last record; its start is dated up to ``precision`` seconds early.
    A start dated before that stop is a gap of 0: within ``precision``, the dating's own error, said in the note;
    beyond it, the clocks disagree (the wall clock stepped back, or the restart ran on another host), said too."""
    seconds = start - previous_stop
    if seconds >= 0:
        return Gap(seconds, None, False)
    early = f"the start is dated {-seconds:.3f} s before the previous segment's stop"
    if -seconds <= precision:
        return Gap(0.0, f"{early}, within its clock's precision ({precision:g} s): gap 0", False)
    return Gap(0.0, f"clocks disagree: {early}, beyond its clock's precision ({precision:g} s); gap counted as 0", True)
