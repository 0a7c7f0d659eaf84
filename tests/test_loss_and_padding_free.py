"""Training features of the v3 contract on the tiny model, each through ``train()``: ``--enable_reduce_loss_sum``
(v3.1.0's summed loss), ``--padding_free huggingface`` (TRL's padding-free batches, with the padded run's loss),
and fms-hf-tuning 3.2's LoRA with added tokens (the new embedding rows trained and saved with the adapter)."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers.training import make_args
from tuning.config.acceleration_configs import AttentionAndDistributedPackingConfig
from tuning.config.acceleration_configs.attention_and_distributed_packing import PaddingFree
from tuning.config.peft_config import LoraConfig, PromptTuningConfig
from tuning.sft_trainer import get_parser, parse_arguments, save, train
from tuning.trainer import IGNORE_INDEX
from tuning.utils.error_logging import UserInputError

PADDING_FREE = AttentionAndDistributedPackingConfig(padding_free=["huggingface"])


def _losses(trainer) -> list[float]:
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def _label_tokens(dataset) -> int:
    """Tokens a causal LM predicts with a label: every label but the first of each row, unless ignored."""
    return sum(sum(label != IGNORE_INDEX for label in row["labels"][1:]) for row in dataset)


def test_reduce_loss_sum_is_the_sum_of_the_token_losses(tiny_model, sample_train, tmp_path):
    """One batch holding every example: the summed loss is the mean loss times the number of label tokens."""
    lines = Path(sample_train).read_text(encoding="utf-8").splitlines()[:4]
    data = tmp_path / "four.jsonl"
    data.write_text("\n".join(lines) + "\n")
    losses = {}
    for reduce_sum in (False, True):
        args = make_args(tiny_model, str(tmp_path / f"out-{reduce_sum}"), str(data), max_steps=1)
        args[2].enable_reduce_loss_sum = reduce_sum
        trainer, *_ = train(*args, trackers=[])
        losses[reduce_sum] = _losses(trainer)[0]
        assert trainer.reduce_loss_sum is reduce_sum
    tokens = _label_tokens(trainer.train_dataset)
    assert tokens > 10 and losses[True] == pytest.approx(losses[False] * tokens, rel=1e-3)


def test_reduce_loss_sum_parses_and_trains_lora(tiny_model, sample_train, tmp_path, monkeypatch):
    """No longer refused: the flag parses and a LoRA run trains with it (a loss summed over many tokens)."""
    monkeypatch.setattr("sys.argv", ["sft_trainer.py", "--enable_reduce_loss_sum", "True"])
    assert parse_arguments(get_parser()).training_args.enable_reduce_loss_sum is True
    args = make_args(tiny_model, str(tmp_path / "out"), sample_train, max_steps=2, enable_reduce_loss_sum=True)
    trainer, *_ = train(*args, peft_config=LoraConfig(r=4), trackers=[])
    assert all(loss > 50 for loss in _losses(trainer))  # a mean cross entropy on 512 tokens is below ln(512)


def test_padding_free_trains_with_the_padded_runs_loss(tiny_model, sample_train, tmp_path):
    """Same data, same seed: each step's loss padding-free equals the padded run's, to float tolerance; the batches
    are one row without padding or attention mask, the sequences kept apart by their position_ids."""
    runs = {}
    for padding_free in (False, True):
        args = make_args(tiny_model, str(tmp_path / f"out-{padding_free}"), sample_train, max_steps=3)
        args[2].learning_rate = 1e-3
        config = PADDING_FREE if padding_free else None
        runs[padding_free], *_ = train(*args, attention_and_distributed_packing_config=config, trackers=[])
    trainer = runs[True]
    assert trainer.args.padding_free and not runs[False].args.padding_free
    rows = [trainer.train_dataset[index] for index in range(4)]
    batch = trainer.data_collator(rows)
    lengths = [len(row["input_ids"]) for row in rows]
    assert "attention_mask" not in batch and batch["input_ids"].shape == (1, sum(lengths))
    assert (batch["position_ids"][0] == 0).sum() == 4 and len(set(lengths)) > 1  # unequal: padding had work to do
    padded, padding_free = _losses(runs[False]), _losses(trainer)
    assert len(padded) == 3 and padding_free == pytest.approx(padded, rel=1e-4)


@pytest.mark.parametrize(
    ("change", "culprit"),
    [
        (lambda m, t: setattr(t, "packing", True), "--padding_free with --packing"),
        (lambda m, t: setattr(t, "use_cache", True), "--padding_free with --use_cache True"),
        (lambda m, t: setattr(m, "flash_attn_implementation", "flex_attention"), "flex_attention"),
        (None, "--padding_free with --peft_method pt"),
    ],
)
def test_padding_free_refuses_what_it_cannot_train(change, culprit, tiny_model, sample_train, tmp_path, monkeypatch):
    model_args, data_args, train_args = make_args(tiny_model, str(tmp_path / "out"), sample_train)
    peft_config = PromptTuningConfig() if change is None else None
    if change is not None:
        change(model_args, train_args)
    # A stand-in for a CUDA machine with flash-attn, where --flash_attn_implementation is what the model runs.
    model_args.use_flash_attn = True
    monkeypatch.setattr("tuning.sft_trainer.torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("tuning.sft_trainer.is_flash_attn_2_available", lambda: True)
    with pytest.raises(UserInputError, match=culprit):
        train(model_args, data_args, train_args, peft_config, attention_and_distributed_packing_config=PADDING_FREE)
    assert not (tmp_path / "out").exists()


def test_padding_free_and_multipack_parse_into_v3_dataclasses(monkeypatch, tiny_model, sample_train, tmp_path):
    monkeypatch.setattr("sys.argv", ["sft_trainer.py", "--padding_free", "huggingface"])
    config = parse_arguments(get_parser()).attention_and_distributed_packing_config
    assert config.padding_free == PaddingFree("huggingface") and config.is_padding_free and not config.is_multipack
    with pytest.raises(ValueError, match="only 'huggingface'"):
        AttentionAndDistributedPackingConfig(padding_free=["flash"])
    multipack = AttentionAndDistributedPackingConfig(multipack=["8"])
    assert multipack.is_multipack
    with pytest.raises(UserInputError, match="--multipack 8: multipack sampling is not supported"):
        train(*make_args(tiny_model, str(tmp_path), sample_train), attention_and_distributed_packing_config=multipack)


def _new_token_rows(adapter_dir, token_id: int) -> dict[str, torch.Tensor]:
    """The saved rows of ``token_id`` in each embedding trained in full with the adapter, by module name."""
    weights = load_file(str(adapter_dir / "adapter_model.safetensors"))
    return {
        name: weight[token_id]
        for name, weight in weights.items()
        if "modules_to_save" in name and ("embed_tokens" in name or "lm_head" in name)
    }


@pytest.mark.parametrize("tied", [False, True])
def test_lora_with_added_tokens_trains_and_saves_their_rows(tied, tiny_model, sample_train, tmp_path):
    """3.2's fix, and past it on an untied lm_head: the added token's input (and output) rows are trained in full,
    saved with the adapter, and a model loaded from base + adapter has them."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = tiny_model
    if tied:
        base = str(tmp_path / "tied")
        model = AutoModelForCausalLM.from_pretrained(tiny_model, tie_word_embeddings=True)
        model.save_pretrained(base)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(Path(tiny_model) / name, Path(base) / name)
    records = [json.loads(line) for line in Path(sample_train).read_text(encoding="utf-8").splitlines()[:16]]
    data = tmp_path / "tool.jsonl"  # the new token in every response: its input row gets gradients
    data.write_text(
        "".join(json.dumps({"output": r["output"].replace("Response: ", "Response: <tool> ")}) + "\n" for r in records)
    )
    model_args, data_args, train_args = make_args(base, str(tmp_path / "out"), str(data), max_steps=3)
    train_args.learning_rate = 1e-2
    data_args.add_special_tokens = ["<tool>"]
    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"])
    trainer, info, _ = train(model_args, data_args, train_args, lora, trackers=[])
    assert lora.modules_to_save is None  # the caller's config is left as given
    save(str(tmp_path / "adapter"), trainer)
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    saved_modules = {name.rsplit(".", 1)[-1] for name in config["modules_to_save"]}  # peft may add full paths
    assert saved_modules == ({"embed_tokens"} if tied else {"embed_tokens", "lm_head"})
    assert config["ensure_weight_tying"] is tied

    token_id = trainer.processing_class.convert_tokens_to_ids("<tool>")
    saved = _new_token_rows(tmp_path / "adapter", token_id)
    assert any("embed_tokens" in name for name in saved) and any("lm_head" in name for name in saved)  # tied: one
    original = AutoModelForCausalLM.from_pretrained(base)
    starts = {  # where the new rows started: the mean of the old ones
        "embed_tokens": original.get_input_embeddings().weight.mean(dim=0),
        "lm_head": original.get_output_embeddings().weight.mean(dim=0),
    }
    for name, row in saved.items():
        start = starts["embed_tokens" if "embed_tokens" in name else "lm_head"]
        assert not torch.allclose(row, start, atol=1e-4)  # trained

    original.resize_token_embeddings(info["added_tokens_info"]["new_embedding_size"])
    loaded = PeftModel.from_pretrained(original, str(tmp_path / "adapter"))
    for embeddings in ("get_input_embeddings", "get_output_embeddings"):
        expected = getattr(trainer.model, embeddings)().weight[token_id]
        assert torch.equal(getattr(loaded, embeddings)().weight[token_id], expected)
    assert not torch.allclose(loaded.get_input_embeddings().weight[token_id], starts["embed_tokens"], atol=1e-4)


def test_bench_train_hands_padding_free_to_train(tiny_model, tmp_path, capfd):
    """Through bench_train's main too (in this process: the flags' path, not the process, is under test):
    padding-free trains (its dump counts the examples' tokens, TRL's count of the concatenated rows agreeing), and
    padding-free with packing is refused as a user error, not ignored."""
    from tests.helpers.bench import bench_args, read_dump, series
    from tests.helpers.training import BENCH_TRAIN, load_script

    bench_train = load_script(BENCH_TRAIN)
    out = tmp_path / "ok"
    assert bench_train.main(bench_args(tiny_model, out, padding_free="huggingface")) == 0, capfd.readouterr().err
    dump = read_dump(out / "bench.json")
    assert sum(series(dump, "step_tokens")["values"]) == series(dump, "num_tokens")["values"][-1] > 0
    capfd.readouterr()
    refused = tmp_path / "refused"
    code = bench_train.main(bench_args(tiny_model, refused, padding_free="huggingface", packing="True"))
    assert code == 1 and "--padding_free with --packing" in capfd.readouterr().err
