"""Tied embeddings under LoRA (fms-hf-tuning 3.2): with ``embed_tokens`` or ``lm_head`` in ``modules_to_save`` of a
model that ties them, they stay tied through training, saving and reloading the adapter; a LoRA adapter that would
sit on ``lm_head`` (TRL refuses it) is a user error before the model loads."""

import json

import pytest
import torch
from peft import PeftModel
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from tests.helpers.training import cli_args, make_args, run_main
from tuning.config.peft_config import LoraConfig, check_lora_targets
from tuning.sft_trainer import save, train
from tuning.utils.error_logging import UserInputError
from tuning.utils.tiny_model import SAMPLE_TRAIN_PATH


@pytest.fixture(scope="module")
def tied_model(tiny_model, tmp_path_factory) -> str:
    """The tiny Llama's shape with its output embeddings tied to its input ones."""
    path = str(tmp_path_factory.mktemp("tied-llama"))
    config = AutoConfig.from_pretrained(tiny_model)
    config.tie_word_embeddings = True
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    AutoTokenizer.from_pretrained(tiny_model).save_pretrained(path)
    return path


def embeddings(model) -> tuple[torch.Tensor, torch.Tensor]:
    return model.get_input_embeddings().weight, model.get_output_embeddings().weight


@pytest.mark.parametrize("modules_to_save", [["embed_tokens"], ["lm_head"]])
def test_embeddings_trained_in_full_stay_tied_through_train_save_and_reload(tied_model, tmp_path, modules_to_save):
    model_args, data_args, train_args = make_args(
        tied_model, str(tmp_path / "out"), SAMPLE_TRAIN_PATH, learning_rate=0.05
    )
    lora = LoraConfig(r=4, target_modules=["q_proj"], modules_to_save=modules_to_save)
    trainer, _, _ = train(model_args, data_args, train_args, lora)
    trained_input, trained_output = embeddings(trainer.model)
    assert torch.equal(trained_input, trained_output)
    save(str(tmp_path / "adapter"), trainer)
    assert json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())["ensure_weight_tying"] is True

    base = AutoModelForCausalLM.from_pretrained(tied_model)
    before = base.get_input_embeddings().weight.detach().clone()
    merged = PeftModel.from_pretrained(base, str(tmp_path / "adapter")).merge_and_unload()
    reloaded_input, reloaded_output = embeddings(merged)
    assert reloaded_input.data_ptr() == reloaded_output.data_ptr()
    assert torch.equal(reloaded_input, trained_input.detach()) and not torch.equal(reloaded_input, before)


@pytest.mark.parametrize(
    ("target_modules", "culprit"),
    [(["q_proj", "lm_head"], "--target_modules lm_head"), (["embed_tokens"], "--target_modules embed_tokens: .* ties")],
)
def test_an_adapter_that_would_sit_on_lm_head_is_refused_before_the_model_loads(
    tied_model, tmp_path, target_modules, culprit
):
    model_args, data_args, train_args = make_args(tied_model, str(tmp_path / "out"), SAMPLE_TRAIN_PATH)
    with pytest.raises(UserInputError, match=f"{culprit}.*TRL"):
        train(model_args, data_args, train_args, LoraConfig(r=4, target_modules=target_modules))


def test_the_refusal_reaches_stderr_and_the_termination_log_whole(tied_model, tmp_path, monkeypatch, capfd):
    """The CLI (main()): the message, longer than the stderr marker's share, is printed whole on a line of its own
    (no traceback holds it) and written whole to the termination log."""
    with pytest.raises(UserInputError) as refused:
        check_lora_targets(LoraConfig(target_modules=["embed_tokens"]), tied_model)
    message = f"UserInputError: {refused.value}"
    log = tmp_path / "termination.log"
    argv = cli_args(tied_model, str(tmp_path / "out"), peft_method="lora", target_modules="embed_tokens")
    code, stderr = run_main(argv, monkeypatch, capfd, TERMINATION_LOG_FILE=str(log))
    assert code == 1
    assert message in stderr.splitlines()
    assert log.read_text() == f"user_error: {message}\n"
