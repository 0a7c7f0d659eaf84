"""The tracker helper's protocol, in process: a ``HelperChild`` serving an echo backend in a thread over a real
``multiprocessing`` pipe, driven as the transport drives it; then the parent side (``IsolatedCallback`` over its
``HelperTransport``) against children serving on threads (tests/helpers/thread_helper.py): messages, acknowledgements,
degradation, the end. No subprocess, so these run in ``make test-fast``; the real helpers (spawned, adopted, killed,
against real servers) are the two tests marked slow here and test_aim_tracker.py's and test_mlflow_tracker.py's.
"""

import json
import socket
import threading
import time
from multiprocessing.connection import Pipe

import pytest

from tests.helpers.echo_backend import BlockedTrack, EchoBackend, FailingTrack
from tests.helpers.thread_helper import KILLED_STATUS, thread_helpers
from tuning.trackers.helper_child import KILLED, HelperChild
from tuning.trackers.helper_transport import EarlyHelpers
from tuning.trackers.isolated import IsolatedCallback
from tuning.trackers.tracker import KILLED as TRACKER_KILLED


class Served:
    """A child serving ``backend`` on a thread; ``exits`` holds the exit statuses it asked for."""

    def __init__(self, backend):
        self.backend = backend
        self.parent, child_end = Pipe()
        self.exits: list[int] = []
        self.alarms: list[int] = []
        self.child = HelperChild(child_end, backend, exit=self.exits.append, alarm=self.alarms.append)
        self.thread = threading.Thread(target=self.child.serve, daemon=True)
        self.thread.start()
        assert self.answer() == {"ack": 0}  # ready: the backend is imported

    def answer(self) -> dict:
        assert self.parent.poll(10), "the child did not answer"
        return self.parent.recv()

    def send(self, *messages: dict) -> dict:
        self.parent.send(list(messages))
        return self.answer()

    def ended(self) -> bool:
        self.thread.join(10)
        return not self.thread.is_alive() and self.exits == [0]


def opening(server=None, **options) -> dict:
    return {"op": "open", "server": server, "timeout": 5, **options}


def test_a_run_is_opened_tracked_annotated_and_closed_with_each_list_acknowledged():
    served = Served(EchoBackend())
    opened = served.send(opening(repo="r"), {"op": "track", "points": [[1.0, "loss", 1, None, {}, 0.0]]})
    assert opened == {"ack": 2, "info": {"run_id": "echo-1", "options": {"repo": "r"}}}
    assert served.send({"op": "set", "name": "hparams", "params": {"lr": 0.1}}) == {"ack": 3}
    assert served.send({"op": "close", "status": "FINISHED"}) == {"ack": 4}
    assert served.ended()
    assert [name for name, _ in served.backend.calls] == ["open", "track", "set", "close"]
    assert served.backend.calls[-1] == ("close", "FINISHED")


def test_a_close_without_an_open_run_only_ends_the_child():
    served = Served(EchoBackend())
    assert served.send({"op": "close", "status": "FAILED"}) == {"ack": 1}
    assert served.ended() and served.backend.calls == []


def test_a_failing_call_is_answered_with_its_error_and_ends_the_child():
    served = Served(FailingTrack())
    answer = served.send(opening(), {"op": "track", "points": [[1.0, "loss", 1, None, {}, 0.0]]})
    assert answer["ack"] == 1 and answer["failed"] == "RuntimeError('the store is read-only')"
    assert served.ended()


def test_a_parent_gone_without_closing_ends_the_run_as_killed_within_the_timeout():
    served = Served(EchoBackend())
    served.send(opening())
    served.parent.close()  # the training process died
    assert served.ended()
    assert served.backend.calls[-1] == ("close", KILLED) and KILLED == TRACKER_KILLED
    assert served.alarms == [5]  # the close is bounded by the run's timeout


def test_an_unreachable_server_is_gone_before_the_run_opens():
    with socket.socket() as unused:  # a port nothing listens on once closed
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    served = Served(EchoBackend())
    answer = served.send(opening(server=["127.0.0.1", port]))
    assert answer["ack"] == 0 and f"127.0.0.1:{port} is unreachable" in answer["gone"]
    assert served.ended() and served.backend.calls == []


@pytest.mark.parametrize("dies", [True, False], ids=["server dies just after", "server stays"])
def test_a_call_cut_short_by_a_server_that_dies_a_moment_later_names_the_dead_server(dies):
    """A server being killed can fail a call and still accept a connection for a moment: the failure's reason is the
    dead server if it stops accepting within SETTLE_S, else the call's own error."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    served = Served(FailingTrack())
    assert served.send(opening(server=["127.0.0.1", port])) == {"ack": 1, "info": {"run_id": "echo-1", "options": {}}}
    if dies:
        threading.Timer(0.3, listener.close).start()
    answer = served.send({"op": "track", "points": [[1.0, "loss", 1, None, {}, 0.0]]})
    listener.close()
    if dies:
        assert f"127.0.0.1:{port} is unreachable" in answer["gone"] and "failed" not in answer
    else:
        assert answer["failed"] == "RuntimeError('the store is read-only')" and "gone" not in answer
    assert served.ended()


@pytest.mark.parametrize("backend", [EchoBackend, FailingTrack])
def test_messages_after_the_end_are_never_handled(backend):
    served = Served(backend())
    served.parent.send([opening(), {"op": "close", "status": "FINISHED"}, {"op": "track", "points": []}])
    answer = served.answer()
    assert served.ended() and answer["ack"] == 2 and ("track", []) not in served.backend.calls


ECHO = "tests.helpers.echo_backend:EchoBackend"


class EchoCallback(IsolatedCallback):
    tracker, label, export_filename = "echo", "Echo", "echo.json"
    default_backend = ECHO


def threaded(backend: str = ECHO, timeout: float = 5.0, **kwargs):
    """An ``EchoCallback`` whose helper (running ``backend``) serves on a thread; and that helper."""
    early, children = thread_helpers()
    early.start(backend)
    callback = EchoCallback({"repo": "r"}, timeout=timeout, backend=backend, early_helpers=early, **kwargs)
    assert early.adopt(backend) is None and len(children) == 1  # the callback took it
    return callback, children[0]


def test_a_callback_built_directly_runs_its_class_backend():
    """Built without the registry, a callback still knows what its helper runs: the backend is handed to it or is
    its class's, never looked up in the registry."""
    early, children = thread_helpers()
    early.start(ECHO)
    callback = EchoCallback({}, early_helpers=early)
    callback.close("FINISHED")
    assert callback.backend == ECHO and callback.degraded_reason is None and children[0].poll() == 0


