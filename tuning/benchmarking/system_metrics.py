"""System metrics sampled by the benchmark itself, in a background thread, independent of any tracker.

Series (context ``{}`` unless said): ``cpu_percent`` (whole machine), ``memory_percent`` (whole machine),
``process_rss_bytes`` (this process); with NVIDIA GPUs, per visible device (context ``{"gpu": i}``, ``i`` as torch
numbers ``cuda:i``): ``gpu_utilization_percent``, ``gpu_memory_used_bytes``, ``gpu_power_watts``,
``gpu_power_percent`` (of the enforced power limit) and ``gpu_temperature_celsius``.

NVML comes from ``nvidia-ml-py`` (``pip install 'tuning-bench[nvml]'``), imported only here and only when a sampler
starts; without it, or without a driver, the GPU series are simply absent. A sample that fails is logged once and
skipped: measuring must never stop training.
"""

import contextlib
import importlib.metadata
import logging
import os
import platform
import resource
import sys
import threading
from collections.abc import Callable
from typing import Any

import psutil

from tuning.benchmarking.schema import PROCESS_RSS

logger = logging.getLogger(__name__)

Sink = Callable[[str, float, dict[str, Any]], None]


def _nvml() -> Any | None:
    """The initialised pynvml module, or None where NVML is not usable."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - missing package, missing driver and no GPU all mean "no GPU series"
        logger.debug("NVML unavailable, no GPU metrics: %s", exc)
        return None
    return pynvml


def _visible_gpu_handles(nvml: Any) -> list[Any]:
    """NVML handles of the devices this process sees, in CUDA order (``CUDA_VISIBLE_DEVICES`` ids or UUIDs)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return [nvml.nvmlDeviceGetHandleByIndex(index) for index in range(nvml.nvmlDeviceGetCount())]
    handles = []
    for item in (part.strip() for part in visible.split(",")):
        # CUDA stops at the first entry it cannot use; so do we.
        try:
            if item.isdigit():
                handles.append(nvml.nvmlDeviceGetHandleByIndex(int(item)))
            else:
                handles.append(nvml.nvmlDeviceGetHandleByUUID(item))
        except Exception:  # noqa: BLE001 - invalid index or UUID
            break
    return handles


class SystemMetricsSampler:
    """Calls ``sink(name, value, context)`` for every series every ``interval`` seconds, and once more at ``stop()``."""

    def __init__(self, interval: float, sink: Sink):
        self.interval = interval
        self.sink = sink
        self._process = psutil.Process()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml: Any | None = None
        self._gpus: list[Any] = []
        self._failed: set[str] = set()

    def start(self) -> None:
        self._nvml = _nvml()
        if self._nvml is not None:
            self._gpus = _visible_gpu_handles(self._nvml)
        psutil.cpu_percent(interval=None)  # the first reading only sets the baseline
        self._thread = threading.Thread(target=self._loop, name="system-metrics", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End sampling with one last sample, so that even a run shorter than the interval has one."""
        if self._thread is None or self._stop.is_set():
            return
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=max(5.0, self.interval))
        self.sample()
        if self._nvml is not None:
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()
            self._nvml = None

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def sample(self) -> None:
        self._read("cpu_percent", lambda: psutil.cpu_percent(interval=None))
        self._read("memory_percent", lambda: psutil.virtual_memory().percent)
        self._read(PROCESS_RSS, lambda: self._process.memory_info().rss)
        for index, handle in enumerate(self._gpus):
            self._sample_gpu(index, handle)

    def _sample_gpu(self, index: int, handle: Any) -> None:
        nvml = self._nvml
        readers: dict[str, Callable[[], float]] = {
            "gpu_utilization_percent": lambda: nvml.nvmlDeviceGetUtilizationRates(handle).gpu,
            "gpu_memory_used_bytes": lambda: nvml.nvmlDeviceGetMemoryInfo(handle).used,
            "gpu_power_watts": lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
            "gpu_power_percent": lambda: (
                100.0 * nvml.nvmlDeviceGetPowerUsage(handle) / nvml.nvmlDeviceGetEnforcedPowerLimit(handle)
            ),
            "gpu_temperature_celsius": lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU),
        }
        for name, read in readers.items():
            self._read(name, read, {"gpu": index})

    def _read(self, name: str, read: Callable[[], float], context: dict[str, Any] | None = None) -> None:
        try:
            self.sink(name, float(read()), context or {})
        except Exception as exc:  # noqa: BLE001 - e.g. a GPU without power readings: skip that series
            key = f"{name}{context or ''}"
            if key not in self._failed:
                self._failed.add(key)
                logger.warning("system metric %s%s unavailable: %s", name, context or "", exc)


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment_info() -> dict[str, Any]:
    """Versions the numbers depend on; CUDA, driver and GPU names when there is a GPU."""
    import torch

    info: dict[str, Any] = {
        "python": platform.python_version(),
        **{name: _version(name) for name in ("torch", "transformers", "trl", "peft", "aim")},
        "cuda": None,
        "cuda_driver": None,
        "gpus": [],
    }
    if torch.cuda.is_available():
        info["cuda"] = torch.version.cuda
        info["gpus"] = [torch.cuda.get_device_name(index) for index in range(torch.cuda.device_count())]
        nvml = _nvml()
        if nvml is not None:
            driver = nvml.nvmlSystemGetDriverVersion()
            info["cuda_driver"] = driver.decode() if isinstance(driver, bytes) else driver
            nvml.nvmlShutdown()
    return info


def peak_rss_bytes() -> int:
    """This process's peak resident set size, from the kernel rather than sampled.

    The kernel updates its high-water mark lazily, so the current RSS can be a little above it: take the larger.
    """
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peak = peak if sys.platform == "darwin" else peak * 1024  # Linux reports KiB
    return max(peak, psutil.Process().memory_info().rss)


def cuda_peak_memory() -> list[dict[str, int]] | None:
    """torch's peak allocated and reserved memory on each device this process used, or None without CUDA.

    Devices the process never allocated on (other ranks' GPUs) are left out rather than reported as zeros.
    """
    import torch

    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    peaks = []
    for index in range(torch.cuda.device_count()):
        reserved = torch.cuda.max_memory_reserved(index)
        if reserved:
            peaks.append(
                {
                    "device": index,
                    "max_memory_allocated_bytes": torch.cuda.max_memory_allocated(index),
                    "max_memory_reserved_bytes": reserved,
                }
            )
    return peaks
