"""The mlflow tracker against real MLflow: local stores, a real ``mlflow server``, and the ways it fails; in-process
hooks (real transformers objects) and real jobs (``sft_trainer``, ``bench_train``)."""

import contextlib
import dataclasses
import json
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from transformers import TrainerCallback

from tests.helpers.aim import existing_repo, read_runs
from tests.helpers.aim import series as aim_series
from tests.helpers.bench import bench_args, read_dump, series
from tests.helpers.mlflow import METADATA, METADATA_FILTER, MlflowServer, history, search
from tests.helpers.trackers import MIRRORED_POINTS, degraded_warnings, drive
from tests.helpers.training import (
    BENCH_TRAIN,
    REPO_ROOT,
    cli_args,
    free_port,
    load_script,
    run_main,
    subprocess_env,
    wait_for_exit,
)
from tuning.benchmarking.dump import STEP_TIME
from tuning.config.tracker_configs import AimConfig, MLflowConfig, TrackerConfigFactory
from tuning.trackers import Tracker, TrackerSpec
from tuning.trackers.mlflow_tracker import DEGRADED_WARNING, RUN_URI_FILENAME, MLflowTracker
from tuning.utils.error_logging import UserInputError

pytestmark = pytest.mark.slow  # subprocesses, servers, torchrun ranks: not in make test-fast

METADATA_FLAG = json.dumps(METADATA)


@pytest.fixture(scope="module")
def bench_train():
    """bench_train's main, run in this process (its tracker helpers are real processes)."""
    return load_script(BENCH_TRAIN)


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    server = MlflowServer(tmp_path_factory.mktemp("mlflow-server"))
    yield server
    server.stop()


# ---- configuration ----


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (MLflowConfig(mlflow_tracking_uri="http://127.0.0.1:99999"), "http://host:port"),
        (MLflowConfig(mlflow_tracking_uri="http://:5000"), "http://host:port"),
        (MLflowConfig(mlflow_close_timeout=0), "--mlflow_close_timeout"),
    ],
)
def test_bad_config_is_a_clear_user_error(config, message, tmp_path):
    with pytest.raises(UserInputError) as caught:
        MLflowTracker(config)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_registry_builds_the_mlflow_tracker_from_parsed_flags(tmp_path, monkeypatch):
    from tuning.sft_trainer import get_parser, parse_arguments
    from tuning.trackers.tracker_factory import build_trackers

    store = tmp_path / "store"
    argv = ["sft_trainer", "--model_name_or_path", "m", "--training_data_path", "d", "--output_dir", str(tmp_path)]
    argv += ["--tracker", "mlflow", "--mlflow_tracking_uri", str(store), "--mlflow_experiment", "flags"]
    monkeypatch.setattr(sys, "argv", argv)
    args = parse_arguments(get_parser())
    assert args.tracker_configs.mlflow_config == MLflowConfig(mlflow_experiment="flags", mlflow_tracking_uri=str(store))
    file_logger, tracker = build_trackers(args.training_args.trackers, args.tracker_configs)
    assert isinstance(tracker, MLflowTracker) and tracker.callback.tracking_uri == f"sqlite:///{store}/mlflow.db"
    tracker.callback.close()


@dataclasses.dataclass
class DemoConfig:
    demo_level: int = 0


class DemoTracker(Tracker):
    name = "demo"

    def __init__(self, tracker_config: DemoConfig):
        super().__init__(name="demo", tracker_config=tracker_config)


