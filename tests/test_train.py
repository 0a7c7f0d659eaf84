"""Real training on the tiny model: full fine-tuning, LoRA, prompt tuning, callbacks, CLI (the design notes' torchrun
command: tests/trackers/test_aim_e2e.py)."""

import json
import sys

import pytest
from transformers import TrainerCallback

import tuning
from tests.helpers.training import (
    RESPONSE_TEMPLATE,
    cli_args,
    make_args,
    run_main,
)
from tuning.config.peft_config import PromptTuningConfig
from tuning.data.formatting import format_file
from tuning.data.masking import tokenize_and_mask
from tuning.sft_trainer import _to_sft_config, save, train
from tuning.utils.error_logging import UserInputError


class SpyCallback(TrainerCallback):
    def __init__(self):
        self.events = []

    def on_train_begin(self, args, state, control, **kwargs):
        self.events.append("train_begin")

    def on_step_end(self, args, state, control, **kwargs):
        self.events.append("step_end")

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.events.append("log")

    def on_train_end(self, args, state, control, **kwargs):
        self.events.append("train_end")


def test_added_tokens_count_the_rows_that_round_the_embeddings_up(tiny_model, sample_train, tmp_path):
    """--add_special_tokens grows the embeddings to a multiple of --embedding_size_multiple_of; the information
    train() returns counts the tokens and the rows added to reach it, as fms-hf-tuning v3.1.0 does."""
    model_args, data_args, train_args = make_args(tiny_model, str(tmp_path / "out"), sample_train, max_steps=1)
    model_args.embedding_size_multiple_of = 64
    data_args.add_special_tokens = ["<tool>", "<call>", "<result>"]
    trainer, info, _ = train(model_args, data_args, train_args, trackers=[])
    vocabulary = len(trainer.processing_class)
    size = trainer.model.get_input_embeddings().weight.shape[0]
    assert size % 64 == 0 and size - 64 < vocabulary <= size
    assert info["added_tokens_info"] == {"num_new_tokens": 3 + size - vocabulary, "new_embedding_size": size}


def test_package_exports_train():
    assert tuning.train is train


def test_full_fine_tuning_calls_given_callbacks_and_saves_only_when_asked(tiny_model, sample_train, tmp_path):
    spy = SpyCallback()
    output_dir = tmp_path / "out"
    trainer, info, tc_callback = train(*make_args(tiny_model, str(output_dir), sample_train), callbacks=[spy])
    assert trainer.state.global_step == 2 and tc_callback is None
    assert info["model_load_time"] > 0 and info["added_tokens_info"]["num_new_tokens"] == 0
    assert spy.events[0] == "train_begin" and spy.events[-1] == "train_end"
    assert spy.events.count("step_end") == 2 and "log" in spy.events
    assert not list(output_dir.glob("*.safetensors"))  # the final model goes where save() is told, as in v3.1.0
    save(str(tmp_path / "final"), trainer, tc_callback)
    assert (tmp_path / "final" / "model.safetensors").exists() and (tmp_path / "final" / "tokenizer.json").exists()


def test_prompt_tuning_writes_an_adapter(tiny_model, sample_train, tmp_path):
    trainer, *_ = train(
        *make_args(tiny_model, str(tmp_path / "out"), sample_train),
        peft_config=PromptTuningConfig(num_virtual_tokens=4, prompt_tuning_init_text="Answer the question"),
    )
    save(str(tmp_path), trainer, None)
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    assert config["peft_type"] == "PROMPT_TUNING" and config["num_virtual_tokens"] == 4


def test_template_validation_data_and_packing(tiny_model, sample_train, sample_validation, tmp_path):
    model_args, data_args, train_args = make_args(
        tiny_model,
        str(tmp_path),
        sample_train,
        packing=True,
        max_seq_length=64,
        eval_strategy="steps",
        eval_steps=2,
        per_device_eval_batch_size=4,
    )
    data_args.dataset_text_field = None
    data_args.data_formatter_template = "Q: {{input}}\nA: {{response}}"
    data_args.response_template = None
    data_args.validation_data_path = sample_validation
    spy = SpyCallback()
    trainer, *_ = train(model_args, data_args, train_args, callbacks=[spy])
    assert trainer.state.global_step == 2


class LossCallback(TrainerCallback):
    def __init__(self):
        self.losses = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.losses.append(logs["loss"])


TRL_PASSES = ("Truncating train dataset", "Dropping fully masked examples")


