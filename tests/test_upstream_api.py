"""fms-hf-tuning's Python API (v3.1.0, and the older names that still work): names, signatures, defaults,
exceptions and log files."""

import inspect
import json
import re

import pytest
import torch
from transformers import (
    DefaultFlowCallback,
    PrinterCallback,
    ProgressCallback,
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)

from tests.helpers.aim import existing_repo
from tests.helpers.training import RESPONSE_TEMPLATE, cli_args, make_args, run_main
from tuning import sft_trainer
from tuning.config.acceleration_configs import AttentionAndDistributedPackingConfig, FastMoeConfig
from tuning.config.configs import ModelArguments, TrainerControllerArguments
from tuning.config.peft_config import Mxfp4Config
from tuning.config.tracker_configs import AimConfig, FileLoggingTrackerConfig, TrackerConfigFactory, TrackerConfigs
from tuning.trackers.filelogging_tracker import FileLoggingCallback, FileLoggingTracker
from tuning.trackers.tracker import Tracker
from tuning.trackers.tracker_factory import (
    AIMSTACK_TRACKER,
    AVAILABLE_TRACKERS,
    FILE_LOGGING_TRACKER,
    get_tracker,
    validate_tracker_names,
)
from tuning.utils import config_utils, error_logging
from tuning.utils.data_type_utils import get_torch_dtype, str_to_torch_dtype
from tuning.utils.error_logging import UserInputError
from tuning.utils.tiny_model import SAMPLE_TRAIN_PATH
from tuning.utils.tokens_per_second import count_train_tokens

UPSTREAM_TRAIN_PARAMETERS = [
    ("model_args", inspect.Parameter.empty),
    ("data_args", inspect.Parameter.empty),
    ("train_args", inspect.Parameter.empty),
    ("peft_config", None),
    ("quantization_config", None),
    ("trainer_controller_args", None),
    ("tracker_configs", TrackerConfigs()),
    ("additional_callbacks", None),
    ("exp_metadata", None),
    ("quantized_lora_config", None),
    ("fusedops_kernels_config", None),
    ("attention_and_distributed_packing_config", None),
    ("fast_moe_config", None),
    ("additional_data_handlers", None),
]
UPSTREAM_PARSED_FIELDS = (
    "model_args",
    "data_args",
    "training_args",
    "trainer_controller_args",
    "tune_config",
    "quantization_config",
    "quantized_lora_config",
    "fusedops_kernels_config",
    "attention_and_distributed_packing_config",
    "fast_moe_config",
    "tracker_configs",
    "exp_metadata",
)


def training_logs(output_dir) -> list[dict]:
    return [json.loads(line) for line in (output_dir / "training_logs.jsonl").read_text().splitlines()]


# ---- shapes ----


def test_train_takes_upstreams_arguments_in_upstreams_order():
    parameters = list(inspect.signature(sft_trainer.train).parameters.values())
    upstream = parameters[: len(UPSTREAM_TRAIN_PARAMETERS)]
    assert [(p.name, p.default) for p in upstream] == UPSTREAM_TRAIN_PARAMETERS
    assert all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in upstream)
    ours = {p.name: p for p in parameters[len(UPSTREAM_TRAIN_PARAMETERS) :]}
    assert set(ours) == {"callbacks", "trackers"}
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is None for p in ours.values())


def test_parse_arguments_returns_upstreams_twelve_values(monkeypatch):
    parameters = inspect.signature(sft_trainer.parse_arguments).parameters
    assert list(parameters)[:2] == ["parser", "json_config"]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in list(parameters.values())[2:])
    assert sft_trainer.ParsedArguments._fields == UPSTREAM_PARSED_FIELDS
    monkeypatch.setattr("sys.argv", ["sft_trainer.py", "--model_name_or_path", "m", "--output_dir", "out"])
    model_args, *_, tracker_configs, exp_metadata = parsed = sft_trainer.parse_arguments(sft_trainer.get_parser())
    assert len(parsed) == 12 and model_args.model_name_or_path == "m" and exp_metadata is None
    assert isinstance(tracker_configs, TrackerConfigs)


