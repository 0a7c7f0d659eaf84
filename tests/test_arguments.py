"""Argument parsing: fms-hf-tuning flags, aliases, JSON job configs."""

import base64
import dataclasses
import json
import logging
import pickle

import pytest
import torch

from tests.helpers.training import RESPONSE_TEMPLATE
from tuning.config.configs import DataArguments, TrainingArguments
from tuning.config.peft_config import LoraConfig, PromptTuningConfig
from tuning.config.tracker_configs import TrackerConfigs
from tuning.data.tokenizer_data_utils import tokenizer_and_embedding_resize as legacy_resize
from tuning.data.tokenizer_utils import tokenizer_and_embedding_resize
from tuning.sft_trainer import get_parser, parse_arguments
from tuning.trackers.tracker_factory import validate_tracker_names
from tuning.utils.config_utils import (
    CONFIG_BASE64_ENV,
    CONFIG_PATH_ENV,
    create_tuning_config,
    get_hf_peft_config,
    get_json_config,
    update_config,
)
from tuning.utils.error_logging import UserInputError
from tuning.utils.logging import set_log_level


def parse(argv: list[str], monkeypatch):
    monkeypatch.setattr("sys.argv", ["sft_trainer.py", *argv])
    return parse_arguments(get_parser())


BASE = ["--model_name_or_path", "m", "--output_dir", "out", "--dataset_text_field", "output"]


def test_parse_arguments_reads_the_flags_it_is_given_instead_of_argv(monkeypatch):
    """A wrapper hands over its share of the command line as a list; ``sys.argv`` stays the wrapper's own."""
    monkeypatch.setattr("sys.argv", ["bench_train.py", "--auto_stop", "--not_a_trainer_flag"])
    args = parse_arguments(get_parser(), args=[*BASE, "--training_data_path", "d.jsonl"])
    assert args.model_args.model_name_or_path == "m" and args.data_args.training_data_path == "d.jsonl"


def test_seed_spellings_map_to_current_fields(monkeypatch):
    args = parse(
        BASE
        + ["--data_path", "d.jsonl", "--use_peft", "--evaluation_strategy", "no", "--warmup_ratio", "0.03"]
        + ["--tracker", "aim", "--response_template", "\\n### Response:", "--experiment", "123"],
        monkeypatch,
    )
    assert args.data_args.training_data_path == "d.jsonl"
    assert isinstance(args.tune_config, LoraConfig)
    assert args.training_args.eval_strategy == "no"
    assert args.training_args.warmup_steps == pytest.approx(0.03)
    assert args.training_args.trackers == ["aim"]
    assert args.data_args.response_template == RESPONSE_TEMPLATE
    assert args.tracker_configs.aim_config.experiment == "123"


def test_result_unpacks_and_has_names(monkeypatch):
    args = parse(
        BASE + ["--peft_method", "pt", "--num_virtual_tokens", "4", "--exp_metadata", '{"a": {"b": 1}}'], monkeypatch
    )
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
    ) = args
    assert model_args is args.model_args and model_args.model_name_or_path == "m"
    assert isinstance(tune_config, PromptTuningConfig) and tune_config.num_virtual_tokens == 4
    assert json.loads(exp_metadata) == {"a": {"b": 1}} == args.experiment_metadata
    assert training_args.trackers == ["file_logger"]
    assert tracker_configs == TrackerConfigs() and tracker_configs is args.tracker_configs
    assert args.file_logger_config.training_logs_filename == "training_logs.jsonl"
    assert args.aim_config.experiment == tracker_configs.aim_experiment == "fms-hf-tuning"
    assert quantization_config is None
    for config in (trainer_controller_args, quantized_lora_config, fusedops_kernels_config):
        assert dataclasses.asdict(config) == dataclasses.asdict(type(config)())
    for config in (attention_and_distributed_packing_config, fast_moe_config):
        assert dataclasses.asdict(config) == dataclasses.asdict(type(config)())
    monkeypatch.delenv(CONFIG_BASE64_ENV, raising=False)
    assert get_json_config() == {}


def test_defaults_follow_fms_hf_tuning(monkeypatch):
    args = parse(BASE, monkeypatch)
    assert args.tune_config is None
    assert args.model_args.torch_dtype is torch.bfloat16 and args.model_args.use_flash_attn  # a dtype, as in v3.1.0
    assert parse(BASE + ["--torch_dtype", "float32"], monkeypatch).model_args.torch_dtype == "float32"  # given: a name
    assert args.training_args.max_seq_length == 4096 and not args.training_args.packing
    assert args.training_args.save_strategy == "epoch" and args.training_args.logging_strategy == "epoch"


