"""The memory estimate (tuning.benchmarking.memory): within 10 % of the real peak of live tensor bytes on the tiny
models, from a config-only directory, with its reason where it cannot trace, and the Llama-3-8B-shaped config."""

import json
import shutil
from pathlib import Path

import pytest

from benchmarks.memory_estimate import job_args, long_rows, measure, write_llama3_8b_config
from tests.helpers.bench import bench_args, read_dump
from tests.helpers.training import BENCH_TRAIN, load_script
from tuning.benchmarking.memory import estimate_memory, suggest_devices

TOLERANCE = 0.10


@pytest.fixture(scope="module")
def long_data(tmp_path_factory) -> str:
    """Rows longer than any case's sequence: every batch full, as the estimate assumes."""
    return long_rows(tmp_path_factory.mktemp("memory-data") / "long.jsonl")


@pytest.mark.slow  # seconds: traces the step under FakeTensorMode and measures a real one
@pytest.mark.parametrize(
    ("model", "batch", "length", "flags"),
    [
        ("tiny_model", 4, 128, ["--gradient_checkpointing", "False"]),
        ("tiny_moe", 2, 64, ["--fast_moe", "1", "--torch_dtype", "bfloat16"]),
    ],
    ids=["full-ft-no-checkpointing-4x128", "moe-fast-moe-2x64"],
)
def test_the_estimate_is_within_ten_percent_of_the_real_peak(model, batch, length, flags, long_data, tmp_path, request):
    args = job_args(request.getfixturevalue(model), long_data, str(tmp_path), batch, length, flags)
    estimate = estimate_memory(args)
    measured = measure(args)
    assert estimate["not_estimated"] is None
    assert abs(estimate["peak_bytes_per_device"] / measured - 1) <= TOLERANCE, (estimate, measured)
    assert estimate["parts"]["parameters"] > 0 and estimate["peak_phase"] in ("forward", "backward", "optimizer")


@pytest.mark.slow
def test_a_real_run_records_the_estimate_beside_its_measured_peak(tiny_model, long_data, tmp_path):
    """LoRA with gradient checkpointing through bench_train: the dump's estimate, summary.peak_tensor_bytes (torch's
    tracker over the real steps) and their ratio, within 10 %."""
    bench_train = load_script(BENCH_TRAIN)
    args = bench_args(
        tiny_model,
        tmp_path,
        training_data_path=long_data,
        peft_method="lora",
        gradient_checkpointing=True,
        per_device_train_batch_size=2,
        max_seq_length=64,
        max_steps=2,
        memory_estimate=True,
        trackers="none",
    )
    assert bench_train.main(args) == 0
    dump = read_dump(tmp_path / "bench.json")
    assert dump["estimate"]["not_estimated"] is None and not dump["estimate"]["estimate_only"]
    assert dump["summary"]["peak_tensor_bytes"] > 0
    ratio = dump["summary"]["memory_estimate_ratio"]
    assert ratio == dump["estimate"]["peak_bytes_per_device"] / dump["summary"]["peak_tensor_bytes"]
    assert abs(ratio - 1) <= TOLERANCE, dump["estimate"]


def test_estimate_only_reads_no_weight_file_and_trains_nothing(tiny_model, tmp_path, capfd):
    """A directory of the model's config and tokenizer without its weights: --estimate_memory prints the table,
    exits 0 and writes the dump's estimate; nothing trains."""
    config_only = tmp_path / "config-only"
    config_only.mkdir()
    for path in Path(tiny_model).iterdir():
        if not path.name.endswith((".safetensors", ".bin")):
            shutil.copy(path, config_only / path.name)
    bench_train = load_script(BENCH_TRAIN)
    args = bench_args(str(config_only), tmp_path, estimate_memory=True, per_device_train_batch_size=2)
    assert bench_train.main(args) == 0
    dump = read_dump(tmp_path / "bench.json")
    assert (dump["status"], dump["training_steps"]) == ("ok", 0)
    estimate = dump["estimate"]
    assert estimate["estimate_only"] and estimate["peak_bytes_per_device"] > 0, estimate
    assert (estimate["devices"], estimate["batch_size"]) == (1, 2)
    assert "peak tensor memory per device:" in capfd.readouterr().out


