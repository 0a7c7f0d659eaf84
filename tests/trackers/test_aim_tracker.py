"""The aim tracker against real Aim: a local repo, a real ``aim server``, and the ways they fail.

Hooks are driven with real transformers ``TrainingArguments``/``TrainerState`` objects; everything about process exit
runs in a child process, since a hang there is exactly the failure under test.
"""

import json
import math
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.aim import METADATA, METADATA_QUERY, AimServer, existing_repo, read_runs, series
from tests.helpers.trackers import MIRRORED_POINTS, degraded_warnings, drive
from tests.helpers.training import REPO_ROOT, free_port, run_python, subprocess_env, wait_for_exit, wait_until
from tuning.config.tracker_configs import AimConfig, TrackerConfigFactory
from tuning.trackers import helper_child, isolated
from tuning.trackers.aimstack_tracker import DEGRADED_WARNING, RUN_HASH_FILENAME, AimStackTracker, SafeAimCallback
from tuning.utils.error_logging import UserInputError

# Almost every test here starts an Aim writer process or an Aim server.
pytestmark = pytest.mark.slow

# ---- configuration ----


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (AimConfig(), "--aim_repo DIR or an Aim server"),
        (AimConfig(aim_url="http://127.0.0.1:53800"), "aim://host:port"),
        (AimConfig(aim_url="aim://127.0.0.1"), "aim://host:port"),
        (AimConfig(aim_url="aim://127.0.0.1:99999"), "port 1-65535"),
        (AimConfig(aim_remote_server_ip="127.0.0.1"), "must be given together"),
        (AimConfig(aim_remote_server_port=53800), "must be given together"),
        (AimConfig(aim_url="aim://h:1", aim_remote_server_ip="h", aim_remote_server_port=2), "not both"),
        (AimConfig(aim_repo="r", aim_close_timeout=0), "--aim_close_timeout"),
        (AimConfig(aim_repo="r", aim_system_tracking_interval=0), "--aim_system_tracking_interval"),
    ],
)
def test_bad_config_is_a_clear_user_error(config, message, tmp_path):
    with pytest.raises(UserInputError) as caught:
        AimStackTracker(config)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "server",
    [
        {"aim_remote_server_ip": "127.0.0.1", "aim_remote_server_port": 53800},
        {"aim_remote_server_ip": "127.0.0.1", "aim_remote_server_port": "53800"},
        {"aim_url": "aim://127.0.0.1:53800/"},
    ],
)
def test_configured_server_wins_over_repo_path(server, tmp_path):
    tracker = AimStackTracker(AimConfig(aim_repo=str(tmp_path / "repo"), **server))
    assert tracker.callback.repo == "aim://127.0.0.1:53800"
    assert not (tmp_path / "repo").exists()


def test_constructor_touches_nothing(tmp_path):
    AimStackTracker(AimConfig(aim_repo=str(tmp_path / "repo")))
    assert list(tmp_path.iterdir()) == []


# ---- a local repo ----


def test_local_repo_records_logs_metrics_and_searchable_metadata(tmp_path, caplog):
    repo, output_dir, export_dir = tmp_path / "new" / "repo", tmp_path / "out", tmp_path / "export"
    config = AimConfig(
        aim_repo=str(repo),
        experiment="sft-llama7b-test",
        aim_run_id_export_path=str(export_dir),
        aim_system_tracking_interval=0.5,
    )
    tracker = AimStackTracker(config)
    # train() reports these before the trainer (and so the run) exists.
    tracker.set_params(METADATA, "experiment_metadata")
    tracker.track(1.25, "model_load_time")
    # The writer tracks a row of points of one step and context with one call: the same series twice in a row (step
    # None: Aim counts on) must still be two points.
    tracker.callback.track_many(MIRRORED_POINTS)
    drive(tracker.get_hf_callback(), output_dir)

    assert not tracker.degraded and not degraded_warnings(caplog, DEGRADED_WARNING)
    assert json.loads((export_dir / RUN_HASH_FILENAME).read_text()) == {"run_hash": tracker.run_hash}
    assert not (output_dir / RUN_HASH_FILENAME).exists()
    (run,) = read_runs(repo, METADATA_QUERY)
    assert run["hash"] == tracker.run_hash and run["experiment"] == "sft-llama7b-test"
    assert run["params"]["experiment_metadata"] == METADATA
    assert run["params"]["hparams"]["output_dir"] == str(output_dir)
    assert {"aim", "transformers", "torch"} <= set(run["params"]["__system_params"]["packages"])
    assert series(run, "loss") == {step: pytest.approx(1.0 / step) for step in range(1, 6)}
    assert series(run, "learning_rate") == {step: pytest.approx(1e-5) for step in range(1, 6)}
    assert series(run, "gpu_power_watts", {"gpu": 0}) == {0: 100.0, 1: 120.0}
    assert series(run, "step_time_seconds") == {3: 0.25} and series(run, "tokens_per_second") == {3: 400.0}
    assert series(run, "model_load_time", {"subset": "additional_metrics"}) == {0: 1.25}
    assert series(run, "loss", {"subset": "train"}) == {5: 0.4}  # the trainer's final train_loss
    assert series(run, "tflops", {"subset": "train"}) == {5: 2.5}
    assert any(name.startswith("__system__") for name, _context in run["metrics"])  # Aim's own sampler
    assert read_runs(repo, 'run.experiment_metadata.dataset_id == "another-dataset"') == []


