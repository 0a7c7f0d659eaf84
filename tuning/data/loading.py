"""Reading training records from JSON arrays or JSON lines, one record at a time.

Memory is bounded by a record plus a 1 MiB read, not by the file. Every error names the file and the line, with
fms-hf-tuning's types (``datasets``' ``DatasetNotFoundError``, a ``FileNotFoundError``, for a missing file, else its
``DatasetGenerationError``), also ``UserInputError``.
"""

import codecs
import glob
import json
import os
import re
from collections.abc import Iterator

from datasets.exceptions import DatasetGenerationError, DatasetNotFoundError

from tuning.utils import error_logging
from tuning.utils.error_logging import UserInputError

GLOB_CHARACTERS = "*?["  # a data path with one of these is a glob

_READ_SIZE = 1 << 20
_SIGNIFICANT = re.compile(r"[^ \t\r\n]")
# A parse failure this close to the end of the buffer may only mean the record goes on in the next read (a cut
# literal such as ``-Infinit`` or a ``\\uXXXX`` escape is at most this long).
_MAX_CUT_TOKEN = 8
_DECODER = json.JSONDecoder()


class InputFileNotFoundError(error_logging.InputFileNotFoundError, DatasetNotFoundError):
    """A data file that is missing or not a file: also ``datasets``' ``DatasetNotFoundError``, which fms-hf-tuning
    v3.1.0 raises there (and a ``FileNotFoundError``, as 2.x raised)."""


class MalformedDataError(UserInputError, DatasetGenerationError):
    """A data file that is not UTF-8, not JSON lines or a JSON array of objects, or holds no records."""


def check_data_file(path: str) -> None:
    """Fail unless ``path`` is an existing regular file, saying which of the two it is not."""
    if os.path.isdir(path):
        raise InputFileNotFoundError(f"data path is a directory, not a file: {path}")
    if not os.path.isfile(path):
        raise InputFileNotFoundError(f"data file not found: {path}")


class _Reader:
    """Decodes JSON values one by one from a text buffer refilled 1 MiB at a time. ``text[position:]`` is left to
    parse; ``line`` is the line of ``position``, ``text_column`` the column of ``text[0]`` (lines may be long)."""

    def __init__(self, path: str, handle):
        self.path, self.handle = path, handle
        self.decoder = codecs.getincrementaldecoder("utf-8-sig")()
        self.text, self.position, self.line, self.text_column = "", 0, 1, 0
        self.lines_read = 1  # the line at the end of the bytes read so far
        self.eof = False
        self.kind = "JSON"  # what the file is, for errors

    def column(self, position: int) -> int:
        """The 0-based column of ``text[position]``."""
        newline = self.text.rfind("\n", 0, position)
        return position - newline - 1 if newline >= 0 else self.text_column + position

    def refill(self) -> bool:
        """Append the next read to the text left to parse; False at the end of the file."""
        if self.eof:
            return False
        # At least as much as is left unparsed: a record spanning many reads is decoded O(log n) times, not O(n).
        data = self.handle.read(max(_READ_SIZE, len(self.text) - self.position))
        self.eof = not data
        try:
            decoded = self.decoder.decode(data, final=self.eof)
        except UnicodeDecodeError as exc:
            before = exc.object[: exc.start]
            newline = before.rfind(b"\n")
            column = self.column(len(self.text)) if newline < 0 else 0
            column += len(before[newline + 1 :].decode("utf-8", "replace")) + 1
            line, byte = self.lines_read + before.count(b"\n"), exc.object[exc.start : exc.start + 1].hex()
            raise MalformedDataError(
                f"{self.path} is not valid UTF-8: byte 0x{byte} on line {line}, column {column}"
            ) from None
        if self.eof:
            return False
        self.lines_read += data.count(b"\n")
        self.text_column = self.column(self.position)
        self.text = self.text[self.position :] + decoded
        self.position = 0
        return True

    def advance_to(self, position: int) -> None:
        self.line += self.text.count("\n", self.position, position)
        self.position = position

    def next_significant(self) -> str:
        """The next character that is not whitespace, now at ``position``; "" at the end of the file."""
        while True:
            found = _SIGNIFICANT.search(self.text, self.position)
            self.advance_to(found.start() if found else len(self.text))
            if found:
                return found.group()
            if not self.refill():
                return ""

    def error(self, message: str, position: int | None = None) -> MalformedDataError:
        position = self.position if position is None else position
        line = self.line + self.text.count("\n", self.position, position)
        return MalformedDataError(
            f"malformed {self.kind} in {self.path} on line {line}, column {self.column(position) + 1}: {message}"
        )

    def value(self):
        """Decode the value at ``position``, reading on while the end of the buffer may have cut it."""
        while True:
            try:
                value, end = _DECODER.raw_decode(self.text, self.position)
            except json.JSONDecodeError as exc:
                cut = exc.msg.startswith("Unterminated string") or exc.pos >= len(self.text) - _MAX_CUT_TOKEN
                if cut and self.refill():
                    continue
                raise self.error(exc.msg.removesuffix(" at"), exc.pos) from None
            self.advance_to(end)
            return value


