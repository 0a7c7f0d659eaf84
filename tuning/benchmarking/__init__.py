"""Benchmark runs: the dump, its journal and what measures a run. ``tuning.benchmarking.api`` is the one module a
benchmark wrapper (``wrappers/bench_train.py``, or your copy of it) imports. This package itself imports nothing
until one of ``api``'s names is read from it (older copies of bench_train do), so that light users (the rebuild
command, ``bench_report``) never load torch or transformers. Modules: ``api``, ``job`` (one run's lifecycle, the
recipe's steps), ``paths`` (a run's file names), ``report`` (many runs → rows, table, plots), ``schema`` (the dump's
models, for ``validate_dump``), ``journal``, ``dump`` (journal records → dump, the series names), ``record``,
``callback``, ``tokens``, ``flops`` (model FLOPs per token, device peaks), ``ranks`` (per-rank forward time and data
wait), ``system_metrics``, ``stopping``, ``watchdog``, ``rebuild`` (``python -m tuning.benchmarking.rebuild
JOURNAL``), ``memory`` (the peak memory estimate from a model's config, and the measured peak), ``statistics``
(bench_compare's two-sample tests, MLPerf's scoring), ``quality`` (its loss verdict), ``mlperf`` (time to train and
its result log), ``goodput`` (where a run's wall time went), ``clocks`` (a process's start, and how a run's times are
compared)."""

import importlib
import importlib.util
from typing import Any


def __getattr__(name: str) -> Any:
    """``tuning.benchmarking.X`` for each name of ``api.__all__``, loaded on first use, so that copies of bench_train
    written against the package itself (``from tuning import benchmarking``) keep working. A submodule's name is left
    to the import system (``from tuning.benchmarking import journal`` asks here first), so it loads nothing else."""
    if importlib.util.find_spec(f"{__name__}.{name}") is None:
        api = importlib.import_module(f"{__name__}.api")
        if name in api.__all__:
            return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
