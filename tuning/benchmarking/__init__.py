"""Benchmark runs: the dump schema and the parts that write it, shared by ``wrappers/bench_train.py`` and readers.

- ``schema``: ``DUMP_SCHEMA``, ``SCHEMA_VERSION``, series names, ``validate_dump``
- ``journal``: the crash-safe JSON-lines journal (writer and reader)
- ``dump``: journal records → dump (summary, aggregates), atomic write, report file names
- ``record``: ``RunRecord``, the live run's records (also a ``Tracker``)
- ``callback``: ``BenchmarkCallback``, per-step measurement, stop decisions, sampler and watchdog lifetimes
- ``tokens``: ``StepTokenCounter``, non-padding tokens per optimizer step without a device sync
- ``system_metrics``, ``stopping``, ``watchdog``: the background sampler, the stop rule, the stall watchdog
- ``rebuild``: ``python -m tuning.benchmarking.rebuild JOURNAL``

Submodules are imported one by one: ``schema``, ``journal``, ``dump`` and ``rebuild`` need neither torch nor
transformers.
"""
