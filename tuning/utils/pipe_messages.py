"""Messages from the training process to a helper process of its own (the Aim writer, the journal writer).

A message is the length of its pickle (4 bytes, little-endian), then the pickle. Pickling takes a tenth of the time
of JSON, and the thread that sends holds the GIL while it encodes, so the training thread waits for it. Only plain
Python is pickled (``_PlainPickler``), so a helper never needs a class of the training process. Stdlib only: helpers
import this before anything else.
"""

import io
import numbers
import os
import pickle
from collections.abc import Iterator, Mapping
from typing import Any

_PLAIN_TYPES = (int, float, str, dict, list)


class _PlainPickler(pickle.Pickler):
    """Pickles plain Python only: numbers of other types (numpy's) become ints or floats, other mappings dicts, other
    sequences lists, anything else its string (as JSON's ``default=str`` would)."""

    def reducer_override(self, obj: Any) -> Any:
        if any(obj is kind for kind in _PLAIN_TYPES):  # the constructors below, which pickle by name
            return NotImplemented
        if isinstance(obj, numbers.Integral):
            return int, (int(obj),)
        if isinstance(obj, numbers.Real):
            return float, (float(obj),)
        if isinstance(obj, Mapping):
            return dict, (dict(obj),)
        if isinstance(obj, (list, tuple)):
            return list, (list(obj),)
        return str, (str(obj),)


def encode(message: Any) -> bytes:
    """``message`` as its reader reads it (``decode``)."""
    buffer = io.BytesIO()
    _PlainPickler(buffer, pickle.HIGHEST_PROTOCOL).dump(message)
    return len(buffer.getbuffer()).to_bytes(4, "little") + buffer.getvalue()


def decode(data: bytes) -> tuple[list[Any], bytes]:
    """The whole messages at the start of ``data``, and the rest (the start of a message still arriving)."""
    messages, start = [], 0
    while len(data) - start >= 4:
        end = start + 4 + int.from_bytes(data[start : start + 4], "little")
        if end > len(data):
            break
        messages.append(pickle.loads(data[start + 4 : end]))
        start = end
    return messages, data[start:]


def receive(fd: int) -> Iterator[list[Any]]:
    """The messages arriving on ``fd``, a list per read (what arrived together), until its writer closes it."""
    pending = b""
    while chunk := os.read(fd, 1 << 20):
        messages, pending = decode(pending + chunk)
        if messages:
            yield messages
