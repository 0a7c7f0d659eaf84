"""tuning.launch end to end: 2 real torch.distributed ranks (CPU, gloo) on the tiny model, real faults injected
through bench_train's --callbacks, real signals; and SIGTERM/SIGINT from the first line of the CLIs."""

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.helpers.bench import bench_args, read_dump, start_bench
from tests.helpers.training import (
    BENCH_CALLBACKS,
    BENCH_TRAIN,
    REPO_ROOT,
    SFT_TRAINER,
    Job,
    cli_args,
    free_port,
    markers,
    run_python,
    start_launch,
    termination_lines,
    two_ranks,
    wait_for_steps,
    worker_pid,
)
from tuning.benchmarking.journal import read_journal
from tuning.launch import K8S_TERMINATION_MESSAGE_MAX_BYTES, RankFailure, termination_message

pytestmark = pytest.mark.slow  # subprocesses, servers, torchrun ranks: not in make test-fast

MANIFEST = REPO_ROOT / "docs" / "kubernetes" / "job.yaml"
COLLECTIVE_FAULT = REPO_ROOT / "tests" / "helpers" / "collective_fault.py"


def slow_bench_args(model: str, tmp_path: Path) -> list[str]:
    """bench_train on 2 ranks, long enough to be stopped or killed mid-training."""
    return bench_args(
        model,
        tmp_path,
        max_steps=200,
        per_device_train_batch_size=2,
        tracker="none",
        callbacks=f"{BENCH_CALLBACKS}:SlowSteps",
    )


def check_pod_log(tmp_path: Path) -> list[str]:
    text = (tmp_path / "termination-log").read_text(encoding="utf-8")
    assert len(text.encode()) <= K8S_TERMINATION_MESSAGE_MAX_BYTES
    return text.splitlines()


def test_container_entrypoint_runs_a_large_job_config_on_two_ranks(tiny_model, tmp_path):
    """No script, the job config from a file, 200 KB of it exp_metadata (more than an environment variable can carry
    to exec: the workers get it another way): 8 examples, batch 2, one epoch are 2 steps on 2 ranks (4 on 1); a
    launcher key the launcher does not take is named in a warning. (The base64 variable's decoding is
    get_json_config's, tested in-process.)"""
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"output": f"### Input: q{i}\n\n### Response: a{i}"}) + "\n" for i in range(8)))
    config = {
        "model_name_or_path": tiny_model,
        "training_data_path": str(data),
        "dataset_text_field": "output",
        "response_template": "\n### Response:",
        "output_dir": str(tmp_path / "out"),
        "num_train_epochs": 1,
        "per_device_train_batch_size": 2,
        "logging_strategy": "steps",
        "logging_steps": 1,
        "save_strategy": "no",
        "torch_dtype": "float32",
        "use_flash_attn": False,
        "exp_metadata": json.dumps({"notes": "x" * 200_000}),
        "accelerate_launch_args": {"num_processes": 2, "main_process_port": 29555},
        "save_model_dir": str(tmp_path / "final"),
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    launcher = start_launch([], tmp_path, SFT_TRAINER_CONFIG_JSON_PATH=str(tmp_path / "config.json"))
    stderr = launcher.finish()
    assert launcher.returncode == 0, stderr[-3000:]
    assert "tuning.launch ignores accelerate_launch_args.main_process_port; give torchrun flags" in stderr
    assert not (tmp_path / "termination-log").exists()  # a clean run writes nothing
    records = [json.loads(line) for line in (tmp_path / "out" / "training_logs.jsonl").read_text().splitlines()]
    assert [record["data"]["step"] for record in records if record["name"] == "training_loss"] == [1, 2]
    assert (tmp_path / "final" / "model.safetensors").exists()


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (["--nproc_per_node", "0", SFT_TRAINER], "--nproc_per_node must be a positive integer or one of auto, cpu"),
        (["missing/train.py", "--max_steps", "1"], "the script to run, missing/train.py, is not a file"),
    ],
)
def test_bad_launcher_arguments_are_a_user_error_before_any_worker_starts(args, reason, tmp_path):
    launcher = start_launch(args, tmp_path)
    stderr = launcher.finish(timeout=120)
    assert launcher.returncode == 1, stderr[-3000:]
    (line,) = check_pod_log(tmp_path)
    assert line.startswith(f"user_error: UserInputError: {reason}"), line
    assert "Traceback" not in stderr and "torch/distributed" not in stderr


