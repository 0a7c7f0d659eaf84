"""fms-acceleration's jobs on transformers 5 and peft (``tuning.utils.acceleration``): ``--fast_moe`` on a tiny
GraniteMoe (grouped-GEMM experts; expert parallelism on two torchrun ranks, preempted and resumed), QLoRA through
bitsandbytes and aLoRA through peft, each trained for real; the refusals name what is missing."""

import json
import logging
import re
import shutil
import signal
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer, HfArgumentParser

from tests.helpers.bench import bench_args, read_dump
from tests.helpers.training import (
    BENCH_TRAIN,
    SFT_TRAINER,
    TORCHRUN,
    Job,
    cli_args,
    load_script,
    logged_steps,
    make_args,
    run_main,
    run_python,
    two_ranks,
    wait_for_steps,
)
from tuning import sft_trainer
from tuning.config.acceleration_configs import FastMoeConfig, FusedOpsAndKernelsConfig, QuantizedLoraConfig
from tuning.config.acceleration_configs.needs import QLORA_EXTRA
from tuning.config.peft_config import LoraConfig
from tuning.utils.acceleration import load_settings
from tuning.utils.checkpoints import COMPLETED_FILE
from tuning.utils.error_logging import UserInputError
from tuning.utils.sharded_state import check_resume_layout
from tuning.utils.tiny_model import build_tiny_hybrid

EXPERTS = 4  # the tiny_moe fixture's


def test_fast_moe_1_trains_with_grouped_experts_and_checkpoints_loadable_safetensors(tiny_moe, sample_train, tmp_path):
    output_dir = tmp_path / "out"
    args = make_args(tiny_moe, str(output_dir), sample_train, save_strategy="steps", save_steps=2)
    trainer, _, _ = sft_trainer.train(*args, fast_moe_config=FastMoeConfig(fast_moe=["1"]))
    assert trainer.model.config._experts_implementation == "grouped_mm"
    assert trainer.state.log_history[-1]["train_loss"] > 0
    # fms-hf-tuning 3.2's layout: checkpoint-N/safetensors-N, a model transformers loads, the trained weights.
    converted = output_dir / "checkpoint-2" / "safetensors-2"
    loaded = AutoModelForCausalLM.from_pretrained(converted)
    trained = trainer.model.state_dict()
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, trained[name]), name
    assert AutoTokenizer.from_pretrained(converted).vocab_size == trainer.processing_class.vocab_size
    # Its checkpoint, as an expert-parallel run would have written it, resumed by this unsharded run: refused.
    (output_dir / "checkpoint-2" / "sharded_state").mkdir()
    (output_dir / "checkpoint-2" / "sharded_state" / "layout.json").write_text('{"world_size": 2, "ep_degree": 2}')
    args[2].max_steps = 4  # more steps to train: at its final step the job would be finished, nothing resumed
    with pytest.raises(UserInputError, match=re.escape("checkpoint-2 was written by a run with 2 processes at")):
        sft_trainer.train(*args, fast_moe_config=FastMoeConfig(fast_moe=["1"]))


@pytest.mark.parametrize(
    ("written", "whole_optimizer", "layout", "refusal"),
    [
        ((2, 2), False, (2, 2), None),
        ((2, 2), False, (4, 2), "2 processes at expert-parallel degree 2 and this run has 4 processes at"),
        ((4, 4), False, (4, 2), "4 processes at expert-parallel degree 4 and this run has 4 processes at"),
        ((2, 2), False, None, "2 processes at expert-parallel degree 2 and this run has no expert parallelism"),
        (None, True, (2, 2), "no expert parallelism and this run has 2 processes at expert-parallel degree 2"),
        (None, False, (2, 2), None),  # the model only (--save_only_model): the optimizer restarts
    ],
)
def test_a_resume_under_another_expert_parallel_layout_is_refused_naming_both(
    tmp_path, written, whole_optimizer, layout, refusal
):
    checkpoint = tmp_path / "checkpoint-4"
    (checkpoint / "sharded_state").mkdir(parents=True)
    if written is not None:
        text = json.dumps({"world_size": written[0], "ep_degree": written[1]})
        (checkpoint / "sharded_state" / "layout.json").write_text(text)
    if whole_optimizer:
        (checkpoint / "optimizer.pt").write_bytes(b"")
    layout = None if layout is None else {"world_size": layout[0], "ep_degree": layout[1]}
    if refusal is None:
        assert check_resume_layout(str(checkpoint), layout) is (written is not None)
    else:
        with pytest.raises(UserInputError, match=re.escape(f"checkpoint-4 was written by a run with {refusal}")):
            check_resume_layout(str(checkpoint), layout)


