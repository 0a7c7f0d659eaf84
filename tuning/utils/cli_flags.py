"""Unknown flags of a fire script rejected before it does any work.

fire reports a flag it could not consume only after the function has run (a whole sweep, a report already written),
and exits 2. ``reject_unknown_flags(main)`` before ``fire.Fire(main)`` makes a mistyped flag a one-line user error
naming the closest valid one, exit 1. ``fire_flags(main, Flags, name)`` does both for a recipe whose flags are a
dataclass.
"""

import atexit
import difflib
import gc
import inspect
import re
import sys
from collections.abc import Callable
from typing import Any

# fire's own flags, which it also reads among the function's (--help) or after a bare "--".
FIRE_FLAGS = ("help", "h", "trace", "verbose", "interactive", "completion", "separator")
# What fire takes for a flag: a hyphen, then a letter (not a negative number, not a bare "-" separator).
_FLAG = re.compile(r"^--?(?P<name>[A-Za-z][^=]*)")


def unknown_flag(function: Callable[..., Any], argv: list[str]) -> str | None:
    """The first flag of ``argv`` that ``function`` has no parameter for, as a one-line message naming the closest
    valid flag; None when every flag is known. As fire reads them: ``--a_b``, ``--a-b``, ``--a_b=1``, ``--noa_b`` for a
    ``False``; everything after a bare ``--`` is fire's own."""
    parameters = inspect.signature(function).parameters.values()
    if any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters):
        return None
    names = [p.name for p in parameters if p.kind is not inspect.Parameter.VAR_POSITIONAL]
    for token in argv:
        if token == "--":
            return None
        if not (match := _FLAG.match(token)):
            continue
        name = match["name"].replace("-", "_")
        if name in names or name in FIRE_FLAGS or (name.startswith("no") and name[2:] in names):
            continue
        if (
            len(name) == 1 and sum(known.startswith(name) for known in names) == 1
        ):  # fire's -x: the one flag starting with x
            continue
        return unknown_flag_message(token, names)
    return None


def unknown_flag_message(token: str, names: list[str]) -> str:
    """One line naming the unknown flag ``token`` and the closest of the valid flag ``names`` (or all of them)."""
    name = token.lstrip("-").split("=", 1)[0].replace("-", "_")
    closest = difflib.get_close_matches(name, names, n=1, cutoff=0.5)
    hint = f"; did you mean --{closest[0]}?" if closest else f"; valid flags: --{', --'.join(names)}"
    return f"unknown flag {token.split('=', 1)[0]}{hint}"


def reject_unknown_flags(function: Callable[..., Any], argv: list[str] | None = None) -> None:
    """Exit 1 with a one-line message on stderr when ``argv`` (default: the command line) holds a flag that
    ``function`` does not take; call it before ``fire.Fire(function)``."""
    if problem := unknown_flag(function, sys.argv[1:] if argv is None else argv):
        raise SystemExit(problem)


def fire_flags(main: Callable[..., int], flags: type, name: str) -> int:
    """Run ``main`` under fire with the fields of the dataclass ``flags`` as its command line: the fields without a
    default positional, the others flags, the dataclass's docstring as ``--help``; an unknown flag rejected first.
    ``main`` receives the values as fire parsed them, as ``flags``' fields by position and name. At the process's
    exit, after the handlers registered from here on, what is still alive is frozen (``gc.freeze``), so that Python's
    final collections skip it, as a training script's prologue does (``tuning.utils.prologue``)."""
    import fire  # the wrappers' command lines only: the trainer's modules that read this one never load it

    atexit.register(gc.freeze)
    reject_unknown_flags(flags)

    def command_line(*args: Any, **kwargs: Any) -> int:
        return main(*args, **kwargs)

    command_line.__signature__ = inspect.signature(flags).replace(return_annotation=int)  # what fire reads
    command_line.__doc__ = flags.__doc__
    return fire.Fire(command_line, name=name, serialize=lambda _: None)