def test_save_takes_upstreams_arguments():
    parameters = inspect.signature(sft_trainer.save).parameters
    assert [(p.name, p.default) for p in parameters.values()] == [
        ("path", inspect.Parameter.empty),
        ("trainer", inspect.Parameter.empty),
        ("tc_callback", None),
        ("log_level", "WARNING"),
        ("args", None),
    ]


# Flags of fms-hf-tuning v3.1.0's parser (tag v3.1.0, tuning/sft_trainer.py get_parser and its dataclasses) that
# are not transformers.TrainingArguments' own.
UPSTREAM_FLAGS = [
    "--model_name_or_path",
    "--use_flash_attn",
    "--torch_dtype",
    "--embedding_size_multiple_of",
    "--tokenizer_name_or_path",
    "--flash_attn_implementation",
    "--training_data_path",
    "--dataset_text_field",
    "--dataset_conversation_field",
    "--validation_data_path",
    "--data_formatter_template",
    "--data_config_path",
    "--chat_template",
    "--response_template",
    "--instruction_template",
    "--dataset_image_field",
    "--add_special_tokens",
    "--do_dataprocessing_only",
    "--num_train_dataset_shards",
    "--num_eval_dataset_shards",
    "--cache_dir",
    "--max_seq_length",
    "--packing",
    "--save_model_dir",
    "--trackers",
    "--enable_reduce_loss_sum",
    "--trainer_controller_config_file",
    "--r",
    "--lora_alpha",
    "--target_modules",
    "--exclude_modules",
    "--lora_dropout",
    "--fan_in_fan_out",
    "--bias",
    "--use_rslora",
    "--modules_to_save",
    "--init_lora_weights",
    "--layers_to_transform",
    "--layers_pattern",
    "--trainable_token_indices",
    "--use_dora",
    "--lora_bias",
    "--target_parameters",
    "--prompt_tuning_init",
    "--num_virtual_tokens",
    "--prompt_tuning_init_text",
    "--dequantize",
    "--auto_gptq",
    "--bnb_qlora",
    "--fused_lora",
    "--fast_kernels",
    "--padding_free",
    "--multipack",
    "--fast_moe",
    "--experiment",
    "--run_uri_export_path",
    "--aim_experiment",
    "--aim_repo",
    "--aim_remote_server_ip",
    "--aim_remote_server_port",
    "--aim_url",
    "--mlflow_experiment",
    "--mlflow_tracking_uri",
    "--clearml_project",
    "--clearml_task",
    "--scanner_output_filename",
    "--training_logs_filename",
    "--peft_method",
    "--quantization_method",
    "--exp_metadata",
    "--alora_invocation_string",
    "--include_tokens_per_second",
]


def test_parser_has_every_upstream_flag():
    help_text = sft_trainer.get_parser().format_help()
    assert [flag for flag in UPSTREAM_FLAGS if flag not in re.findall(r"--\w+", help_text)] == []
    assert "--peft_method {lora,pt,none,alora}" in help_text


def test_get_json_config_is_the_config_utils_one():
    assert sft_trainer.get_json_config is config_utils.get_json_config


def test_tracker_constructors_take_their_config():
    assert list(inspect.signature(get_tracker).parameters) == ["name", "tracker_configs"]
    assert list(inspect.signature(Tracker).parameters) == ["name", "tracker_config"]
    assert list(inspect.signature(FileLoggingTracker).parameters) == ["tracker_config"]
    base = Tracker(name="mine", tracker_config={"k": 1})
    assert base.name == "mine" and base.config == {"k": 1} and base.get_hf_callback() is None
    assert {FILE_LOGGING_TRACKER, AIMSTACK_TRACKER} <= set(AVAILABLE_TRACKERS)


def test_exit_code_constants_are_the_categories_defaults():
    assert error_logging.USER_ERROR_EXIT_CODE == 1 == error_logging.exit_code_for("user_error")
    assert error_logging.INTERNAL_ERROR_EXIT_CODE == 203 == error_logging.exit_code_for("internal")


