"""MFU, energy and rank skew below the wrapper: the FLOPs formula against a hand count of the tiny Llama, the peak
table, the dump's efficiency keys from synthetic journals with known answers, the NVML energy counter through the
stand-in NVML, and per-step forward timing on the real tiny model."""

import statistics
import sys
import time

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

from tests.helpers.flops import LORA_WEIGHTS, attention_flops, tiny_llama_matmul_weights
from tests.helpers.nvml import load_fake_nvml
from tuning.benchmarking import report
from tuning.benchmarking.callback import DISPATCHED_BATCHES, _dispatched
from tuning.benchmarking.dump import (
    GPU_POWER,
    STEP_IMAGE_TOKENS,
    STEP_SAMPLES,
    STEP_TIME,
    STEP_TOKENS,
    node_figures,
    slowest_node,
    straggler,
)
from tuning.benchmarking.flops import (
    config_parameter_counts,
    flops_per_token,
    parameter_counts,
    peak_tflops_of,
    vision_flops_per_image_token,
)
from tuning.benchmarking.journal import Journal
from tuning.benchmarking.ranks import RankFigures, RankTimes
from tuning.benchmarking.record import RunRecord
from tuning.benchmarking.schema import validate_dump
from tuning.benchmarking.system_metrics import SystemMetricsSampler
from tuning.config.peft_config import LoraConfig, to_peft_config
from tuning.sft_trainer import VISION_LORA_TARGETS
from tuning.utils.tiny_model import build_tiny_moe, build_tiny_vision_model

HEADER = {
    "experiment": "e",
    "host": "h",
    "rank": 0,
    "world_size": 2,
    "environment": {
        **dict.fromkeys(("python", "torch", "transformers", "trl", "peft", "aim", "cuda", "cuda_driver")),
        "gpus": [],
    },
}


def test_full_fine_tuning_flops_are_six_per_weight_plus_attention(tiny_model):
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    weights = tiny_llama_matmul_weights(model.config.vocab_size)
    counts = parameter_counts(model)
    assert counts == {
        "frozen_matmul_parameters": 0,
        "trained_matmul_parameters": weights,
        "layers": 2,
        "attention_width": 64,
    }
    assert config_parameter_counts(AutoConfig.from_pretrained(tiny_model)) == counts  # from the config alone
    assert flops_per_token(counts, 30.0) == 6 * weights + attention_flops(30.0)


def test_a_mixture_of_experts_counts_the_routed_experts_only(tmp_path):
    """The tiny GraniteMoe (hidden 64, 2 layers, 4 experts of width 64, 2 routed per token), counted by hand: per
    layer q 64x64, k and v 64x32, o 64x64, the router 64x4, two norms; the experts' gate/up 4x128x64 and down 4x64x64
    at 2/4 of their number; a final norm and the untied head."""
    model = AutoModelForCausalLM.from_pretrained(
        build_tiny_moe(str(tmp_path / "moe"), num_experts=4, experts_per_token=2)
    )
    dense = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 64 * 4 + 2 * 64
    experts = 4 * 128 * 64 + 4 * 64 * 64
    expected = 2 * (dense + experts * 2 // 4) + 64 + 64 * model.config.vocab_size
    assert parameter_counts(model)["trained_matmul_parameters"] == expected
    assert config_parameter_counts(model.config) == parameter_counts(model)


def test_lora_flops_leave_out_the_frozen_weights_gradients(tiny_model):
    import peft

    model = peft.get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model), to_peft_config(LoraConfig(), None))
    weights = tiny_llama_matmul_weights(model.config.vocab_size)
    counts = parameter_counts(model)
    assert counts["frozen_matmul_parameters"] == weights and counts["trained_matmul_parameters"] == LORA_WEIGHTS
    assert flops_per_token(counts, 30.0) == 4 * weights + 6 * LORA_WEIGHTS + attention_flops(30.0)


