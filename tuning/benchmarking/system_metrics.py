"""System metrics sampled in a background thread (series: docs/dump-schema.md). NVML (``nvidia-ml-py``, extra
``nvml``) is imported only by ``init_nvml``; without it or a driver the GPU series are absent. A sample that fails is
logged once and skipped: measuring must never stop training.
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
import torch

from tuning.benchmarking.dump import GPU_POWER, GPU_UTILIZATION, PROCESS_ANON_RSS, PROCESS_RSS

logger = logging.getLogger(__name__)

GPU_MEMORY_USED = "gpu_memory_used_bytes"
GPU_POWER_PERCENT = "gpu_power_percent"
GPU_TEMPERATURE = "gpu_temperature_celsius"


def init_nvml() -> Any | None:
    """The initialised pynvml module, or None where NVML is not usable; the caller shuts it down."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - missing package, missing driver and no GPU all mean "no GPU series"
        logger.debug("NVML unavailable, no GPU metrics: %s", exc)
        return None
    return pynvml


def nvml_text(value: str | bytes) -> str:
    """pynvml returns bytes in old releases, str in current ones."""
    return value.decode() if isinstance(value, bytes) else value


def visible_gpu_handles(nvml: Any) -> list[Any]:
    """NVML handles of the GPUs this process's CUDA sees, in CUDA's order: item ``i`` is ``cuda:i``.

    ``CUDA_VISIBLE_DEVICES`` entries are NVML indices, UUIDs or prefixes only one GPU's UUID starts with (MIG UUIDs:
    NVML's own lookup); like CUDA, the list ends before the first entry naming no GPU or one already named. Unset:
    NVML's order, which is CUDA's on machines with one GPU model.
    """
    gpus = [nvml.nvmlDeviceGetHandleByIndex(index) for index in range(nvml.nvmlDeviceGetCount())]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return gpus
    uuids = [nvml_text(nvml.nvmlDeviceGetUUID(handle)) for handle in gpus]
    handles: dict[str, Any] = {}  # by UUID, in CUDA's order
    for item in (part.strip() for part in visible.split(",")):
        matches = [index for index, uuid in enumerate(uuids) if item and uuid.startswith(item)]  # UUIDs or prefixes
        if item.isdigit() and int(item) < len(gpus):
            matches = [int(item)]
        if len(matches) == 1:
            uuid, handle = uuids[matches[0]], gpus[matches[0]]
        else:  # a MIG UUID; else no GPU (no such index, an empty entry, a prefix of several UUIDs): NVML fails too
            try:
                uuid, handle = item, nvml.nvmlDeviceGetHandleByUUID(item.encode())  # bytes: every pynvml takes them
            except Exception:  # noqa: BLE001 - NVML knows no such UUID either
                break
        if uuid in handles:
            break
        handles[uuid] = handle
    return list(handles.values())


class SystemMetricsSampler:
    """Calls ``sink(name, value, context)`` for every series every ``interval`` seconds, and once more at ``stop()``."""

    def __init__(self, interval: float, sink: Callable[[str, float, dict[str, Any]], None]):
        self.interval = interval
        self.sink = sink
        self._process = psutil.Process()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml: Any | None = None
        self._gpus: list[Any] = []
        self._failed: set[str] = set()

    def start(self) -> None:
        self._nvml = init_nvml()
        if self._nvml is not None:
            try:
                self._gpus = visible_gpu_handles(self._nvml)
            except Exception as exc:  # noqa: BLE001 - an NVML that cannot list its GPUs costs their series only
                logger.warning("no GPU metrics: NVML could not list the GPUs: %s", exc)
        psutil.cpu_percent(interval=None)  # the first reading only sets the baseline
        self._thread = threading.Thread(target=self._loop, name="system-metrics", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End sampling with one last sample: even a run shorter than the interval has one."""
        if self._thread is None or self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout=max(5.0, self.interval))
        self.sample()
        if self._nvml is not None:
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()
            self._nvml = None

    def energy_millijoules(self) -> list[float | None]:
        """Each sampled GPU's total energy counter (millijoules since the driver loaded; None where NVML lacks it)."""
        readings: list[float | None] = []
        for handle in self._gpus:
            try:
                readings.append(float(self._nvml.nvmlDeviceGetTotalEnergyConsumption(handle)))
            except Exception:  # noqa: BLE001 - older GPUs have no counter: the dump integrates their power instead
                readings.append(None)
        return readings

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def sample(self) -> None:
        self._read("cpu_percent", lambda: psutil.cpu_percent(interval=None))
        self._read("memory_percent", lambda: psutil.virtual_memory().percent)
        self._read(PROCESS_RSS, lambda: self._process.memory_info().rss)
        if sys.platform.startswith("linux"):
            self._read(PROCESS_ANON_RSS, lambda: anon_rss_bytes(self._process))
        for index, handle in enumerate(self._gpus):
            self._sample_gpu(index, handle)

    def _sample_gpu(self, index: int, handle: Any) -> None:
        nvml, context = self._nvml, {"gpu": index}
        self._read(GPU_UTILIZATION, lambda: nvml.nvmlDeviceGetUtilizationRates(handle).gpu, context)
        self._read(GPU_MEMORY_USED, lambda: nvml.nvmlDeviceGetMemoryInfo(handle).used, context)
        watts = self._read(GPU_POWER, lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0, context)
        if watts is not None:  # the same reading in % of the limit the GPU enforces now (mW; an admin may change it)
            limit_watts = nvml.nvmlDeviceGetEnforcedPowerLimit
            self._read(GPU_POWER_PERCENT, lambda: 100.0 * watts / (limit_watts(handle) / 1000.0), context)
        self._read(GPU_TEMPERATURE, lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU), context)

    def _read(self, name: str, read: Callable[[], float], context: dict[str, Any] | None = None) -> float | None:
        """Sample one series; None when it could not be read (warned about once per series)."""
        try:
            value = float(read())
        except Exception as exc:  # noqa: BLE001 - e.g. a GPU without power readings: skip that series
            key = f"{name}{context or ''}"
            if key not in self._failed:
                self._failed.add(key)
                logger.warning("system metric %s unavailable: %s", key, exc)
            return None
        self.sink(name, value, context or {})
        return value


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment_info() -> dict[str, Any]:
    """Versions the numbers depend on; CUDA, driver and GPU names when there is a GPU."""
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
        nvml = init_nvml()
        if nvml is not None:
            info["cuda_driver"] = nvml_text(nvml.nvmlSystemGetDriverVersion())
            nvml.nvmlShutdown()
    return info


def peak_rss_bytes() -> int:
    """This process's peak resident set size from the kernel, which updates it lazily (the current RSS may be more)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peak = peak if sys.platform == "darwin" else peak * 1024  # Linux reports KiB
    return max(peak, psutil.Process().memory_info().rss)


def anon_rss_bytes(process: psutil.Process) -> int:
    """``process``'s resident anonymous memory on Linux: its RSS less the file-backed and shared pages (``statm``'s
    shared), which include memory-mapped Arrow data that the kernel can drop and read again."""
    memory = process.memory_info()
    return memory.rss - memory.shared


def cuda_peak_memory() -> list[dict[str, int]] | None:
    """torch's peak allocated and reserved memory per device this process used (not other ranks' GPUs as zeros), or
    None without CUDA."""
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    return [
        {
            "device": index,
            "max_memory_allocated_bytes": torch.cuda.max_memory_allocated(index),
            "max_memory_reserved_bytes": reserved,
        }
        for index in range(torch.cuda.device_count())
        if (reserved := torch.cuda.max_memory_reserved(index))
    ]
