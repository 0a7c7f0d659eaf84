"""How many times a file was opened for reading, as the kernel saw it (Linux inotify, through libc): a test of what
reads a file, with no stand-in for the code that reads it."""

import ctypes
import os
import struct
from pathlib import Path

_IN_CLOSE_WRITE, _IN_CLOSE_NOWRITE, _IN_OPEN = 0x08, 0x10, 0x20
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, length of the name that follows


class FileReads:
    """Counts the opens of ``path`` that were closed without writing (a read, whole or part), from construction on.
    Opens and closes are both watched, so that the kernel never merges two reads into one event."""

    def __init__(self, path: Path | str):
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        mask = _IN_OPEN | _IN_CLOSE_WRITE | _IN_CLOSE_NOWRITE
        if self._libc.inotify_add_watch(self._fd, os.fsencode(path), mask) < 0:
            os.close(self._fd)
            raise OSError(ctypes.get_errno(), f"inotify_add_watch {path}")
        self._reads = 0

    def count(self) -> int:
        """The reads so far."""
        while True:
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                return self._reads
            offset = 0
            while offset < len(data):
                _, mask, _, name_length = _EVENT.unpack_from(data, offset)
                offset += _EVENT.size + name_length
                self._reads += bool(mask & _IN_CLOSE_NOWRITE)

    def close(self) -> None:
        os.close(self._fd)

    def __enter__(self) -> "FileReads":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