def test_write_termination_log_takes_a_log_file_that_the_environment_overrides(tmp_path, monkeypatch):
    monkeypatch.delenv("TERMINATION_LOG_FILE", raising=False)
    own = tmp_path / "error.log"
    assert error_logging.write_termination_log("user_error: bad flag", log_file=str(own)) == str(own)
    assert own.read_text() == "user_error: bad flag\n"
    monkeypatch.setenv("TERMINATION_LOG_FILE", str(tmp_path / "env.log"))
    error_logging.write_termination_log("internal: boom", log_file=str(own))
    assert (tmp_path / "env.log").read_text() == "internal: boom\n" and own.read_text() == "user_error: bad flag\n"


# ---- configs ----


def test_tracker_configs_defaults_and_post_init():
    configs = TrackerConfigs()
    assert (configs.experiment, configs.run_uri_export_path) == ("fms-hf-tuning", None)
    assert configs.aim_experiment == configs.mlflow_experiment == "fms-hf-tuning"
    assert (configs.clearml_project, configs.clearml_task) == ("fms-hf-tuning", "SFTTrainer")
    assert configs.scanner_output_filename == "scanner_output.json"
    assert configs.training_logs_filename == "training_logs.jsonl"
    assert configs.aim_repo is configs.aim_url is configs.mlflow_tracking_uri is None
    assert TrackerConfigs(experiment="e", mlflow_experiment="m").aim_experiment == "e"
    assert TrackerConfigs(experiment="e", mlflow_experiment="m").mlflow_experiment == "m"
    assert TrackerConfigs(aim_remote_server_ip="h", aim_remote_server_port=5).aim_url == "aim://h:5/"
    assert TrackerConfigs(aim_remote_server_ip="h", aim_remote_server_port="5").aim_url == "aim://h:5/"


def test_tracker_configs_split_into_the_2x_sections():
    configs = TrackerConfigs(experiment="e", aim_repo="r", run_uri_export_path="x", training_logs_filename="l.jsonl")
    sections = configs.as_factory()
    assert sections.file_logger_config == FileLoggingTrackerConfig("l.jsonl") == configs.file_logger_config
    assert (sections.aim_config.experiment, sections.aim_config.aim_repo) == ("e", "r")
    assert sections.aim_config.aim_run_id_export_path == sections.mlflow_config.mlflow_run_uri_export_path == "x"
    assert sections.mlflow_config.mlflow_experiment == "e"


def test_aim_config_defaults_and_server_url():
    assert AimConfig().experiment == "fms-hf-tuning"
    assert AimConfig(experiment="mine").experiment == "mine"
    assert AimConfig(aim_remote_server_ip="10.0.0.1", aim_remote_server_port=53800).aim_url == "aim://10.0.0.1:53800/"
    assert AimConfig(aim_url="aim://h:1", aim_remote_server_ip="h", aim_remote_server_port=1).aim_url == "aim://h:1"
    assert AimConfig(aim_remote_server_ip="10.0.0.1").aim_url is None


def test_tokenizer_defaults_to_the_model_path(monkeypatch):
    assert ModelArguments(model_name_or_path="/models/m").tokenizer_name_or_path == "/models/m"
    assert ModelArguments(model_name_or_path="m", tokenizer_name_or_path="t").tokenizer_name_or_path == "t"
    monkeypatch.setattr("sys.argv", ["sft_trainer.py", "--model_name_or_path", "m", "--output_dir", "out"])
    assert sft_trainer.parse_arguments(sft_trainer.get_parser()).model_args.tokenizer_name_or_path == "m"


def test_data_type_utils():
    assert str_to_torch_dtype("bfloat16") is torch.bfloat16
    assert get_torch_dtype("float32") is torch.float32
    assert get_torch_dtype(torch.float16) is torch.float16
    for bad in ("not a type", "Tensor", None):
        with pytest.raises(ValueError, match="Unrecognized data type of a torch.Tensor"):
            get_torch_dtype(bad)