def test_gpu_oom_on_rank_1_is_the_pods_exit_code_and_first_line(bench_runs):
    """bench_runs' ranks-b2: bench_train on 2 ranks under tuning.launch, as a pod runs it (batch size 2, 6 steps),
    rank 1 out of memory at step 2. (The same job's files are the report's 2-rank run in
    tests/wrappers/test_bench_report.py.)"""
    runs_dir, stderr = bench_runs.dir, bench_runs.stderr["ranks-b2"]
    assert bench_runs.returncodes["ranks-b2"] == 204, stderr[-3000:]
    first, second = check_pod_log(bench_runs.logs["ranks-b2"])
    assert first.startswith("gpu_oom: rank 1: OutOfMemoryError: CUDA out of memory")
    # What rank 0 saw depends on timing: its lost peer (communication) or the agent's SIGTERM (interrupted).
    assert second.startswith(("communication: rank 0: ", "interrupted: rank 0: "))
    # Each rank's own report: rank 1's error report and TUNING_ERROR line, rank 0's dump with its own, truthful error.
    assert "TUNING_ERROR category=gpu_oom rank=1 step=2 exit_code=204" in stderr
    report = json.loads((runs_dir / "ranks-b2.json.rank1.error.json").read_text())
    assert report["category"] == "gpu_oom" and report["rank"] == 1 and report["global_step"] == 2
    assert "injected by the test" in report["message"] and report["world_size"] == 2
    dump = read_dump(runs_dir / "ranks-b2.json")
    assert dump["error"]["rank"] == 0 and dump["error"]["category"] in ("communication", "interrupted")
    assert dump["status"] == ("interrupted" if dump["error"]["category"] == "interrupted" else "error")
    assert not (runs_dir / "ranks-b2.json.rank0.error.json").exists()


def test_rank_killed_by_sigkill_is_the_root_cause(tiny_model, tmp_path):
    """The survivor does not hang until --ddp_timeout: it reports what it saw and the pod ends well within it."""
    launcher = start_launch(two_ranks(BENCH_TRAIN, slow_bench_args(tiny_model, tmp_path)), tmp_path)
    wait_for_steps(tmp_path / "bench.journal.jsonl", 2, launcher)
    started = time.monotonic()
    os.kill(worker_pid(launcher, 1), signal.SIGKILL)
    stderr = launcher.finish()
    assert time.monotonic() - started < 60  # far below --ddp_timeout's default plus torchrun's grace period
    assert launcher.returncode == 128 + signal.SIGKILL, stderr[-3000:]
    first, second = check_pod_log(tmp_path)
    assert first.startswith("interrupted: rank 1: killed by SIGKILL, without an error report of its own")
    assert second.startswith(("communication: rank 0: ", "interrupted: rank 0: "))
    assert not (tmp_path / "bench.json.rank1.error.json").exists()


