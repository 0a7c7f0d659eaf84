"""A process's start as the dump dates it (``tuning.benchmarking.clocks``): from the kernel's start time, never after
the process's first line ran and no earlier than the interpreter's own start-up explains."""

import json
import time

import pytest

from tests.helpers.training import run_python
from tuning.benchmarking.clocks import PROC_STAT_STARTTIME

FIRST_LINE = """import time; first = time.time()
import json
from tuning.benchmarking.clocks import process_start
start = process_start()
print(json.dumps({"first": first, "start": start.time, "clock": start.clock()}))
"""
INTERPRETER_START_UP_S = 0.2  # what an interpreter needs here before its first line runs, at most


@pytest.mark.slow  # a fresh interpreter
def test_a_fresh_process_s_start_is_dated_at_or_before_its_first_line_and_no_earlier_than_its_launch():
    launched = time.time()
    result = run_python("-c", FIRST_LINE, timeout=60)
    assert result.returncode == 0, result.stderr
    dated = json.loads(result.stdout)
    first, start, clock = dated["first"], dated["start"], dated["clock"]
    assert clock["source"] == PROC_STAT_STARTTIME and 0 < clock["precision_seconds"] <= 0.011, clock
    assert start <= first and first - start < INTERPRETER_START_UP_S, (first - start, clock)
    assert start >= launched - clock["precision_seconds"], (launched - start, clock)
