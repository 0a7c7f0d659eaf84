"""Result files: written so that a reader never sees half of one (dumps, error reports), and JSON-lines files read
as their writer may have left them (journals, a sweep's state)."""

import json
import os
import threading
from collections.abc import Iterator
from typing import Any


def write_json_atomic(path: str | os.PathLike[str], obj: Any) -> None:
    """Write JSON through a temporary file in the same directory and ``os.replace``: readers never see half a file."""
    directory, name = os.path.split(os.path.abspath(path))
    tmp = os.path.join(directory, f".{name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            # One compact dumps: the C encoder (an indent would fall back to the pure-Python one).
            f.write(json.dumps(obj) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_json_lines(path: str | os.PathLike[str], what: str = "JSON") -> Iterator[tuple[int, Any]]:
    """``(line number, value)`` of each non-empty line; a torn last line (its writer died) is dropped, a bad line
    anywhere else raises ``ValueError`` saying it is not ``what``."""
    with open(path, encoding="utf-8") as handle:
        lines = handle.read().split("\n")
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except json.JSONDecodeError as exc:
            if number >= len(lines) - 1:
                return
            raise ValueError(f"{os.fspath(path)}:{number}: not {what} ({exc})") from exc
