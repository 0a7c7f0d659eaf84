"""Unit tests of tuning.utils.error_logging, with real exceptions raised by the real libraries (no mocks)."""

import argparse
import datetime
import errno
import json
import logging
import os
import re
import signal
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.distributed as dist

from tests.helpers.training import REPO_ROOT, free_port, subprocess_env
from tuning.utils import error_logging as er
from tuning.utils.error_logging import (
    ErrorCategory,
    StorageError,
    TrainingInterrupted,
    TrainingStalled,
    UserInputError,
    build_error_report,
    classify,
    error_marker,
    exit_code_for,
    one_line,
    run_with_error_reporting,
    termination_line,
    write_termination_log,
)


def test_one_line_collapses_whitespace_and_cuts_to_whole_utf8_characters():
    """The one helper that makes a message fit one line: of a termination log, a stderr marker, a data error."""
    assert one_line(FileNotFoundError("no\n  such\tfile")) == "no such file"
    assert one_line("  café\n\nbar ") == "café bar"
    assert one_line("ab cd", max_bytes=5) == "ab cd"
    cut = one_line("é" * 10, max_bytes=8)  # two bytes each: two whole characters fit before the ellipsis
    assert cut == "éé..." and len(cut.encode()) <= 8


REPORT_KEYS = {
    "category",
    "exit_code",
    "exception_type",
    "message",
    "rank",
    "local_rank",
    "world_size",
    "host",
    "pid",
    "global_step",
    "timestamp",
    "traceback",
}
CUDA_OOM_TEXT = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which 1.2 GiB is free."
)


def raised(fn, *args, **kwargs) -> BaseException:
    """The exception ``fn`` really raises, with its traceback and implicit context."""
    try:
        fn(*args, **kwargs)
    except BaseException as exc:
        return exc
    raise AssertionError(f"{fn} did not raise")


def raise_(exc: BaseException):
    raise exc


def raise_from(outer: BaseException, inner: BaseException):
    try:
        raise inner
    except BaseException as cause:
        raise outer from cause


def raise_while_handling(outer: BaseException, inner: BaseException):
    try:
        raise inner
    except BaseException:
        raise outer  # noqa: B904 - the implicit __context__ is what this test needs


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in list(os.environ):
        if name.startswith(er.EXIT_CODE_ENV_PREFIX) or name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
            monkeypatch.delenv(name)
    monkeypatch.delenv(er.TERMINATION_LOG_ENV, raising=False)


# --- classification -------------------------------------------------------------------------------------------


def test_user_errors_from_real_calls(tmp_path):
    parser = argparse.ArgumentParser(exit_on_error=False)
    parser.add_argument("--epochs", type=int)
    (tmp_path / "file").touch()
    cases = [
        UserInputError("--num_train_epochs must be positive"),
        raised(open, tmp_path / "missing.jsonl"),
        raised(open, tmp_path),  # IsADirectoryError
        raised(open, tmp_path / "file" / "child"),
        raised(json.loads, "{not json"),
        raised(parser.parse_args, ["--epochs", "three"]),  # argparse.ArgumentError
        raised(int, "three"),
        raised(len, 3),  # TypeError
    ]
    assert [type(exc).__name__ for exc in cases[1:5]] == [
        "FileNotFoundError",
        "IsADirectoryError",
        "NotADirectoryError",
        "JSONDecodeError",
    ]
    assert [classify(exc) for exc in cases] == [ErrorCategory.USER_ERROR] * len(cases)


def test_hf_argument_and_model_path_errors_are_user_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from transformers import AutoConfig, AutoTokenizer, HfArgumentParser, TrainingArguments

    unknown_flag = raised(
        HfArgumentParser(TrainingArguments).parse_args_into_dataclasses, ["--output_dir", "o", "--bogus", "1"]
    )
    bad_value = raised(TrainingArguments, output_dir=str(tmp_path), lr_scheduler_type="no-such-scheduler")
    missing_model = raised(AutoTokenizer.from_pretrained, str(tmp_path / "no" / "such" / "model"))
    empty_model_dir = raised(AutoConfig.from_pretrained, str(tmp_path))
    for exc in (unknown_flag, bad_value, missing_model, empty_model_dir):
        assert classify(exc) is ErrorCategory.USER_ERROR, repr(exc)
    assert isinstance(missing_model, OSError) and not isinstance(missing_model, ValueError)


