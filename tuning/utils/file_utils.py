"""Writing result files (dumps, error reports) so that a reader never sees half of one."""

import json
import os
import threading
from typing import Any


def write_json_atomic(path: str | os.PathLike[str], obj: Any) -> None:
    """Write JSON through a temporary file in the same directory and ``os.replace``: readers never see half a file."""
    path = os.fspath(path)
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
