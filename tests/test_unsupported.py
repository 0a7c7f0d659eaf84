"""The one rule for unsupported features (``tuning.config.unsupported``): every row of its table, hence of
docs/cli-and-api.md's "Not supported" table, is refused by sft_trainer and bench_train alike (exit 1, the same
``user_error`` line) before the model loads, and by ``train()``; the flags the docs mark "only parse" are accepted.
Rows are taken from the rule's table, so that a row added later is covered by construction."""

import json
import re
from types import SimpleNamespace

import pytest
from transformers import HfArgumentParser

from tests.helpers.training import (
    BENCH_TRAIN,
    REPO_ROOT,
    cli_args,
    load_script,
    make_args,
    termination_lines,
)
from tuning import sft_trainer
from tuning.config.acceleration_configs import (
    AttentionAndDistributedPackingConfig,
    FastMoeConfig,
    FusedOpsAndKernelsConfig,
    QuantizedLoraConfig,
)
from tuning.config.configs import DataArguments, TrainerControllerArguments, TrainingArguments
from tuning.config.peft_config import LoraConfig, Mxfp4Config
from tuning.config.unsupported import (
    ANY_BUT_DEFAULT,
    PLAIN_FLAGS,
    UNSUPPORTED,
    Unsupported,
    refuse_unsupported,
    refused_flags,
)
from tuning.utils import config_utils
from tuning.utils.error_logging import UserInputError
from tuning.utils.tiny_model import SAMPLE_TRAIN_PATH

# The rows this machine refuses: every row but those whose needs (a library, a GPU) are all here.
CLI_ROWS = [row for row in UNSUPPORTED if row.name in refused_flags() and row.refuses_here()]


def refusal(row: Unsupported) -> str:
    """How ``row``'s refusal ends: its feature, and for a row with needs, what this machine lacks of them."""
    missing = f" without {' and '.join(row.missing())}, which this machine lacks" if row.missing else ""
    return f"{row.feature} is not supported by tuning-bench{missing}"