@pytest.mark.parametrize(
    ("name", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", 989.0),
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA H200 NVL", 835.0),
        ("NVIDIA H200", 989.0),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("NVIDIA L40S", 362.0),
        ("NVIDIA L4", 121.0),
        ("AMD Instinct MI300X", 1307.4),
        ("NVIDIA GeForce RTX 4090", None),  # not in the table: no guess
        (None, None),  # CPU
    ],
)
def test_peak_table_matches_cuda_device_names(name, peak):
    assert peak_tflops_of(name) == peak


COUNTS = {"frozen_matmul_parameters": 1000, "trained_matmul_parameters": 500, "layers": 2, "attention_width": 8}


def efficiency_run(
    tmp_path, power: list[tuple[float, float]] = (), counts: dict = COUNTS, image_tokens: int | None = None, **notes
) -> dict:
    """A 2-rank run of 6 steps of 0.5 s, 100 tokens and 4 samples each (``image_tokens`` of them image tokens),
    warmup 2 steps (ending 1 s into training, at time 1001), training from time 1000 to 1003, GPU 0's ``power``
    samples (time, watts); ``notes`` as the callback would make them. Its summary."""
    record = RunRecord(Journal(str(tmp_path / "run.journal.jsonl"), sync_interval=0.0), HEADER)
    record.note(train_start=1000.0, flops_counts=counts, peak_tflops=2e-6)
    for at, watts in power:
        record.record_many([(GPU_POWER, watts, None, {"gpu": 0})], at=at)
    for step in range(1, 7):
        images = [] if image_tokens is None else [(STEP_IMAGE_TOKENS, image_tokens, step, None)]
        record.record_many(
            [(STEP_TIME, 0.5, step, None), (STEP_TOKENS, 100, step, None), (STEP_SAMPLES, 4, step, None), *images]
        )
        if step == 2:
            record.note(warmup_steps=2, warmup_seconds=1.0)
    record.note(train_end=1003.0, **notes)
    dump = record.finish("ok", training_steps=6)
    assert validate_dump(dump) == []
    return dump["summary"]


def test_mfu_is_measured_throughput_times_the_formula_over_the_peak(tmp_path):
    summary = efficiency_run(tmp_path)
    flops = 4 * 1000 + 6 * 500 + 12 * 2 * 8 * 25.0  # 25 tokens per sample
    assert summary["model_flops_per_token"] == flops
    achieved = 200.0 * flops / 2 / 1e12  # 400 tokens in 2 s, over 2 devices
    assert summary["achieved_tflops_per_device"] == pytest.approx(achieved)
    assert summary["mfu"] == pytest.approx(achieved / 2e-6)
    assert summary["energy_joules"] is None and summary["energy_source"] is None  # no NVML
    assert summary["language_flops_per_token"] is None and summary["vision_flops_fraction"] is None  # text-only


def test_a_vision_model_s_mfu_adds_its_image_path_per_image_token_and_says_the_split(tmp_path):
    vision = {
        "vision_frozen_matmul_parameters": 0,
        "vision_trained_matmul_parameters": 300,
        "vision_layers": 1,
        "vision_attention_width": 4,
        "vision_sequence_length": 5,
    }
    summary = efficiency_run(tmp_path, counts={**COUNTS, **vision}, image_tokens=40)
    language = 4 * 1000 + 6 * 500 + 12 * 2 * 8 * 25.0
    per_image_token = 6 * 300 + 12 * 1 * 4 * 5
    assert summary["language_flops_per_token"] == language
    assert summary["vision_flops_per_image_token"] == per_image_token
    assert summary["model_flops_per_token"] == pytest.approx(language + per_image_token * 40 / 100)
    assert summary["vision_flops_fraction"] == pytest.approx(per_image_token * 0.4 / (language + per_image_token * 0.4))
    assert summary["mfu"] == pytest.approx(200.0 * summary["model_flops_per_token"] / 2 / 1e12 / 2e-6)


