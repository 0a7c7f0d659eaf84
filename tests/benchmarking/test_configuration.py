"""The dump's ``config``: equal exactly for runs of the same work, whatever names or places them."""

import hashlib
import json

import pytest

from tuning.benchmarking.configuration import CONFIG_ARGUMENTS, run_configuration
from tuning.sft_trainer import get_parser, parse_arguments

BASE = ["--model_name_or_path", "m", "--training_data_path", "d.jsonl", "--output_dir", "out", "--max_steps", "5"]


def config_of(*flags: str, world_size: int = 1) -> dict:
    return run_configuration(parse_arguments(get_parser(), args=[*BASE, *flags]), world_size)


def test_it_is_flat_json_with_every_listed_argument():
    config = config_of("--peft_method", "lora", "--torch_dtype", "float32", "--target_modules", "q_proj", "v_proj")
    assert json.loads(json.dumps(config)) == config
    assert all(not isinstance(value, dict) for name, value in config.items() if name != "fsdp_config")
    listed = {name for where, names in CONFIG_ARGUMENTS.items() if where != "pt" for name in names}
    measured = {"peft_method", "world_size", "data_config_sha256", "attn_implementation", "effective_max_seq_length"}
    loaded = {"experts_implementation", "ep_degree", "quantization"}  # what the acceleration flags load
    assert set(config) == listed | measured | loaded | {"model_class"}
    assert (config["peft_method"], config["r"], config["target_modules"]) == ("lora", 8, ["q_proj", "v_proj"])
    assert (config["torch_dtype"], config["save_strategy"], config["world_size"]) == ("float32", "epoch", 1)


@pytest.mark.parametrize(
    "noise",
    [
        ["--output_dir", "elsewhere"],
        ["--seed", "7"],
        ["--logging_steps", "3", "--run_name", "x"],
        ["--exp_metadata", '{"a": 1}'],
        ["--lora_alpha", "64"],  # scaling only; and this run is no LoRA run: ignored
        ["--eval_steps", "10"],  # no evaluation
        ["--num_train_epochs", "9"],  # max_steps decides
    ],
)
def test_what_only_names_or_places_a_run_leaves_it_equal(noise):
    assert config_of(*noise) == config_of()


@pytest.mark.parametrize(
    ("flags", "key"),
    [
        (["--per_device_train_batch_size", "2"], "per_device_train_batch_size"),
        (["--max_seq_length", "128"], "max_seq_length"),
        (["--gradient_checkpointing", "True"], "gradient_checkpointing"),
        (["--packing", "True"], "packing"),
        (["--peft_method", "pt"], "peft_method"),
        (["--torch_dtype", "float16"], "torch_dtype"),
        (["--save_strategy", "steps", "--save_steps", "2"], "save_steps"),
        (["--instruction_template", "<|user|>"], "instruction_template"),
        (["--do_dataprocessing_only", "True"], "do_dataprocessing_only"),
        (["--fast_moe", "1"], "experts_implementation"),
        (["--fast_moe", "2"], "ep_degree"),
        (["--peft_method", "lora", "--bnb_qlora", "nf4"], "quantization"),
        (["--peft_method", "alora", "--alora_invocation_string", "<x>"], "peft_method"),
    ],
)
def test_what_changes_the_work_makes_it_differ(flags, key):
    changed, base = config_of(*flags), config_of()
    assert changed != base and changed[key] != base[key]


def test_world_size_and_the_peft_method_s_own_arguments():
    assert config_of(world_size=2)["world_size"] == 2
    prompt = config_of("--peft_method", "pt", "--num_virtual_tokens", "4")
    assert prompt["num_virtual_tokens"] == 4 and "r" not in prompt
    assert "num_virtual_tokens" not in config_of() and "r" not in config_of()


def test_one_spelling_per_setting():
    """The default dtype (a torch.dtype once parsed, as in v3.1.0) equals the same dtype typed as a flag, and a
    parsed ``--padding_free`` reads as the flag's value, so that equal work is one configuration."""
    default = config_of()
    typed = config_of("--torch_dtype", "bfloat16", "--padding_free", "huggingface")
    assert default["torch_dtype"] == typed["torch_dtype"] == "bfloat16"
    assert default["padding_free"] is None and typed["padding_free"] == "huggingface"
    assert {k: v for k, v in typed.items() if k != "padding_free"} == {
        k: v for k, v in default.items() if k != "padding_free"
    }


def test_a_data_config_edited_under_the_same_path_is_another_configuration(tmp_path):
    """``data_config_sha256``: the file's bytes, so that the same path with other contents is other work; null
    without a data config."""
    path = tmp_path / "data.yaml"
    path.write_text("datasets:\n  - name: a\n    data_paths: [a.jsonl]\n")
    flags = ["--model_name_or_path", "m", "--data_config_path", str(path), "--output_dir", "out"]
    before = run_configuration(parse_arguments(get_parser(), args=flags), 1)
    assert before["data_config_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    path.write_text("datasets:\n  - name: a\n    data_paths: [a.jsonl]\n    sampling: 1.0\n")
    after = run_configuration(parse_arguments(get_parser(), args=flags), 1)
    assert after["data_config_path"] == before["data_config_path"] and after != before
    assert config_of()["data_config_sha256"] is None


def test_it_records_the_attention_and_sequence_length_the_run_gets(tiny_model):
    """What the model runs, beside what was asked: sdpa without --use_flash_attn (whose implementation flag then
    changes nothing, so is null) and where flash-attn cannot run (no CUDA here); --max_seq_length capped by the
    tokenizer's model_max_length (the tiny model's 512), null when the tokenizer's files cannot be read."""
    flags = ["--model_name_or_path", tiny_model, "--max_seq_length", "4096"]
    plain = config_of(*flags, "--use_flash_attn", "False")
    assert (plain["attn_implementation"], plain["use_flash_attn"], plain["flash_attn_implementation"]) == (
        "sdpa",
        False,
        None,
    )
    assert (plain["max_seq_length"], plain["effective_max_seq_length"]) == (4096, 512)
    asked = config_of(*flags, "--use_flash_attn", "True")
    assert (asked["attn_implementation"], asked["flash_attn_implementation"]) == ("sdpa", "flash_attention_2")
    assert config_of("--max_seq_length", "128")["effective_max_seq_length"] is None  # model "m": nothing to read
    assert config_of(*flags[:2], "--max_seq_length", "128")["effective_max_seq_length"] == 128


def test_it_names_what_the_acceleration_flags_load():
    assert config_of("--fast_moe", "2").items() >= {"experts_implementation": "grouped_mm", "ep_degree": 2}.items()
    assert config_of("--fast_moe", "True")["ep_degree"] == 1
    assert config_of("--peft_method", "lora", "--bnb_qlora", "fp4")["quantization"] == "bitsandbytes-fp4"
    plain = config_of()
    assert (plain["experts_implementation"], plain["ep_degree"], plain["quantization"]) == (None, None, None)


def test_it_names_the_image_field_and_the_model_class(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlavaForConditionalGeneration"]}))
    flags = ["--model_name_or_path", str(tmp_path), "--dataset_image_field", "images"]
    config = config_of(*flags)
    assert (config["dataset_image_field"], config["model_class"]) == ("images", "LlavaForConditionalGeneration")
    assert (config_of()["dataset_image_field"], config_of()["model_class"]) == (None, None)  # "m": nowhere to read