def test_fast_moe_trains_a_tiny_granite_hybrid(sample_train, tmp_path):
    model = build_tiny_hybrid(str(tmp_path / "hybrid"))
    args = make_args(model, str(tmp_path / "out"), sample_train, max_steps=1)
    trainer, _, _ = sft_trainer.train(*args, fast_moe_config=FastMoeConfig(fast_moe=True))
    assert trainer.model.config.model_type == "granitemoehybrid"
    assert trainer.state.global_step == 1


@pytest.mark.parametrize(
    ("degree", "message"),
    [
        (3, f"--fast_moe 3: the expert-parallel degree must divide the expert count ({EXPERTS} experts per layer in"),
        (2, "and the world size (1 processes)"),
    ],
)
def test_fast_moe_degree_must_divide_experts_and_world_size(tiny_moe, sample_train, tmp_path, degree, message):
    with pytest.raises(UserInputError, match=re.escape(message)):
        sft_trainer.train(
            *make_args(tiny_moe, str(tmp_path / "out"), sample_train), fast_moe_config=FastMoeConfig(degree)
        )
    assert not (tmp_path / "out").exists()  # before the data or the model


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        (["--bnb_qlora", "int8"], "--bnb_qlora int8: quant_type can only be either 'nf4' or 'fp4'"),
        (["--fast_moe", "0"], "--fast_moe 0: the expert-parallel degree is at least 1 (or True)"),
        (["--fast_moe", "-2"], "--fast_moe -2: the expert-parallel degree is at least 1 (or True)"),
        (["--fast_moe", "many"], "--fast_moe many: a number or a boolean (true/false, yes/no...) expected, got 'many'"),
        (["--bnb_qlora", "nf4", "maybe"], "--bnb_qlora nf4 maybe: a boolean expected"),
        (["--auto_gptq", "foo"], "--auto_gptq foo: only 'triton_v2' kernel currently supported."),
    ],
)
def test_a_bad_flag_value_is_refused_naming_the_flag(flag, message, tiny_moe, tmp_path, monkeypatch, capfd):
    """One line through main(): the marker, exit 1, no traceback (a chained pair of them before)."""
    exit_code, stderr = run_main([*cli_args(tiny_moe, str(tmp_path)), *flag], monkeypatch, capfd)
    assert exit_code == 1
    assert f"type=UserInputError: {message}" in stderr and "Traceback" not in stderr
    assert stderr.count(flag[0]) == 1  # the flag named once, not "--fast_moe 0: --fast_moe 0: ..."


def test_fast_moe_false_is_off_and_the_dump_names_the_experts_the_loaded_model_runs(tiny_moe, tmp_path, capfd):
    """--fast_moe False loads as if not given; without --fast_moe transformers 5 loads grouped_mm experts all the
    same, and the dump's config says so, read from the loaded model (it said null before, and grouped_mm for
    --fast_moe 1, as if that changed the run)."""
    assert FastMoeConfig(fast_moe=["False"]).fast_moe is None
    bench_train = load_script(BENCH_TRAIN)
    args = bench_args(tiny_moe, tmp_path, max_steps=1, system_metrics_interval=0, fast_moe="False")
    assert bench_train.main(args) == 0, capfd.readouterr().err[-3000:]
    config = read_dump(tmp_path / "bench.json")["config"]
    assert (config["experts_implementation"], config["ep_degree"], config["fast_moe"]) == ("grouped_mm", None, None)