def test_a_vision_language_model_counts_its_image_path_apart(tmp_path):
    """The tiny LLaVA by hand: its Llama is the tiny Llama; its image path a CLIP tower (hidden 32, MLP 64, 2 layers;
    a 16x16 patch convolution without bias and a class token; norms before and after) over 4 patches and the class
    token, and the projector 32 → 64 → 64. Under LoRA on the language model no gradient reaches the image path: its
    forward only."""
    import peft

    model = AutoModelForImageTextToText.from_pretrained(build_tiny_vision_model(str(tmp_path), "llava"))
    layer = 4 * (32 * 32 + 32) + 2 * 2 * 32 + (32 * 64 + 64) + (64 * 32 + 32)
    image_path = 3 * 32 * 16 * 16 + 32 + 2 * 2 * 32 + 2 * layer + (32 * 64 + 64) + (64 * 64 + 64)
    language = tiny_llama_matmul_weights(model.config.text_config.vocab_size)
    shape = {"layers": 2, "attention_width": 64, "vision_layers": 2, "vision_attention_width": 32}
    counts = parameter_counts(model)
    assert counts == {
        **shape,
        "frozen_matmul_parameters": 0,
        "trained_matmul_parameters": language,
        "vision_frozen_matmul_parameters": 0,
        "vision_trained_matmul_parameters": image_path,
        "vision_sequence_length": 5,
    }
    assert vision_flops_per_image_token(counts) == 6 * image_path + 12 * 2 * 32 * 5
    lora = peft.get_peft_model(model, to_peft_config(LoraConfig(target_modules=VISION_LORA_TARGETS), None))
    counts = parameter_counts(lora)
    assert counts["vision_trained_matmul_parameters"] == 0 and counts["vision_frozen_matmul_parameters"] == image_path
    assert counts["frozen_matmul_parameters"] == language and counts["trained_matmul_parameters"] == LORA_WEIGHTS
    assert vision_flops_per_image_token(counts) == 2 * image_path + 4 * 2 * 32 * 5


def test_energy_is_the_counters_difference_after_the_warmup(tmp_path):
    summary = efficiency_run(
        tmp_path,
        energy_mj_at_train_start=[0.0, 0.0],
        energy_mj_at_warmup_end=[5_000.0, 7_000.0],
        energy_mj_at_train_end=[605_000.0, 907_000.0],
    )
    assert summary["energy_source"] == "nvml_energy_counter"
    assert summary["energy_joules_per_gpu"] == [600.0, 900.0] and summary["energy_joules"] == 1500.0
    assert summary["joules_per_token"] == 1500.0 / 400  # the 4 steps after the warmup


def test_without_a_counter_the_sampled_power_is_integrated_over_the_same_time(tmp_path):
    """GPU 0 draws 100 W, then from 1002 s on 300 W; sampled at 1000.5 (warmup: left out), 1001.5 and 1002.5, no
    sample at the window's edges (1001 and 1003). The linear integral held at the edges gives 400 J; the truth is
    100 + 300 J. GPU 1 has a counter, but one GPU without decides for all."""
    power = [(1000.5, 100.0), (1001.5, 100.0), (1002.5, 300.0)]
    summary = efficiency_run(
        tmp_path, power, energy_mj_at_warmup_end=[None, 0.0], energy_mj_at_train_end=[None, 5_000.0]
    )
    assert summary["energy_source"] == "integrated_power"
    assert summary["energy_joules_per_gpu"] == [pytest.approx(400.0)]
    assert summary["joules_per_token"] == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("forward", "fetch", "expected"),
    [
        ([0.1, 0.1], [0.16, 0.01], (0, "data")),
        ([0.1, 0.15, 0.1], [0.01, 0.01, 0.02], (1, "compute")),
        ([0.1, 0.105], [0.01, 0.01], (None, None)),  # within 10 %: no straggler
        ([0.1, 0.3], None, (1, "compute")),  # fetch not measurable: compute alone
        ([0.1], [0.5], (None, None)),  # one process
        ([0.1, None], [0.1, 0.1], (None, None)),
    ],
)
def test_the_straggler_is_the_rank_with_the_longest_own_time_and_its_larger_excess(forward, fetch, expected):
    assert straggler(forward, fetch) == expected


