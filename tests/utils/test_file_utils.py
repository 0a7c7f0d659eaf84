"""tuning.utils.file_utils on a real filesystem."""

import json

import pytest

from tuning.utils.file_utils import read_json_lines, write_json_atomic


def test_write_json_atomic(tmp_path):
    path = tmp_path / "error_report.json"
    write_json_atomic(path, {"a": 1})
    write_json_atomic(str(path), {"a": 2})
    assert json.loads(path.read_text()) == {"a": 2}
    with pytest.raises(TypeError):
        write_json_atomic(path, {"a": object()})
    assert json.loads(path.read_text()) == {"a": 2}  # the old file survives a failed write
    assert sorted(p.name for p in tmp_path.iterdir()) == ["error_report.json"]


def test_json_lines_drop_a_torn_last_line_and_name_a_bad_one(tmp_path):
    path = tmp_path / "state.jsonl"
    path.write_text('{"a": 1}\n\n{"a": 2}\n{"a": 3, "b"')  # the writer died in the middle of its last line
    assert list(read_json_lines(path)) == [(1, {"a": 1}), (3, {"a": 2})]
    path.write_text('{"a": 1}\n{oops\n{"a": 2}\n')
    with pytest.raises(ValueError, match=r"state\.jsonl:2: not a record"):
        list(read_json_lines(path, "a record"))