def test_fast_moe_on_a_dense_model_is_a_user_error(tiny_model, sample_train, tmp_path):
    with pytest.raises(UserInputError, match="is no mixture-of-experts model"):
        sft_trainer.train(*make_args(tiny_model, str(tmp_path / "out"), sample_train), fast_moe_config=FastMoeConfig(1))


def test_qlora_nf4_trains_and_saves_an_adapter_that_loads(tiny_model, sample_train, tmp_path):
    import bitsandbytes
    import peft

    args = make_args(tiny_model, str(tmp_path / "out"), sample_train)
    trainer, _, _ = sft_trainer.train(*args, LoraConfig(), quantized_lora_config=QuantizedLoraConfig(bnb_qlora=["nf4"]))
    base_layer = trainer.model.get_base_model().model.layers[0].self_attn.q_proj.base_layer
    assert isinstance(base_layer, bitsandbytes.nn.Linear4bit)
    assert base_layer.weight.quant_state.quant_type == "nf4"
    saved = tmp_path / "adapter"
    sft_trainer.save(str(saved), trainer)
    loaded = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model), saved)
    weights = load_file(str(saved / "adapter_model.safetensors"))
    lora_b = next(name for name in weights if "lora_B" in name)
    assert weights[lora_b].abs().sum() > 0  # trained: B starts at zero
    module_name = lora_b.removeprefix("base_model.model.").removesuffix(".lora_B.weight")
    assert torch.equal(loaded.get_base_model().get_submodule(module_name).lora_B["default"].weight, weights[lora_b])


def test_bnb_qlora_second_value_readies_the_4bit_model_as_v3_1_0(tiny_model, sample_train, tmp_path):
    """--bnb_qlora nf4 True (v3.1.0's no_peft_model): the base model readied for LoRA by peft's
    prepare_model_for_kbit_training, as v3.1.0's TRL did: its 16-bit parameters (norms, embeddings) trained in
    float32; without it they stay in --torch_dtype."""
    model_args, data_args, train_args = make_args(tiny_model, str(tmp_path), sample_train, max_steps=1)
    model_args.torch_dtype = "bfloat16"
    kinds = {}
    for no_peft_model in ("False", "True"):
        qlora = QuantizedLoraConfig(bnb_qlora=["nf4", no_peft_model])
        trainer, _, _ = sft_trainer.train(model_args, data_args, train_args, LoraConfig(), quantized_lora_config=qlora)
        kinds[no_peft_model] = trainer.model.get_base_model().model.norm.weight.dtype
        train_args.resume_from_checkpoint = "false"
    assert kinds == {"False": torch.bfloat16, "True": torch.float32}


def test_a_resumed_qlora_run_trains_on_as_the_run_it_continues(tiny_model, sample_train, tmp_path):
    """TRL trains a quantised model's LoRA weights in bfloat16; transformers' resume reloaded them in float32, so a
    resumed QLoRA run drifted from the uninterrupted one (step 4: 6.211875 vs 6.211697). Now its weights after the
    resumed step are those of the uninterrupted run, bit for bit."""
    args = make_args(tiny_model, str(tmp_path), sample_train, max_steps=3, save_strategy="steps", save_steps=2)
    qlora = QuantizedLoraConfig(bnb_qlora=["nf4"])
    sft_trainer.train(*args, LoraConfig(), quantized_lora_config=qlora)
    uninterrupted = load_file(str(tmp_path / "checkpoint-3" / "adapter_model.safetensors"))
    shutil.rmtree(tmp_path / "checkpoint-3")  # as if stopped after step 2's checkpoint
    (tmp_path / COMPLETED_FILE).unlink()
    trainer, info, _ = sft_trainer.train(*args, LoraConfig(), quantized_lora_config=qlora)
    assert (info["resumed_from_step"], trainer.state.global_step) == (2, 3)
    resumed = load_file(str(tmp_path / "checkpoint-3" / "adapter_model.safetensors"))
    assert {tensor.dtype for tensor in resumed.values()} == {torch.bfloat16}
    for name, tensor in uninterrupted.items():
        assert torch.equal(tensor, resumed[name]), name