@pytest.mark.parametrize(
    ("argv", "culprit"),
    [
        (["--peft_method", "qlora"], "qlora"),
        (["--exp_metadata", "{not json"], "exp_metadata"),
        (["--exp_metadata", "[1, 2]"], "JSON object"),
        (["--warmup_ratio", "1.5"], "warmup_ratio"),
    ],
)
def test_bad_flags_name_the_culprit(argv, culprit, monkeypatch):
    with pytest.raises(UserInputError, match=culprit):
        parse(BASE + argv, monkeypatch)


def test_leftover_arguments_are_ignored_with_one_warning_naming_them(monkeypatch, caplog):
    """As fms-hf-tuning v3.1.0 drops what its parser leaves over (IBM ado passes transformers 4 flags), but said."""
    leftovers = ["--num_train_epochz", "2", "--dataset_kwargs", '{"a": 1}']
    with caplog.at_level(logging.WARNING, logger="tuning.sft_trainer"):
        args = parse([*BASE[:2], *leftovers, *BASE[2:]], monkeypatch)
    assert args.model_args.model_name_or_path == "m" and args.data_args.dataset_text_field == "output"
    (warning,) = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert warning.endswith("no sft_trainer flag: " + " ".join(leftovers))


@pytest.mark.parametrize(
    ("argv", "named", "left_out"),
    [
        (["--peft_method", "lora", "--num_virtual_tokens", "4"], "--num_virtual_tokens", "--r"),
        (["--peft_method", "pt", "--r", "16", "--lora_alpha", "8"], "--r --lora_alpha", "--num_virtual_tokens"),
        (["--r", "16"], "--r", "--num_virtual_tokens"),
    ],
)
def test_flags_of_another_peft_method_are_named_in_a_warning(argv, named, left_out, monkeypatch, caplog):
    with caplog.at_level("WARNING", logger="tuning.sft_trainer"):
        parse(BASE + argv, monkeypatch)
    (warning,) = [record.getMessage() for record in caplog.records if "ignoring" in record.getMessage()]
    assert warning.startswith(f"ignoring {named}: ") and left_out not in warning


def test_flags_of_the_chosen_peft_method_raise_no_warning(monkeypatch, caplog):
    with caplog.at_level("WARNING", logger="tuning.sft_trainer"):
        parse(BASE + ["--peft_method", "pt", "--num_virtual_tokens", "4"], monkeypatch)
    assert not [record for record in caplog.records if "ignoring" in record.getMessage()]


JOB = {
    "model_name_or_path": "m",
    "data_path": "d.jsonl",
    "output_dir": "out",
    "dataset_text_field": "output",
    "response_template": "\n### Response:",
    "peft_method": "lora",
    "r": 4,
    "tracker": "aim",
    "aim_repo": "/tmp/aim",
    "evaluation_strategy": "no",
    "exp_metadata": {"gpu_model": "A100-80GB"},
}


def check_job(args):
    assert args.data_args.training_data_path == "d.jsonl"
    assert isinstance(args.tune_config, LoraConfig) and args.tune_config.r == 4
    assert args.training_args.trackers == ["aim"]
    assert args.aim_config.aim_repo == "/tmp/aim"
    assert args.experiment_metadata == {"gpu_model": "A100-80GB"}
    assert json.loads(args.exp_metadata) == {"gpu_model": "A100-80GB"}  # a string, as fms-hf-tuning hands it on


def test_job_config_from_file(tmp_path, monkeypatch):
    path = tmp_path / "job.json"
    path.write_text(json.dumps(JOB))
    monkeypatch.setenv(CONFIG_PATH_ENV, str(path))
    check_job(parse_arguments(get_parser(), get_json_config()))


def test_job_config_from_base64_env(monkeypatch):
    metadata_as_string = dict(JOB, exp_metadata=json.dumps(JOB["exp_metadata"]))
    monkeypatch.delenv(CONFIG_PATH_ENV, raising=False)
    monkeypatch.setenv(CONFIG_BASE64_ENV, base64.b64encode(json.dumps(metadata_as_string).encode()).decode())
    check_job(parse_arguments(get_parser(), get_json_config()))


def test_no_job_config_means_argv(monkeypatch):
    monkeypatch.delenv(CONFIG_PATH_ENV, raising=False)
    monkeypatch.delenv(CONFIG_BASE64_ENV, raising=False)
    assert get_json_config() == {}