@pytest.mark.slow
def test_trl_makes_no_pass_over_our_prepared_data_and_the_losses_are_unchanged(
    tiny_model, sample_train, tmp_path, capfd
):
    """TRL's own truncation and fully-masked filter found nothing to do on our data: skipping them trains the same.
    max_seq_length 16 truncates every row and drops those that lose their whole response."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTTrainer

    model_args, data_args, train_args = make_args(
        tiny_model, str(tmp_path), sample_train, max_seq_length=16, max_steps=4
    )
    skipped = LossCallback()
    train(model_args, data_args, train_args, callbacks=[skipped], trackers=[])
    stderr = capfd.readouterr().err
    assert not [name for name in TRL_PASSES if name in stderr], stderr[-2000:]

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    tokenizer.pad_token = tokenizer.eos_token
    texts = format_file(sample_train, tokenizer.eos_token, "output")
    dataset = tokenize_and_mask(texts, tokenizer, 16, RESPONSE_TEMPLATE)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype="float32", attn_implementation="sdpa")
    trl_prepared = LossCallback()
    config = _to_sft_config(train_args, 16)
    config.dataset_kwargs = None  # TRL prepares the data itself, as before
    trainer = SFTTrainer(
        model=model, args=config, train_dataset=dataset, processing_class=tokenizer, callbacks=[trl_prepared]
    )
    stderr = capfd.readouterr().err
    assert all(name in stderr for name in TRL_PASSES), stderr[-2000:]
    trainer.train()
    assert len(skipped.losses) == 4 and skipped.losses == pytest.approx(trl_prepared.losses, rel=1e-5)


class ExtraMetricsTracker(tuning.trackers.Tracker):
    def __init__(self):
        self.tracked, self.params = {}, {}

    def track(self, metric, name, stage="additional_metrics"):
        self.tracked[name] = metric

    def set_params(self, params, name="experiment_metadata"):
        self.params[name] = params


def test_trackers_receive_additional_metrics_and_metadata(tiny_model, sample_train, tmp_path):
    tracker = ExtraMetricsTracker()
    _, info, _ = train(
        *make_args(tiny_model, str(tmp_path), sample_train, max_steps=1),
        trackers=[tracker],
        exp_metadata={"dataset_id": "sample"},
    )
    assert tracker.tracked.keys() == {"model_load_time", "data_preparation_time"}
    assert tracker.tracked["model_load_time"] == info["model_load_time"]
    assert tracker.tracked["data_preparation_time"] > 0
    assert tracker.params.keys() == {"experiment_metadata", "data_cache", "loaded_model"}
    assert tracker.params["loaded_model"] == {"experts_implementation": None}  # a dense model: no experts
    assert tracker.params["experiment_metadata"] == {"dataset_id": "sample"}
    assert tracker.params["data_cache"]["status"] == "off"  # the suite runs without the processed-data cache


@pytest.mark.parametrize(
    ("change", "culprit"),
    [
        (lambda m, d, t: setattr(m, "model_name_or_path", "/nonexistent/model"), "/nonexistent/model"),
        (lambda m, d, t: setattr(m, "model_name_or_path", None), "model_name_or_path"),
        (lambda m, d, t: setattr(d, "training_data_path", "/nonexistent/data.jsonl"), "/nonexistent/data.jsonl"),
        (lambda m, d, t: setattr(d, "dataset_text_field", "text"), "'text'"),
        (
            lambda m, d, t: (setattr(d, "dataset_text_field", None), setattr(d, "data_formatter_template", "{{nope}}")),
            "nope",
        ),
        (lambda m, d, t: setattr(d, "data_formatter_template", "{{input}}"), "exactly one of .* not both"),
        (lambda m, d, t: setattr(d, "response_template", None), "response_template"),
        (lambda m, d, t: (setattr(t, "num_train_epochs", 0), setattr(t, "max_steps", -1)), "num_train_epochs"),
    ],
)
def test_bad_input_fails_before_the_model_loads(change, culprit, tiny_model, sample_train, tmp_path):
    args = make_args(tiny_model, str(tmp_path), sample_train)
    change(*args)
    tracker = ExtraMetricsTracker()
    with pytest.raises(UserInputError, match=culprit):
        train(*args, trackers=[tracker])
    assert "model_load_time" not in tracker.tracked


def test_cli_writes_training_logs_and_the_lora_artifacts(tiny_model, tmp_path, monkeypatch, capfd):
    """The command line through main() in this process (the script as a process of its own: test_preemption,
    test_aim_e2e, test_error_logging_e2e)."""
    args = cli_args(
        tiny_model,
        str(tmp_path),
        peft_method="lora",
        r=4,
        target_modules="all-linear",
        save_model_dir=tmp_path / "final",
    )
    exit_code, stderr = run_main(args, monkeypatch, capfd)
    assert exit_code == 0, stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "training_logs.jsonl").read_text().splitlines()]
    losses = [r for r in records if r["name"] == "training_loss"]
    assert [r["data"]["step"] for r in losses] == [1, 2, 3]
    assert all(set(r["data"]) == {"epoch", "step", "value", "timestamp"} for r in records)
    assert [r["name"] for r in records].count("model_load_time") == 1
    assert (tmp_path / "final" / "adapter_model.safetensors").exists()
    assert (
        not (tmp_path / "final" / "model.safetensors").exists()
        and not (tmp_path / "adapter_model.safetensors").exists()
    )
    config = json.loads((tmp_path / "final" / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 4
    assert any(name.endswith("mlp.down_proj") for name in config["target_modules"])  # all-linear, not q and v only
    for directory in (tmp_path, tmp_path / "final"):  # fms-hf-tuning's LoRA artifact, in both places
        assert json.loads((directory / "added_tokens_info.json").read_text())["num_new_tokens"] == 0


def test_help_lists_upstream_and_our_flags_and_exits_0(monkeypatch, capfd):
    """main() as the CLI runs it (``sys.exit(main())``); each entry as a process of its own (the script,
    ``-m tuning.sft_trainer``, the console script) starts in test_launch's
    test_signal_while_sft_trainer_still_imports."""
    from tuning.sft_trainer import main

    monkeypatch.setattr(sys, "argv", ["sft_trainer.py", "--help"])
    capfd.readouterr()
    assert main() == 0
    out = capfd.readouterr().out
    for flag in ("--training_data_path", "--peft_method", "--trackers", "--aim_repo", "--exp_metadata", "--r"):
        assert flag in out
