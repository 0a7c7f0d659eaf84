"""A stand-in for nvidia-ml-py's ``pynvml`` where no GPU is: the NVML calls tuning makes, over made-up devices.

Put this folder on ``PYTHONPATH`` (child processes) or the module into ``sys.modules["pynvml"]`` (this process). The
devices are the JSON list in ``$FAKE_NVML_DEVICES``, read at ``nvmlInit`` (or given to ``configure``), each an object
with ``uuid``, ``name``, ``utilization`` (percent), ``memory_used`` and ``memory_total`` (bytes), ``power_mw`` (a list
of readings that successive ``nvmlDeviceGetPowerUsage`` calls cycle through), ``enforced_limit_mw``, ``temperature``,
``energy_mj_per_read`` (how far the total energy counter, in millijoules from 0, advances with every read of it),
``mig_uuids`` (UUIDs of MIG instances NVML finds by UUID only) and ``unsupported`` (names of calls that raise
``NVMLError_NotSupported`` on that device). Like NVML, every call but ``nvmlInit`` fails before it or after
``nvmlShutdown``; an ``nvmlInit`` while ``$FAKE_NVML_INIT_ERROR`` is set fails, as on a machine without a driver.
"""

import json
import os
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

NVML_TEMPERATURE_GPU = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_NOT_FOUND = 6


class NVMLError(Exception):
    def __init__(self, value: int):
        self.value = value
        super().__init__(f"NVML error {value}")


class NVMLError_NotSupported(NVMLError):  # noqa: N801 - pynvml's name
    def __init__(self):
        super().__init__(NVML_ERROR_NOT_SUPPORTED)


_devices: list[dict[str, Any]] = []
_initialised = 0
_power_readings: dict[int, int] = {}
_energy_reads: dict[int, int] = {}


@dataclass(frozen=True)
class _Handle:
    index: int


def configure(devices: list[dict[str, Any]]) -> None:
    """Set the devices of this process's stand-in (instead of ``$FAKE_NVML_DEVICES``) and forget earlier state."""
    global _initialised
    _devices[:] = devices
    _initialised = 0
    _power_readings.clear()
    _energy_reads.clear()


def _call(name: str, handle: _Handle | None = None) -> dict[str, Any] | None:
    """The device behind ``handle`` (None without one), raising as NVML would for this call."""
    if not _initialised:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    if handle is None:
        return None
    device = _devices[handle.index]
    if name in device.get("unsupported", ()):
        raise NVMLError_NotSupported()
    return device


def nvmlInit() -> None:  # noqa: N802 - pynvml's names from here on
    global _initialised
    if os.environ.get("FAKE_NVML_INIT_ERROR"):
        raise NVMLError(NVML_ERROR_DRIVER_NOT_LOADED)
    if "FAKE_NVML_DEVICES" in os.environ and not _initialised:
        _devices[:] = json.loads(os.environ["FAKE_NVML_DEVICES"])
    _initialised += 1


def nvmlShutdown() -> None:  # noqa: N802
    global _initialised
    _call("nvmlShutdown")
    _initialised -= 1


def nvmlSystemGetDriverVersion() -> str:  # noqa: N802
    _call("nvmlSystemGetDriverVersion")
    return "580.00.00"


def nvmlDeviceGetCount() -> int:  # noqa: N802
    _call("nvmlDeviceGetCount")
    return len(_devices)


def nvmlDeviceGetHandleByIndex(index: int) -> _Handle:  # noqa: N802
    _call("nvmlDeviceGetHandleByIndex")
    if not 0 <= index < len(_devices):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return _Handle(index)


def nvmlDeviceGetHandleByUUID(uuid: str | bytes) -> _Handle:  # noqa: N802
    _call("nvmlDeviceGetHandleByUUID")
    uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
    for index, device in enumerate(_devices):
        if uuid == device["uuid"] or uuid in device.get("mig_uuids", ()):
            return _Handle(index)
    raise NVMLError(NVML_ERROR_NOT_FOUND)


def nvmlDeviceGetUUID(handle: _Handle) -> str:  # noqa: N802
    return _call("nvmlDeviceGetUUID", handle)["uuid"]


def nvmlDeviceGetName(handle: _Handle) -> str:  # noqa: N802
    return _call("nvmlDeviceGetName", handle).get("name", "Fake GPU")


def nvmlDeviceGetUtilizationRates(handle: _Handle) -> SimpleNamespace:  # noqa: N802
    device = _call("nvmlDeviceGetUtilizationRates", handle)
    return SimpleNamespace(gpu=device["utilization"], memory=device["utilization"] // 2)


def nvmlDeviceGetMemoryInfo(handle: _Handle) -> SimpleNamespace:  # noqa: N802
    device = _call("nvmlDeviceGetMemoryInfo", handle)
    total = device.get("memory_total", 2 * device["memory_used"])
    return SimpleNamespace(total=total, used=device["memory_used"], free=total - device["memory_used"])


def nvmlDeviceGetPowerUsage(handle: _Handle) -> int:  # noqa: N802
    device = _call("nvmlDeviceGetPowerUsage", handle)
    reading = _power_readings.get(handle.index, 0)
    _power_readings[handle.index] = reading + 1
    return device["power_mw"][reading % len(device["power_mw"])]


def nvmlDeviceGetEnforcedPowerLimit(handle: _Handle) -> int:  # noqa: N802
    return _call("nvmlDeviceGetEnforcedPowerLimit", handle)["enforced_limit_mw"]


def nvmlDeviceGetTemperature(handle: _Handle, sensor: int) -> int:  # noqa: N802
    device = _call("nvmlDeviceGetTemperature", handle)
    if sensor != NVML_TEMPERATURE_GPU:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return device["temperature"]


def nvmlDeviceGetTotalEnergyConsumption(handle: _Handle) -> int:  # noqa: N802
    device = _call("nvmlDeviceGetTotalEnergyConsumption", handle)
    _energy_reads[handle.index] = _energy_reads.get(handle.index, 0) + 1
    return _energy_reads[handle.index] * device.get("energy_mj_per_read", 0)