# ---- the helper process ----


def test_messages_reach_the_helper_as_plain_python():
    """Whatever a job tracks arrives as plain values: the helper cannot import the job's classes."""

    class Custom:
        def __str__(self) -> str:
            return "custom"

    params = {"f32": np.float32(2.5), "i64": np.int64(3), "custom": Custom(), "ordered": OrderedDict(a=1)}
    params.update(row=(1, 2), flag=True, nested={"listed": [np.float64(0.5), None, float("nan")]})
    sent = isolated.plain(params)
    assert [type(sent[key]) for key in ("f32", "i64", "custom", "ordered", "flag")] == [float, int, str, dict, bool]
    assert sent["f32"] == 2.5 and sent["i64"] == 3 and sent["custom"] == "custom" and sent["ordered"] == {"a": 1}
    assert sent["row"] == [1, 2] and sent["nested"]["listed"][:2] == [0.5, None]
    assert type(sent["nested"]["listed"][0]) is float and math.isnan(sent["nested"]["listed"][2])


def test_a_helper_started_early_is_adopted_by_the_tracker_and_writes_its_run(tmp_path):
    """``start_helpers`` before the heavy imports: the Aim callback built later and handed its helpers uses that
    helper, not a new one. Then a callback whose run is never opened: its helper exits with the process, quietly."""
    code = textwrap.dedent(
        """
        import sys
        from pathlib import Path
        import psutil
        from tuning.trackers import start_helpers
        early_helpers = start_helpers(["--trackers", "aim"])
        (early,) = psutil.Process().children()
        from tests.helpers.trackers import drive
        from tuning.trackers.aimstack_tracker import SafeAimCallback
        callback = SafeAimCallback(sys.argv[1], experiment="early", early_helpers=early_helpers)
        drive(callback, Path(sys.argv[2]), steps=3)
        print(callback.transport.process.pid == early.pid, len(psutil.Process().children()), callback.run_hash)
        print(callback.degraded_reason)
        print(SafeAimCallback(sys.argv[1] + "-never-opened").transport.process.pid)
        """
    )
    result = run_python("-c", code, str(existing_repo(tmp_path / "repo")), str(tmp_path / "out"), timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    adopted, children, run_hash, degraded, never_opened = result.stdout.split()
    assert (adopted, children, degraded) == ("True", "0", "None")  # closed: the helper that wrote the run is gone
    assert result.stderr == "", result.stderr[-2000:]
    wait_for_exit(int(never_opened), 30, "the helper of the run never opened outlived its process")
    assert not (tmp_path / "repo-never-opened").exists()
    (run,) = read_runs(tmp_path / "repo")
    assert run["hash"] == run_hash and run["params"]["status"] == "FINISHED"
    assert series(run, "loss") == {step: pytest.approx(1.0 / step) for step in range(1, 4)}


def test_a_helper_started_early_exits_when_its_process_is_killed_before_adopting_it():
    job = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from tuning.trackers import start_helpers\nstart_helpers(['--tracker', 'aim'])\n"
            "import psutil, time\nprint(psutil.Process().children()[0].pid, flush=True)\ntime.sleep(300)",
        ],
        env=subprocess_env(),
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    helper = int(job.stdout.readline())
    job.kill()
    job.wait(30)
    wait_for_exit(helper, 30, "the early helper outlived its killed process")


