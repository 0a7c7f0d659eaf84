"""benchmarks/gpu_check.py without a GPU: everything but CUDA itself runs here, so that a GPU run only confirms.

The whole check runs on the tiny model on CPU, with the stand-in NVML of tests/helpers/fake_nvml (in this process and,
through PYTHONPATH, in every job) and the OOM injected through bench_train's ``--callbacks`` (torch's own exception,
where a CPU cannot run out of GPU memory); the default model's size is counted on torch's meta device.
"""

import json
import statistics
import subprocess
import sys
from dataclasses import asdict

import pytest

from benchmarks import gpu_check, overhead
from tests.helpers.nvml import FAKE_NVML_DIR, load_fake_nvml
from tests.helpers.training import BENCH_TRAIN, REPO_ROOT, load_script, subprocess_env
from tuning.data.masking import IGNORE_INDEX, tokenize_and_mask
from tuning.utils.tiny_model import EOS, build_tokenizer, llama_config

TINY = gpu_check.Workload(
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    seq_length=32,
    batch_size=2,
    max_steps=4,
    warmup_steps=1,
    rounds=1,
    oom_batch_size=3,
    torch_dtype="float32",
    threads=1,
    system_metrics_interval=0.2,
)
# NVML's GPU 1 is the one the check runs on (CUDA_VISIBLE_DEVICES=1 in the check's own environment).
DEVICES = [
    {
        "uuid": "GPU-0a1b2c3d-0000-0000-0000-000000000000",
        "name": "Fake H200",
        "utilization": 5,
        "memory_used": 3 * 2**30,
        "power_mw": [90_000],
        "enforced_limit_mw": 700_000,
        "temperature": 30,
    },
    {
        "uuid": "GPU-9f8e7d6c-1111-1111-1111-111111111111",
        "name": "Fake H200",
        "utilization": 97,
        "memory_used": 60 * 2**30,
        "power_mw": [450_000, 510_000],
        "enforced_limit_mw": 600_000,
        "energy_mj_per_read": 9_000,
        "temperature": 66,
    },
]