# ---- trackers, upstream style ----


def test_file_logger_is_always_among_the_trackers():
    assert validate_tracker_names(None) == ["file_logger"]
    assert validate_tracker_names(["aim"]) == ["file_logger", "aim"]
    assert validate_tracker_names(["AIM", "file_logger", "aim"]) == ["file_logger", "aim"]
    assert validate_tracker_names(["none"]) == []


def test_get_tracker_builds_a_file_logger_from_its_config(tmp_path):
    configs = TrackerConfigFactory(file_logger_config=FileLoggingTrackerConfig(training_logs_filename="logs.jsonl"))
    tracker = get_tracker("file_logger", configs)
    assert isinstance(tracker, FileLoggingTracker) and tracker.config is configs.file_logger_config
    assert get_tracker("file_logger", TrackerConfigs(training_logs_filename="logs.jsonl")).config == tracker.config
    # Tracked before the trainer exists, written once the callback learns the trainer's output_dir.
    tracker.track(1.5, "model_load_time")
    callback = tracker.get_hf_callback()
    assert callback is tracker.get_hf_callback()
    args, state = TrainingArguments(output_dir=str(tmp_path), report_to="none"), TrainerState()
    callback.on_init_end(args, state, TrainerControl())
    state.global_step, state.epoch = 1, 0.5
    callback.on_log(args, state, TrainerControl(), logs={"loss": 2.0})
    callback.on_train_end(args, state, TrainerControl())
    records = [json.loads(line) for line in (tmp_path / "logs.jsonl").read_text().splitlines()]
    assert [(r["name"], r["data"]["step"], r["data"]["value"]) for r in records] == [
        ("model_load_time", None, 1.5),
        ("training_loss", 1, 2.0),
    ]


@pytest.mark.slow  # starts the Aim writer's child process
def test_get_tracker_builds_aim_from_its_config(tmp_path):
    configs = TrackerConfigFactory(aim_config=AimConfig(experiment="unit_test", aim_repo=str(tmp_path / "repo")))
    tracker = get_tracker("aim", configs)
    try:
        assert tracker.name == "aim" and tracker.config.experiment == "unit_test"
        assert tracker.get_hf_callback().repo == str(tmp_path / "repo")
    finally:
        tracker.get_hf_callback().close()


