"""tuning.utils.processes: the processes a run forks for a ``datasets`` ``map`` (its ``num_proc`` workers and the
manager it starts) die with the run, so that a SIGKILLed run leaves none behind. Real forks, a real SIGKILL."""

import ctypes
import json
import multiprocessing
import os
import signal
import time
from pathlib import Path

import psutil
import pytest
from transformers import AutoTokenizer

from tuning.data.data_config import DataHandlerConfig, DataPreProcessorConfig, DataSetConfig
from tuning.data.data_handlers import DataHandler, DataHandlerType
from tuning.data.data_processors import get_datapreprocessor
from tuning.utils.processes import PR_GET_PDEATHSIG, children_die_with_this_process

FORK = multiprocessing.get_context("fork")


def exit_with_death_signal() -> None:
    """Exit with the signal the kernel sends this process when its parent dies (0: none)."""
    found = ctypes.c_int(0)
    ctypes.CDLL(None, use_errno=True).prctl(PR_GET_PDEATHSIG, ctypes.byref(found), 0, 0, 0)
    os._exit(found.value)


def death_signal_of_a_child() -> int:
    child = FORK.Process(target=exit_with_death_signal)
    child.start()
    child.join(timeout=30)
    return child.exitcode


def test_children_forked_inside_die_with_the_process_and_others_do_not():
    with children_die_with_this_process():
        assert death_signal_of_a_child() == signal.SIGKILL
    assert death_signal_of_a_child() == 0


def wait_in_a_worker(row: dict, pid_dir: str, **_handler_kwargs) -> dict:
    """A data handler that marks its worker and then waits: the test kills the run meanwhile."""
    (Path(pid_dir) / str(os.getpid())).touch()
    time.sleep(60)
    return row


def prepare_data_on_two_processes(model: str, data: str, pid_dir: str) -> None:
    """The run: a data config whose handler maps on two processes (``num_proc``)."""
    handler = DataHandler(wait_in_a_worker, DataHandlerType.MAP)
    preprocessor = get_datapreprocessor(
        DataPreProcessorConfig(), AutoTokenizer.from_pretrained(model), additional_data_handlers={"wait": handler}
    )
    arguments = {"num_proc": 2, "fn_kwargs": {"pid_dir": pid_dir}}
    dataset = DataSetConfig(name="rows", data_paths=[data], data_handlers=[DataHandlerConfig("wait", arguments)])
    preprocessor.process_dataset_configs([dataset])


@pytest.mark.slow
def test_a_sigkilled_run_leaves_none_of_its_map_processes_behind(tiny_model, tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"text": f"row {index}"}) + "\n" for index in range(4)))
    pid_dir = tmp_path / "workers"
    pid_dir.mkdir()
    run = FORK.Process(target=prepare_data_on_two_processes, args=(tiny_model, str(data), str(pid_dir)))
    run.start()
    deadline = time.monotonic() + 60
    while len(list(pid_dir.iterdir())) < 2 and run.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    forked = psutil.Process(run.pid).children(recursive=True)
    assert len(forked) >= 3, forked  # two workers and the manager datasets starts
    os.kill(run.pid, signal.SIGKILL)
    run.join(timeout=10)
    _, alive = psutil.wait_procs(forked, timeout=5)
    for process in alive:  # a failing case's survivors: not left to hold the test's output open
        process.kill()
    assert not alive, alive
