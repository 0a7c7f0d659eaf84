"""Everything a benchmark wrapper (``wrappers/bench_train.py``, or your copy of it) takes from this project, in one
module of ordinary imports: ``from tuning.benchmarking import api as benchmarking``. It imports the trainer (torch,
transformers) but not pydantic: ``validate_dump``, the one name that needs the schema's models, stays in
``tuning.benchmarking.schema``, so a training run never pays for them.

The recipe's steps use the first names of ``__all__`` (``BenchmarkJob`` and its helpers, ``train``, ``save``); the
others are the building blocks earlier copies of bench_train assembled themselves. They stay, deprecated: a new
wrapper takes the job's methods instead (docs/benchmarking.md, "Adapt the wrapper").
"""

from tuning.benchmarking.callback import BenchmarkCallback
from tuning.benchmarking.configuration import run_configuration
from tuning.benchmarking.dump import SCHEMA_VERSION, rank_report_path, write_dump
from tuning.benchmarking.job import BenchmarkJob, flag, load_callbacks, load_metadata, parse_command_line
from tuning.benchmarking.journal import Journal, journal_path
from tuning.benchmarking.memory import PeakTensorMeter, estimate_memory, format_estimate, suggest_devices
from tuning.benchmarking.paths import RunPaths
from tuning.benchmarking.profiling import OomSnapshot, ProfileCallback
from tuning.benchmarking.record import RunRecord
from tuning.benchmarking.stopping import StopRule
from tuning.benchmarking.system_metrics import cuda_peak_memory, environment_info, peak_rss_bytes
from tuning.benchmarking.watchdog import StallWatchdog, thread_stacks
from tuning.config.tracker_configs import AimConfig
from tuning.sft_trainer import (
    ParsedArguments,
    check_output_dir,
    get_parser,
    parse_arguments,
    save,
    train,
    validate_arguments,
)
from tuning.trackers import (
    AIMSTACK_TRACKER,
    FAILED,
    KILLED,
    MLFLOW_TRACKER,
    Tracker,
    closed_on_failure,
    get_tracker,
    hf_callbacks,
    run_status,
    validate_tracker_names,
)
from tuning.trackers.aimstack_tracker import AimStackTracker
from tuning.trackers.helper_transport import EarlyHelpers
from tuning.utils.cli_flags import unknown_flag_message
from tuning.utils.config_utils import get_json_config
from tuning.utils.error_logging import (
    ErrorCategory,
    StorageError,
    TrainingInterrupted,
    TrainingStalled,
    UserInputError,
    build_error_report,
    install_early_signal_handlers,
    print_error_marker,
    print_own_line,
    run_with_error_reporting,
    termination_line,
    write_termination_log,
)
from tuning.utils.file_utils import write_json_atomic
from tuning.utils.graceful_stop import GracefulStopCallback, StopAgreement

__all__ = [
    # The recipe's surface (wrappers/bench_train.py).
    "BenchmarkJob",
    "EarlyHelpers",
    "RunPaths",
    "flag",
    "load_callbacks",
    "load_metadata",
    "parse_command_line",
    "save",
    "train",
    # Will it fit: the peak memory per device from the model's config alone, and the real peak beside it.
    "estimate_memory",
    "format_estimate",
    "suggest_devices",
    "PeakTensorMeter",
    # Callbacks any train() caller may pass: a profile of a step window, a CUDA memory snapshot at an OOM.
    "OomSnapshot",
    "ProfileCallback",
    # The building blocks of earlier copies of bench_train (deprecated: the job's methods do these steps).
    "AIMSTACK_TRACKER",
    "MLFLOW_TRACKER",
    "SCHEMA_VERSION",
    "AimConfig",
    "AimStackTracker",
    "BenchmarkCallback",
    "ErrorCategory",
    "FAILED",
    "GracefulStopCallback",
    "Journal",
    "KILLED",
    "ParsedArguments",
    "RunRecord",
    "StallWatchdog",
    "StopAgreement",
    "StopRule",
    "StorageError",
    "Tracker",
    "TrainingInterrupted",
    "TrainingStalled",
    "UserInputError",
    "build_error_report",
    "check_output_dir",
    "closed_on_failure",
    "cuda_peak_memory",
    "environment_info",
    "get_json_config",
    "get_parser",
    "get_tracker",
    "hf_callbacks",
    "install_early_signal_handlers",
    "journal_path",
    "parse_arguments",
    "peak_rss_bytes",
    "print_error_marker",
    "print_own_line",
    "rank_report_path",
    "run_configuration",
    "run_status",
    "run_with_error_reporting",
    "termination_line",
    "thread_stacks",
    "unknown_flag_message",
    "validate_arguments",
    "validate_tracker_names",
    "write_dump",
    "write_json_atomic",
    "write_termination_log",
]