def test_jobs_started_together_into_a_new_repo_all_get_their_run(tmp_path, caplog):
    """Jobs started together into a repository nobody has created yet: each creates its run (the repository is
    created once, under a lock). The repository is made by the jobs' helper processes (a training process only hands
    its helper the path), so two callbacks in this process, a real helper each, open their runs together once both
    have imported Aim."""
    repo = tmp_path / "new-repo"
    callbacks = [SafeAimCallback(str(repo), experiment="together") for _ in range(2)]
    for callback in callbacks:
        assert callback.ready.wait(120)
    for index, callback in enumerate(callbacks):
        callback.set_params({"index": index}, "job")  # the run opens now: both within a moment
    for index, callback in enumerate(callbacks):
        drive(callback, tmp_path / f"out{index}", steps=2)
    assert [callback.degraded_reason for callback in callbacks] == [None, None]
    assert not degraded_warnings(caplog, DEGRADED_WARNING)
    runs = read_runs(repo)
    assert sorted(run["hash"] for run in runs) == sorted(callback.run_hash for callback in callbacks)
    assert sorted(run["params"]["job"]["index"] for run in runs) == [0, 1]


def test_other_ranks_track_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    tracker = AimStackTracker(AimConfig(aim_repo=str(tmp_path / "repo")))
    tracker.set_params(METADATA)
    tracker.track(1.0, "model_load_time")
    drive(tracker.get_hf_callback(), tmp_path / "out")
    assert tracker.run_hash is None and tracker.callback.transport.process is None
    assert not (tmp_path / "repo").exists()


class BenchCallback(SafeAimCallback):
    """What the benchmarking wrapper does: searchable labels plus a per-step series, through the safe API."""

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        super().on_train_begin(args, state, control, model=model, **kwargs)
        self.set_params({"name": "bench-1"}, "benchmark")

    def on_log(self, args, state, control, logs=None, **kwargs):
        super().on_log(args, state, control, logs=logs, **kwargs)
        self.track(0.01 * state.global_step, "optimization_step_duration", step=state.global_step)


def test_subclass_adds_data_through_the_safe_api(tmp_path):
    callback = BenchCallback(str(existing_repo(tmp_path / "repo")), experiment="bench")
    drive(callback, tmp_path / "out", steps=3)
    (run,) = read_runs(tmp_path / "repo", 'run.benchmark.name == "bench-1"')
    assert run["hash"] == callback.run_hash
    assert series(run, "optimization_step_duration") == {step: pytest.approx(0.01 * step) for step in (1, 2, 3)}


