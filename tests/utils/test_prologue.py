"""The prologue's garbage-collector policy. At exit (and at the wrappers' fire_flags'), after every exit handler, the
objects still alive are frozen, so that Python's final garbage collections do not walk them: real processes, with
and without it. For the heavy imports, the collector is paused until ``train()`` begins."""

import gc

import pytest

from tests.helpers.training import make_args, run_python
from tuning.sft_trainer import train
from tuning.utils.error_logging import UserInputError
from tuning.utils.prologue import collector_paused, pause_collector

SCRIPT = """
import atexit
import sys

if sys.argv[1] == "prologue":  # a training script's: tuning.prologue's, which runs tuning.utils.prologue's
    import gc

    from tuning.prologue import prologue

    prologue([])
    sys.stdout.write(f"collector on for the imports: {gc.isenabled()}\\n")


class Cycle:
    def __del__(self):
        sys.stdout.write("finalized\\n")


alive = Cycle()
alive.itself = alive  # alive at exit, in a cycle: only a garbage collection at exit finalizes it
atexit.register(lambda: sys.stdout.write("exit handler\\n"))

if sys.argv[1] == "fire_flags":  # a wrapper's entry: bench_sweep's, bench_compare's
    import dataclasses

    from tuning.utils.cli_flags import fire_flags

    del sys.argv[1:]
    fire_flags(lambda: 0, dataclasses.make_dataclass("Flags", []), "wrapper.py")
"""


@pytest.mark.parametrize(
    ("first", "printed"),
    [
        ("prologue", "collector on for the imports: False\nexit handler\n"),
        ("fire_flags", "exit handler\n"),
        ("none", "exit handler\nfinalized\n"),
    ],
)
def test_the_exit_handlers_run_and_the_final_collection_skips_what_is_still_alive(tmp_path, first, printed):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    result = run_python(str(script), first, timeout=60)
    assert (result.returncode, result.stdout) == (0, printed), result.stderr


def test_train_turns_the_collector_the_prologue_paused_back_on_with_what_the_imports_built_frozen(tmp_path):
    """``train()``'s first act: where the prologue paused the collector, it freezes what is alive (the imports'
    objects, which the training's collections then skip) and turns the collector back on; without the prologue (a
    program calling ``train()`` itself) the collector stays as it was. A ``train()`` refused at once shows it. (A
    frozen object that dies meanwhile lowers the count: nothing frozen is the count not rising.)"""
    args = make_args("unused-model", str(tmp_path), "unused.jsonl")
    frozen = gc.get_freeze_count()
    with pytest.raises(UserInputError, match="not both"):
        train(*args, callbacks=[], additional_callbacks=[])
    assert gc.isenabled() and gc.get_freeze_count() <= frozen
    pause_collector()
    assert not gc.isenabled()
    with pytest.raises(UserInputError, match="not both"):
        train(*args, callbacks=[], additional_callbacks=[])
    assert gc.isenabled() and gc.get_freeze_count() > frozen


def test_a_block_of_heavy_imports_runs_with_the_collector_paused_and_ends_with_a_freeze():
    """``collector_paused`` (a sweep's driver loading bench_train's parser): off inside, frozen and back on after;
    inside a pause already under way it leaves the pause to its owner."""
    frozen = gc.get_freeze_count()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled() and gc.get_freeze_count() > frozen
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
