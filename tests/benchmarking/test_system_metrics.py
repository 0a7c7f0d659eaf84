"""The NVML side of the system-metrics sampler, against the stand-in NVML of tests/helpers/fake_nvml (no GPU here):
which GPU each CUDA index is (CUDA_VISIBLE_DEVICES by index, UUID, UUID prefix, MIG UUID), what is read from it, and
that a failing reading or a missing NVML costs only the series concerned."""

import logging
import mmap
import sys
from types import ModuleType

import pytest

from tests.helpers.nvml import load_fake_nvml
from tuning.benchmarking.system_metrics import (
    GPU_MEMORY_USED,
    GPU_POWER,
    GPU_POWER_PERCENT,
    GPU_TEMPERATURE,
    GPU_UTILIZATION,
    SystemMetricsSampler,
    init_nvml,
    visible_gpu_handles,
)

ANON_SERIES = {"process_anon_rss_bytes"} if sys.platform.startswith("linux") else set()
GPU_SERIES = {GPU_UTILIZATION, GPU_MEMORY_USED, GPU_POWER, GPU_POWER_PERCENT, GPU_TEMPERATURE}

# Two GPUs whose UUIDs share a prefix, and one carrying a MIG instance. Enforced and management power limits differ.
DEVICES = [
    {
        "uuid": "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6",
        "utilization": 91,
        "memory_used": 70 * 2**30,
        "power_mw": [512_000, 640_000],
        "enforced_limit_mw": 640_000,
        "temperature": 61,
    },
    {
        "uuid": "GPU-8932f9aa-1111-2222-3333-444444444444",
        "utilization": 3,
        "memory_used": 2**30,
        "power_mw": [75_500],
        "enforced_limit_mw": 700_000,
        "temperature": 35,
    },
    {
        "uuid": "GPU-5d7a1c33-aaaa-bbbb-cccc-dddddddddddd",
        "mig_uuids": ["MIG-0f6e2b1c-9a8b-5c4d-8e7f-123456789abc"],
        "utilization": 55,
        "memory_used": 40 * 2**30,
        "power_mw": [300_000, 350_000, 400_000],
        "enforced_limit_mw": 500_000,
        "temperature": 48,
    },
]


@pytest.fixture
def fake_nvml(monkeypatch) -> ModuleType:
    module = load_fake_nvml()
    module.configure(DEVICES)
    monkeypatch.setitem(sys.modules, "pynvml", module)
    for name in ("CUDA_VISIBLE_DEVICES", "FAKE_NVML_DEVICES", "FAKE_NVML_INIT_ERROR"):
        monkeypatch.delenv(name, raising=False)
    return module


@pytest.mark.parametrize(
    ("visible", "expected"),
    [
        (None, [0, 1, 2]),
        ("2,0", [2, 0]),
        ("GPU-5d7a1c33-aaaa-bbbb-cccc-dddddddddddd,1", [2, 1]),
        (" GPU-5d7a , 0 ", [2, 0]),  # a unique prefix, spaces around entries
        ("1,GPU-8932f937", [1, 0]),  # the prefix of one UUID only
        ("GPU-8932f9,2", []),  # a prefix of two UUIDs names no GPU: CUDA stops there
        ("0,7,1", [0]),  # no GPU 7: the list ends before it
        ("1,GPU-00000000,0", [1]),
        ("0,0,1", [0]),
        ("", []),
        ("-1", []),
        ("MIG-0f6e2b1c-9a8b-5c4d-8e7f-123456789abc", [2]),  # NVML's own lookup
    ],
)
def test_visible_gpus_are_cuda_s_devices_in_cuda_s_order(fake_nvml, monkeypatch, visible, expected):
    if visible is not None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    nvml = init_nvml()
    assert [handle.index for handle in visible_gpu_handles(nvml)] == expected


def sample_points(sink_points: list, name: str, gpu: int) -> list[float]:
    return [value for point_name, value, context in sink_points if point_name == name and context == {"gpu": gpu}]