def test_a_backend_registered_from_outside_gets_its_flags_parsed(tmp_path, monkeypatch):
    """Plug and play: a backend is its config dataclass and its class, registered; nothing else changes."""
    from tuning.sft_trainer import get_parser, parse_arguments
    from tuning.trackers import build_trackers, register_tracker, tracker_factory

    monkeypatch.setattr(tracker_factory, "_REGISTRY", dict(tracker_factory._REGISTRY))
    register_tracker("demo", TrackerSpec(DemoConfig, f"{__name__}:DemoTracker"))
    argv = ["sft_trainer", "--model_name_or_path", "m", "--training_data_path", "d", "--output_dir", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", [*argv, "--tracker", "demo", "--demo_level", "3"])
    args = parse_arguments(get_parser())
    file_logger, tracker = build_trackers(args.training_args.trackers, args.tracker_configs)
    assert isinstance(tracker, DemoTracker) and tracker.config == DemoConfig(demo_level=3)


# ---- local stores ----


@pytest.mark.parametrize("store", ["sqlite", "file"])
def test_local_store_records_logs_metrics_and_searchable_metadata(store, tmp_path, caplog, monkeypatch):
    """A sqlite URI, and v3.1.0's ``file://`` store (MLflow 3 refuses file stores unless opted in: the helper opts in,
    with one warning of MLflow's deprecation and the way to sqlite). A directory is a sqlite store in it, the same
    writer: test_sft_trainer_run_lands_searchable_in_a_directory_store's job and
    test_registry_builds_the_mlflow_tracker_from_parsed_flags."""
    uris = {
        "sqlite": f"sqlite:///{tmp_path / 'db' / 'mlflow.db'}",
        "file": f"file://{tmp_path / 'mlruns'}",
    }
    uri = uris[store]
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    output_dir, export_dir = tmp_path / "out", tmp_path / "export"
    config = MLflowConfig(
        mlflow_tracking_uri=uri, mlflow_experiment="local", mlflow_run_uri_export_path=str(export_dir)
    )
    from tuning.trackers.mlflow_writer import MAX_PARAM_VALUE_LENGTH  # MLflow: not imported by test-fast

    tracker = MLflowTracker(config)
    long_value = "x" * (MAX_PARAM_VALUE_LENGTH + 10)
    long_keys = {"k" * 300 + "a": "first", "k" * 300 + "b": "second"}  # alike in MLflow's first 250 characters
    tracker.set_params({**METADATA, "cluster": {"zone": "a", "gpus": [0, 1]}, "notes": long_value, **long_keys})
    tracker.track(1.25, "model_load_time")
    tracker.callback.track_many(MIRRORED_POINTS)
    drive(tracker.get_hf_callback(), output_dir)

    assert not tracker.degraded and not degraded_warnings(caplog, DEGRADED_WARNING)
    deprecations = [record for record in caplog.records if "MLflow deprecates" in record.getMessage()]
    assert len(deprecations) == (store == "file")
    if store == "file":
        assert "sqlite" in deprecations[0].getMessage() and (tmp_path / "mlruns" / "0").is_dir()  # MLflow's layout
        monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # to read it back here, as its users must
    exported = json.loads((export_dir / RUN_URI_FILENAME).read_text())
    assert exported["run_id"] == tracker.run_id and exported["run_uri"] == f"runs:/{tracker.run_id}"
    assert not (output_dir / RUN_URI_FILENAME).exists()
    tracking_uri = exported["tracking_uri"]
    (run,) = search(tracking_uri, METADATA_FILTER)
    assert run.info.run_id == tracker.run_id and run.info.status == "FINISHED"
    params = run.data.params
    assert params["gpu_model"] == "A100-80GB" and params["cluster.zone"] == "a" and params["cluster.gpus"] == "[0, 1]"
    assert params["notes"] + params["notes.part2"] == long_value  # long values continue, never dropped
    assert sorted(value for key, value in params.items() if key.startswith("kkk")) == ["first", "second"]
    assert params["output_dir"] == str(output_dir)  # the training arguments
    assert "model" not in params and not any(key.startswith("model.") for key in params)  # no model in drive()
    assert history(tracking_uri, run.info.run_id, "loss") == {step: pytest.approx(1.0 / step) for step in range(1, 6)}
    assert history(tracking_uri, run.info.run_id, "gpu_power_watts/gpu_0") == {0: 100.0, 1: 120.0}
    assert history(tracking_uri, run.info.run_id, "step_time_seconds") == {3: 0.25}
    assert history(tracking_uri, run.info.run_id, "model_load_time") == {0: 1.25}
    assert history(tracking_uri, run.info.run_id, "train_loss") == {5: 0.4}
    assert history(tracking_uri, run.info.run_id, "train_tflops") == {5: 2.5}
    assert search(tracking_uri, "params.dataset_id = 'another-dataset'") == []


def test_other_ranks_track_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    tracker = MLflowTracker(MLflowConfig(mlflow_tracking_uri=str(tmp_path / "mlruns")))
    tracker.set_params(METADATA)
    drive(tracker.get_hf_callback(), tmp_path / "out")
    assert tracker.run_id is None and tracker.callback.transport.process is None
    assert not (tmp_path / "mlruns").exists()


def test_killed_training_process_leaves_closed_runs(tmp_path):
    """SIGKILL the training process mid-run: its helpers (MLflow's and Aim's, one process) see the connection end and
    close their runs, as KILLED, then exit."""
    code = textwrap.dedent(
        """
        import sys, time
        from tuning.config.tracker_configs import AimConfig, MLflowConfig
        from tuning.trackers.aimstack_tracker import AimStackTracker
        from tuning.trackers.mlflow_tracker import MLflowTracker
        trackers = [MLflowTracker(MLflowConfig(mlflow_tracking_uri=sys.argv[1])),
                    AimStackTracker(AimConfig(aim_repo=sys.argv[2], aim_close_timeout=20))]
        for tracker in trackers:
            tracker.set_params({"dataset_id": "killed"})
            tracker.track(0.5, "model_load_time")
        def unsent(tracker):
            callback = tracker.callback
            return callback.run_info is None or callback._points or callback.transport.pending
        while any(unsent(tracker) and not tracker.degraded for tracker in trackers):
            time.sleep(0.05)  # until the runs exist and hold everything tracked
        for tracker in trackers:
            print(tracker.callback.transport.process.pid, tracker.degraded_reason, flush=True)
        time.sleep(600)
        """
    )
    store, repo = tmp_path / "mlruns", existing_repo(tmp_path / "aim")
    argv = [sys.executable, "-c", code, str(store), str(repo)]
    child = subprocess.Popen(argv, env=subprocess_env(), cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
    try:
        helpers = [child.stdout.readline().split() for _ in range(2)]
    finally:
        child.kill()
        child.wait()
    assert [reason for _pid, reason in helpers] == ["None", "None"]
    for pid, _reason in helpers:
        wait_for_exit(int(pid), 30, "a helper outlived its training process by 30 s")
    (run,) = search(f"sqlite:///{store}/mlflow.db", "params.dataset_id = 'killed'")
    assert run.info.status == "KILLED"
    assert history(f"sqlite:///{store}/mlflow.db", run.info.run_id, "model_load_time") == {0: 0.5}
    (aim_run,) = read_runs(repo, 'run.experiment_metadata.dataset_id == "killed"')
    assert aim_run["params"]["status"] == "KILLED" and not aim_run["active"]
    assert aim_series(aim_run, "model_load_time", {"subset": "additional_metrics"}) == {0: 0.5}


# ---- a real server ----


def test_remote_server_records_the_run(mlflow_server, tmp_path, caplog):
    config = MLflowConfig(mlflow_tracking_uri=mlflow_server.url, mlflow_experiment="remote")
    tracker = MLflowTracker(config)
    tracker.set_params(METADATA)
    tracker.track(2.5, "model_load_time")
    drive(tracker.get_hf_callback(), tmp_path / "out")
    assert tracker.run_id and not tracker.degraded and not degraded_warnings(caplog, DEGRADED_WARNING)
    (run,) = search(mlflow_server.url, METADATA_FILTER)
    assert run.info.run_id == tracker.run_id
    assert history(mlflow_server.url, tracker.run_id, "loss") == {
        step: pytest.approx(1.0 / step) for step in range(1, 6)
    }
    assert history(mlflow_server.url, tracker.run_id, "model_load_time") == {0: 2.5}


def test_server_that_never_existed(tmp_path, caplog):
    tracker = MLflowTracker(MLflowConfig(mlflow_tracking_uri=f"http://127.0.0.1:{free_port()}"))
    assert tracker.callback.ready.wait(120)  # the helper imported its library: the probe comes first
    tracker.set_params(METADATA)
    start = time.monotonic()
    drive(tracker.get_hf_callback(), tmp_path / "out")
    assert time.monotonic() - start < 5
    assert tracker.run_id is None and "unreachable" in tracker.degraded_reason
    assert len(degraded_warnings(caplog, DEGRADED_WARNING)) == 1
    assert not (tmp_path / "out" / RUN_URI_FILENAME).exists()


def test_server_that_accepts_but_never_answers_is_abandoned_after_the_timeout(tmp_path, caplog):
    with socket.socket() as silent:  # the kernel completes connections; nobody ever reads them
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        uri = f"http://127.0.0.1:{silent.getsockname()[1]}"
        tracker = MLflowTracker(MLflowConfig(mlflow_tracking_uri=uri, mlflow_close_timeout=2))
        assert tracker.callback.ready.wait(120)  # the bound counts from the helper's progress: MLflow imported
        start = time.monotonic()
        drive(tracker.get_hf_callback(), tmp_path / "out")
        took = time.monotonic() - start
    assert "blocked for more than 2s" in tracker.degraded_reason and tracker.run_id is None
    assert len(degraded_warnings(caplog, DEGRADED_WARNING)) == 1
    assert took < 10  # the 2 s bound plus scheduling slack (MLflow's client would wait 120 s per try)
    assert tracker.callback.transport.process.wait(timeout=10) == -signal.SIGKILL


# ---- real jobs ----


def test_sft_trainer_run_lands_searchable_in_a_directory_store(tiny_model, tmp_path, monkeypatch, capfd, caplog):
    """A job through sft_trainer's main (in this process; the writer is a helper process as always) into a local
    directory: its run is in the sqlite store there. A job whose tracker is degraded (a server that never existed)
    still trains every step with one warning: test_aim_e2e.py's test_server_that_never_existed_costs_one_warning (the
    same IsolatedCallback); MLflow's own unreachable server, test_server_that_never_existed here."""
    store = tmp_path / "mlruns"
    args = cli_args(tiny_model, str(tmp_path / "local"), max_steps=4)
    args += ["--trackers", "file_logger", "mlflow", "--mlflow_experiment", "e2e", "--exp_metadata", METADATA_FLAG]
    exit_code, stderr = run_main([*args, "--mlflow_tracking_uri", str(store)], monkeypatch, capfd)
    assert exit_code == 0, stderr[-3000:]
    assert degraded_warnings(caplog, DEGRADED_WARNING) == []
    exported = json.loads((tmp_path / "local" / RUN_URI_FILENAME).read_text())
    store_uri = f"sqlite:///{store}/mlflow.db"
    assert exported["tracking_uri"] == store_uri
    (run,) = search(store_uri, f"{METADATA_FILTER} and params.per_device_train_batch_size = '4'")
    assert run.info.run_id == exported["run_id"] and run.info.status == "FINISHED"
    assert sorted(history(store_uri, run.info.run_id, "loss")) == [1, 2, 3, 4]
    assert len(history(store_uri, run.info.run_id, "model_load_time")) == 1
    assert run.data.params["model.model_type"] == "llama"  # the model config, as the "model" group


def test_bench_train_mirrors_its_series_and_records_the_run_id(bench_train, tiny_model, mlflow_server, tmp_path, capfd):
    metadata = json.dumps({"batch": 4, "sweep": "mlflow-bench"})
    args = bench_args(
        tiny_model, tmp_path, max_steps=6, tracker="mlflow", mlflow_tracking_uri=mlflow_server.url, metadata=metadata
    )
    capfd.readouterr()
    assert bench_train.main(args) == 0
    assert DEGRADED_WARNING not in capfd.readouterr().err
    dump = read_dump(tmp_path / "bench.json")
    assert dump["status"] == "ok" and dump["mlflow_degraded_reason"] is None
    (run,) = search(mlflow_server.url, "params.sweep = 'mlflow-bench' and params.batch = '4'")
    assert run.info.run_id == dump["mlflow_run_id"]
    assert run.data.params["benchmark.system_metrics_interval"] == "0.2"
    # The dump's data description, searchable: its scalar keys one param each, the datasets as JSON.
    assert run.data.params["data.data_config_path"] == "null" and run.data.params["data.seed"] == "42"
    assert json.loads(run.data.params["data.datasets"]) == dump["data"]["datasets"]
    steps = series(dump, STEP_TIME)["steps"]
    for name in (STEP_TIME, "tokens_per_second"):  # at most once a second, and the last step
        mirrored = history(mlflow_server.url, run.info.run_id, name)
        assert set(mirrored) <= set(steps) and steps[-1] in mirrored
    assert history(mlflow_server.url, run.info.run_id, "cpu_percent")  # a system series
    assert sorted(history(mlflow_server.url, run.info.run_id, "loss")) == list(range(1, 7))


def test_params_alike_once_flattened_are_all_kept_with_one_warning(tmp_path, capfd):
    """Names that flatten to one key keep their values under ``key-2``; null is JSON's ``null``, not ``None``."""
    tracker = MLflowTracker(MLflowConfig(mlflow_tracking_uri=str(tmp_path / "store")))
    metadata = {"cluster": {"zone": "a"}, "cluster.zone": "b", "x:y": "colon", "x_y": "underscore", "gpus": None}
    tracker.set_params({**METADATA, **metadata})
    tracker.set_params({"a:b": 1, "a_b": 2, "a.b": 3}, "extra")
    tracker.close()
    (run,) = search(f"sqlite:///{tmp_path / 'store'}/mlflow.db", METADATA_FILTER)
    params = run.data.params
    assert (params["cluster.zone"], params["cluster.zone-2"]) == ("a", "b")
    assert (params["x_y"], params["x_y-2"]) == ("colon", "underscore")
    assert (params["extra.a_b"], params["extra.a_b-2"], params["extra.a.b"]) == ("1", "2", "3")
    assert params["gpus"] == "null"
    assert capfd.readouterr().err.count("came out under the key of another param") == 1


def test_jobs_started_together_on_a_new_sqlite_store_each_get_their_run(tmp_path, caplog):
    """Two jobs create one new store at once: each gets its run and the store stays searchable. The store is made
    by the jobs' helper processes (a training process only hands its helper the URI), so two trackers in this
    process, a real helper each, open their runs together once both have imported MLflow."""
    store = tmp_path / "new-store"
    trackers = [MLflowTracker(MLflowConfig(mlflow_tracking_uri=str(store))) for _ in range(2)]
    for tracker in trackers:
        assert tracker.callback.ready.wait(120)
    for index, tracker in enumerate(trackers):
        tracker.set_params({"job": index})  # the run opens now: both within a moment
    for tracker in trackers:
        tracker.close()
    assert [tracker.degraded_reason for tracker in trackers] == [None, None]
    assert not degraded_warnings(caplog, DEGRADED_WARNING)
    runs = search(f"sqlite:///{store}/mlflow.db")
    assert sorted(run.data.params["job"] for run in runs) == ["0", "1"]
    assert {run.info.status for run in runs} == {"FINISHED"}


# ---- a run's status is the job's outcome ----


def assert_runs_ended(workdir: Path, status: str) -> None:
    """The job's MLflow run (store ``workdir/mlflow``) and Aim run (repo ``workdir/aim``) ended with ``status``."""
    (run,) = search(f"sqlite:///{workdir / 'mlflow'}/mlflow.db")
    assert run.info.status == status
    (aim_run,) = read_runs(workdir / "aim", f"run.status == '{status}'")  # as users query it
    assert aim_run["params"]["status"] == status and not aim_run["active"]


def both_trackers(workdir: Path) -> list[str]:
    """Flags for MLflow and Aim runs in ``workdir`` (its Aim repo made), opened at once (the metadata is set before
    the model loads)."""
    args = ["--trackers", "mlflow", "aim", "--mlflow_tracking_uri", str(workdir / "mlflow")]
    return [*args, "--aim_repo", str(existing_repo(workdir / "aim")), "--exp_metadata", METADATA_FLAG]


def test_runs_of_a_user_error_and_an_interrupted_job_end_with_the_jobs_outcome(
    tiny_model, tmp_path, monkeypatch, capfd
):
    """A user error (a data file without the text field) through the CLI's main, and a SIGTERM in training through
    train(), in this process (the helpers are real processes): MLflow's run status and Aim's ``status`` param say
    FAILED and KILLED. A crash is test_train_that_raises_closes_the_runs_it_built_as_failed's; the exit statuses a
    shell sees (1, 143) are test_launch.py's and test_error_logging_e2e.py's."""
    from tests.helpers.graceful_stop import SignalAtStep
    from tuning.sft_trainer import get_parser, parse_arguments, train
    from tuning.utils.graceful_stop import GracefulStopCallback

    bad_data = tmp_path / "bad.jsonl"
    bad_data.write_text('{"input": "a"}\n' * 8)
    workdir = tmp_path / "user_error"
    args = [*cli_args(tiny_model, str(workdir), data=str(bad_data)), *both_trackers(workdir)]
    exit_code, stderr = run_main(args, monkeypatch, capfd)
    assert exit_code == 1, stderr[-3000:]
    assert_runs_ended(workdir, "FAILED")

    workdir = tmp_path / "sigterm"
    argv = [*cli_args(tiny_model, str(workdir), max_steps=5), *both_trackers(workdir)]
    monkeypatch.setattr(sys, "argv", ["sft_trainer", *argv])
    args = parse_arguments(get_parser())
    stop = GracefulStopCallback()
    try:
        trainer, _, _ = train(
            args.model_args,
            args.data_args,
            args.training_args,
            tracker_configs=args.tracker_configs,
            callbacks=[SignalAtStep(1, signal.SIGTERM), stop],
            exp_metadata=args.experiment_metadata,
        )
    finally:
        stop.restore_signal_handlers()
    assert (trainer.state.global_step, stop.received_signal) == (1, signal.SIGTERM)
    assert_runs_ended(workdir, "KILLED")


class CrashAtStep2(TrainerCallback):
    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == 2:
            raise RuntimeError("injected crash at step 2")


def tracker_helpers() -> set[int]:
    """The pids of this process's tracker helper processes still running (earlier tests' included)."""
    helpers = set()
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):  # one that ends meanwhile is not left
            if child.status() != psutil.STATUS_ZOMBIE and "tuning.trackers.helper_child" in child.cmdline():
                helpers.add(child.pid)
    return helpers


def test_train_that_raises_closes_the_runs_it_built_as_failed(tiny_model, tmp_path, monkeypatch):
    """The Python API: ``train()`` builds the trackers (MLflow and Aim), training crashes; both runs end FAILED and
    the helpers are gone when it has raised."""
    from tuning.sft_trainer import get_parser, parse_arguments, train

    argv = cli_args(tiny_model, str(tmp_path / "out"), max_steps=5)
    monkeypatch.setattr(sys, "argv", ["sft_trainer", *argv, *both_trackers(tmp_path)])
    args = parse_arguments(get_parser())
    earlier_helpers = tracker_helpers()
    with pytest.raises(RuntimeError, match="injected crash"):
        train(
            args.model_args,
            args.data_args,
            args.training_args,
            tracker_configs=args.tracker_configs,
            callbacks=[CrashAtStep2()],
            exp_metadata={"dataset_id": "crashed"},
        )
    assert tracker_helpers() <= earlier_helpers
    assert_runs_ended(tmp_path, "FAILED")
    store = f"sqlite:///{tmp_path / 'mlflow'}/mlflow.db"
    (run,) = search(store, "params.dataset_id = 'crashed'")
    assert sorted(history(store, run.info.run_id, "loss")) == [1, 2]  # logged before the crash


def test_trackers_built_before_one_that_cannot_be_are_closed(tmp_path):
    """A bad MLflow config fails the build after Aim's helper started: that helper does not outlive the error."""
    from tuning.trackers.tracker_factory import build_trackers

    configs = TrackerConfigFactory(
        aim_config=AimConfig(aim_repo=str(tmp_path / "aim")), mlflow_config=MLflowConfig(mlflow_close_timeout=0)
    )
    earlier_helpers = tracker_helpers()
    with pytest.raises(UserInputError, match="--mlflow_close_timeout"):
        build_trackers(["aim", "mlflow"], configs)
    assert tracker_helpers() <= earlier_helpers


def test_bench_train_whose_mlflow_config_is_bad_ends_the_aim_run_it_opened_as_failed(
    bench_train, tiny_model, tmp_path, capfd
):
    """bench_train opens each run as it builds its tracker: one that cannot be built fails the job, and the run
    opened before it ends as FAILED, not FINISHED at exit."""
    args = bench_args(tiny_model, tmp_path)
    args += ["--trackers", "aim", "mlflow", "--aim_repo", str(existing_repo(tmp_path / "aim"))]
    args += ["--mlflow_close_timeout", "0"]
    capfd.readouterr()
    returncode = bench_train.main(args)
    stderr = capfd.readouterr().err
    assert returncode == 1 and "--mlflow_close_timeout" in stderr, stderr[-3000:]
    (run,) = read_runs(tmp_path / "aim")
    assert run["params"]["status"] == "FAILED" and not run["active"]
