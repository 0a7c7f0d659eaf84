"""tuning.utils.prologue's exit: after every exit handler the objects still alive are frozen, so that Python's final
garbage collections do not walk them. Real processes, each with and without the prologue."""

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
"""


@pytest.mark.parametrize(("first", "printed"), [("prologue", "exit handler\n"), ("none", "exit handler\nfinalized\n")])
def test_the_exit_handlers_run_and_the_final_collection_skips_what_is_still_alive(tmp_path, first, printed):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    result = run_python(str(script), first, timeout=60)
    assert (result.returncode, result.stdout) == (0, printed), result.stderr