@pytest.mark.parametrize(
    ("setup", "culprit"),
    [
        (lambda tmp, mp: mp.setenv(CONFIG_PATH_ENV, str(tmp / "missing.json")), "missing.json"),
        (lambda tmp, mp: mp.setenv(CONFIG_BASE64_ENV, "%%%not-base64"), CONFIG_BASE64_ENV),
        (lambda tmp, mp: mp.setenv(CONFIG_BASE64_ENV, base64.b64encode(b"[1]").decode()), "JSON object"),
    ],
)
def test_bad_job_config(setup, culprit, tmp_path, monkeypatch):
    monkeypatch.delenv(CONFIG_PATH_ENV, raising=False)
    setup(tmp_path, monkeypatch)
    with pytest.raises(UserInputError, match=culprit):
        get_json_config()


def test_unknown_job_config_keys_are_ignored_with_one_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="tuning.sft_trainer"):
        args = parse_arguments(get_parser(), dict(JOB, not_a_flag=1, accelerate_launch_args={"num_processes": 2}))
    check_job(args)
    (warning,) = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert "accelerate_launch_args, not_a_flag" in warning


def test_base64_job_config_wrapped_at_76_columns_is_read(monkeypatch):
    """GNU base64 wraps at 76 columns; fms-hf-tuning reads that, and so do we."""
    wrapped = base64.encodebytes(json.dumps(JOB).encode()).decode()  # 76-column lines, as `base64` prints them
    assert "\n" in wrapped.strip()
    monkeypatch.setenv(CONFIG_BASE64_ENV, wrapped)
    check_job(parse_arguments(get_parser(), get_json_config()))


def test_pickled_base64_job_config_is_refused_without_unpickling(tmp_path, monkeypatch):
    marker = tmp_path / "unpickled"
    # Unpickling this would create the marker file; it must never be unpickled.
    payload = pickle.dumps(type("Job", (), {"__reduce__": lambda self: (open, (str(marker), "w"))})())
    monkeypatch.setenv(CONFIG_BASE64_ENV, base64.b64encode(payload).decode())
    with pytest.raises(UserInputError, match="pickled object, which is refused .*base64-encoded JSON"):
        get_json_config()
    assert not marker.exists()


def test_trackers_given_as_one_string_from_python_is_one_name():
    assert TrainingArguments(output_dir="out", trackers="aim").trackers == ["aim"]


def test_comma_separated_trackers_get_a_hint(monkeypatch):
    args = parse([*BASE, "--tracker", "mlflow,aim"], monkeypatch)
    with pytest.raises(UserInputError, match=r"separate tracker names with spaces: --trackers mlflow aim"):
        validate_tracker_names(args.training_args.trackers)


@pytest.mark.parametrize(
    ("argv", "culprit"),
    [
        (["--quantization_method", "mxfp4"], "--quantization_method mxfp4: MXFP4 quantized models is not supported"),
        (["--dequantize", "False"], "--dequantize False: MXFP4 quantized models is not supported"),
    ],
)
def test_unsupported_peft_and_quantization_methods_are_refused_by_name(argv, culprit, monkeypatch):
    with pytest.raises(UserInputError, match=culprit):
        parse(BASE + argv, monkeypatch)


def test_alora_parses_as_v3_into_a_lora_config_with_its_invocation_string(monkeypatch, caplog):
    args = parse([*BASE, "--peft_method", "alora", "--alora_invocation_string", "<x>", "--r", "4"], monkeypatch)
    assert isinstance(args.tune_config, LoraConfig) and args.tune_config.r == 4
    assert args.tune_config.alora_invocation_string == "<x>"
    assert parse([*BASE, "--alora_invocation_string", "<x>"], monkeypatch).tune_config is None
    assert "ignoring --alora_invocation_string: only for --peft_method alora" in caplog.text