@pytest.mark.parametrize(
    ("name", "configs", "message"),
    [
        ("NotAValidTracker", TrackerConfigFactory(), "Requested Tracker NotAValidTracker not found"),
        ("aim", TrackerConfigFactory(), "Aim tracker requested but repo or server is not specified"),
        ("aim", None, "Aim tracker requested but repo or server is not specified"),
        ("aim", TrackerConfigs(), "Aim tracker requested but repo or server is not specified"),
        ("mlflow", TrackerConfigs(), "mlflow tracker requested but mlflow_uri is not specified"),
        ("mlflow,aim", TrackerConfigs(), "separate tracker names with spaces: --trackers mlflow aim"),
    ],
)
def test_get_tracker_rejects_what_it_cannot_build(name, configs, message, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with pytest.raises(UserInputError, match=message) as caught:
        get_tracker(name, configs)
    assert isinstance(caught.value, ValueError)


# ---- train() from Python ----


def test_train_writes_training_logs_with_the_default_tracker_configs(tiny_model, sample_train, tmp_path):
    model_args, data_args, train_args = make_args(tiny_model, str(tmp_path), sample_train)
    model_args.torch_dtype = torch.float32  # upstream callers pass dtypes as well as names
    sft_trainer.train(model_args, data_args, train_args, None, additional_callbacks=[TrainerCallback()])
    records = training_logs(tmp_path)
    assert [r["data"]["step"] for r in records if r["name"] == "training_loss"] == [1, 2]
    assert [r["name"] for r in records].count("model_load_time") == 1


@pytest.mark.slow
def test_train_with_aim_keeps_the_file_logger(tiny_model, sample_train, tmp_path):
    output_dir = tmp_path / "out"
    model_args, data_args, train_args = make_args(tiny_model, str(output_dir), sample_train, trackers=["aim"])
    aim_config = AimConfig(experiment="unit_test", aim_repo=str(existing_repo(tmp_path / "aim")))
    configs = TrackerConfigFactory(aim_config=aim_config)
    sft_trainer.train(model_args, data_args, train_args, tracker_configs=configs, exp_metadata={"dead": "beef"})
    assert [r["data"]["step"] for r in training_logs(output_dir) if r["name"] == "training_loss"] == [1, 2]
    assert json.loads((output_dir / "aim_tracker.json").read_text())["run_hash"]


def test_trackers_none_means_no_training_logs(tiny_model, sample_train, tmp_path):
    trainer, *_ = sft_trainer.train(*make_args(tiny_model, str(tmp_path), sample_train, max_steps=1, trackers=["none"]))
    assert not (tmp_path / "training_logs.jsonl").exists()
    assert trainer.state.global_step == 1


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"tracker_configs": "NotSupposedToBeHere"}, "tracker configs should adhere to the TrackerConfigs type"),
        ({"additional_callbacks": ["NotSupposedToBeHere"]}, "additional callbacks should be of type TrainerCallback"),
        ({"callbacks": [object()]}, "additional callbacks should be of type TrainerCallback"),
        ({"callbacks": [], "additional_callbacks": []}, "not both"),
        ({"exp_metadata": "deadbeef"}, "exp metadata passed should be a dict with valid json"),
        ({"trainer_controller_args": object()}, "trainer_controller_args: the trainer controller is not supported"),
        ({"quantized_lora_config": object()}, "quantized_lora_config: GPTQ LoRA and QLoRA is not supported"),
        ({"fusedops_kernels_config": object()}, "fusedops_kernels_config: fast loss, RMS norm and RoPE kernels and"),
        ({"quantization_config": Mxfp4Config()}, "quantization_config: MXFP4 quantized models is not supported"),
        (
            {"trainer_controller_args": TrainerControllerArguments("rules.yaml")},
            "--trainer_controller_config_file rules.yaml: the trainer controller is not supported",
        ),
        (
            {"attention_and_distributed_packing_config": AttentionAndDistributedPackingConfig(multipack=["16"])},
            "--multipack 16: multipack sampling is not supported",
        ),
        ({"fast_moe_config": FastMoeConfig(fast_moe=["1"])}, "--fast_moe: .* is no mixture-of-experts model"),
        (
            {"additional_data_handlers": {"mine": object()}},
            r"Handler should be of type tuning.data_handler.DataHandler, and name of str",
        ),
    ],
)
def test_train_rejects_bad_arguments(arguments, message, tiny_model, sample_train, tmp_path):
    with pytest.raises(UserInputError, match=message) as caught:
        sft_trainer.train(*make_args(tiny_model, str(tmp_path), sample_train), **arguments)
    assert isinstance(caught.value, ValueError)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda m, t: setattr(t, "trackers", ["NotAValidTracker"]), "Requested Tracker NotAValidTracker not found"),
        (lambda m, t: setattr(t, "trackers", ["aim"]), "Aim tracker requested but repo or server is not specified"),
        (lambda m, t: setattr(t, "num_train_epochs", 0), "num_train_epochs has to be an integer/float >= 1"),
        (lambda m, t: setattr(t, "gradient_accumulation_steps", 0), "gradient_accumulation_steps has to be an integer"),
        (lambda m, t: setattr(m, "torch_dtype", "not a type"), "Unrecognized data type of a torch.Tensor"),
    ],
)
def test_train_rejects_bad_settings_with_upstreams_messages(change, message, tiny_model, sample_train, tmp_path):
    model_args, data_args, train_args = make_args(tiny_model, str(tmp_path), sample_train, max_steps=-1)
    change(model_args, train_args)
    with pytest.raises(UserInputError, match=message):
        sft_trainer.train(model_args, data_args, train_args)
    assert list(tmp_path.iterdir()) == []


