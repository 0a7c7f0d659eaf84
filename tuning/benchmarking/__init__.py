"""Benchmark runs: the dump, its journal and what measures a run. ``tuning.benchmarking.api`` is the one module a
benchmark wrapper (``wrappers/bench_train.py``, or your copy of it) imports; this package itself imports nothing, so
that light users (the rebuild command, ``bench_report``) never load torch or transformers. Modules: ``api``,
``schema`` (the dump's models, for ``validate_dump``), ``journal``, ``dump`` (journal records → dump, the series
names), ``record``, ``callback``, ``tokens``, ``flops`` (model FLOPs per token, device peaks), ``ranks`` (per-rank
forward time and data wait), ``system_metrics``, ``stopping``, ``watchdog``, ``rebuild``
(``python -m tuning.benchmarking.rebuild JOURNAL``).
"""