def test_transformers_model_path_messages_on_plain_oserrors():
    for text in (
        "nope is not a local folder and is not a valid model identifier listed on 'https://huggingface.co/models'",
        "Can't load tokenizer for '/models/x'. If you were trying to load it from 'https://huggingface.co/models'",
        "/models/x does not appear to have a file named config.json.",
    ):
        assert classify(OSError(text)) is ErrorCategory.USER_ERROR
    assert classify(OSError(28, "No space left on device")) is ErrorCategory.STORAGE  # not the user's fault


def test_argparse_exit_is_a_user_error_with_argparse_message():
    parser = argparse.ArgumentParser(prog="sft_trainer")
    parser.add_argument("--peft_method", choices=["lora", "pt", "none"])
    exc = raised(parser.parse_args, ["--peft_method", "qlora"])
    assert isinstance(exc, SystemExit) and exc.code == 2
    assert classify(exc) is ErrorCategory.USER_ERROR
    report = build_error_report(exc)
    assert report["exception_type"] == "SystemExit"
    assert "invalid choice: 'qlora'" in report["message"]
    assert classify(SystemExit(3)) is ErrorCategory.INTERNAL


def test_gpu_oom_types_and_messages():
    assert torch.cuda.OutOfMemoryError is torch.OutOfMemoryError
    cases = [
        torch.OutOfMemoryError(CUDA_OOM_TEXT),
        torch.OutOfMemoryError("unexpected allocator failure"),  # the type alone is enough
        RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported"),
        RuntimeError("HIP out of memory. Tried to allocate 20.00 MiB"),
        torch.AcceleratorError("CUDA error: out of memory"),
        RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
        dist.DistBackendError("NCCL error: unhandled cuda error\nLast error:\nCuda failure 'out of memory'"),
    ]
    assert [classify(exc) for exc in cases] == [ErrorCategory.GPU_OOM] * len(cases)


def test_real_host_oom_in_process_allocator():
    exc = raised(torch.empty, 2**60, dtype=torch.uint8)
    assert "DefaultCPUAllocator" in str(exc)
    assert classify(exc) is ErrorCategory.HOST_OOM
    assert classify(MemoryError()) is ErrorCategory.HOST_OOM
    assert classify(OSError(12, "Cannot allocate memory")) is ErrorCategory.HOST_OOM