def iter_records(path: str) -> Iterator[tuple[int, dict]]:
    """Yield ``(line, record)`` for each object of a JSON lines file or JSON array, ``line`` being where it starts."""
    check_data_file(path)
    with open(path, "rb") as handle:
        reader = _Reader(path, handle)
        first = reader.next_significant()
        if not first:
            raise MalformedDataError(f"data file is empty: {path}")
        array, end = (True, "]") if first == "[" else (False, "")
        if array:
            reader.kind = "JSON array"
            reader.advance_to(reader.position + 1)  # the opening bracket
        index = last_line = 0
        while (char := reader.next_significant()) != end:
            if array and index:
                if char != ",":
                    raise reader.error("expected ',' or ']' after an element" if char else "the array is not closed")
                reader.advance_to(reader.position + 1)
                reader.next_significant()
            elif not array and reader.line == last_line:
                raise reader.error("extra data after a record (JSON lines hold one record a line)")
            line, record = reader.line, reader.value()
            if not isinstance(record, dict):
                kind = type(record).__name__
                raise MalformedDataError(f"record {index} (line {line}) of {path} is {kind}, expected a JSON object")
            yield line, record
            index, last_line = index + 1, reader.line
        if array:
            reader.advance_to(reader.position + 1)  # the closing bracket
            if reader.next_significant():
                raise reader.error("extra data after the array")
    if not index:
        raise MalformedDataError(f"data file has no records: {path}")


def load_records(path: str) -> list[dict]:
    """All records of a JSON array or JSON lines file, for data small enough to hold in memory."""
    return [record for _, record in iter_records(path)]


def expand_data_path(path: str) -> list[str]:
    """The files a data path names: itself, a folder's files (not hidden, recursively), or a glob's matches."""
    if os.path.isdir(path):
        found = []
        for root, folders, names in os.walk(path):
            folders[:] = [folder for folder in folders if not folder.startswith(".")]
            found.extend(os.path.join(root, name) for name in names if not name.startswith("."))
        found.sort()
        if not found:
            raise InputFileNotFoundError(f"data folder has no files: {path}")
        return found
    if any(char in path for char in GLOB_CHARACTERS) and not os.path.exists(path):
        found = sorted(match for match in glob.glob(path, recursive=True) if os.path.isfile(match))
        if not found:
            raise InputFileNotFoundError(f"no data file matches {path}")
        return found
    if not os.path.exists(path):
        raise InputFileNotFoundError(f"data file not found: {path}")
    return [path]


def files_dir(paths: list[str]) -> str | None:
    """The one folder holding every file the data ``paths`` name (absolute), or None when they are in several (or a
    path names no local file: a Hub dataset id)."""
    try:
        folders = {os.path.dirname(os.path.abspath(file)) for path in paths for file in expand_data_path(path)}
    except InputFileNotFoundError:
        return None
    return folders.pop() if len(folders) == 1 else None
