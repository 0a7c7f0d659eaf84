"""The local executor: a sweep's points as process trees of this machine, a device set each."""

import os
import socket
import subprocess
import time
from pathlib import Path

from tuning.benchmarking.sweep.executor import Ended, check_gpus
from tuning.benchmarking.sweep.point import POLL_SECONDS, PointProcess
from tuning.benchmarking.sweep.spec import Point


class LocalExecutor:
    """Points as process trees of this machine. With GPUs (``CUDA_VISIBLE_DEVICES``, else ``nvidia-smi``) each point
    gets ``nproc_per_node`` devices of its own; on CPU one point runs at a time unless ``concurrency`` says more. A
    point's files are ``points_dir/<id>.*``; ``pass_fds`` (the sweep's lock) are inherited by every point."""

    def __init__(
        self,
        points: list[Point],
        points_dir: Path,
        bench_train: str,
        point_timeout: float | None,
        concurrency: int | None,
        pass_fds: tuple[int, ...] = (),
    ):
        self.points_dir, self.bench_train, self.point_timeout, self.pass_fds = (
            points_dir,
            bench_train,
            point_timeout,
            pass_fds,
        )
        self.devices = visible_gpus()
        self.free_devices = list(self.devices)
        self.concurrency = concurrency or len(self.devices) or 1
        self.running: list[tuple[Point, PointProcess, list[str]]] = []  # and the devices it was given
        check_gpus(points, len(self.devices), f"this machine has {len(self.devices)} ({','.join(self.devices)})")
        if spread := next((point for point in points if point.nnodes > 1), None):
            raise SystemExit(f"point {spread.label} spans {spread.nnodes} nodes; run it with --executor ray")

    def can_start(self, point: Point) -> bool:
        return len(self.running) < self.concurrency and (not self.devices or point.nproc <= len(self.free_devices))

    def start(self, point: Point) -> None:
        devices = self.free_devices[: point.nproc]
        del self.free_devices[: point.nproc]
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(devices)} if devices else None
        stem = str(self.points_dir / point.id)
        popen = {"env": env, "pass_fds": self.pass_fds}
        process = PointProcess(point.flags, point.nproc, stem, self.bench_train, self.point_timeout, **popen)
        self.running.append((point, process, devices))

    def wait(self) -> list[tuple[Point, Ended]]:
        """The points that ended since the last call, each with its ``exit_code``, ``timed_out`` and ``host``."""
        ended = []
        for point, process, devices in list(self.running):
            if (code := process.poll()) is not None:
                self.running.remove((point, process, devices))
                self.free_devices += devices
                ended.append((point, {"exit_code": code, "timed_out": process.timed_out, "host": socket.gethostname()}))
        if not ended:
            time.sleep(POLL_SECONDS)
        return ended

    def stop(self) -> list[tuple[Point, Ended]]:
        """Every running point stopped and waited for (each writes its dump); none is recorded as finished."""
        for _, process, _ in self.running:
            process.stop()
        for _, process, _ in self.running:
            process.wait()
        self.running.clear()
        return []


def visible_gpus() -> list[str]:
    """This machine's GPUs as ``CUDA_VISIBLE_DEVICES`` entries (no torch import: the driver stays light)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [device for device in visible.split(",") if device.strip() not in ("", "-1")]
    try:
        query = ["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"]
        listing = subprocess.run(query, capture_output=True, text=True, timeout=60, check=True)
    except (OSError, subprocess.SubprocessError):  # no nvidia-smi, or no driver behind it
        return []
    return [line.strip() for line in listing.stdout.splitlines() if line.strip()]
