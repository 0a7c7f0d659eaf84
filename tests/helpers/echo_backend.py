"""A tracker helper backend that keeps every call it gets, for the helper protocol's tests; ``FailingTrack`` fails
its first ``track``."""

import threading
from typing import Any


class EchoBackend:
    def __init__(self):
        self.calls: list[tuple[str, Any]] = []

    def open(self, options: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("open", options))
        return {"run_id": "echo-1", "options": options}

    def track(self, points: list[list]) -> None:
        self.calls.append(("track", points))

    def set_params(self, name: str, params: dict[str, Any]) -> None:
        self.calls.append(("set", (name, params)))

    def close(self, status: str) -> None:
        self.calls.append(("close", status))


class FailingTrack(EchoBackend):
    def track(self, points: list[list]) -> None:
        raise RuntimeError("the store is read-only")


class BlockedTrack(EchoBackend):
    """A store that stops answering: its first ``track`` waits until ``release`` is set (the helper's kill sets it)."""

    release = threading.Event()

    def track(self, points: list[list]) -> None:
        self.release.wait(30)
        super().track(points)


class ExitsOnSet(EchoBackend):
    """A library that takes its process down with it (``os._exit`` inside a call): its first ``set_params`` ends
    the child without an answer."""

    def set_params(self, name: str, params: dict[str, Any]) -> None:
        raise SystemExit(3)
