"""Benchmark runs: everything a benchmark wrapper (``wrappers/bench_train.py``, or your copy of it) needs, in one place.

``__all__`` is the public surface, listed by module in ``_EXPORTS``. Each name is imported from its module on first
use, so that light users (the rebuild command, ``bench_report``) never import torch or transformers, and a training
run never imports pydantic. Modules: ``schema`` (the dump's models, for ``validate_dump``), ``journal``, ``dump``
(journal records → dump, the series names), ``record``, ``callback``, ``tokens``, ``system_metrics``, ``stopping``,
``watchdog``, ``rebuild`` (``python -m tuning.benchmarking.rebuild JOURNAL``).
"""

import importlib
from typing import Any

# module: the names it exports, separated by spaces
_EXPORTS = {
    "tuning.sft_trainer": "train get_parser parse_arguments validate_arguments check_output_dir ParsedArguments",
    "tuning.config.tracker_configs": "AimConfig",
    "tuning.utils.config_utils": "get_json_config",
    "tuning.trackers": "AIMSTACK_TRACKER MLFLOW_TRACKER Tracker get_tracker hf_callbacks validate_tracker_names "
    "FAILED KILLED closed_on_failure run_status",
    "tuning.trackers.aimstack_tracker": "AimStackTracker",
    "tuning.utils.error_logging": "install_early_signal_handlers run_with_error_reporting ErrorCategory UserInputError "
    "StorageError TrainingInterrupted TrainingStalled build_error_report termination_line write_termination_log "
    "print_error_marker print_own_line",
    "tuning.utils.graceful_stop": "GracefulStopCallback StopAgreement",
    "tuning.utils.file_utils": "write_json_atomic",
    "tuning.benchmarking.callback": "BenchmarkCallback",
    "tuning.benchmarking.stopping": "StopRule",
    "tuning.benchmarking.watchdog": "StallWatchdog thread_stacks",
    "tuning.benchmarking.system_metrics": "environment_info peak_rss_bytes cuda_peak_memory",
    "tuning.benchmarking.record": "RunRecord",
    "tuning.benchmarking.journal": "Journal journal_path",
    "tuning.benchmarking.dump": "write_dump rank_report_path SCHEMA_VERSION",
    "tuning.benchmarking.schema": "validate_dump",
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names.split()}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    if name not in _MODULE_OF:
        raise AttributeError(f"module 'tuning.benchmarking' has no attribute {name!r}")
    value = getattr(importlib.import_module(_MODULE_OF[name]), name)
    globals()[name] = value
    return value