def test_unwritable_repo_degrades_once_and_training_goes_on(tmp_path, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    tracker = AimStackTracker(AimConfig(aim_repo=str(blocker / "repo"), aim_close_timeout=5))
    assert tracker.callback.ready.wait(120)  # the helper imported Aim: what follows is the failure alone
    tracker.track(1.0, "model_load_time")
    start = time.monotonic()
    drive(tracker.get_hf_callback(), tmp_path / "out")
    assert time.monotonic() - start < 5
    assert tracker.degraded and "creating the Aim run" in tracker.degraded_reason
    assert len(degraded_warnings(caplog, DEGRADED_WARNING)) == 1


def test_locked_repo_degrades_within_the_timeout(tmp_path, caplog):
    from filelock import SoftFileLock

    repo = existing_repo(tmp_path / "repo")
    callback = SafeAimCallback(str(repo), timeout=2)
    assert callback.ready.wait(120)  # the bound is on Aim's progress, counted once the helper has imported Aim
    # Another live process (this one) holds the repo's lock, as a concurrent writer would: Aim waits 5 minutes.
    with SoftFileLock(str(repo / ".aim" / "locks" / "structured_db_lock")):
        start = time.monotonic()
        drive(callback, tmp_path / "out")
        assert time.monotonic() - start < 6  # the 2 s bound plus scheduling slack
    assert "more than 2s" in callback.degraded_reason and callback.run_hash is None
    assert len(degraded_warnings(caplog, DEGRADED_WARNING)) == 1


# ---- a real Aim server ----


@pytest.fixture(scope="module")
def aim_server(tmp_path_factory):
    server = AimServer(tmp_path_factory.mktemp("aim-server"))
    yield server
    server.stop()


def test_remote_server_records_the_run(aim_server, tmp_path, caplog):
    config = AimConfig(aim_remote_server_ip="127.0.0.1", aim_remote_server_port=aim_server.port, experiment="remote")
    tracker = AimStackTracker(config)
    tracker.set_params(METADATA)
    tracker.track(2.5, "model_load_time")
    drive(tracker.get_hf_callback(), tmp_path / "out")
    assert tracker.run_hash and not tracker.degraded and not degraded_warnings(caplog, DEGRADED_WARNING)
    aim_server.stop()
    (run,) = read_runs(aim_server.repo, METADATA_QUERY)
    assert run["hash"] == tracker.run_hash and run["experiment"] == "remote"
    assert series(run, "loss") == {step: pytest.approx(1.0 / step) for step in range(1, 6)}
    assert series(run, "learning_rate") == {step: pytest.approx(1e-5) for step in range(1, 6)}
    assert series(run, "model_load_time", {"subset": "additional_metrics"}) == {0: 2.5}


def test_server_that_never_existed(tmp_path, caplog):
    tracker = AimStackTracker(AimConfig(aim_url=f"aim://127.0.0.1:{free_port()}"))
    assert tracker.callback.ready.wait(120)  # the helper imported its library: the probe comes first
    tracker.set_params(METADATA)
    start = time.monotonic()
    drive(tracker.get_hf_callback(), tmp_path / "out")
    assert time.monotonic() - start < 5
    assert tracker.run_hash is None and "unreachable" in tracker.degraded_reason
    assert len(degraded_warnings(caplog, DEGRADED_WARNING)) == 1


# ---- failures that must not keep the process alive: each in a child process ----

DRIVER = textwrap.dedent(
    """
    import json, os, sys, time
    from transformers import TrainerControl, TrainerState, TrainingArguments
    from tuning.config.tracker_configs import AimConfig
    from tuning.trackers.aimstack_tracker import AimStackTracker

    config, output_dir, marker = json.loads(sys.argv[1]), sys.argv[2], sys.argv[5]
    steps, pause_at, crash = int(sys.argv[3]), int(sys.argv[4]), sys.argv[6] == "crash"
    tracker = AimStackTracker(AimConfig(**config))
    callback = tracker.get_hf_callback()
    callback.ready.wait(120)  # the helper has imported Aim: the timeouts count from its progress
    args, state, control = TrainingArguments(output_dir=output_dir, report_to="none"), TrainerState(), TrainerControl()
    tracker.set_params({"dataset_id": "my-amazing-dataset"})
    callback.on_init_end(args, state, control)
    tracker.track(0.5, "model_load_time")
    callback.on_train_begin(args, state, control)
    slowest = 0.0
    for step in range(1, steps + 1):
        state.global_step = step
        start = time.monotonic()
        callback.on_log(args, state, control, logs={"loss": 1.0 / step})
        slowest = max(slowest, time.monotonic() - start)
        if step == pause_at:  # let the test break Aim now, once the run exists
            unsent = lambda: callback.transport.pending or callback._points  # noqa: E731
            while (tracker.run_hash is None or unsent()) and not tracker.degraded:
                time.sleep(0.05)
            with open(marker + ".paused", "w") as paused:  # says which process writes the run
                paused.write(str(callback.transport.process.pid if callback.transport.process else ""))
            while not os.path.exists(marker + ".go"):
                time.sleep(0.05)
        time.sleep(0.1)
    start = time.monotonic()
    if not crash:  # a crashed training never reaches on_train_end: the tracker closes at exit
        callback.on_train_end(args, state, control)
    close_s = time.monotonic() - start
    writer = callback.transport.process
    writer_alive = lambda: writer is not None and writer.poll() is None  # noqa: E731
    deadline = time.monotonic() + 2
    while writer_alive() and time.monotonic() < deadline:  # the Aim writer process must end too
        time.sleep(0.05)
    report = {"close_s": close_s, "slowest_call_s": slowest, "ended_at": time.time(), "writer_alive": writer_alive()}
    report.update(degraded_reason=tracker.degraded_reason, run_hash=tracker.run_hash)
    print(json.dumps(report), flush=True)
    if crash:
        raise RuntimeError("injected training failure")
    """
)


def run_driver(
    tmp_path: Path, config: dict, steps: int = 10, pause_at: int = 0, on_pause=None, crash: bool = False
) -> dict:
    """Drive the tracker in a child; returns its report plus how long it took to exit after training ended.

    With ``crash`` training raises instead of ending, as a failed job does.
    """
    script, marker = tmp_path / "driver.py", str(tmp_path / "marker")
    script.write_text(DRIVER)
    argv = [sys.executable, str(script), json.dumps(config), str(tmp_path / "out"), str(steps), str(pause_at), marker]
    argv.append("crash" if crash else "end")
    child = subprocess.Popen(argv, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        if pause_at:
            wait_until(Path(marker + ".paused").exists, child, "the driver's pause", timeout=120)
            on_pause()
            Path(marker + ".go").touch()
        stdout, stderr = child.communicate(timeout=120)
    finally:
        child.kill()
    exited_at = time.time()
    assert child.returncode == (1 if crash else 0), stderr
    assert crash == ("injected training failure" in stderr), stderr
    report = json.loads(stdout.strip().splitlines()[-1])
    report["exit_s"] = exited_at - report["ended_at"]
    report["warnings"] = stderr.count(DEGRADED_WARNING)
    return report


def test_server_killed_mid_run_costs_a_warning_not_the_job(tmp_path):
    server = AimServer(tmp_path / "server-repo")
    try:
        config = {"aim_url": server.url, "aim_close_timeout": 10, "aim_system_tracking_interval": 0.5}
        report = run_driver(tmp_path, config, steps=12, pause_at=4, on_pause=server.kill)
    finally:
        server.kill()
    assert report["run_hash"] and "unreachable" in report["degraded_reason"]
    assert report["warnings"] == 1
    assert not report["writer_alive"]
    assert report["slowest_call_s"] < 0.5
    assert report["close_s"] < 3
    assert report["exit_s"] < 15


def test_crashed_training_still_closes_the_run_at_exit(tmp_path):
    # Three quick steps: the run may still be in creation when training dies; exit waits for it, within bounds.
    report = run_driver(tmp_path, {"aim_repo": str(existing_repo(tmp_path / "repo"))}, steps=3, crash=True)
    assert report["degraded_reason"] is None and report["exit_s"] < 30
    (run,) = read_runs(tmp_path / "repo")
    assert {"run_hash": run["hash"]} == json.loads((tmp_path / "out" / RUN_HASH_FILENAME).read_text())
    assert not run["active"]  # finalised by the tracker's exit hook
    assert series(run, "loss") == {step: pytest.approx(1.0 / step) for step in (1, 2, 3)}


def test_server_that_accepts_but_never_answers_is_abandoned_after_the_timeout(tmp_path):
    with socket.socket() as silent:  # the kernel completes connections; nobody ever reads them
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        config = {"aim_url": f"aim://127.0.0.1:{silent.getsockname()[1]}", "aim_close_timeout": 2}
        report = run_driver(tmp_path, config, steps=30)
    assert "blocked for more than 2s" in report["degraded_reason"] and report["run_hash"] is None
    assert report["warnings"] == 1
    assert report["slowest_call_s"] < 0.5 and report["close_s"] < 3
    assert report["exit_s"] < 15


def test_server_gone_while_aim_waits_on_it_is_reported_unreachable(tmp_path, caplog):
    """Aim's client waits on a connection the server accepted and never answers, while new connections are refused:
    the helper's server watch, not Aim, must say the server is gone."""
    held: list[socket.socket] = []
    asked = threading.Event()  # a client sent a request: Aim's, not the helper's own probe (which sends nothing)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(0.1)
    port = listener.getsockname()[1]

    def accept_and_hold() -> None:
        while listener.fileno() != -1:
            try:
                connection = listener.accept()[0]
                held.append(connection)
                connection.settimeout(5)
                if connection.recv(1, socket.MSG_PEEK):
                    asked.set()
            except OSError:
                continue

    threading.Thread(target=accept_and_hold, daemon=True).start()
    callback = SafeAimCallback(f"aim://127.0.0.1:{port}", timeout=300)
    try:
        callback.set_params(METADATA, "experiment_metadata")  # opens the run
        deadline = time.monotonic() + 60
        while not asked.is_set():  # Aim's client has asked and now waits for an answer
            assert not callback.degraded and time.monotonic() < deadline, "the helper never connected"
            time.sleep(0.05)
        listener.close()
        closed_at = time.monotonic()
        while not callback.degraded:
            assert time.monotonic() - closed_at < helper_child.PROBE_INTERVAL_S + helper_child.PROBE_TIMEOUT_S + 5
            time.sleep(0.05)
        assert "unreachable" in callback.degraded_reason
        wait_for_exit(callback.transport.process.pid, 5, "the helper outlived its server")
        assert len(degraded_warnings(caplog, DEGRADED_WARNING)) == 1
    finally:
        callback.close()
        listener.close()
        for connection in held:
            connection.close()


def test_registry_builds_the_aim_tracker(tmp_path):
    from tuning.trackers.tracker_factory import build_trackers

    configs = TrackerConfigFactory(aim_config=AimConfig(aim_repo=str(tmp_path / "repo")))
    file_logger, tracker = build_trackers(["aim"], configs)
    assert isinstance(tracker, AimStackTracker) and file_logger.name == "file_logger"
