"""Train like ``python tuning/sft_trainer.py`` with one real fault injected mid-training (error-reporting e2e tests).

    FAULT=gpu_oom|host_oom FAULT_STEP=3 REPORT_PATH=report.json \\
        python -m tests.helpers.fault_injection <sft_trainer flags>

Once FAULT_STEP optimizer steps are done, ``gpu_oom`` raises torch.OutOfMemoryError from inside the training loop
(no GPU here), and ``host_oom`` caps the address space (RLIMIT_AS) just above what the process already uses, so the
next step's own allocations really fail. The error report is written to REPORT_PATH.
"""

import os
import resource
import sys

from tuning.utils.prologue import pause_collector

pause_collector()  # as sft_trainer.py's prologue does, until train() begins

import torch  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

from tuning.sft_trainer import get_parser, parse_arguments, train  # noqa: E402
from tuning.utils.error_logging import run_with_error_reporting  # noqa: E402
from tuning.utils.file_utils import write_json_atomic  # noqa: E402
from tuning.utils.graceful_stop import GracefulStopCallback  # noqa: E402

# Room for the incidental allocations between steps; one step of the e2e test's batch needs far more.
HOST_OOM_HEADROOM_BYTES = 32 << 20


class InjectFault(TrainerCallback):
    def __init__(self, fault: str, step: int):
        self.fault = fault
        self.step = step

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step != self.step:
            return
        if self.fault == "gpu_oom":
            raise torch.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which "
                "3.19 GiB is free."
            )
        with open("/proc/self/status") as status:
            used = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
        resource.setrlimit(resource.RLIMIT_AS, (used + HOST_OOM_HEADROOM_BYTES, resource.RLIM_INFINITY))


def run() -> None:
    args = parse_arguments(get_parser())
    fault = InjectFault(os.environ["FAULT"], int(os.environ.get("FAULT_STEP", "3")))
    train(
        args.model_args,
        args.data_args,
        args.training_args,
        args.tune_config,
        tracker_configs=args.tracker_configs,
        callbacks=[fault, GracefulStopCallback()],
        exp_metadata=args.experiment_metadata,
    )


def write_report(report: dict) -> None:
    write_json_atomic(os.environ["REPORT_PATH"], report)


if __name__ == "__main__":
    sys.exit(run_with_error_reporting(run, on_error=write_report))