def test_qlora_needs_lora(tiny_model, sample_train, tmp_path):
    with pytest.raises(UserInputError, match="--bnb_qlora: quantised LoRA trains LoRA adapters"):
        sft_trainer.train(
            *make_args(tiny_model, str(tmp_path / "out"), sample_train),
            quantized_lora_config=QuantizedLoraConfig(bnb_qlora=["fp4"]),
        )


def test_qlora_without_bitsandbytes_is_refused_naming_the_extra(tiny_model, sample_train, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # what an import of a missing package meets
    with pytest.raises(
        UserInputError,
        match=re.escape(
            f"--bnb_qlora nf4: QLoRA is not supported by tuning-bench without bitsandbytes ({QLORA_EXTRA})"
        ),
    ):
        sft_trainer.train(
            *make_args(tiny_model, str(tmp_path / "out"), sample_train),
            LoraConfig(),
            quantized_lora_config=QuantizedLoraConfig(bnb_qlora=["nf4"]),
        )


def test_gptq_and_kernels_load_settings_where_they_run(tiny_model, tmp_path):
    """What a GPU machine with gptqmodel and kernels does with ``--auto_gptq``, ``--fused_lora`` and
    ``--fast_kernels`` (here the refusal rule stops them first, for want of a GPU): checked against the model's
    config, and handed to ``from_pretrained``."""
    config = json.loads((Path(tiny_model) / "config.json").read_text())
    gptq_model = tmp_path / "gptq"
    gptq_model.mkdir()
    (gptq_model / "config.json").write_text(json.dumps({**config, "quantization_config": {"quant_method": "gptq"}}))
    parser = HfArgumentParser((QuantizedLoraConfig, FusedOpsAndKernelsConfig))
    quantized, kernels = parser.parse_args_into_dataclasses(
        ["--auto_gptq", "triton_v2", "--fused_lora", "auto_gptq", "True", "--fast_kernels", "True", "True", "True"]
    )
    settings = load_settings(str(gptq_model), None, LoraConfig(), torch.float32, quantized, kernels)
    assert (settings.quantization, settings.keywords) == ("gptq", {"use_kernels": True})
    with pytest.raises(UserInputError, match="--auto_gptq: .* is no GPTQ-quantised checkpoint"):
        load_settings(tiny_model, None, LoraConfig(), torch.float32, quantized, kernels)
    with pytest.raises(UserInputError, match="`--fused_lora` must be accompanied by a quantized base layer"):
        load_settings(str(gptq_model), None, LoraConfig(), torch.float32, QuantizedLoraConfig(), kernels)


def test_alora_from_the_command_line_trains_with_its_invocation_tokens(tiny_model, sample_train, tmp_path):
    invocation = "### Response:"
    flags = cli_args(tiny_model, str(tmp_path / "out"), save_strategy="steps", save_steps=2, max_steps=2)
    argv = [*flags, "--peft_method", "alora", "--alora_invocation_string", invocation]
    args = sft_trainer.parse_arguments(sft_trainer.get_parser(), args=argv)
    sft_trainer.train(args.model_args, args.data_args, args.training_args, args.tune_config)
    adapter_config = json.loads((tmp_path / "out" / "checkpoint-2" / "adapter_config.json").read_text())
    tokens = AutoTokenizer.from_pretrained(tiny_model).encode(invocation, add_special_tokens=False)
    assert tokens and adapter_config["alora_invocation_tokens"] == tokens
    assert adapter_config["peft_type"] == "LORA"


@pytest.mark.parametrize(
    "invocation",
    [
        "Response:",  # [267, 272, 28] alone; inside the rows' text "### Response:" tokenises as ĠResponse (274)
        "### Answer:",  # in no row at all
    ],
)
def test_alora_whose_invocation_tokens_occur_in_no_row_is_refused_before_the_model_loads(
    tiny_model, sample_train, tmp_path, monkeypatch, capfd, invocation
):
    """The CLI (main()): every row's adapter would stay inactive, every lora_B 0.0; refused, exit 1, the reason."""
    argv = [
        *cli_args(tiny_model, str(tmp_path / "out")),
        "--peft_method",
        "alora",
        "--alora_invocation_string",
        invocation,
    ]
    code, stderr = run_main(argv, monkeypatch, capfd)
    tokens = AutoTokenizer.from_pretrained(tiny_model).encode(invocation, add_special_tokens=False)
    assert code == 1
    assert (
        f"--alora_invocation_string {invocation!r}: its tokens {tokens} occur in none of the 96 rows of "
        f"--training_data_path {sample_train} as the data tokenises them"
    ) in stderr
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("checkpoint-*"))


