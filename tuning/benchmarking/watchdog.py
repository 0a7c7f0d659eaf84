"""Stall watchdog: a deadlocked collective, a wedged device or a dead data-loader worker leave the main thread waiting
forever, with no exception. The watchdog thread calls ``on_stall`` once when ``beat()`` was not called for ``timeout``
seconds while armed; the caller reports the hang (with ``thread_stacks()``) and ends the process itself.
"""

import sys
import threading
import time
import traceback
from collections.abc import Callable


def thread_stacks() -> str:
    """The Python stack of every thread of this process, main thread first: where each one is stuck."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    frames = sorted(sys._current_frames().items(), key=lambda item: item[0] != threading.main_thread().ident)
    stacks = [
        f"Thread {names.get(ident, '?')} (ident {ident}):\n{''.join(traceback.format_stack(frame))}"
        for ident, frame in frames
    ]
    return "\n".join(stacks)


class StallWatchdog:
    def __init__(self, timeout: float, on_stall: Callable[[float], None]):
        self.timeout = timeout
        self.on_stall = on_stall
        self._last_beat = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def arm(self) -> None:
        """Start watching; progress is expected within ``timeout`` seconds from now."""
        self.beat()
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="stall-watchdog", daemon=True)
            self._thread.start()

    def beat(self) -> None:
        self._last_beat = time.monotonic()

    def disarm(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(min(1.0, self.timeout / 4)):
            idle = time.monotonic() - self._last_beat
            if idle >= self.timeout:
                self.on_stall(idle)
                return