def not_supported_table() -> list[str]:
    """The rows of docs/cli-and-api.md's "Not supported" table (without its header)."""
    page = (REPO_ROOT / "docs" / "cli-and-api.md").read_text(encoding="utf-8")
    section = page.split("\n## Not supported\n", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| ")][1:]


def refusing_argv(row: Unsupported) -> list[str]:
    """Command-line tokens that ask for ``row``'s feature: its value, else one that differs from the default."""
    if row.value != ANY_BUT_DEFAULT:
        return [f"--{row.name}", row.value]
    if row.example:
        return [f"--{row.name}", *row.example]
    action = next(a for a in sft_trainer.get_parser()._actions if f"--{row.name}" in a.option_strings)
    if action.nargs == "+":
        return [f"--{row.name}", "x", "y"]
    if action.nargs == "?":  # a bool flag
        return [f"--{row.name}", str(not action.default)]
    if action.type is int:
        return [f"--{row.name}", str(action.default + 1)]
    return [f"--{row.name}", "x"]


@pytest.fixture(scope="module")
def bench_train():
    return load_script(BENCH_TRAIN)


@pytest.fixture(scope="module")
def unloadable_model(tmp_path_factory) -> str:
    """A model directory that loading fails on loudly (an unknown model type): a refusal proves it came first."""
    path = tmp_path_factory.mktemp("unloadable")
    (path / "config.json").write_text(json.dumps({"model_type": "refused-before-loading"}))
    return str(path)


def test_the_docs_table_lists_exactly_the_refused_flags():
    documented, only_parse = [], []
    for line in not_supported_table():
        flags = re.findall(r"`--(\w+)", line)
        (only_parse if "only parse" in line else documented).extend(flags)
    assert sorted(documented) == sorted(refused_flags())
    assert only_parse  # the ClearML and scanner flags, accepted with no effect on training


@pytest.mark.parametrize("row", CLI_ROWS, ids=lambda row: row.name)
def test_both_scripts_refuse_each_row_alike_before_the_model_loads(
    row, bench_train, unloadable_model, tmp_path, monkeypatch
):
    termination_log = tmp_path / "termination-log"
    monkeypatch.setenv("TERMINATION_LOG_FILE", str(termination_log))
    monkeypatch.delenv(config_utils.CONFIG_PATH_ENV, raising=False)
    monkeypatch.delenv(config_utils.CONFIG_BASE64_ENV, raising=False)
    argv = [*cli_args(unloadable_model, str(tmp_path / "out")), *refusing_argv(row)]
    monkeypatch.setattr("sys.argv", ["sft_trainer.py", *argv])
    assert sft_trainer.main() == 1
    assert bench_train.main([*argv, "--metrics_path", str(tmp_path / "bench.json")]) == 1
    trainer_line, bench_line = termination_lines(termination_log)
    assert trainer_line == bench_line
    assert trainer_line.startswith(f"user_error: UserInputError: --{row.name} ")
    assert trainer_line.endswith(refusal(row))
    assert not (tmp_path / "out").exists()


# The argument dataclass of each train() keyword the table's rows live in: a row in a new place needs its class here.
KEYWORD_CLASSES = {
    "data_args": DataArguments,
    "train_args": TrainingArguments,
    "trainer_controller_args": TrainerControllerArguments,
    "quantization_config": Mxfp4Config,
    "quantized_lora_config": QuantizedLoraConfig,
    "fusedops_kernels_config": FusedOpsAndKernelsConfig,
    "attention_and_distributed_packing_config": AttentionAndDistributedPackingConfig,
    "fast_moe_config": FastMoeConfig,
}


@pytest.mark.parametrize("row", [row for row in CLI_ROWS if row.where != PLAIN_FLAGS], ids=lambda row: row.name)
def test_train_refuses_each_row_given_as_its_dataclass(row, tiny_model, sample_train, tmp_path):
    """A Python caller builds the dataclass itself (here from the row's flag): ``train()`` refuses it alike."""
    output_dir = str(tmp_path / "out")
    model_args, data_args, train_args = make_args(tiny_model, output_dir, sample_train)
    keywords = {"model_args": model_args, "data_args": data_args, "train_args": train_args}
    extra = ["--output_dir", output_dir] if row.where == "train_args" else []
    parser = HfArgumentParser(KEYWORD_CLASSES[row.where])
    (keywords[row.where],) = parser.parse_args_into_dataclasses(args=[*refusing_argv(row), *extra])
    with pytest.raises(UserInputError, match=f"^--{row.name} .*: {re.escape(refusal(row))}$"):
        sft_trainer.train(**keywords)
    assert not (tmp_path / "out").exists()


def test_a_job_config_is_refused_alike(bench_train, unloadable_model, tmp_path, monkeypatch):
    """The Kubernetes route: the flags in SFT_TRAINER_CONFIG_JSON_PATH, a list value as a job config holds it."""
    row = next(row for row in UNSUPPORTED if row.name == "fast_kernels")
    if not row.refuses_here():
        pytest.skip("this machine has what --fast_kernels needs")
    job = {
        "model_name_or_path": unloadable_model,
        "training_data_path": SAMPLE_TRAIN_PATH,
        "dataset_text_field": "output",
        "output_dir": str(tmp_path / "out"),
        "fast_kernels": ["True", "True", "True"],
    }
    (tmp_path / "job.json").write_text(json.dumps(job))
    monkeypatch.setenv(config_utils.CONFIG_PATH_ENV, str(tmp_path / "job.json"))
    monkeypatch.setenv("TERMINATION_LOG_FILE", str(tmp_path / "termination-log"))
    monkeypatch.setattr("sys.argv", ["sft_trainer.py"])
    assert sft_trainer.main() == 1
    assert bench_train.main([]) == 1
    expected = f"user_error: UserInputError: --fast_kernels True True True: {refusal(row)}"
    assert termination_lines(tmp_path / "termination-log") == [expected] * 2
    assert not (tmp_path / "out").exists()


def test_bench_train_refuses_multipack_with_exit_1(bench_train, unloadable_model, tmp_path, monkeypatch):
    """bench_train's main: before the model loads (an unloadable one), with no dump of a run that never was."""
    args = [*cli_args(unloadable_model, str(tmp_path / "out")), "--multipack", "16"]
    monkeypatch.setenv("TERMINATION_LOG_FILE", str(tmp_path / "log"))
    assert bench_train.main(args) == 1
    line = (tmp_path / "log").read_text().strip()
    refusal = "--multipack 16: multipack sampling is not supported by tuning-bench"
    assert line == f"user_error: UserInputError: {refusal}"
    assert not (tmp_path / "out").exists()


def test_only_parse_flags_are_accepted(monkeypatch):
    flags = ["--clearml_project", "p", "--clearml_task", "t", "--scanner_output_filename", "s.json"]
    monkeypatch.setattr("sys.argv", ["sft_trainer.py", *flags])
    sft_trainer.parse_arguments(sft_trainer.get_parser())


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"quantized_lora_config": QuantizedLoraConfig()}, None),  # at its defaults: asks for nothing
        ({"peft_config": LoraConfig(r=4)}, None),
        ({PLAIN_FLAGS: SimpleNamespace(peft_method="lora", quantization_method="none")}, None),
        ({"quantized_lora_config": object()}, "quantized_lora_config: GPTQ LoRA and QLoRA is not supported"),
        (
            {"attention_and_distributed_packing_config": AttentionAndDistributedPackingConfig(multipack=["16"])},
            "--multipack 16: multipack sampling is not supported",
        ),
        ({"additional_data_handlers": {"mine": object()}}, None),  # supported: train() checks the handlers
        ({"quantization_config": object()}, "quantization_config: MXFP4 quantized models is not supported"),
    ],
)
def test_train_keywords_follow_the_rule(arguments, message):
    if message is None:
        refuse_unsupported(**arguments)
        return
    with pytest.raises(UserInputError, match=re.escape(message)):
        refuse_unsupported(**arguments)