def test_rank_skew_is_the_slowest_over_the_fastest_forward_time(tmp_path):
    summary = efficiency_run(
        tmp_path, rank_forward_time_p50=[0.1, 0.25], rank_data_wait_p50=[0.01, 0.02], rank_data_fetch_p50=[0.01, 0.01]
    )
    assert summary["rank_skew"] == pytest.approx(2.5)
    assert summary["rank_forward_time_p50"] == [0.1, 0.25] and summary["rank_data_wait_p50"] == [0.01, 0.02]
    assert summary["rank_data_fetch_p50"] == [0.01, 0.01] and summary["data_fetch_unmeasurable"] is None
    assert (summary["straggler_rank"], summary["straggler_cause"]) == (1, "compute")
    assert summary["straggler_node"] is None  # one node


def test_across_nodes_the_straggler_s_node_is_the_slowest_node_and_the_report_names_it(tmp_path):
    places = [{"host": f"host-{node}", "node_rank": node, "ray_node_id": None} for node in (0, 0, 1, 1)]
    summary = efficiency_run(tmp_path, rank_forward_time_p50=[0.1, 0.1, 0.1, 0.3], rank_nodes=places)
    assert (summary["straggler_rank"], summary["straggler_node"], summary["rank_nodes"]) == (3, 1, places)
    assert report._straggler(summary) == "rank 3 on node 1: compute"


def test_across_nodes_each_node_s_figures_are_its_ranks_and_the_slowest_node_is_named_without_a_straggler(tmp_path):
    """4 ranks on 2 nodes: a node's throughput is its ranks' summed, its own time its slowest rank's (forward + fetch),
    its collective wait its ranks' median; the slowest node is named though no rank passes the straggler rule's 10 %.
    A run that gathered nothing (a node lost) has its nodes without figures; one node has none."""
    places = [{"host": f"host-{node}", "node_rank": node, "ray_node_id": f"ray-{node}"} for node in (0, 0, 1, 1)]
    summary = efficiency_run(
        tmp_path,
        rank_nodes=places,
        rank_forward_time_p50=[0.1, 0.1, 0.1, 0.105],
        rank_data_fetch_p50=[0.01, 0.02, 0.01, 0.01],
        rank_collective_wait_p50=[0.03, 0.02, 0.01, 0.05],
        rank_tokens_per_second=[50.0, 60.0, 40.0, 45.0],
    )
    assert summary["straggler_rank"] is None  # rank 1's 0.12 s is within 10 % of the others' median 0.11 s
    node_0, node_1 = summary["nodes"]
    assert (node_0["node_rank"], node_0["host"], node_0["ray_node_id"], node_0["ranks"]) == (
        0,
        "host-0",
        "ray-0",
        [0, 1],
    )
    assert node_1["ranks"] == [2, 3] and (node_0["tokens_per_second"], node_1["tokens_per_second"]) == (110.0, 85.0)
    assert (node_0["own_time_p50"], node_1["own_time_p50"]) == (pytest.approx(0.12), pytest.approx(0.115))
    assert (node_0["collective_wait_p50"], node_1["collective_wait_p50"]) == (pytest.approx(0.025), pytest.approx(0.03))
    assert summary["slowest_node"] == 0
    assert report._per_node(summary, "tokens_per_second", "{:.1f}") == "0: 110.0, 1: 85.0"
    lost = node_figures(places, {})
    assert [node["ranks"] for node in lost] == [[0, 1], [2, 3]] and slowest_node(lost) is None
    assert all(
        node[key] is None for node in lost for key in ("tokens_per_second", "own_time_p50", "collective_wait_p50")
    )
    assert node_figures(places[:2], {"rank_forward_time_p50": [0.1, 0.2]}) is None  # one node