def test_without_cuda_it_says_so_in_one_line_and_exits_0(tmp_path, capsys):
    """main's result is the script's exit status (``sys.exit(main())``)."""
    output = tmp_path / "gpu_check.md"
    assert gpu_check.main(["--output", str(output)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "gpu_check: no CUDA device here (torch.cuda.is_available() is False), so nothing to check"
    ]
    assert not output.exists()


def test_flags_that_leave_no_step_to_measure_are_refused(capsys):
    with pytest.raises(SystemExit) as exited:
        gpu_check.parse_args(["--max_steps", "11", "--warmup_steps", "10"])
    assert exited.value.code == 2
    assert "--warmup_steps must leave at least two of --max_steps" in capsys.readouterr().err
    assert gpu_check.parse_args(["--max_steps", "12", "--warmup_steps", "10"]).max_steps == 12


def test_the_default_model_has_about_a_billion_parameters(tmp_path):
    """The full-size config, counted on the meta device (no memory, no time): what the GPU run will build."""
    import torch
    from transformers import AutoModelForCausalLM

    workload = gpu_check.Workload()
    tokenizer = build_tokenizer(str(tmp_path), model_max_length=workload.seq_length)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(llama_config(tokenizer, **workload.model_shape()))
    parameters = sum(parameter.numel() for parameter in model.parameters())
    low, high = gpu_check.MODEL_PARAMETERS
    assert low <= parameters <= high, parameters
    assert model.config.max_position_embeddings >= workload.seq_length


def test_the_model_is_built_in_its_dtype_and_counted(tmp_path):
    from transformers import AutoModelForCausalLM

    workload = gpu_check.Workload(**{**asdict(TINY), "torch_dtype": "bfloat16"})
    built = gpu_check.build_model(tmp_path / "model", workload)
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    assert built["parameters"] == sum(parameter.numel() for parameter in model.parameters())
    assert built["dtypes"] == ["BF16"] and built["seconds"] > 0
    assert model.config.num_hidden_layers == 2 and model.config.max_position_embeddings == 32


def test_every_example_fills_the_sequence_with_a_response_to_train_on(tmp_path):
    tokenizer = build_tokenizer(str(tmp_path / "tokenizer"), model_max_length=64)
    path = gpu_check.build_dataset(tmp_path / "train.jsonl", records=6, seq_length=64, seed=3)
    texts = [json.loads(line)["output"] + EOS for line in path.read_text().splitlines()]
    dataset = tokenize_and_mask(texts, tokenizer, 64, overhead.RESPONSE_TEMPLATE)
    assert len(dataset) == 6
    assert all(len(input_ids) == 64 for input_ids in dataset["input_ids"])  # cut to the length: no padding
    assert all(sum(label != IGNORE_INDEX for label in labels) > 32 for labels in dataset["labels"])  # mostly response
    again = gpu_check.build_dataset(tmp_path / "again.jsonl", records=6, seq_length=64, seed=3)
    other = gpu_check.build_dataset(tmp_path / "other.jsonl", records=6, seq_length=64, seed=4)
    assert again.read_text() == path.read_text() != other.read_text()


def synthetic_job(
    arm: str, round_index: int, step_s: float, loop_s: float, losses: list[str], peak: int | None
) -> gpu_check.Job:
    """A job whose first two steps take 10x longer (warm-up) and the rest ``step_s`` each; losses as logged."""
    durations = [10 * step_s] * 2 + [step_s] * 8
    ends = [5.0 + sum(durations[: index + 1]) for index in range(len(durations))]
    run = overhead.Run("gpu", arm, round_index, loop_s + 10, loop_s, statistics.median(durations), losses, ends)
    return run, peak


def test_throughput_figures_are_per_round_ratios_of_the_steps_after_the_warmup():
    workload = gpu_check.Workload(**{**asdict(TINY), "max_steps": 10, "warmup_steps": 2, "rounds": 3})
    trl_losses = [2.0, 1.5, 1.25, 1.0]
    jobs = []
    timings = [((0.100, 10.0), (0.102, 10.05)), ((0.200, 20.0), (0.196, 20.3)), ((0.100, 10.0), (0.103, 10.2))]
    for round_index, ((trl_step, trl_loop), (bench_step, bench_loop)) in enumerate(timings):
        trl_logged = [f"{loss:.4f}" for loss in trl_losses]
        jobs.append(synthetic_job("trl", round_index, trl_step, trl_loop, trl_logged, 10 * 2**30))
        bench_losses = [f"{loss * (1.004 if round_index == 1 else 1.0):.4f}" for loss in trl_losses]
        jobs.append(synthetic_job("bench_train", round_index, bench_step, bench_loop, bench_losses, 10 * 2**30 + 2**20))
    summary = gpu_check.throughput_summary(jobs, workload)
    assert summary["rounds"] == 3
    assert summary["step_time_ratio"] == pytest.approx(1.02)  # the median of 1.02, 0.98, 1.03
    assert summary["tokens_per_second_ratio"] == pytest.approx(1 / 1.02)
    assert summary["step_s"] == {"trl": pytest.approx(0.1), "bench_train": pytest.approx(0.103)}
    assert summary["tokens_per_second"]["trl"] == pytest.approx(workload.tokens_per_step / 0.1)
    assert summary["peak_reserved_bytes"] == {"trl": 10 * 2**30, "bench_train": 10 * 2**30 + 2**20}
    assert summary["max_loss_difference"] == pytest.approx(0.004)
    assert summary["loop_ratio"] == pytest.approx(1.015)  # the median of 1.005, 1.015, 1.02
    assert summary["loop_s"] == {"trl": 10.0, "bench_train": 10.2}
    rows = {row.figure: row for row in gpu_check.throughput_rows({"throughput": summary})}
    assert not rows["tokens/s, bench_train ÷ bare TRL"].ok and not rows["step time, bench_train ÷ bare TRL"].ok
    loop_row = rows["loop (train_runtime), bench_train ÷ bare TRL: our share of the loop"]
    assert not loop_row.ok and loop_row.value.endswith(f"ours +{100 * (1 - 1 / 1.015):.2f} %")
    assert rows["peak GPU memory (torch, reserved)"].ok and rows["same work: per-step losses against bare TRL's"].ok


def test_failed_steps_become_failed_rows_and_the_table_escapes_pipes():
    results = {
        "workload": asdict(gpu_check.Workload()),
        "attention": "sdpa",
        "gpu": {"uuid": None, "name": None, "power_limit_watts": None},
        "versions": {"torch": "2.13.0", "cuda": "12.8"},
        "model": {"error": "OSError: disk full"},
        "throughput": {"error": "RuntimeError: trl run 0 failed (exit 1); stderr ends with:"},
        "dump": {"error": "FileNotFoundError: metrics.json"},
        "oom": {"error": "TimeoutExpired: 300 s"},
        "profile": {"error": "CalledProcessError: exit 1"},
        "padding_free": {"error": "CalledProcessError: exit 1"},
        "seconds": 600.0,
    }
    rows = gpu_check.table_rows(results)
    failed = [row for row in rows if row.value.startswith("failed: ")]
    assert [row.ok for row in failed] == [False] * 6
    assert rows[-1].value == "10 min 0 s" and rows[-1].ok is False
    table = gpu_check.markdown([*rows, gpu_check.Row("a | b", "1 | 2", "", None)]).splitlines()
    assert table[:2] == ["| figure | value | target | ✓/✗ |", "|---|---|---|---|"]
    assert table[-1] == "| a \\| b | 1 \\| 2 |  |  |"
    assert table[3] == "| model | failed: OSError: disk full | completes | ✗ |"


@pytest.fixture
def fake_gpus(monkeypatch):
    """The stand-in NVML in this process (sys.modules) and in every job (PYTHONPATH), with NVML's GPU 1 visible."""
    monkeypatch.setenv("FAKE_NVML_DEVICES", json.dumps(DEVICES))
    monkeypatch.setenv("PYTHONPATH", f"{FAKE_NVML_DIR}:{REPO_ROOT}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    monkeypatch.setitem(sys.modules, "pynvml", load_fake_nvml())


@pytest.mark.slow
def test_the_whole_check_runs_on_cpu_with_stand_ins_for_nvml_and_the_oom(tmp_path, fake_gpus):
    gpu = gpu_check.find_gpu()
    assert (gpu.uuid, gpu.name, gpu.power_limit_watts) == (DEVICES[1]["uuid"], "Fake H200", 600.0)
    try:
        results = gpu_check.run_check(
            TINY,
            tmp_path / "work",
            gpu,
            "sdpa",
            warmup_round=False,
            oom_flags=("--callbacks", "tests.helpers.bench_callbacks:OutOfMemoryOnLastRank"),
        )
    finally:
        gpu.close()
    for step in ("model", "throughput", "dump", "oom", "profile", "padding_free"):
        assert "error" not in results[step], results[step]

    # Both arms trained the same batches: identical losses on CPU; no CUDA, so no peaks.
    throughput = results["throughput"]
    assert throughput["rounds"] == 1 and throughput["max_loss_difference"] == 0
    assert throughput["peak_reserved_bytes"] == {"trl": None, "bench_train": None}
    assert [run["arm"] for run in results["runs"]] == ["trl", "bench_train"]
    for run in results["runs"]:
        assert len(run["step_ends"]) == TINY.max_steps and run["peak_reserved_bytes"] is None

    # bench_train sampled NVML's GPU 1, named by its UUID, as {"gpu": 0}.
    dump = results["dump"]
    assert dump["gpu_contexts"] == ['{"gpu": 0}']
    assert all(count >= 1 for count in dump["samples"].values())
    assert dump["utilization_max"] == 97 and dump["memory_used_max_bytes"] == 60 * 2**30
    assert 450 <= dump["power_avg_watts"] <= 510
    assert dump["power_avg_percent"] == pytest.approx(100 * dump["power_avg_watts"] / 600)
    assert dump["tokens_per_step"] == [TINY.tokens_per_step] and dump["cuda"] is None
    # The estimate against the measured peak runs here too (torch's tracker on the CPU, max_memory_allocated on a GPU).
    assert dump["estimate"]["peak_bytes_per_device"] > 0 and dump["peak_tensor_bytes"] > 0, dump["estimate"]
    assert dump["memory_estimate_ratio"] == dump["estimate"]["peak_bytes_per_device"] / dump["peak_tensor_bytes"]

    oom = results["oom"]
    assert (oom["exit_code"], oom["dump_category"]) == (204, "gpu_oom"), oom["stderr_tail"]
    assert oom["termination_log"].startswith("gpu_oom: OutOfMemoryError: CUDA out of memory.")
    assert oom["memory_before_bytes"] == oom["memory_after_bytes"] == 60 * 2**30 and oom["freed_after_s"] < 1
    assert oom["oom_snapshot"]["missing"] == "no CUDA device was recording: a memory snapshot needs one"

    # The step anatomy's parts sum to the step time; the profile job traced its window, without CUDA's parts.
    assert dump["parts_sum_ratio"] == pytest.approx(1, abs=0.05) and dump["bound_by"] is not None
    profile = results["profile"]
    assert profile["profile"]["profiled_steps"] == list(gpu_check.PROFILE_WINDOW) and profile["trace_bytes"] > 0
    assert profile["profile"]["top_ops"]["cpu"] and profile["memory_snapshot_bytes"] is None

    rows = {row.figure: row for row in gpu_check.table_rows(results)}
    assert rows["caching allocator overhead (reserved − allocated)"].value == "—"  # no CUDA here
    expected = {
        'NVML series under {"gpu": 0}, GPU named by UUID (GPU-9f8e7d6c-1111-1111-1111-111111111111)': True,
        "GPU utilisation while training (max)": True,
        "GPU power while training (mean)": True,
        "bench_train's tokens per step": True,
        "same work: per-step losses against bare TRL's": True,
        "OOM job (batch 3): exit code": True,
        "OOM job (batch 3): category in the dump / termination log": True,
        "OOM job (batch 3): GPU memory in use after it, against before": True,
        "random-initialised Llama: parameters": False,  # tiny and float32
        "peak GPU memory (torch, reserved)": False,  # no CUDA here
        "CUDA peak memory in the dump's summary": False,
        "GPU memory used by NVML (max) against CUDA's reserved peak": False,
        "MFU in the dump (dense bf16 peak from the datasheet table)": False,  # CPU: no peak, no MFU
        "energy per token in the dump": True,
        "energy source": True,  # the stand-in's counter
        "step anatomy: the parts' sum ÷ the step time (median)": True,
        "profile job (steps 2-3): trace and top operators": False,  # no CUDA operators here
        "profile job (steps 2-3): the window's CUDA memory snapshot": False,
        "OOM job (batch 3): memory snapshot at the failure": False,
    }
    assert {figure: rows[figure].ok for figure in expected} == expected
    padding_free = results["padding_free"]  # one measured round of each arm, on data whose batches need padding
    assert [len(runs) for runs in padding_free["runs"].values()] == [1, 1] and padding_free["ratio"] > 0
    row = rows["tokens/s, padding-free ÷ padded (sdpa, responses 1/8-1× of the sequence)"]
    assert row.value.startswith(f"{padding_free['ratio']:.3f}×") and row.ok is None  # sdpa: a figure, no target
    timed_rows = {"tokens/s, bench_train ÷ bare TRL", "step time, bench_train ÷ bare TRL", "whole check"}
    assert {*timed_rows, "loop (train_runtime), bench_train ÷ bare TRL: our share of the loop"} <= set(rows)

    output = tmp_path / "report" / "gpu_check.md"
    gpu_check.write_report(list(rows.values()), results, output)
    table = output.read_text()
    assert table.startswith("| figure | value | target | ✓/✗ |\n") and table.count("\n") == len(rows) + 2
    assert json.loads(output.with_suffix(".json").read_text())["oom"]["exit_code"] == 204


def test_the_makefile_target_runs_the_check_in_the_project_venv():
    """``make -n`` prints the recipe without running it: the nvml extra where pynvml is missing, then the module
    (no directory lines, which a make run from another make, as under ``make test``, would add)."""
    result = subprocess.run(
        ["make", "--no-print-directory", "-n", "-W", "setup.py", "gpu-check"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[-2:] == [
        ".venv/bin/python -c 'import pynvml' 2>/dev/null || .venv/bin/python -m pip install --quiet -e '.[nvml]'",
        ".venv/bin/python -m benchmarks.gpu_check",
    ]
    assert "python3 -m venv .venv" in lines[0]  # a new .venv is made the same way as for make test


@pytest.mark.parametrize("attention", ["sdpa", gpu_check.FLASH_ATTENTION])
def test_both_arms_parse_the_check_s_settings_over_the_overhead_benchmark_s(tmp_path, monkeypatch, attention):
    """The flags appended to overhead.py's commands win (bf16 instead of float32, the check's data), in each arm's
    own parser, at the default (GPU) size. transformers refuses bf16 without a GPU that has it: a stand-in says
    there is one."""
    import transformers.training_args
    from transformers import HfArgumentParser
    from trl import SFTConfig

    monkeypatch.setattr(transformers.training_args, "is_torch_bf16_gpu_available", lambda: True)

    workload, data = gpu_check.Workload(), tmp_path / "train.jsonl"
    bare_command = gpu_check.job_command("trl", workload, tmp_path / "model", data, tmp_path / "trl", attention)
    bare_trl = load_script(REPO_ROOT / "benchmarks" / "bare_trl.py")
    bare, config = HfArgumentParser((bare_trl.BareArguments, SFTConfig)).parse_args_into_dataclasses(bare_command[2:])
    assert (bare.training_data_path, bare.torch_dtype, bare.attn_implementation) == (str(data), "bfloat16", attention)
    assert (config.bf16, config.per_device_train_batch_size, config.max_steps, config.max_length) == (True, 8, 60, 1024)

    bench_command = gpu_check.job_command(
        "bench_train", workload, tmp_path / "model", data, tmp_path / "bench", attention
    )
    bench_train = load_script(BENCH_TRAIN)
    flags, args = bench_train.benchmarking.parse_command_line(bench_train.BenchmarkFlags, bench_command[2:])
    assert (flags.system_metrics_interval, flags.skip_warmup_steps) == (1.0, 10)
    assert (args.data_args.training_data_path, args.model_args.torch_dtype) == (str(data), "bfloat16")
    assert args.model_args.use_flash_attn == (attention == gpu_check.FLASH_ATTENTION)
    train_args = args.training_args
    assert (train_args.bf16, train_args.per_device_train_batch_size, train_args.max_steps) == (True, 8, 60)
    assert train_args.max_seq_length == 1024 and train_args.trackers == ["aim"]


def minimal_dump(**summary) -> dict:
    """A dump with no series, and a summary holding the keys dump_summary reads plus ``summary``."""
    return {"aggregates": [], "metrics": [], "summary": {"cuda": None, "tokens_per_second": 100.0, **summary}}


def test_padding_free_row_has_a_target_only_with_flash_attention():
    measured = {"tokens_per_second": {"padded": 1000.0, "padding_free": 1500.0}, "ratio": 1.5}
    (flash,) = gpu_check.padding_free_rows({"padding_free": measured, "attention": gpu_check.FLASH_ATTENTION})
    (sdpa,) = gpu_check.padding_free_rows({"padding_free": measured, "attention": "sdpa"})
    assert (flash.value, flash.target, flash.ok) == ("1.500× (1,500 vs 1,000)", "> 1×", True)
    assert (sdpa.target, sdpa.ok) == ("", None)
    slower = {**measured, "ratio": 0.9}
    assert gpu_check.padding_free_rows({"padding_free": slower, "attention": gpu_check.FLASH_ATTENTION})[0].ok is False


def test_varied_data_needs_padding_and_the_job_is_one_epoch(tmp_path):
    path = gpu_check.build_varied_dataset(tmp_path / "varied.jsonl", 40, 64, seed=1)
    lengths = [len(json.loads(line)["output"].split()) for line in path.read_text().splitlines()]
    assert len(lengths) == 40 and max(lengths) - min(lengths) > 32
    command = gpu_check.padding_free_command(TINY, tmp_path / "m", path, tmp_path / "pf", "sdpa")
    flags = dict(zip(command[3::2], command[4::2], strict=True))
    assert int(flags["--max_steps"]) * int(flags["--batch_size"]) == TINY.batch_size * gpu_check.PADDING_FREE_STEPS
    assert flags["--use_flash_attn"] == "False" and flags["--data_path"] == str(path)


def test_mfu_and_energy_rows_judge_the_dump_s_efficiency_keys():
    efficiency = {"mfu": 0.4213, "peak_tflops_per_device": 989.0, "joules_per_token": 0.01234}
    measured = gpu_check.dump_summary(minimal_dump(**efficiency, energy_source="nvml_energy_counter", rank_skew=1.0))
    assert [(row.value, row.ok) for row in gpu_check.efficiency_rows(measured)] == [
        ("42.1 % of 989 TFLOP/s", True),
        ("0.0123 J/token", True),
        ("nvml_energy_counter", True),
    ]
    unmeasured = gpu_check.dump_summary(minimal_dump(mfu=None, joules_per_token=None, energy_source="integrated_power"))
    assert [(row.value, row.ok) for row in gpu_check.efficiency_rows(unmeasured)] == [
        ("—", False),
        ("—", False),
        ("integrated_power", False),
    ]


def test_a_cpu_rehearsal_fails_only_on_a_step_that_failed():
    missed = [gpu_check.Row("GPU", "Fake H200"), gpu_check.Row("tokens/s", "0.8×", "≥ 0.99×", False)]
    assert gpu_check.exit_code(missed, cpu_rehearsal=True) == 0
    assert gpu_check.exit_code(missed, cpu_rehearsal=False) == 1
    failed = [*missed, gpu_check.Row("model", f"{gpu_check.FAILED}OSError: disk full", "completes", False)]
    assert gpu_check.exit_code(failed, cpu_rehearsal=True) == 1
    assert gpu_check.exit_code(missed[:1], cpu_rehearsal=False) == 0


def test_the_gpu_machine_list_pins_what_it_was_read_with_and_lacks_what_the_wheels_carry():
    gpu_wheels = load_script(REPO_ROOT / "benchmarks" / "gpu_wheels.py")
    packages = gpu_wheels.machine_packages()
    assert (packages["torch"], packages["transformers"], packages["huggingface-hub"]) == ("2.11.0", "5.17.0", "1.33.0")
    assert packages["peft"] is None and packages["nvidia-ml-py"] is None  # there, version not read yet
    assert not {"trl", "fire", "datasets", "aim", "pydantic"} & set(packages)
    assert gpu_wheels.requirement_name("aim-ui==3.29.1") == "aim-ui"
    assert gpu_wheels.requirement_name("RestrictedPython>=5.1; extra == 'x'") == "restrictedpython"


def test_the_device_script_without_wheels_says_so_and_exits_3(tmp_path):
    """Run where no .whl/ was carried: nothing is installed or trained, and $OUT gets the log saying why."""
    result = subprocess.run(
        ["bash", str(REPO_ROOT / "benchmarks" / "gpu_device.sh"), "--quick"],
        cwd=tmp_path,
        env=subprocess_env(OUT=str(tmp_path / "out")),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 3
    message = "gpu_device: no wheels in .whl/ (run `make gpu-wheels` where the registry is reachable, carry .whl)"
    assert message in result.stdout  # with $OUT set, the script's stderr goes to its log and the log to stdout
    assert message in (tmp_path / "out" / "gpu_device.log").read_text()


@pytest.mark.slow
@pytest.mark.skipif(
    not (REPO_ROOT / ".whl" / "gpu_machine_closure.txt").exists(),
    reason="no .whl/ here: `make gpu-wheels` (needs the package registry) makes it, then this rehearses the GPU run",
)
def test_the_rehearsal_runs_the_check_from_the_carried_wheels_alone():
    """``make gpu-rehearsal``: Python 3.12 with torch 2.11 and the GPU machine's versions, the registry out of reach,
    and gpu_device.sh installing .whl/ into a temporary folder: every step of the check completes on CPU."""
    out = REPO_ROOT / ".gpu-rehearsal" / "out"
    result = subprocess.run(
        ["make", "--no-print-directory", "gpu-rehearsal"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=1800
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    log = (out / "gpu_device.log").read_text()
    versions = dict(line.split(None, 1) for line in log.splitlines() if line.startswith("  ") and "==" in line)
    assert versions["torch==2.11.0"].endswith("/.gpu-rehearsal/venv/lib/python3.12/site-packages")
    assert versions["transformers==5.17.0"] == versions["torch==2.11.0"]
    carried = {name for name in versions if name.split("==")[0] in ("trl", "datasets", "aim", "fire", "pydantic")}
    assert len(carried) == 5 and all(versions[name].startswith("/tmp/gpu-device-site.") for name in carried)
    results = json.loads((out / "gpu_check.json").read_text())
    assert all("error" not in results[step] for step in ("model", "throughput", "dump", "oom")), results
    assert results["versions"]["torch"].startswith("2.11.0") and results["oom"]["exit_code"] == 204
    assert (out / "gpu_check.md").read_text().startswith("| figure | value | target | ✓/✗ |\n")
    assert "=== oom/stderr.log" in (out / "gpu_jobs.log").read_text()