def test_two_nodes_on_loopback_each_pod_reports_the_root_cause_its_node_saw(tmp_path):
    """Two launchers as the two pods of a PyTorchJob or TrainJob (torchrun reads the PET_* variables the operators
    set): one job of 2 ranks, one per node. Node 1's rank fails with a user error after a first all-reduce: node 1's
    pod exits 1 with that line, naming its node; node 0's pod exits 206 with the communication error its rank saw
    losing the peer, naming node 0 (its launcher sees its own workers only)."""
    port = str(free_port())
    nodes = []
    for node in (0, 1):
        pet = {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "1", "PET_NODE_RANK": str(node)}
        pet |= {"PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": port}
        nodes.append(start_launch([str(COLLECTIVE_FAULT)], tmp_path / f"node{node}", **pet))
    stderrs = [launcher.finish() for launcher in nodes]
    assert [launcher.returncode for launcher in nodes] == [206, 1], [stderr[-2000:] for stderr in stderrs]
    outputs = [(tmp_path / f"node{node}" / "stdout").read_text() for node in (0, 1)]
    assert outputs == [f"rank {node} of 2 on node {node}: sum 1\n" for node in (0, 1)]  # one job, a rank per node
    (node_1_line,) = check_pod_log(tmp_path / "node1")
    assert node_1_line.startswith("user_error: rank 1: node 1 (") and "the data of node 1 is not what" in node_1_line
    (node_0_line,) = check_pod_log(tmp_path / "node0")
    # gloo words the lost peer as "closed" or "reset", depending on which read first finds the socket gone.
    assert node_0_line.startswith("communication: rank 0: node 0 (")
    assert re.search(r"Connection (closed|reset) by peer", node_0_line), node_0_line


def test_a_node_that_never_joins_ends_the_job_within_the_rendezvous_timeout(tmp_path):
    """Node 0 of 2 on loopback, node 1 never started, the rendezvous timeout 3 s as a pod sets it (PET_RDZV_CONF):
    no worker starts; the launcher ends within the timeout and a margin, as a communication error naming its node
    and how many nodes joined, in the pod's termination log and on stderr."""
    port = free_port()
    pet = {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "1", "PET_NODE_RANK": "0", "PET_RDZV_CONF": "timeout=3"}
    started = time.monotonic()
    launcher = start_launch(
        [str(COLLECTIVE_FAULT)], tmp_path, PET_MASTER_ADDR="127.0.0.1", PET_MASTER_PORT=str(port), **pet
    )
    stderr = launcher.finish()
    assert time.monotonic() - started < 3 + 8 and launcher.returncode == 206, stderr[-2000:]
    (line,) = check_pod_log(tmp_path)
    assert line.startswith("communication: node 0 (")
    assert line.endswith(f"): only 1 of 2 nodes joined the rendezvous at 127.0.0.1:{port} within 3 s"), line
    assert line in stderr and not (tmp_path / "stdout").read_text()  # no worker ran


def test_bad_input_on_every_rank_exits_1(tiny_model, tmp_path):
    args = cli_args(tiny_model, str(tmp_path / "out"), data=str(tmp_path / "missing.jsonl"))
    launcher = start_launch(two_ranks(SFT_TRAINER, args), tmp_path)
    stderr = launcher.finish()
    assert launcher.returncode == 1, stderr[-3000:]
    lines = check_pod_log(tmp_path)
    assert len(lines) == 2 and lines[0].startswith("user_error: rank ")
    assert "data file not found" in lines[0]
    assert {line.split(": ")[1] for line in lines} == {"rank 0", "rank 1"}


def test_sigterm_to_the_launcher_stops_every_rank_and_exits_143(tiny_model, tmp_path):
    launcher = start_launch(two_ranks(BENCH_TRAIN, slow_bench_args(tiny_model, tmp_path)), tmp_path)
    wait_for_steps(tmp_path / "bench.journal.jsonl", 2, launcher, signal.SIGTERM)
    stderr = launcher.finish()
    assert launcher.returncode == 143, stderr[-3000:]
    assert check_pod_log(tmp_path) == ["interrupted: SignalInterrupt: stopped by SIGTERM"]
    last_marker = [line for line in stderr.splitlines() if line.startswith("TUNING_ERROR ")][-1]
    assert last_marker.startswith("TUNING_ERROR category=interrupted rank=launcher step=- exit_code=143")
    dump = read_dump(tmp_path / "bench.json")
    rank1 = json.loads((tmp_path / "bench.json.rank1.error.json").read_text())
    assert dump["status"] == "interrupted" and dump["error"]["category"] == rank1["category"] == "interrupted"
    assert dump["error"]["global_step"] == rank1["global_step"] == dump["training_steps"] >= 2  # the agreed step
    assert sorted(path.name for path in tmp_path.glob("bench*.json")) == ["bench.json", "bench.json.rank1.error.json"]