def test_module_aliases_of_v3(monkeypatch):
    """v3.1.0's helper modules, on our dataclasses."""
    tune_config = create_tuning_config("lora", r=4, lora_alpha=16, **{"PromptTuningConfig.num_virtual_tokens": 3})
    assert isinstance(tune_config, LoraConfig) and (tune_config.r, tune_config.lora_alpha) == (4, 16)
    assert create_tuning_config(None) is None and create_tuning_config("none") is None
    prompt = create_tuning_config("pt", **{"PromptTuningConfig.num_virtual_tokens": 3, "r": 4})
    assert isinstance(prompt, PromptTuningConfig) and prompt.num_virtual_tokens == 3
    configs = [LoraConfig(), PromptTuningConfig()]
    update_config(configs, **{"LoraConfig.r": 2, "num_virtual_tokens": 5})
    assert configs[0].r == 2 and configs[1].num_virtual_tokens == 5
    assert isinstance(create_tuning_config("alora", r=2), LoraConfig)  # as v3.1.0: aLoRA is LoRA's dataclass
    for caught in (AssertionError, UserInputError):  # v3.1.0's exception type, and a user fault here
        with pytest.raises(caught, match="peft config hello not defined"):
            create_tuning_config("hello", foo="x")
    hf_config = get_hf_peft_config("CAUSAL_LM", LoraConfig(r=4, target_modules=["all-linear"]), None)
    assert (hf_config.r, hf_config.target_modules, hf_config.task_type) == (4, "all-linear", "CAUSAL_LM")
    assert get_hf_peft_config("CAUSAL_LM", None, None) is None
    logger, level = set_log_level("mine", "info")
    assert (logger.name, level, logging.getLogger().level) == ("mine", "info", logging.INFO)
    set_log_level("mine", "warning")
    for name in ("LOG_LEVEL", "TRANSFORMERS_VERBOSITY"):
        monkeypatch.delenv(name, raising=False)
    logger, level = set_log_level("mine", "passive")  # neither flag nor environment: v3.1.0's INFO
    assert (level, logger.getEffectiveLevel()) == ("info", logging.INFO)
    monkeypatch.setenv("LOG_LEVEL", "error")
    assert set_log_level("mine")[1] == "error"
    set_log_level("mine", "warning")
    assert DataArguments(add_special_tokens=["<x>"]).add_special_tokens == ["<x>"]
    assert legacy_resize is tokenizer_and_embedding_resize


def test_a_job_validates_its_arguments_once(tmp_path):
    """The CLI and bench_train validate before building trackers, then hand the same arguments to ``train()``: it
    finds them checked and reads no file again; other (or changed) arguments are checked afresh."""
    import numpy
    from safetensors.numpy import save_file

    from tuning.sft_trainer import validate_arguments
    from tuning.utils.tiny_model import SAMPLE_TRAIN_PATH

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    save_file({"w": numpy.zeros(4, dtype=numpy.float32)}, str(model / "model.safetensors"))
    argv = [*BASE, "--training_data_path", SAMPLE_TRAIN_PATH, "--response_template", "x"]
    args = parse_arguments(get_parser(), args=argv[:1] + [str(model)] + argv[2:])
    validate_arguments(args.model_args, args.data_args, args.training_args)
    (model / "model.safetensors").write_bytes(b"cut short")
    validate_arguments(args.model_args, args.data_args, args.training_args)  # checked: not read again
    with pytest.raises(UserInputError, match="model.safetensors is not a complete safetensors file"):
        validate_arguments(dataclasses.replace(args.model_args), args.data_args, args.training_args)


def test_each_job_keeps_its_own_validation(tmp_path):
    """The memo travels with a job's arguments, not in a module: a second job validated in the same process (a
    sweep's points, tests) neither skips its own checks nor makes the first job's arguments checked again."""
    import numpy
    from safetensors.numpy import save_file

    from tuning.sft_trainer import validate_arguments
    from tuning.utils.tiny_model import SAMPLE_TRAIN_PATH

    jobs = []
    for name in ("first", "second"):
        model = tmp_path / name
        model.mkdir()
        (model / "config.json").write_text("{}")
        save_file({"w": numpy.zeros(4, dtype=numpy.float32)}, str(model / "model.safetensors"))
        argv = [*BASE, "--training_data_path", SAMPLE_TRAIN_PATH, "--response_template", "x"]
        jobs.append((model, parse_arguments(get_parser(), args=argv[:1] + [str(model)] + argv[2:])))
    (first_model, first), (second_model, second) = jobs
    validate_arguments(first.model_args, first.data_args, first.training_args)
    (second_model / "model.safetensors").write_bytes(b"cut short")
    with pytest.raises(UserInputError, match="model.safetensors is not a complete safetensors file"):
        validate_arguments(second.model_args, second.data_args, second.training_args)
    (first_model / "model.safetensors").write_bytes(b"cut short")
    validate_arguments(first.model_args, first.data_args, first.training_args)  # its own memo: not read again