def test_each_visible_gpu_is_sampled_under_its_cuda_index(fake_nvml, monkeypatch):
    """CUDA_VISIBLE_DEVICES names NVML's GPU 2 by UUID, then GPU 0: they are {"gpu": 0} and {"gpu": 1}, and power is
    a percentage of the enforced limit of the same reading."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-5d7a1c33-aaaa-bbbb-cccc-dddddddddddd,0")
    points: list[tuple[str, float, dict]] = []
    sampler = SystemMetricsSampler(3600, lambda name, value, context: points.append((name, value, context)))
    sampler.start()
    sampler.sample()
    sampler.sample()
    sampler.stop()  # a third sample, then NVML shut down
    assert fake_nvml._initialised == 0
    assert {name for name, _, context in points if context} == GPU_SERIES
    assert {context["gpu"] for _, _, context in points if context} == {0, 1}
    assert sample_points(points, GPU_UTILIZATION, 0) == [55.0] * 3
    assert sample_points(points, GPU_MEMORY_USED, 0) == [40.0 * 2**30] * 3
    assert sample_points(points, GPU_TEMPERATURE, 0) == [48.0] * 3
    assert sample_points(points, GPU_POWER, 0) == [300.0, 350.0, 400.0]
    assert sample_points(points, GPU_POWER_PERCENT, 0) == [60.0, 70.0, 80.0]  # of 500 W enforced, not 700 W
    assert sample_points(points, GPU_UTILIZATION, 1) == [91.0] * 3
    assert sample_points(points, GPU_POWER, 1) == [512.0, 640.0, 512.0]
    assert sample_points(points, GPU_POWER_PERCENT, 1) == [80.0, 100.0, 80.0]


def test_a_reading_a_gpu_lacks_costs_only_its_series(fake_nvml, monkeypatch, caplog):
    """No power readings on GPU 0: neither watts nor percent, one warning; no enforced limit on GPU 1: no percent."""
    fake_nvml.configure(
        [
            {**DEVICES[0], "unsupported": ["nvmlDeviceGetPowerUsage"]},
            {**DEVICES[1], "unsupported": ["nvmlDeviceGetEnforcedPowerLimit"]},
        ]
    )
    points: list[tuple[str, float, dict]] = []
    sampler = SystemMetricsSampler(3600, lambda name, value, context: points.append((name, value, context)))
    with caplog.at_level(logging.WARNING, logger="tuning.benchmarking.system_metrics"):
        sampler.start()
        sampler.sample()
        sampler.stop()
    series = {(name, context.get("gpu")) for name, _, context in points if context}
    assert series == {
        (GPU_UTILIZATION, 0),
        (GPU_MEMORY_USED, 0),
        (GPU_TEMPERATURE, 0),
        (GPU_UTILIZATION, 1),
        (GPU_MEMORY_USED, 1),
        (GPU_TEMPERATURE, 1),
        (GPU_POWER, 1),
    }
    warnings = [record.getMessage() for record in caplog.records]
    assert len(warnings) == 2  # one per failing series, though each failed twice
    assert any(f"{GPU_POWER}{{'gpu': 0}}" in warning for warning in warnings)
    assert any(f"{GPU_POWER_PERCENT}{{'gpu': 1}}" in warning for warning in warnings)


@pytest.mark.parametrize("failure", ["no package", "no driver", "cannot list GPUs"])
def test_without_a_usable_nvml_only_the_host_series(fake_nvml, monkeypatch, failure):
    if failure == "no package":
        monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    elif failure == "no driver":
        monkeypatch.setenv("FAKE_NVML_INIT_ERROR", "1")
    else:

        def count_fails():
            raise fake_nvml.NVMLError(fake_nvml.NVML_ERROR_UNINITIALIZED)

        monkeypatch.setattr(fake_nvml, "nvmlDeviceGetCount", count_fails)
    points: list[tuple[str, float, dict]] = []
    sampler = SystemMetricsSampler(3600, lambda name, value, context: points.append((name, value, context)))
    sampler.start()
    sampler.stop()
    assert {name for name, _, _ in points} == {"cpu_percent", "memory_percent", "process_rss_bytes", *ANON_SERIES}
    assert fake_nvml._initialised == 0


def memory_sample() -> dict[str, float]:
    points: dict[str, float] = {}
    SystemMetricsSampler(3600, lambda name, value, context: points.setdefault(name, value)).sample()
    return points


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="resident anonymous memory is read on Linux")
def test_anonymous_memory_leaves_out_memory_mapped_file_pages(tmp_path):
    """Reading a memory-mapped file (as training reads Arrow data) grows RSS by the pages read, not anonymous memory;
    allocating grows both."""
    size = 64 << 20
    path = tmp_path / "data.bin"
    path.write_bytes(b"x" * size)
    before = memory_sample()
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        assert sum(mapped[offset] for offset in range(0, size, mmap.PAGESIZE)) == ord("x") * (size // mmap.PAGESIZE)
        mapped_pages = memory_sample()
    allocated = bytearray(b"y" * size)
    after_allocating = memory_sample()
    assert mapped_pages["process_rss_bytes"] - before["process_rss_bytes"] > 0.9 * size
    assert abs(mapped_pages["process_anon_rss_bytes"] - before["process_anon_rss_bytes"]) < 0.1 * size
    assert after_allocating["process_anon_rss_bytes"] - mapped_pages["process_anon_rss_bytes"] > 0.9 * size
    assert len(allocated) == size
