"""Every file of one benchmark run, named in one place: whatever writes them (the job, the journal, a sweep) and
whatever finds them again (bench_report, bench_sweep, the rebuild command) asks ``RunPaths``. Imports nothing heavy.

For ``--metrics_path run.json`` (docs/benchmarking.md, "What a run leaves"):

    run.json                    the dump (rank 0)
    run.json.lock               the lock rank 0 holds while the run lives; run.json.rank<N>.lock for a sampling rank N
    run.journal.jsonl           rank 0's journal; run.rank<N>.journal.jsonl for another node's local rank 0
    run.json.rank<N>.error.json the error report of rank N > 0
    run.termination-log         the run's TERMINATION_LOG_FILE when a sweep runs it
    run.log                     its stdout and stderr in a sweep
    run.profile/rank<N>/        rank N's profile of --profile_steps (trace, operators' table, memory files)
    run.oom_snapshot.pickle     the CUDA memory snapshot at an out-of-memory failure (--oom_snapshot), and its .html
"""

import glob
import os
import re
import tempfile
from dataclasses import dataclass

DEFAULT_STEM = "benchmark"  # the dump's name in the output directory when no --metrics_path is given
DUMP_SUFFIX = ".json"
JOURNAL_SUFFIX = ".journal.jsonl"
TERMINATION_LOG_SUFFIX = ".termination-log"
LOG_SUFFIX = ".log"
REBUILT_SUFFIX = ".rebuilt.json"
# Recognising a run's files by name: a rank's error report and a (rank's) journal.
RANK_REPORT = re.compile(r"^(?P<metrics_path>.+)\.rank(?P<rank>\d+)\.error\.json$")
JOURNAL = re.compile(r"^(?P<stem>.+?)(?:\.rank(?P<rank>\d+))?\.journal\.jsonl$")
# The files of runs in a directory, for a recursive search.
DIRECTORY_PATTERNS = (f"*{DUMP_SUFFIX}", f"*{JOURNAL_SUFFIX}", f"*{TERMINATION_LOG_SUFFIX}")


@dataclass(frozen=True)
class RunPaths:
    """The files of the run whose dump is ``metrics_path``; each method takes the writing rank where it matters."""

    metrics_path: str

    @classmethod
    def in_output_dir(cls, output_dir: str) -> "RunPaths":
        """The run whose dump takes the default place: ``<output_dir>/benchmark.json``."""
        return cls(os.path.join(output_dir, f"{DEFAULT_STEM}{DUMP_SUFFIX}"))

    @classmethod
    def from_stem(cls, stem: str) -> "RunPaths":
        """The run named ``stem`` (a sweep's point): its dump is ``stem.json``."""
        return cls(f"{stem}{DUMP_SUFFIX}")

    @property
    def stem(self) -> str:
        return os.path.splitext(self.metrics_path)[0]

    @property
    def dump(self) -> str:
        return self.metrics_path

    def lock(self, rank: int = 0) -> str:
        """The lock a rank writing files here holds for the run's lifetime (rank 0: the dump's)."""
        return f"{self.metrics_path}.lock" if rank == 0 else f"{self.metrics_path}.rank{rank}.lock"

    def journal(self, rank: int = 0) -> str:
        """``run.json`` → ``run.journal.jsonl``; ``run.rank3.journal.jsonl`` for another node's local rank 0."""
        return f"{self.stem}{JOURNAL_SUFFIX}" if rank == 0 else f"{self.stem}.rank{rank}{JOURNAL_SUFFIX}"

    def rank_report(self, rank: int) -> str:
        """Where a rank other than 0 writes its error report, one file per rank."""
        return f"{self.metrics_path}.rank{rank}.error.json"

    def rank_reports(self) -> list[str]:
        """The error reports of other ranks present on disk, sorted."""
        return sorted(glob.glob(glob.escape(self.metrics_path) + ".rank*.error.json"))

    @property
    def termination_log(self) -> str:
        return f"{self.stem}{TERMINATION_LOG_SUFFIX}"

    @property
    def log(self) -> str:
        return f"{self.stem}{LOG_SUFFIX}"

    @property
    def profile_dir(self) -> str:
        return f"{self.stem}.profile"

    @property
    def oom_snapshot(self) -> str:
        return f"{self.stem}.oom_snapshot.pickle"

    def dump_fallbacks(self, output_dir: str, pid: int) -> list[str]:
        """Where the dump goes when ``metrics_path`` cannot be written, in order: the output directory, then the
        system's temporary directory (named by the writing process)."""
        name = os.path.basename(self.metrics_path)
        return [os.path.join(output_dir, name), os.path.join(tempfile.gettempdir(), f"{pid}-{name}")]


def run_of_dump(dump: str) -> str:
    """The run a dump's path names (``run.json`` → ``run``), a rebuilt one's too (``run.rebuilt.json`` → ``run``)."""
    return dump.removesuffix(REBUILT_SUFFIX) if dump.endswith(REBUILT_SUFFIX) else os.path.splitext(dump)[0]


def rebuilt_dump_path(journal: str) -> str:
    """The rebuild command's default output: ``run.journal.jsonl`` → ``run.rebuilt.json``."""
    return f"{journal.removesuffix(JOURNAL_SUFFIX)}{REBUILT_SUFFIX}"