@pytest.mark.slow
@pytest.mark.parametrize("allocation", ["bytearray(1 << 31)", "torch.empty(1 << 31, dtype=torch.uint8)"])
def test_real_memory_error_under_address_space_limit(allocation):
    """A child limits its own address space (RLIMIT_AS) once imported, then allocates 2 GiB for real."""
    script = textwrap.dedent(
        f"""
        import resource, torch
        from tuning.utils.error_logging import classify
        with open("/proc/self/status") as f:
            vm_kib = next(int(line.split()[1]) for line in f if line.startswith("VmSize:"))
        limit = vm_kib * 1024 + (256 << 20)
        resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
        try:
            {allocation}
        except BaseException as exc:
            print(type(exc).__name__, classify(exc))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], env=subprocess_env(), capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    exc_type, category = result.stdout.split()
    assert exc_type in ("MemoryError", "RuntimeError")
    assert category == "host_oom"


def test_real_distributed_errors_are_communication():
    port = free_port()  # nobody listens: a real connect timeout from c10d's TCPStore
    store_failure = raised(dist.TCPStore, "127.0.0.1", port, 2, False, timeout=datetime.timedelta(seconds=0.2))
    assert isinstance(store_failure, dist.DistError)
    from torch.distributed.elastic.rendezvous.api import RendezvousTimeoutError

    cases = [
        store_failure,
        dist.DistBackendError("NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error"),
        dist.DistNetworkError("Connection reset by peer"),
        dist.DistStoreError("Timed out after 901 seconds waiting for clients. 1/2 clients joined."),
        RendezvousTimeoutError("The node failed to join the rendezvous"),
        RuntimeError("NCCL Error 3: internal error"),
        RuntimeError("ncclRemoteError: A call failed possibly due to a network error or a remote process exiting"),
        RuntimeError(
            "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE) ran for "
            "600000 milliseconds before timing out."
        ),
        RuntimeError(
            "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [10.0.0.2]:37059: "
            "Connection reset by peer. This is typically caused by a remote worker hanging"
        ),
        RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection closed by peer [10.0.0.2]:2"),
        RuntimeError("[gloo/transport/tcp/pair.cc:210] write: Broken pipe"),
    ]
    assert [classify(exc) for exc in cases] == [ErrorCategory.COMMUNICATION] * len(cases)
    # The same words outside gloo/c10d (a download, a local pipe) are not a training communication failure.
    assert classify(ConnectionResetError(104, "Connection reset by peer")) is ErrorCategory.INTERNAL
    assert classify(BrokenPipeError(32, "Broken pipe")) is ErrorCategory.INTERNAL


def test_device_errors_and_device_side_assert():
    cases = [
        torch.AcceleratorError("CUDA error: an illegal memory access was encountered"),
        RuntimeError("CUDA error: an illegal memory access was encountered"),
        RuntimeError("CUDA error: uncorrectable ECC error encountered"),
        RuntimeError("CUDA error: unspecified launch failure"),
        RuntimeError("CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasSgemm( handle, opa, opb, ...)`"),
    ]
    assert [classify(exc) for exc in cases] == [ErrorCategory.DEVICE_ERROR] * len(cases)
    assert classify(torch.AcceleratorError("CUDA error: device-side assert triggered")) is ErrorCategory.INTERNAL


def test_interrupted_and_hang():
    from torch.distributed.elastic.multiprocessing.api import SignalException

    assert classify(KeyboardInterrupt()) is ErrorCategory.INTERRUPTED
    assert classify(TrainingInterrupted(signal.SIGTERM)) is ErrorCategory.INTERRUPTED
    assert classify(SignalException("Process 7 got signal: 15", sigval=signal.SIGTERM)) is ErrorCategory.INTERRUPTED
    assert build_error_report(KeyboardInterrupt())["exit_code"] == 130
    assert build_error_report(TrainingInterrupted(signal.SIGTERM))["exit_code"] == 143
    assert build_error_report(SignalException("got signal", sigval=signal.SIGHUP))["exit_code"] == 129
    assert classify(TrainingStalled("no optimizer step for 600 s")) is ErrorCategory.HANG


def test_no_room_to_store_is_storage(tmp_path):
    """A full device is the storage's fault, whatever raised it; a path the user got wrong stays a user error."""
    with open("/dev/full", "wb", buffering=0) as full:  # a real ENOSPC from the kernel
        no_space = raised(full.write, b"x")
    assert isinstance(no_space, OSError) and no_space.errno == errno.ENOSPC
    assert classify(no_space) is ErrorCategory.STORAGE
    assert build_error_report(no_space)["exit_code"] == 209
    assert classify(StorageError("cannot write the dump")) is ErrorCategory.STORAGE
    assert classify(RuntimeError("[enforce fail] write: No space left on device")) is ErrorCategory.STORAGE
    assert classify(raised(open, tmp_path / "missing" / "x", "w")) is ErrorCategory.USER_ERROR


def test_anything_else_is_internal():
    assert classify(KeyError("input")) is ErrorCategory.INTERNAL
    assert classify(raised(lambda: {}["x"])) is ErrorCategory.INTERNAL
    assert classify(RuntimeError("something odd")) is ErrorCategory.INTERNAL


# --- exception chains -----------------------------------------------------------------------------------------


def test_system_fault_wins_over_user_error_in_explicit_chain():
    exc = raised(raise_from, ValueError("could not run the batch"), torch.OutOfMemoryError(CUDA_OOM_TEXT))
    assert classify(exc) is ErrorCategory.GPU_OOM
    report = build_error_report(exc)
    assert report["exception_type"] == "torch.OutOfMemoryError"
    assert report["message"] == CUDA_OOM_TEXT
    assert "direct cause of the following exception" in report["traceback"]
    assert "ValueError: could not run the batch" in report["traceback"]


def test_implicit_context_and_deep_chains():
    oom_during_handling = raised(raise_while_handling, TypeError("cleanup failed"), torch.OutOfMemoryError("x"))
    assert classify(oom_during_handling) is ErrorCategory.GPU_OOM
    # The training stack wraps: RuntimeError <- RuntimeError <- DistBackendError.
    inner = raised(raise_from, RuntimeError("all_reduce failed"), dist.DistBackendError("NCCL communicator aborted"))
    outer = raised(raise_from, RuntimeError("training step failed"), inner)
    assert classify(outer) is ErrorCategory.COMMUNICATION
    # A user error stays one when nothing more specific is in the chain.
    user = raised(raise_from, UserInputError("bad data file"), json.JSONDecodeError("Expecting value", "x", 0))
    assert classify(user) is ErrorCategory.USER_ERROR
    assert build_error_report(user)["exception_type"] == "tuning.utils.error_logging.UserInputError"


def test_most_specific_cause_wins_between_system_faults():
    exc = raised(
        raise_from, dist.DistBackendError("NCCL error: unhandled cuda error"), RuntimeError("illegal memory access")
    )
    assert classify(exc) is ErrorCategory.DEVICE_ERROR
    stopped_during_oom = raised(raise_while_handling, KeyboardInterrupt(), torch.OutOfMemoryError("x"))
    assert classify(stopped_during_oom) is ErrorCategory.GPU_OOM


def test_cyclic_chains_terminate():
    first, second = RuntimeError("first"), ValueError("second")
    first.__context__, second.__context__ = second, first
    assert classify(first) is ErrorCategory.USER_ERROR
    third, fourth = RuntimeError("third"), dist.DistBackendError("NCCL error")
    third.__cause__, fourth.__cause__ = fourth, third
    report = build_error_report(third)
    assert report["category"] == "communication" and "NCCL error" in report["traceback"]


def test_suppressed_context_is_not_evidence():
    def replace():
        try:
            raise torch.OutOfMemoryError("x")
        except torch.OutOfMemoryError:
            raise UserInputError("--per_device_train_batch_size 512 does not fit; lower it") from None

    assert classify(raised(replace)) is ErrorCategory.USER_ERROR


def test_exception_groups_are_searched():
    group = ExceptionGroup("ranks failed", [ValueError("bad"), torch.OutOfMemoryError("x")])
    assert classify(group) is ErrorCategory.GPU_OOM


def test_broken_str_does_not_break_reporting():
    class Unprintable(Exception):
        def __str__(self):
            raise RuntimeError("no")

    report = build_error_report(Unprintable())
    assert report["category"] == "internal"
    assert report["message"] == "<unprintable Unprintable>"


# --- exit codes -----------------------------------------------------------------------------------------------


def test_default_exit_codes_are_distinct_and_in_range():
    codes = {category: exit_code_for(category) for category in ErrorCategory}
    assert codes[ErrorCategory.USER_ERROR] == 1
    assert codes[ErrorCategory.INTERNAL] == 203
    assert codes[ErrorCategory.GPU_OOM] == 204
    assert codes[ErrorCategory.INTERRUPTED] == 143
    assert codes[ErrorCategory.STORAGE] == 209
    assert len(set(codes.values())) == len(codes)
    assert all(128 <= code <= 254 for category, code in codes.items() if category is not ErrorCategory.USER_ERROR)
    assert exit_code_for("interrupted", signal.SIGINT) == 130
    assert exit_code_for(ErrorCategory.INTERRUPTED, signal.SIGTERM) == 143
    # Signal-derived codes (128+1 .. 128+64) never collide with the fixed system-fault codes.
    assert all(code > 128 + 64 for category, code in codes.items() if category not in ("user_error", "interrupted"))


def test_exit_code_env_overrides(monkeypatch, caplog):
    monkeypatch.setenv("TUNING_EXIT_CODE_GPU_OOM", "250")
    monkeypatch.setenv("TUNING_EXIT_CODE_USER_ERROR", "2")
    monkeypatch.setenv("TUNING_EXIT_CODE_INTERRUPTED", "200")
    assert exit_code_for("gpu_oom") == 250
    assert exit_code_for("user_error") == 2
    assert exit_code_for("interrupted", signal.SIGINT) == 200
    assert build_error_report(torch.OutOfMemoryError("x"))["exit_code"] == 250


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("TUNING_EXIT_CODE_GPU_OOM", "100", 204),  # a system fault may not look like a user fault
        ("TUNING_EXIT_CODE_GPU_OOM", "255", 204),
        ("TUNING_EXIT_CODE_USER_ERROR", "200", 1),  # and a user fault may not look like a system fault
        ("TUNING_EXIT_CODE_USER_ERROR", "0", 1),
        ("TUNING_EXIT_CODE_HOST_OOM", "lots", 205),
        ("TUNING_EXIT_CODE_HOST_OOM", "²", 205),
    ],
)
def test_invalid_exit_code_overrides_are_ignored_with_a_warning(monkeypatch, caplog, name, value, expected):
    monkeypatch.setenv(name, value)
    category = name.removeprefix("TUNING_EXIT_CODE_").lower()
    with caplog.at_level(logging.WARNING, logger=er.__name__):
        assert exit_code_for(category) == expected
    assert f"Ignoring {name}" in caplog.text