def test_alora_warns_how_many_rows_lack_its_invocation_tokens(tiny_model, tmp_path, caplog):
    """train(): rows whose text holds the invocation only as the string tokenises otherwise train nothing; counted."""
    rows = [{"output": f"### Input: {i}\n\n{'### ' if i % 2 else ''}Response: {i + 1}"} for i in range(4)]
    data = tmp_path / "mixed.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    model_args, data_args, train_args = make_args(tiny_model, str(tmp_path / "out"), str(data), max_steps=1)
    data_args.response_template = "Response:"
    lora = LoraConfig(r=4)
    lora.alora_invocation_string = "### Response:"
    with caplog.at_level(logging.WARNING, logger="tuning.data.labels"):
        sft_trainer.train(model_args, data_args, train_args, lora)
    assert [record.getMessage() for record in caplog.records] == [
        f"--alora_invocation_string '### Response:': its tokens [260, 274, 28]: 2 of 4 rows of --training_data_path "
        f"{data} lack them as the data tokenises them; the adapter learns nothing from them"
    ]


def test_alora_tokens_given_as_v3_1_0_s_tests_give_them_are_looked_for_too(tiny_model, sample_train, tmp_path):
    """train() with a LoRA config carrying alora_invocation_tokens themselves (no string), as v3.1.0's tests do."""
    lora = LoraConfig(r=4)
    lora.alora_invocation_tokens = AutoTokenizer.from_pretrained(tiny_model).encode(
        "Response:", add_special_tokens=False
    )
    with pytest.raises(
        UserInputError,
        match=re.escape(f"aLoRA's invocation tokens {lora.alora_invocation_tokens} occur in none of the 96 rows"),
    ):
        sft_trainer.train(*make_args(tiny_model, str(tmp_path / "out"), sample_train), lora)


def test_alora_needs_its_invocation_string(tiny_model, tmp_path):
    argv = [*cli_args(tiny_model, str(tmp_path / "out")), "--peft_method", "alora"]
    with pytest.raises(UserInputError, match="--peft_method alora needs --alora_invocation_string"):
        sft_trainer.parse_arguments(sft_trainer.get_parser(), args=argv)


# Expert parallelism on two ranks: steps long enough (gradient accumulation) for a SIGTERM to land mid-run, and
# enough of them after it for a resumed optimizer's state to show in the losses.
EP_MAX_STEPS = 7


_EP_OPTIONS = {
    "max_steps": EP_MAX_STEPS,
    "per_device_train_batch_size": 2,
    "gradient_accumulation_steps": 2,
    "packing": "True",  # rows of one length: every rank's loss weighs the same
    "response_template": None,
    "seed": 7,
    "learning_rate": 1e-3,  # an optimizer that restarts at the resume changes the next losses by 1e-2 and more
    "save_strategy": "steps",
    "save_steps": 100,  # only the preemption's checkpoint
    "ddp_timeout": 60,
}


def _ep_flags(model: str, output_dir, degree: int, **extra) -> list[str]:
    return cli_args(model, str(output_dir), **{**_EP_OPTIONS, "fast_moe": degree, **extra})


def _losses(output_dir) -> dict[int, float]:
    records = [json.loads(line) for line in (output_dir / "training_logs.jsonl").read_text().splitlines()]
    return {r["data"]["step"]: r["data"]["value"] for r in records if r["name"] == "training_loss"}


