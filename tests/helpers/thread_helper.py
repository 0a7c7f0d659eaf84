"""The parent side of the tracker helper protocol, in process: ``thread_helpers()`` is an ``EarlyHelpers`` whose
helpers are ``HelperChild``\\ ren serving on threads, connected back through the transport's real listener, behind
the face of the ``subprocess.Popen`` the transport holds (poll, wait, kill). Only the process boundary is left out:
the real child process is test_aim_tracker.py's and test_mlflow_tracker.py's."""

import pkgutil
import threading
from multiprocessing.connection import Client, Listener

from tuning.trackers.helper_child import HelperChild
from tuning.trackers.helper_transport import EarlyHelpers

KILLED_STATUS = -9  # what Popen.wait returns for a SIGKILLed child


class ThreadChild:
    """A helper child on a thread; ``backend`` is the instance it serves (its calls can be inspected)."""

    def __init__(self, backend_path: str, address: str):
        self.backend = pkgutil.resolve_name(backend_path)()
        self.returncode: int | None = None
        self._connection = None
        self._ended = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(address,), daemon=True)
        self._thread.start()

    def _serve(self, address: str) -> None:
        self._connection = Client(address, family="AF_UNIX")
        try:
            HelperChild(self._connection, self.backend, exit=self._exit, alarm=lambda seconds: None).serve()
        except SystemExit as exc:  # the library ended the process
            self._exit(exc.code if isinstance(exc.code, int) else 1)
        except OSError:  # its connection closed under it: killed
            if self.returncode is None:
                raise

    def _exit(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
        self._connection.close()
        self._ended.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._ended.wait(timeout)
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            self.returncode = KILLED_STATUS
            release = getattr(self.backend, "release", None)
            if release is not None:
                release.set()  # a call blocked in the store ends with the process
        if self._connection is not None:
            self._connection.close()
        self._ended.set()


def thread_helpers() -> tuple[EarlyHelpers, list[ThreadChild]]:
    """An ``EarlyHelpers`` starting thread children, and the list of those it started."""
    children: list[ThreadChild] = []

    def spawn(backend: str) -> tuple[ThreadChild, Listener]:
        listener = Listener(family="AF_UNIX")
        children.append(ThreadChild(backend, listener.address))
        return children[-1], listener

    return EarlyHelpers(spawn=spawn), children
