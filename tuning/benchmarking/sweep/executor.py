"""What runs a sweep's points: an executor starts a point when it has room for it, and hands back the points that
ended. ``local`` runs them as process trees of this machine (``local_executor``), ``ray`` as tasks on a Ray cluster
(``ray_executor``); another (one point across several nodes, say) implements the same four calls.
"""

from collections.abc import Sized
from typing import Any, Protocol

from tuning.benchmarking.sweep.spec import Point

# How a point ended: its exit_code, timed_out and host; from an executor whose nodes share no filesystem with the
# driver also its files ({name in the points directory: bytes}), which the sweep writes before it reads them.
Ended = dict[str, Any]


class Executor(Protocol):
    running: Sized  # the points started and not yet handed back

    def can_start(self, point: Point) -> bool:
        """Whether ``point`` may start now (a free slot, enough free devices)."""

    def start(self, point: Point) -> None:
        """Start ``point``; its outcome comes back from ``wait`` or ``stop``."""

    def wait(self) -> list[tuple[Point, Ended]]:
        """The points that ended since the last call (after a short wait when none did)."""

    def stop(self) -> list[tuple[Point, Ended]]:
        """Every running point stopped and waited for; the ones that finished before the stop reached them."""


def check_gpus(points: list[Point], gpus: int, where: str) -> None:
    """With GPUs, a point that needs more than ``gpus`` (the most one machine has) is an error before anything runs."""
    if too_big := next((point for point in points if gpus and point.nproc > gpus), None):
        raise SystemExit(f"point {too_big.label} needs {too_big.nproc} GPUs; {where}")
