"""A real tracking server for tests: on 127.0.0.1, in its own process group (servers fork
workers, which own the socket), ready once it accepts connections."""

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from tests.helpers.training import free_port


class ServerProcess:
    """``command(port)`` run on a free port until it accepts TCP connections there; its stderr goes to ``log_path``
    if given, ``env`` is added to its environment. ``stop()`` ends it as an operator would, ``kill()`` as a crash
    does."""

    name = "server"

    def __init__(
        self,
        command: Callable[[int], list[str]],
        startup_timeout: float,
        log_path: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.port = free_port()
        with open(log_path, "w") if log_path else contextlib.nullcontext(subprocess.DEVNULL) as stderr:
            self.process = subprocess.Popen(
                command(self.port),
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                start_new_session=True,
                env={**os.environ, **(env or {})},
            )
        deadline = time.monotonic() + startup_timeout
        while not self.accepts():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                log = f": {log_path.read_text()}" if log_path else ""
                raise RuntimeError(f"{self.name} on port {self.port} did not start{log}")
            time.sleep(0.2)

    def accepts(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
            return True
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL the whole server, as a crashed or evicted server dies: nothing gets flushed or closed."""
        self._signal(signal.SIGKILL)

    def stop(self) -> None:
        self._signal(signal.SIGTERM)

    def _signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, sig)
        self.process.wait(timeout=30)
        deadline = time.monotonic() + 10
        while self.accepts() and time.monotonic() < deadline:
            time.sleep(0.1)
