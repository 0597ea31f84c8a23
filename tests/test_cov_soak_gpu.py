"""The soak's GPU monitor against a fake NVML module: what it says when NVML is missing, fails or finds no GPU, and
the per-GPU note it writes from real samples (NVML reports power in milliwatts)."""

from __future__ import annotations

import asyncio
import sys
import types
from collections.abc import Callable, Iterator

import pytest

from agentload.bench.soak import GpuMonitor


class NVMLError(Exception):
    pass


class FakeNVML(types.ModuleType):
    """NVML (its own camelCase names) with ``devices`` as (power mW, temperature °C, SM clock MHz), each constant
    unless ``power`` is given."""

    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1

    def __init__(self, devices: list[tuple[int, int, int]], *, init_fails: bool = False) -> None:
        super().__init__("pynvml")
        self.devices = devices
        self.init_fails = init_fails
        self.shutdowns = 0
        self.power: Iterator[int] | None = None
        self.reads = 0
        self.want = 0  # ``enough`` is set once this many power readings were taken
        self.enough = asyncio.Event()

    def nvmlInit(self) -> None:
        if self.init_fails:
            raise NVMLError("Driver Not Loaded")

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        self.reads += 1
        if self.reads >= self.want:
            self.enough.set()  # the sample is appended before the monitor next yields
        return self.devices[h][0] if self.power is None else next(self.power)

    def nvmlDeviceGetTemperature(self, h: int, kind: int) -> int:
        return self.devices[h][1]

    def nvmlDeviceGetClockInfo(self, h: int, kind: int) -> int:
        return self.devices[h][2]


Install = Callable[[types.ModuleType | None], None]


@pytest.fixture
def install(monkeypatch: pytest.MonkeyPatch) -> Install:
    def put(module: types.ModuleType | None) -> None:
        # None in sys.modules makes the import fail as ModuleNotFoundError, as an absent package does.
        monkeypatch.setitem(sys.modules, "pynvml", module)

    return put


async def test_without_the_module_the_soak_says_so(install: Install) -> None:
    install(None)
    monitor = GpuMonitor()
    monitor.start()
    assert await monitor.stop() == ["NVML not sampled: the pynvml module (nvidia-ml-py) is not installed"]


async def test_a_failing_driver_is_named_not_raised(install: Install) -> None:
    install(FakeNVML([], init_fails=True))
    monitor = GpuMonitor()
    monitor.start()
    assert await monitor.stop() == ["NVML not sampled: no NVIDIA GPU found (NVMLError)"]


async def test_no_gpu_at_all(install: Install) -> None:
    install(FakeNVML([]))
    monitor = GpuMonitor()
    monitor.start()
    assert await monitor.stop() == ["NVML not sampled: no NVIDIA GPU found"]


async def test_one_note_per_gpu_in_watts_degrees_and_megahertz(install: Install) -> None:
    nvml = FakeNVML([(350_250, 61, 1980), (700_000, 74, 1755)])
    install(nvml)
    nvml.want = 6
    monitor = GpuMonitor(interval_s=0.001)
    monitor.start()
    await asyncio.wait_for(nvml.enough.wait(), 30)  # generous: the loop only has to run thrice on a busy machine
    notes = await monitor.stop()
    assert notes == [
        "GPU 0: power 350 → 350 W, temperature 61 → 61 °C, SM clock 1980 → 1980 MHz (first → last third)",
        "GPU 1: power 700 → 700 W, temperature 74 → 74 °C, SM clock 1755 → 1755 MHz (first → last third)",
    ]
    assert nvml.shutdowns == 1
    count = len(monitor.samples)
    await asyncio.sleep(0.01)
    assert len(monitor.samples) == count  # stopped means stopped


async def test_drift_compares_the_first_and_last_thirds(install: Install) -> None:
    # Power climbs 10 W per sample of GPU 0: with 9 samples the thirds average samples 1-3 and 7-9.
    readings = iter(range(300_000, 10_000_000, 10_000))
    nvml = FakeNVML([(0, 50, 2000)])
    nvml.power = readings
    install(nvml)
    nvml.want = 9
    monitor = GpuMonitor(interval_s=0.001)
    monitor.start()
    await asyncio.wait_for(nvml.enough.wait(), 30)
    await monitor.stop()
    del monitor.samples[9:]  # the loop may have taken one more before it was stopped
    notes = await monitor.stop()
    # First third: 300, 310, 320 W → 310; last third: 360, 370, 380 W → 370.
    assert notes == ["GPU 0: power 310 → 370 W, temperature 50 → 50 °C, SM clock 2000 → 2000 MHz (first → last third)"]