def test_sampler_reads_the_energy_counter_of_each_gpu(monkeypatch):
    fake_nvml = load_fake_nvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("FAKE_NVML_DEVICES", raising=False)
    gpu = {"uuid": "GPU-a", "utilization": 1, "memory_used": 1, "power_mw": [1000], "enforced_limit_mw": 2000}
    fake_nvml.configure(
        [
            {**gpu, "energy_mj_per_read": 250},
            {**gpu, "uuid": "GPU-b", "unsupported": ["nvmlDeviceGetTotalEnergyConsumption"]},
        ]
    )
    sampler = SystemMetricsSampler(3600, lambda *_: None)
    sampler.start()
    assert sampler.energy_millijoules() == [250.0, None]
    assert sampler.energy_millijoules() == [500.0, None]
    sampler.stop()


def test_rank_times_sum_a_step_s_forward_passes_and_time_the_wait_for_its_batches(tiny_model):
    model = AutoModelForCausalLM.from_pretrained(tiny_model).train()
    model.register_forward_pre_hook(lambda *_: time.sleep(0.02))  # runs before RankTimes' hook: not timed
    times = RankTimes(model, torch.device("cpu"))
    model.register_forward_pre_hook(lambda *_: time.sleep(0.02))  # after it: timed
    batch = torch.ones((1, 4), dtype=torch.long)
    for step in (1, 2, 3):
        time.sleep(0.01 * step)  # the data wait
        times.batches_fetched(0.001 * step)
        times.batches_fetched(0.001)  # a step's batches may come in several fetches
        times.collective_waited(0.002 * step)
        times.step_begins(step)
        for _ in range(2):  # micro-batches
            model(input_ids=batch)
        times.collective_waited(0.001)  # the stop agreement, at the step's end
        times.step_ends(step)
        times.tokens_counted(step, 10 * step)  # counted once the step's total reached the host
    model.eval()
    model(input_ids=batch)  # evaluation: not timed
    figures = times.medians(after_step=1)
    forward, data_wait, data_fetch, fetch_share = figures[:4]
    assert 0.04 <= forward < 0.08  # two timed 20 ms sleeps, plus the tiny model's time
    assert 0.025 <= data_wait < 0.045  # the median of 20 ms and 30 ms
    assert data_fetch == pytest.approx(0.0035)  # the median of 3 ms and 4 ms
    # Each step's fetch over its own time (the wait and the forward passes): the median of steps 2 and 3's.
    shares = [times.data_fetch_seconds[step] / times.step_seconds[step] for step in (2, 3)]
    assert fetch_share == pytest.approx(statistics.median(shares)) and 0.02 < fetch_share < 0.1
    assert figures.collective_wait == pytest.approx(0.006)  # the median of steps 2 and 3's 5 and 7 ms
    busy = times.step_seconds[2] + times.step_seconds[3]
    assert figures.tokens_per_second == pytest.approx(50 / busy)  # steps 2 and 3's tokens over their time
    assert times.gather(after_step=1) == RankFigures(*([figure] for figure in figures))
    times.detach()


def test_per_rank_fetch_is_not_measurable_where_one_rank_dispatches_the_batches():
    """accelerate dispatches an iterable dataset's batches from rank 0 by default: with several ranks the dump says
    per-rank fetch is not measurable; a map-style dataset's loader, or one process, is measured."""
    from accelerate import Accelerator
    from torch.utils.data import DataLoader, IterableDataset

    class Stream(IterableDataset):
        def __iter__(self):
            return iter([torch.ones(2)] * 4)

    accelerator = Accelerator(cpu=True)
    streamed = accelerator.prepare_data_loader(DataLoader(Stream(), batch_size=2))
    mapped = accelerator.prepare_data_loader(DataLoader([torch.ones(2)] * 4, batch_size=2))
    assert _dispatched(streamed, world_size=2) == DISPATCHED_BATCHES and "not measurable" in DISPATCHED_BATCHES
    assert _dispatched(streamed, world_size=1) is None and _dispatched(mapped, world_size=2) is None
