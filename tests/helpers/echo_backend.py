"""A tracker helper backend that keeps every call it gets, for the helper protocol's tests; ``FailingTrack`` fails
its first ``track``."""

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
