"""Reading training records from JSON arrays or JSON lines, one record at a time.

Memory is bounded by a record (plus a read buffer of 1 MiB), not by the file. Every error names the file and the line:
a missing file or a directory is a ``FileNotFoundError``, bytes that are not UTF-8 and malformed, empty or non-object
data are ``datasets``' ``DatasetGenerationError``, as ``datasets.load_dataset("json")`` raises in fms-hf-tuning; all
of them are also our ``UserInputError``.
"""

import codecs
import json
import os
import re
from collections.abc import Iterator

from datasets.exceptions import DatasetGenerationError

from tuning.utils.error_logging import InputFileNotFoundError, UserInputError

_READ_SIZE = 1 << 20
_WHITESPACE = b" \t\r\n"
_SIGNIFICANT = re.compile(r"[^ \t\r\n]")
# A parse failure this close to the end of the buffer may only mean the record goes on in the next read (a cut
# literal such as ``-Infinit`` or a ``\\uXXXX`` escape is at most this long).
_MAX_CUT_TOKEN = 8


class MalformedDataError(UserInputError, DatasetGenerationError):
    """A data file that is not UTF-8, not JSON lines or a JSON array of objects, or holds no records."""


def check_data_file(path: str) -> None:
    """Fail unless ``path`` is an existing regular file, saying which of the two it is not."""
    if os.path.isdir(path):
        raise InputFileNotFoundError(f"data path is a directory, not a file: {path}")
    if not os.path.isfile(path):
        raise InputFileNotFoundError(f"data file not found: {path}")


def _first_significant_byte(handle) -> bytes:
    """The first byte after a UTF-8 byte order mark and whitespace, b"" for a blank file; rewinds the handle."""
    if handle.read(len(codecs.BOM_UTF8)) != codecs.BOM_UTF8:
        handle.seek(0)
    first = b""
    while not first and (chunk := handle.read(_READ_SIZE)):
        first = chunk.lstrip(_WHITESPACE)[:1]
    handle.seek(0)
    return first


def _not_utf8(path: str, error: UnicodeDecodeError, line: int, column: int) -> MalformedDataError:
    byte = error.object[error.start : error.start + 1].hex()
    return MalformedDataError(f"{path} is not valid UTF-8: byte 0x{byte} on line {line}, column {column}")


def _check_object(path: str, index: int, line: int, record) -> dict:
    if not isinstance(record, dict):
        raise MalformedDataError(
            f"record {index} (line {line}) of {path} is {type(record).__name__}, expected a JSON object"
        )
    return record


def _json_lines(path: str, handle) -> Iterator[tuple[int, dict]]:
    index = 0
    for number, raw in enumerate(handle, start=1):
        try:
            line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
        except UnicodeDecodeError as exc:
            column = len(raw[: exc.start].decode("utf-8", "replace")) + 1
            raise _not_utf8(path, exc, number, column) from None
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise MalformedDataError(
                f"malformed JSON on line {number}, column {exc.colno} of {path}: {exc.msg.removesuffix(' at')}"
            ) from None
        yield number, _check_object(path, index, number, record)
        index += 1


class _ArrayReader:
    """Decodes a JSON array's elements one by one from a text buffer refilled 1 MiB at a time.

    ``text[position:]`` is what is left to parse; ``line`` is the line of ``position`` and ``text_column`` the column
    of ``text[0]``, so that errors name where they are however long the lines.
    """

    def __init__(self, path: str, handle):
        self.path, self.handle = path, handle
        self.decoder = codecs.getincrementaldecoder("utf-8-sig")()
        self.text, self.position, self.line, self.text_column = "", 0, 1, 0
        self.lines_read = 1  # the line at the end of the bytes read so far
        self.eof = False

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
            raise _not_utf8(self.path, exc, self.lines_read + before.count(b"\n"), column) from None
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
            f"malformed JSON array in {self.path} on line {line}, column {self.column(position) + 1}: {message}"
        )

    def value(self, decoder: json.JSONDecoder):
        """Decode the value at ``position``, reading on while the end of the buffer may have cut it."""
        while True:
            try:
                value, end = decoder.raw_decode(self.text, self.position)
            except json.JSONDecodeError as exc:
                cut = exc.msg.startswith("Unterminated string") or exc.pos >= len(self.text) - _MAX_CUT_TOKEN
                if cut and self.refill():
                    continue
                raise self.error(exc.msg.removesuffix(" at"), exc.pos) from None
            self.advance_to(end)
            return value


def _json_array(path: str, handle) -> Iterator[tuple[int, dict]]:
    reader, decoder = _ArrayReader(path, handle), json.JSONDecoder()
    reader.next_significant()
    reader.advance_to(reader.position + 1)  # the opening bracket
    index = 0
    while (char := reader.next_significant()) != "]":
        if index:
            if char != ",":
                raise reader.error("expected ',' or ']' after an element" if char else "the array is not closed")
            reader.advance_to(reader.position + 1)
            reader.next_significant()
        line = reader.line
        yield line, _check_object(path, index, line, reader.value(decoder))
        index += 1
    reader.advance_to(reader.position + 1)  # the closing bracket
    if reader.next_significant():
        raise reader.error("extra data after the array")


def iter_records(path: str) -> Iterator[tuple[int, dict]]:
    """Yield ``(line, record)`` for each object of a JSON lines file or JSON array, ``line`` being where it starts."""
    check_data_file(path)
    with open(path, "rb") as handle:
        first = _first_significant_byte(handle)
        if not first:
            raise MalformedDataError(f"data file is empty: {path}")
        records = _json_array(path, handle) if first == b"[" else _json_lines(path, handle)
        count = 0
        for numbered in records:
            count += 1
            yield numbered
    if not count:
        raise MalformedDataError(f"data file has no records: {path}")


def load_records(path: str) -> list[dict]:
    """All records of a JSON array or JSON lines file, for data small enough to hold in memory."""
    return [record for _, record in iter_records(path)]
