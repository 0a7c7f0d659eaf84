"""The tracker helper's protocol, in process: a ``HelperChild`` serving an echo backend in a thread over a real
``multiprocessing`` pipe, driven as the transport drives it. No subprocess, so these run in ``make test-fast``; the
real helpers (spawned, adopted, killed, against real servers) are test_aim_tracker.py's and test_mlflow_tracker.py's.
"""

import json
import socket
import threading
from multiprocessing.connection import Pipe

import pytest

from tests.helpers.echo_backend import EchoBackend, FailingTrack
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


@pytest.mark.parametrize("backend", [EchoBackend, FailingTrack])
def test_messages_after_the_end_are_never_handled(backend):
    served = Served(backend())
    served.parent.send([opening(), {"op": "close", "status": "FINISHED"}, {"op": "track", "points": []}])
    answer = served.answer()
    assert served.ended() and answer["ack"] == 2 and ("track", []) not in served.backend.calls


ECHO = "tests.helpers.echo_backend:EchoBackend"


class EchoCallback(IsolatedCallback):
    tracker, label, export_filename = "echo", "Echo", "echo.json"


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


@pytest.mark.slow
def test_a_failing_backend_degrades_tracking_and_names_the_call():
    callback = EchoCallback({}, backend="tests.helpers.echo_backend:FailingTrack")
    callback.track(1.0, "loss", 1)
    callback._flush_points()
    callback.transport.wait_exited()
    assert callback.degraded_reason == "tracking failed: RuntimeError('the store is read-only')"
    callback.close("FINISHED")  # nothing left to do, and it does not wait