def test_tracked_points_params_and_the_close_reach_the_backend_in_order_and_are_all_acknowledged(tmp_path):
    callback, child = threaded(export_dir=str(tmp_path))
    callback.track(1.0, "loss", 1)
    callback.track(0.5, "loss", 2, context={"subset": "train"})
    callback.set_params({"lr": 0.1}, "hparams")
    callback.close("FINISHED")
    calls = child.backend.calls
    assert [name for name, _ in calls] == ["open", "track", "set", "close"]
    assert [point[:3] for point in calls[1][1]] == [[1.0, "loss", 1], [0.5, "loss", 2]]  # batched, in order
    assert calls[2][1] == ("hparams", {"lr": 0.1}) and calls[3] == ("close", "FINISHED")
    assert callback.degraded_reason is None and not callback.transport.pending and child.poll() == 0
    assert callback.run_info["run_id"] == "echo-1" and callback.ready.is_set()
    assert json.loads((tmp_path / "echo.json").read_text()) == callback.run_info


@pytest.mark.parametrize("status", ["FAILED", "KILLED"])
def test_the_jobs_outcome_is_the_runs_status(status):
    callback, child = threaded()
    callback.track(1.0, "loss", 1)
    callback.close(status)
    assert child.backend.calls[-1] == ("close", status)


def test_a_failing_call_degrades_tracking_naming_it_and_training_goes_on():
    callback, child = threaded("tests.helpers.echo_backend:FailingTrack")
    callback.track(1.0, "loss", 1)
    callback._flush_points()
    callback.transport.wait_exited()
    assert callback.degraded_reason == "tracking failed: RuntimeError('the store is read-only')"
    started = time.monotonic()
    callback.track(2.0, "loss", 2)  # after degrading: no-ops that neither raise nor wait
    callback.set_params({"lr": 0.1}, "hparams")
    callback.close("FINISHED")
    assert time.monotonic() - started < 1.0 and ("set", ("hparams", {"lr": 0.1})) not in child.backend.calls


def test_a_store_that_stops_answering_is_given_up_after_the_timeout_and_its_helper_killed():
    BlockedTrack.release.clear()
    callback, child = threaded("tests.helpers.echo_backend:BlockedTrack", timeout=0.3)
    callback.set_params({"lr": 0.1}, "hparams")  # the run opens
    while callback.transport.pending:
        time.sleep(0.01)
    callback.track(1.0, "loss", 1)
    callback._flush_points()
    started = time.monotonic()
    callback.track(2.0, "loss", 2)  # training never waits for the stuck helper
    assert time.monotonic() - started < 0.1
    time.sleep(0.5)
    assert callback.transport.blocked()
    assert callback.degraded_reason == "tracking blocked for more than 0.3s"
    assert child.wait(5) == KILLED_STATUS


def test_a_helper_that_exits_before_the_close_degrades_tracking_with_its_exit_status():
    callback, child = threaded("tests.helpers.echo_backend:ExitsOnSet")
    callback.set_params({"lr": 0.1}, "hparams")
    callback.transport.wait_exited()
    assert callback.degraded_reason == "the Echo helper process exited unexpectedly (exit status 3)"
    callback.close("FINISHED")  # nothing left to do, and it does not wait


def test_a_close_is_the_end_and_the_helper_exits_without_being_degraded():
    callback, child = threaded()
    callback.close("FINISHED")
    callback.transport.wait_exited()
    assert child.poll() == 0 and callback.degraded_reason is None and not callback.transport.pending
    callback.track(1.0, "loss", 1)  # after the end: dropped, no error
    assert [name for name, _ in child.backend.calls] == []  # no run was opened: nothing was tracked


@pytest.mark.slow  # a real helper process, though a light one
def test_a_callback_adopts_the_helper_started_early_and_exports_its_run(tmp_path):
    early = EarlyHelpers()
    early.start(ECHO)
    callback = EchoCallback({"repo": "r"}, export_dir=str(tmp_path), backend=ECHO, early_helpers=early)
    assert early.adopt(ECHO) is None  # the callback took it
    callback.track(1.0, "loss", 1)
    callback.set_params({"lr": 0.1}, "hparams")
    callback.close("FINISHED")
    assert callback.degraded_reason is None and callback.run_info["run_id"] == "echo-1"
    assert json.loads((tmp_path / "echo.json").read_text()) == callback.run_info
    assert callback.transport.process.poll() == 0 and not callback.transport.pending
