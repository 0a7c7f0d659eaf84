"""tuning.utils.file_utils on a real filesystem."""

import json

import pytest

from tuning.utils.file_utils import write_json_atomic


def test_write_json_atomic(tmp_path):
    path = tmp_path / "error_report.json"
    write_json_atomic(path, {"a": 1})
    write_json_atomic(str(path), {"a": 2})
    assert json.loads(path.read_text()) == {"a": 2}
    with pytest.raises(TypeError):
        write_json_atomic(path, {"a": object()})
    assert json.loads(path.read_text()) == {"a": 2}  # the old file survives a failed write
    assert sorted(p.name for p in tmp_path.iterdir()) == ["error_report.json"]