# ---- the command line ----


@pytest.mark.slow  # Aim's helper process
def test_cli_tracker_aim_also_writes_training_logs(tiny_model, tmp_path, monkeypatch, capfd):
    output_dir = tmp_path / "out"
    args = cli_args(tiny_model, str(output_dir), tracker="aim", aim_repo=str(existing_repo(tmp_path / "aim")))
    exit_code, stderr = run_main(args, monkeypatch, capfd)
    assert exit_code == 0, stderr[-3000:]
    assert [r["data"]["step"] for r in training_logs(output_dir) if r["name"] == "training_loss"] == [1, 2, 3]
    assert json.loads((output_dir / "aim_tracker.json").read_text())["run_hash"]


def test_cli_gradient_accumulation_steps_zero_is_a_user_error(tiny_model, tmp_path, monkeypatch, capfd):
    termination_log = tmp_path / "termination-log"
    args = cli_args(tiny_model, str(tmp_path / "out"), gradient_accumulation_steps=0)
    exit_code, stderr = run_main(args, monkeypatch, capfd, TERMINATION_LOG_FILE=str(termination_log))
    assert exit_code == 1, stderr[-3000:]
    assert "gradient_accumulation_steps has to be an integer >= 1" in termination_log.read_text()
    assert termination_log.read_text().startswith("user_error: ")


def test_job_config_with_unknown_keys_runs_with_one_warning(tiny_model, tmp_path, monkeypatch, capfd, caplog):
    job = {
        "model_name_or_path": tiny_model,
        "training_data_path": SAMPLE_TRAIN_PATH,
        "dataset_text_field": "output",
        "response_template": RESPONSE_TEMPLATE,
        "output_dir": str(tmp_path / "out"),
        "max_steps": 3,
        "logging_strategy": "steps",
        "logging_steps": 1,
        "save_strategy": "no",
        "torch_dtype": "float32",
        "use_flash_attn": False,
        "exp_metadata": {"dead": "beef"},
        "accelerate_launch_args": {"num_processes": 1},  # a launcher's key: no sft_trainer flag
        "launcher_note": "x",
    }
    config_path = tmp_path / "job.json"
    config_path.write_text(json.dumps(job))
    exit_code, stderr = run_main([], monkeypatch, capfd, SFT_TRAINER_CONFIG_JSON_PATH=str(config_path))
    assert exit_code == 0, stderr[-3000:]
    warnings = [record.getMessage() for record in caplog.records if "ignoring job config keys" in record.getMessage()]
    assert len(warnings) == 1 and "accelerate_launch_args, launcher_note" in warnings[0]
    assert [r["data"]["step"] for r in training_logs(tmp_path / "out") if r["name"] == "training_loss"] == [1, 2, 3]


# ---- v3.1.0 behaviour: unsupported features, resuming, tokens per second, tracker wiring ----


def test_resume_from_checkpoint_follows_v3(tiny_model, sample_train, tmp_path):
    """Unset or "true": the last checkpoint in output_dir (a restarted job continues); a path; "false": afresh. Once
    the job has trained to its end, unset (or "true") trains nothing: it stays finished."""
    output_dir = tmp_path / "out"
    model_args, data_args, train_args = make_args(tiny_model, str(output_dir), sample_train)
    train_args.save_strategy, train_args.save_steps = "steps", 1
    sft_trainer.train(model_args, data_args, train_args)
    assert sorted(path.name for path in output_dir.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]
    train_args.save_strategy, train_args.max_steps = "no", 3
    for resume, steps_run in (("true", 1), (str(output_dir / "checkpoint-1"), 2), ("false", 3)):
        train_args.resume_from_checkpoint = resume
        spy = StepCounter()
        trainer, *_ = sft_trainer.train(model_args, data_args, train_args, additional_callbacks=[spy])
        assert (trainer.state.global_step, spy.steps) == (3, steps_run), resume
    train_args.resume_from_checkpoint = None
    trainer, info, _ = sft_trainer.train(model_args, data_args, train_args)
    assert (trainer, info["already_complete"], info["resumed_from_step"]) == (None, True, 3)
    train_args.resume_from_checkpoint = str(tmp_path / "missing")
    with pytest.raises(UserInputError, match=f"--resume_from_checkpoint {tmp_path / 'missing'} is not a directory"):
        sft_trainer.train(model_args, data_args, train_args)