def handles_sigterm(pid: int) -> bool:
    """Whether the process has installed a SIGTERM handler (its caught-signals mask in /proc)."""
    status = Path(f"/proc/{pid}/status").read_text()
    caught = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
    return bool(caught >> (signal.SIGTERM - 1) & 1)


def signal_once_handled(process: subprocess.Popen, signum: int, after: float) -> None:
    """Send ``signum`` ``after`` seconds after the start, once the process has its handlers (not before)."""
    started = time.monotonic()
    while not handles_sigterm(process.pid):
        assert process.poll() is None and time.monotonic() - started < 60, "no SIGTERM handler installed"
        time.sleep(0.05)
    time.sleep(max(0.0, started + after - time.monotonic()))
    process.send_signal(signum)


CONSOLE_SCRIPT = "import sys; from tuning.launch import sft_trainer_main; sys.exit(sft_trainer_main())"


@pytest.mark.parametrize(
    ("command", "signum"),
    [
        ([SFT_TRAINER], signal.SIGTERM),
        (["-m", "tuning.sft_trainer"], signal.SIGINT),
        (["-c", CONSOLE_SCRIPT], signal.SIGTERM),  # what the sft_trainer console script runs
    ],
    ids=["script", "module", "console-script"],
)
def test_signal_while_sft_trainer_still_imports(command, signum, tiny_model, tmp_path):
    log = tmp_path / "termination-log"
    process = Job([*command, *cli_args(tiny_model, str(tmp_path / "out"))], tmp_path, TERMINATION_LOG_FILE=str(log))
    signal_once_handled(process, signum, after=1.5)
    stderr = process.finish(timeout=60)
    name = signal.Signals(signum).name
    assert process.returncode == 128 + signum, stderr[-3000:]
    assert termination_lines(log) == [f"interrupted: SignalInterrupt: stopped by {name}"]
    assert [(m[0], m[2], m[3]) for m in markers(stderr)] == [("interrupted", "-", str(128 + signum))]
    assert "Traceback" not in stderr
    assert not (tmp_path / "out").exists()  # ended before it got to training


REPORTING_SCRIPT = """
import os, signal, sys
from tuning.utils.error_logging import install_early_signal_handlers, run_with_error_reporting

install_early_signal_handlers()

def main():
    raise ValueError("bad input")

def on_error(report):
    for _ in range(int(sys.argv[2])):
        os.kill(os.getpid(), signal.SIGTERM)  # as torchrun signals every worker once one has exited
    with open(sys.argv[1], "w") as handle:
        handle.write(report["category"])

sys.exit(run_with_error_reporting(main, on_error=on_error))
"""


@pytest.mark.parametrize(("signals", "returncode", "reported"), [(1, 1, True), (2, -signal.SIGTERM, False)])
def test_a_signal_while_reporting_is_ignored_once(signals, returncode, reported, tmp_path):
    report = tmp_path / "report"
    result = run_python("-c", REPORTING_SCRIPT, str(report), str(signals), timeout=60)
    assert result.returncode == returncode, result.stderr
    assert (report.read_text() == "user_error") if reported else not report.exists()


def test_sigterm_to_bench_train_before_the_model_loads(tiny_model, tmp_path):
    journal = tmp_path / "bench.journal.jsonl"
    args = bench_args(tiny_model, tmp_path, tracker="none")
    process = start_bench(args, log_dir=tmp_path, TERMINATION_LOG_FILE=str(tmp_path / "termination-log"))
    started = time.monotonic()
    while not (journal.exists() and journal.read_text().endswith("\n")):  # its start record, once the run has one
        assert process.poll() is None and time.monotonic() - started < 120, "no journal"
        time.sleep(0.01)
    process.send_signal(signal.SIGTERM)
    stderr = process.finish(timeout=60)
    assert process.returncode == 143, stderr[-3000:]
    assert termination_lines(tmp_path / "termination-log") == ["interrupted: SignalInterrupt: stopped by SIGTERM"]
    dump = read_dump(tmp_path / "bench.json")
    assert dump["status"] == "interrupted" and dump["training_steps"] == 0
    assert dump["error"]["category"] == "interrupted" and dump["error"]["global_step"] is None
    end = read_journal(str(journal))[-1]
    assert end["type"] == "end" and end["status"] == "interrupted"