@pytest.mark.slow
def test_expert_parallel_run_matches_degree_1_shards_the_experts_and_resumes_after_sigterm(tiny_moe, tmp_path):
    """A ``--fast_moe 2`` run on two ranks (gloo) preempted by SIGTERM: half the experts on each rank, a checkpoint at
    the stop that transformers loads whole and that holds the optimizer and scheduler state. Then, in one torchrun
    start (``tests/helpers/train_in_turn.py``): an uninterrupted ``--fast_moe 1`` run of the same flags, the
    preempted run resumed from its checkpoint, and a LoRA ``--fast_moe 2`` run checkpointing at step 2 followed by
    its resume from that checkpoint. Each resumed run logs the losses of its uninterrupted one at every step, before
    the stop and after it, which a restarted optimizer or learning-rate schedule (or other dropout masks) would
    change by 1e-2."""
    output_dir, reference_dir = tmp_path / "ep2", tmp_path / "ep1"
    preempted = Job([*TORCHRUN, *two_ranks(SFT_TRAINER, _ep_flags(tiny_moe, output_dir, 2))], tmp_path / "preempted")
    wait_for_steps(output_dir / "training_logs.jsonl", 2, preempted, signal.SIGTERM)
    stderr = preempted.finish(timeout=180)
    for rank in (0, 1):
        assert f"--fast_moe 2: rank {rank} holds 2 of the {EXPERTS} experts of each layer" in stderr, stderr[-3000:]
    stopped = logged_steps(output_dir / "training_logs.jsonl")[-1]
    assert 2 <= stopped <= EP_MAX_STEPS - 2  # the loss of step stopped + 2 follows a resumed optimizer step
    checkpoint = output_dir / f"checkpoint-{stopped}"
    whole = AutoModelForCausalLM.from_pretrained(checkpoint / f"safetensors-{stopped}")
    assert whole.model.layers[0].block_sparse_moe.experts.gate_up_proj.shape[0] == EXPERTS
    assert json.loads((checkpoint / "sharded_state" / "layout.json").read_text()) == {"world_size": 2, "ep_degree": 2}

    lora = ["--peft_method", "lora", "--target_modules", "q_proj", "v_proj"]
    lora_options = {"max_steps": 4, "save_steps": 2, "learning_rate": 1e-2}
    lora_whole, lora_resumed = tmp_path / "lora", tmp_path / "lora-resumed"
    resume_lora = {"resume_from_checkpoint": lora_whole / "checkpoint-2"}
    jobs = [
        _ep_flags(tiny_moe, reference_dir, 1, save_strategy="no"),
        _ep_flags(tiny_moe, output_dir, 2),
        [*_ep_flags(tiny_moe, lora_whole, 2, **lora_options), *lora],
        [*_ep_flags(tiny_moe, lora_resumed, 2, **lora_options, **resume_lora), *lora],
    ]
    helper = str(Path(__file__).parent / "helpers" / "train_in_turn.py")
    in_turn = run_python(*TORCHRUN, *two_ranks(helper, [*jobs[0], *(a for j in jobs[1:] for a in ("--then", *j))]))
    assert in_turn.returncode == 0, in_turn.stderr[-3000:]
    assert f"resuming from checkpoint-{stopped} (global step {stopped})" in in_turn.stderr
    assert "resuming from checkpoint-2 (global step 2)" in in_turn.stderr
    assert logged_steps(output_dir / "training_logs.jsonl") == list(range(1, EP_MAX_STEPS + 1))
    expected = _losses(reference_dir)
    for step, loss in _losses(output_dir).items():
        assert loss == pytest.approx(expected[step], abs=1e-4), step
    expected, resumed = _losses(lora_whole), _losses(lora_resumed)
    assert sorted(resumed) == [3, 4]
    for step, loss in resumed.items():
        assert loss == pytest.approx(expected[step], abs=1e-4), ("lora", step)
    adapter = load_file(str(lora_resumed / "checkpoint-4" / "adapter_model.safetensors"))
    assert adapter["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"].shape == (64, 8)  # whole