# --- termination log ------------------------------------------------------------------------------------------


def test_termination_log_appends_single_short_lines(tmp_path, monkeypatch):
    path = tmp_path / "termination-log"
    monkeypatch.setenv("TERMINATION_LOG_FILE", str(path))
    assert write_termination_log("user_error: first\nsecond line\ttabbed") == str(path)
    assert write_termination_log("gpu_oom: " + "é" * 5000) == str(path)
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b"" and len(lines) == 3
    assert lines[0] == b"user_error: first second line tabbed"
    assert len(lines[1]) + 1 <= er.TERMINATION_LOG_MAX_BYTES
    assert lines[1].decode("utf-8").startswith("gpu_oom: éé") and lines[1].endswith(b"...")


def test_termination_log_never_raises(tmp_path, monkeypatch):
    monkeypatch.setenv("TERMINATION_LOG_FILE", str(tmp_path))  # a directory
    assert write_termination_log("internal: x") is None
    monkeypatch.setenv("TERMINATION_LOG_FILE", str(tmp_path / "missing" / "dir" / "log"))
    assert write_termination_log("internal: x") is None
    readonly = tmp_path / "readonly"
    readonly.mkdir()
    readonly.chmod(0o500)
    try:
        monkeypatch.setenv("TERMINATION_LOG_FILE", str(readonly / "log"))
        if os.geteuid() != 0:  # root writes anyway
            assert write_termination_log("internal: x") is None
    finally:
        readonly.chmod(0o700)


