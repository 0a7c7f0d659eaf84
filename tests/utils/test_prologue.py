"""tuning.utils.prologue's exit (and the wrappers' fire_flags'): after every exit handler the objects still alive are
frozen, so that Python's final garbage collections do not walk them. Real processes, with and without it."""

import pytest

from tests.helpers.training import run_python

SCRIPT = """
import atexit
import sys

if sys.argv[1] == "prologue":
    from tuning.utils.prologue import prologue

    prologue([])


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
    [("prologue", "exit handler\n"), ("fire_flags", "exit handler\n"), ("none", "exit handler\nfinalized\n")],
)
def test_the_exit_handlers_run_and_the_final_collection_skips_what_is_still_alive(tmp_path, first, printed):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    result = run_python(str(script), first, timeout=60)
    assert (result.returncode, result.stdout) == (0, printed), result.stderr