def test_launcher_imports_without_torch():
    """Its signal handlers (and the sft_trainer console script's) come before torch's import."""
    probe = "import sys, tuning.launch; print('torch' in sys.modules, 'transformers' in sys.modules)"
    result = run_python("-c", probe, timeout=60)
    assert result.stdout.split() == ["False", "False"], result.stderr


def test_termination_message_keeps_the_root_cause_first_within_4_kib():
    failures = [RankFailure(rank, 204, f"gpu_oom: rank {rank}: OutOfMemoryError: {'x' * 2000}") for rank in range(32)]
    lines = termination_message(failures).splitlines()
    assert len(termination_message(failures).encode()) <= K8S_TERMINATION_MESSAGE_MAX_BYTES
    assert lines[0].startswith("gpu_oom: rank 0: ") and len(lines[0].encode()) == 1023
    assert [line.split(": ")[1] for line in lines] == [f"rank {rank}" for rank in range(len(lines))]
    assert 10 < len(lines) < 32  # one short line per other rank while they fit


def test_manifest_has_what_the_docs_promise():
    config_map, job = yaml.safe_load_all(MANIFEST.read_text())
    config = json.loads(config_map["data"]["config.json"])
    assert config["accelerate_launch_args"]["num_processes"] == 2
    pod = job["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["command"][:3] == ["python", "-m", "tuning.launch"]
    assert container["terminationMessagePath"] == "/dev/termination-log"
    assert container["env"] == [{"name": "SFT_TRAINER_CONFIG_JSON_PATH", "value": "/etc/sft/config.json"}]
    shutdown_timeout = int(container["command"][container["command"].index("--shutdown_timeout") + 1])
    assert pod["terminationGracePeriodSeconds"] > shutdown_timeout  # the launcher outlives its wait for the workers


def test_multi_node_manifests_have_what_the_docs_promise():
    """The 2-node PyTorchJob and TrainJob: queued by Kueue, the launcher in every pod on the same job config, two
    nodes of 2 processes; the PyTorchJob restarts on system faults only (exit codes 128-255)."""
    kubernetes = MANIFEST.parent
    config_map, job = yaml.safe_load_all((kubernetes / "pytorchjob.yaml").read_text())
    assert json.loads(config_map["data"]["config.json"])["accelerate_launch_args"]["num_processes"] == 2
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] and job["spec"]["nprocPerNode"] == "2"
    replicas = job["spec"]["pytorchReplicaSpecs"]
    assert sum(spec["replicas"] for spec in replicas.values()) == 2
    for spec in replicas.values():
        [container] = spec["template"]["spec"]["containers"]
        assert spec["restartPolicy"] == "ExitCode" and container["name"] == "pytorch"
        assert container["command"][:3] == ["python", "-m", "tuning.launch"]
    (trainjob,) = yaml.safe_load_all((kubernetes / "trainjob.yaml").read_text())
    trainer = trainjob["spec"]["trainer"]
    assert (
        trainjob["metadata"]["labels"]["kueue.x-k8s.io/queue-name"]
        == job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"]
    )
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (2, 2)
    assert trainer["command"] == container["command"]


def test_manifest_passes_kubectl_client_dry_run():
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed")
    result = subprocess.run(
        ["kubectl", "apply", "--dry-run=client", "--validate=false", "-f", str(MANIFEST)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if result.returncode != 0 and "couldn't get current server API group list" in result.stderr:
        # Even a client-side dry run asks an API server which resources the kinds map to.
        pytest.skip(f"kubectl reaches no cluster: {result.stderr.strip().splitlines()[-1]}")
    assert result.returncode == 0, result.stderr
    assert "configmap/sft-llama-lora-config created (dry run)" in result.stdout
    assert "job.batch/sft-llama-lora created (dry run)" in result.stdout