def test_a_model_that_cannot_be_traced_gives_its_reason(tiny_moe, tmp_path):
    """The tiny MoE's default grouped_mm experts in float32 have no fake-tensor kernel; a quantized checkpoint's
    kernels neither: each gives one line, no figure."""
    args = job_args(tiny_moe, long_rows(tmp_path / "rows.jsonl", 2), str(tmp_path), 1, 32, [])
    estimate = estimate_memory(args)
    assert estimate["peak_bytes_per_device"] is None
    assert estimate["not_estimated"].startswith("the training step cannot be traced: RuntimeError: ")
    quantized = tmp_path / "quantized"
    quantized.mkdir()
    config = json.loads((Path(tiny_moe) / "config.json").read_text())
    (quantized / "config.json").write_text(json.dumps({**config, "quantization_config": {"quant_method": "gptq"}}))
    args = job_args(str(quantized), str(tmp_path / "rows.jsonl"), str(tmp_path), 1, 32, [])
    assert (
        estimate_memory(args)["not_estimated"]
        == f"{quantized} is quantized (gptq): its kernels cannot run on fake tensors"
    )


@pytest.mark.slow  # seconds: three traces
def test_a_deep_stack_traced_cut_short_gives_the_whole_model_s_figures(tmp_path, long_data):
    """Five alike layers: traced at 2 and 3 layers and extended, every part equals the trace of all five (forced by
    a per-layer list in the config, with which the layers may differ and the whole model is traced)."""
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 172,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 5,
        "vocab_size": 1024,
        "max_position_embeddings": 512,
        "tie_word_embeddings": False,
    }
    estimates = []
    for name, listed in (("alike", {}), ("listed", {"layer_types": ["full_attention"] * 5})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(config | listed))
        flags = ["--peft_method", "lora", "--gradient_checkpointing", "True"]
        estimates.append(estimate_memory(job_args(str(tmp_path / name), long_data, str(tmp_path), 2, 128, flags)))
    cut, whole = estimates
    assert (cut["traced_layers"], "traced_layers" in whole, whole["not_estimated"]) == ([2, 3], False, None)
    assert cut["parts"] == whole["parts"] and cut["peak_bytes_per_device"] == whole["peak_bytes_per_device"]


@pytest.mark.slow
def test_a_llama_3_8b_shaped_config_is_estimated_from_its_config_alone(tmp_path):
    """config.json only (no weights, no tokenizer), LoRA, bf16, 1 x 2048: the frozen bf16 weights are the 8.03 B
    parameters' 2 bytes each (its time and host memory: benchmarks/memory_estimate.py)."""
    model = write_llama3_8b_config(tmp_path / "llama3-8b")
    args = job_args(model, long_rows(tmp_path / "rows.jsonl", 2), str(tmp_path), 1, 2048, ["--peft_method", "lora"])
    args.model_args.torch_dtype = "bfloat16"
    estimate = estimate_memory(args)
    assert estimate["not_estimated"] is None, estimate
    assert 8.0e9 * 2 < estimate["parts"]["parameters"] < 8.1e9 * 2
    assert estimate["peak_bytes_per_device"] > estimate["parts"]["parameters"]
    assert estimate["sequence_length"] == 2048 and estimate["traced_layers"] == [2, 3]


@pytest.mark.slow  # seconds: bench_train traces the job, then once more
def test_suggest_devices_names_the_fewest_devices_or_why_none(tiny_model, tmp_path, capfd):
    """Without --fsdp every device holds the whole job: one device when it fits, else no count at all."""
    bench_train = load_script(BENCH_TRAIN)
    args = bench_args(tiny_model, tmp_path, suggest_devices=0.001, per_device_train_batch_size=2, max_seq_length=64)
    assert bench_train.main(args) == 0
    assert (
        "suggest_devices: no device count of 1.02 MiB found: without --fsdp every device holds the whole job: no "
        "device count makes it fit" in capfd.readouterr().err
    )
    assert read_dump(tmp_path / "bench.json")["estimate"]["estimate_only"]
    job = job_args(tiny_model, long_rows(tmp_path / "rows.jsonl", 2), str(tmp_path), 2, 64, [])
    assert suggest_devices(job, 2**30)["devices"] == 1


@pytest.mark.slow  # seconds: two FSDP traces
def test_fsdp_is_traced_sharded_over_a_fake_process_group_sized_like_the_job(tiny_model, tmp_path):
    """--fsdp: FSDPMemTracker over fully_shard on every decoder layer, on a fake process group of the device count:
    the parameters each device keeps shrink with the devices, and no process group is left behind."""
    import torch.distributed as dist

    flags = ["--fsdp", "full_shard auto_wrap"]
    args = job_args(tiny_model, long_rows(tmp_path / "rows.jsonl", 2), str(tmp_path), 2, 64, flags)
    one, four = estimate_memory(args, devices=1), estimate_memory(args, devices=4)
    assert one["not_estimated"] is None and four["devices"] == 4, four
    assert four["parts"]["sharded_param"] < one["parts"]["sharded_param"] / 3, (one["parts"], four["parts"])
    assert four["peak_bytes_per_device"] < one["peak_bytes_per_device"]
    assert not dist.is_initialized()