class StepCounter(TrainerCallback):
    def __init__(self):
        self.steps, self.final_logs = 0, None

    def on_step_end(self, args, state, control, **kwargs):
        self.steps += 1

    def on_log(self, args, state, control, logs=None, **kwargs):
        if "train_runtime" in logs:
            self.final_logs = dict(logs)


class Batches(list):
    """A stand-in train dataloader: a list of batches."""


@pytest.mark.parametrize(
    ("max_steps", "epochs", "accumulation", "tokens"),
    [(5, 1, 2, 3 * 4 * 5 * 2), (-1, 2, 1, (3 * 4 + 3 * 6) * 2), (-1, 0.5, 3, (3 * 4 + 3 * 6) * 0.5)],
)
def test_tokens_are_counted_as_transformers_4_did(max_steps, epochs, accumulation, tokens):
    """With max_steps: the first batch's size x max_steps x accumulation; else all batches x epochs."""
    loader = Batches([{"input_ids": torch.zeros(3, 4)}, {"input_ids": torch.zeros(3, 6)}])
    args = TrainingArguments(
        output_dir="out", max_steps=max_steps, num_train_epochs=epochs, gradient_accumulation_steps=accumulation
    )
    assert count_train_tokens(loader, args) == int(tokens)


def test_include_tokens_per_second_reaches_callbacks_history_and_training_logs(tiny_model, sample_train, tmp_path):
    spy = StepCounter()
    model_args, data_args, train_args = make_args(tiny_model, str(tmp_path), sample_train)
    train_args.include_tokens_per_second = True
    trainer, *_ = sft_trainer.train(model_args, data_args, train_args, additional_callbacks=[spy])
    figure = spy.final_logs["train_tokens_per_second"]
    assert figure > 0 and trainer.state.log_history[-1]["train_tokens_per_second"] == figure
    (record,) = [r for r in training_logs(tmp_path) if r["name"] == "train_tokens_per_second"]
    assert record["data"]["value"] == figure and record["data"]["step"] == 2


def test_trackers_handed_to_train_get_their_callbacks_installed(tiny_model, sample_train, tmp_path):
    """One wiring: the caller builds the trackers and hands them in; train() places their callbacks."""
    file_logger = get_tracker("file_logger", TrackerConfigs())
    trainer, *_ = sft_trainer.train(*make_args(tiny_model, str(tmp_path), sample_train), trackers=[file_logger])
    assert [r["data"]["step"] for r in training_logs(tmp_path) if r["name"] == "training_loss"] == [1, 2]
    assert trainer.callback_handler.callbacks.count(file_logger.get_hf_callback()) == 1


def test_no_trackers_and_own_callbacks_give_exactly_those_plus_the_file_logger(tiny_model, sample_train, tmp_path):
    """IBM ado's way: training_args.trackers = [] and its own callbacks. Without --include_tokens_per_second the final
    logs have no tokens-per-second figure."""
    own = StepCounter()
    model_args, data_args, train_args = make_args(tiny_model, str(tmp_path), sample_train, max_steps=1)
    train_args.trackers = []
    trainer, *_ = sft_trainer.train(model_args, data_args, train_args, additional_callbacks=[own])
    transformers_own = (DefaultFlowCallback, PrinterCallback, ProgressCallback)
    added = [c for c in trainer.callback_handler.callbacks if not isinstance(c, transformers_own)]
    assert [type(c) for c in added] == [StepCounter, FileLoggingCallback] and added[0] is own
    assert "train_tokens_per_second" not in own.final_logs