def test_termination_log_kubernetes_default(tmp_path, monkeypatch):
    monkeypatch.setattr(er, "K8S_TERMINATION_LOG", str(tmp_path / "termination-log"))
    assert write_termination_log("internal: x") is None  # absent: nothing is created
    (tmp_path / "termination-log").touch()
    assert write_termination_log("internal: x") == str(tmp_path / "termination-log")
    assert (tmp_path / "termination-log").read_text() == "internal: x\n"


# --- report, marker, JSON -------------------------------------------------------------------------------------


def test_report_schema(monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    exc = raised(raise_from, RuntimeError("step failed"), torch.OutOfMemoryError(CUDA_OOM_TEXT))
    report = build_error_report(exc, global_step=3, extra={"run_hash": "abc"})
    assert set(report) == REPORT_KEYS | {"run_hash"}
    assert report["category"] == "gpu_oom" and report["exit_code"] == 204
    assert (report["rank"], report["local_rank"], report["world_size"]) == (3, 1, 4)
    assert report["pid"] == os.getpid() and report["global_step"] == 3 and report["host"]
    stamp = report["timestamp"]
    assert stamp.endswith("Z") and datetime.datetime.fromisoformat(stamp).utcoffset() == datetime.timedelta(0)
    assert "torch.OutOfMemoryError" in report["traceback"]
    json.dumps(report)  # JSON-ready
    assert termination_line(report).startswith("gpu_oom: rank 3: OutOfMemoryError: CUDA out of memory.")
    with pytest.raises(ValueError, match="shadow"):
        build_error_report(exc, extra={"category": "mine"})


def test_report_with_explicit_category_for_a_watchdog():
    report = build_error_report(TimeoutError("no optimizer step for 600 s"), category="hang", global_step=41)
    assert report["category"] == "hang" and report["exit_code"] == 208
    assert report["exception_type"] == "TimeoutError"
    assert termination_line(report) == "hang: TimeoutError: no optimizer step for 600 s"


def test_error_marker_is_one_greppable_line():
    report = build_error_report(torch.OutOfMemoryError(CUDA_OOM_TEXT + "\nsecond line"), global_step=3)
    marker = error_marker(report)
    assert marker == f"TUNING_ERROR category=gpu_oom rank=0 step=3 exit_code=204 type=OutOfMemoryError: {CUDA_OOM_TEXT}"
    assert error_marker(build_error_report(KeyboardInterrupt())) == (
        "TUNING_ERROR category=interrupted rank=0 step=- exit_code=130 type=KeyboardInterrupt"
    )


# --- entry point ----------------------------------------------------------------------------------------------


def test_run_with_error_reporting_in_process(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TERMINATION_LOG_FILE", str(tmp_path / "log"))
    reports = []
    assert run_with_error_reporting(lambda: None) == 0
    assert run_with_error_reporting(lambda: 3) == 3
    assert run_with_error_reporting(lambda: raise_(SystemExit(0))) == 0
    code = run_with_error_reporting(
        lambda: raise_(torch.OutOfMemoryError(CUDA_OOM_TEXT)), on_error=reports.append, global_step=lambda: 7
    )
    assert code == 204
    assert reports[0]["category"] == "gpu_oom" and reports[0]["global_step"] == 7
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err
    assert err.rstrip().splitlines()[-1].startswith("TUNING_ERROR category=gpu_oom rank=0 step=7 exit_code=204")
    assert (tmp_path / "log").read_text() == f"gpu_oom: OutOfMemoryError: {CUDA_OOM_TEXT}\n"


def test_marker_starts_a_line_after_an_open_progress_bar(capsys):
    def fail_mid_progress_bar():
        sys.stderr.write("\r  5%|▌         | 5/100 [00:01<00:19]")  # tqdm leaves its line open
        raise TrainingInterrupted(signal.SIGTERM)  # reported without a traceback

    assert run_with_error_reporting(fail_mid_progress_bar) == 143
    marker = r"^TUNING_ERROR category=interrupted rank=0 step=\S+ exit_code=143 type=TrainingInterrupted: "
    assert re.search(marker, capsys.readouterr().err, re.M)


def test_failing_hook_does_not_change_the_exit_code(caplog):
    def hook(report):
        raise OSError("disk full")

    assert run_with_error_reporting(lambda: raise_(KeyError("x")), on_error=hook) == 203
    assert "on_error hook failed" in caplog.text


ENTRY_SCRIPT = """
import argparse, json, os, sys, torch
from tuning.utils.error_logging import UserInputError, run_with_error_reporting
from tuning.utils.file_utils import write_json_atomic

def main():
    kind = sys.argv[1]
    if kind == "ok":
        return None
    if kind == "oom":
        raise RuntimeError("training step failed") from torch.OutOfMemoryError("CUDA out of memory. Tried 2 GiB")
    if kind == "user":
        raise UserInputError("data file not found: /data/train.jsonl")
    if kind == "argparse":
        parser = argparse.ArgumentParser()
        parser.add_argument("--peft_method", choices=["lora", "pt", "none"])
        parser.parse_args(["--peft_method", "qlora"])
    if kind == "ctrl-c":
        raise KeyboardInterrupt

def write_report(report):
    write_json_atomic(os.environ["REPORT_PATH"], report)

sys.exit(run_with_error_reporting(main, on_error=write_report))
"""


@pytest.mark.parametrize(
    ("kind", "code", "log_line"),
    [
        ("ok", 0, None),
        ("oom", 204, "gpu_oom: OutOfMemoryError: CUDA out of memory. Tried 2 GiB"),
        ("user", 1, "user_error: UserInputError: data file not found: /data/train.jsonl"),
        ("argparse", 1, "user_error: SystemExit: argument --peft_method: invalid choice: 'qlora'"),
        ("ctrl-c", 130, "interrupted: KeyboardInterrupt"),
    ],
)
@pytest.mark.slow
def test_run_with_error_reporting_in_a_real_process(tmp_path, kind, code, log_line):
    log = tmp_path / "termination-log"
    report_path = tmp_path / "report.json"
    result = subprocess.run(
        [sys.executable, "-c", ENTRY_SCRIPT, kind],
        env=subprocess_env(TERMINATION_LOG_FILE=str(log), REPORT_PATH=str(report_path)),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == code, result.stderr[-2000:]
    if log_line is None:
        assert not log.exists() and not report_path.exists() and "TUNING_ERROR" not in result.stderr
        return
    lines = log.read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith(log_line)
    markers = [line for line in result.stderr.splitlines() if line.startswith("TUNING_ERROR ")]
    assert len(markers) == 1 and f"exit_code={code} " in markers[0]
    report = json.loads(report_path.read_text())
    assert set(report) == REPORT_KEYS and report["exit_code"] == code and report["pid"] != os.getpid()


@pytest.mark.slow
def test_exit_code_override_reaches_the_process(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", ENTRY_SCRIPT, "oom"],
        env=subprocess_env(TUNING_EXIT_CODE_GPU_OOM="250", TERMINATION_LOG_FILE=str(tmp_path / "log")),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 250
    assert "exit_code=250" in result.stderr


@pytest.mark.slow
def test_module_imports_without_torch_or_transformers():
    probe = "import sys, tuning.utils.error_logging; print('torch' in sys.modules, 'transformers' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", probe], env=subprocess_env(), capture_output=True, text=True, timeout=60, cwd=REPO_ROOT
    )
    assert result.stdout.split() == ["False", "False"], result.stderr
