"""A third-party wrapper written the way IBM ado's v3.x one drives fms-hf-tuning (its ``wrapper_sfttrainer.py`` and
``tuning_versions/at_least_3_0_0_1.py``): its own flags off argv, the rest left in ``sys.argv``, the job config from
the environment, Aim's own ``AimCallback`` subclassed with ``log_system_params=True``, ``training_args.trackers = []``
and ``train()`` called with v3.1.0's keywords. The metrics it saw and any failure go to ``--info_path`` as JSON.

    python ado_style_wrapper.py --aim_repo DIR --info_path FILE [sft_trainer flags]
"""

import dataclasses
import json
import sys

import transformers
from aim.hugging_face import AimCallback


@dataclasses.dataclass
class WrapperArgs:
    aim_repo: str = dataclasses.field(metadata={"help": "Aim repository of the callback's run."})
    info_path: str = dataclasses.field(metadata={"help": "JSON file for what the run reported."})


class MetricsAimCallback(AimCallback):
    """Aim's callback, keeping every logged value so that the final metrics can be written out."""

    def __init__(self, repo: str, info_path: str):
        super().__init__(repo=repo, experiment="ado-style", system_tracking_interval=10, log_system_params=True)
        self.info_path = info_path
        self.logged: dict = {}

    def on_log(self, args, state, control, model=None, logs=None, **kwargs):
        super().on_log(args, state, control, model=model, logs=logs, **kwargs)
        if state.is_world_process_zero:
            self.logged.update(logs or {})

    def on_train_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            info = {"run_hash": self.experiment.hash, "training_steps": state.global_step, "metrics": self.logged}
            with open(self.info_path, "w", encoding="utf-8") as handle:
                json.dump(info, handle)
        super().on_train_end(args, state, control, **kwargs)


def parse_arguments_and_execute_wrapper(callbacks: list, job_config: dict):
    import tuning.sft_trainer

    parser = tuning.sft_trainer.get_parser()
    (
        model_args,
        data_args,
        training_args,
        trainer_controller_args,
        tune_config,
        quantization_config,
        quantized_lora_config,
        fusedops_kernels_config,
        attention_and_distributed_packing_config,
        fast_moe_config,
        tracker_configs,
        exp_metadata,
    ) = tuning.sft_trainer.parse_arguments(parser, job_config)
    training_args.trackers = []
    return tuning.sft_trainer.train(
        model_args=model_args,
        data_args=data_args,
        train_args=training_args,
        peft_config=tune_config,
        quantization_config=quantization_config,
        trainer_controller_args=trainer_controller_args,
        tracker_configs=tracker_configs,
        additional_callbacks=callbacks,
        exp_metadata={},
        quantized_lora_config=quantized_lora_config,
        fusedops_kernels_config=fusedops_kernels_config,
        attention_and_distributed_packing_config=attention_and_distributed_packing_config,
        fast_moe_config=fast_moe_config,
    )


def main() -> None:
    parser = transformers.HfArgumentParser((WrapperArgs,))
    wrapper_args, remaining = parser.parse_args_into_dataclasses(args=sys.argv[1:], return_remaining_strings=True)
    sys.argv = [sys.argv[0], *remaining]
    import tuning.sft_trainer

    try:
        callback = MetricsAimCallback(wrapper_args.aim_repo, wrapper_args.info_path)
        parse_arguments_and_execute_wrapper([callback], tuning.sft_trainer.get_json_config())
    except BaseException as exc:
        with open(wrapper_args.info_path, "w", encoding="utf-8") as handle:
            json.dump({"error": type(exc).__name__, "exception": str(exc)}, handle)
        raise


if __name__ == "__main__":
    # The one line a wrapper adds to get tuning-bench's exit codes, termination log and stderr marker.
    from tuning.utils.error_logging import run_with_error_reporting

    sys.exit(run_with_error_reporting(main))
