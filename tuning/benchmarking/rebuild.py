"""Rebuild a benchmark dump from its journal, e.g. after the run was killed before writing the dump:

    python -m tuning.benchmarking.rebuild out/benchmark.journal.jsonl            # → out/benchmark.rebuilt.json
    python -m tuning.benchmarking.rebuild out/benchmark.journal.jsonl -o x.json

A journal without an ``end`` record gives a dump with ``status: error`` and everything logged before the run died.
"""

import argparse
import sys

from tuning.benchmarking.dump import build_dump, write_dump
from tuning.benchmarking.journal import read_journal
from tuning.benchmarking.paths import rebuilt_dump_path
from tuning.benchmarking.schema import validate_dump


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tuning.benchmarking.rebuild", description=__doc__.split("\n")[0])
    parser.add_argument("journal", help="the *.journal.jsonl file written beside the dump")
    parser.add_argument("-o", "--output", help="dump to write (default: <journal stem>.rebuilt.json)")
    args = parser.parse_args(argv)
    output = args.output or rebuilt_dump_path(args.journal)
    try:
        dump = build_dump(read_journal(args.journal), rebuilt_from_journal=True)
        write_dump(output, dump)
    except (OSError, ValueError) as exc:
        print(f"cannot rebuild from {args.journal}: {exc}", file=sys.stderr)
        return 1
    problems = validate_dump(dump)
    for problem in problems:
        print(f"schema problem: {problem}", file=sys.stderr)
    print(f"{output}: status {dump['status']}, {dump['training_steps']} steps, {len(dump['metrics'])} series")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
