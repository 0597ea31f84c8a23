"""Soak: one level held for a long time, and how it drifted — plus GPU power, temperature and clocks via NVML.

Drift compares the first and the last third of the measured window (each summarised exactly like a level), so
a cache that slowly fills, a queue that slowly grows or a GPU that throttles shows as a change with numbers.
NVML is read only when the ``pynvml`` module (nvidia-ml-py) is importable and finds a GPU; otherwise the soak
says so and carries on. It runs on the machine where agentload runs, so it sees the server's GPUs only when the
server is local.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
from dataclasses import replace
from typing import Any

from agentload.bench.analysis import LevelData, summarise
from agentload.bench.results import LevelSummary


def _pct(a: float | None, b: float | None) -> str:
    if a is None or b is None:
        return "n/a"
    if a == 0:
        return "n/a (from 0)"
    return f"{100.0 * (b - a) / a:+.1f}%"


DRIFT_MIN_TURNS = 30  # turns in each third before a change between them is called a drift


def drift_notes(data: LevelData) -> list[str]:
    """Sentences comparing the first and last third of a soak's window."""
    span = data.end - data.window_start
    first = summarise(replace(data, end=data.window_start + span / 3))
    last = summarise(replace(data, start=data.window_start, window_start=data.end - span / 3))
    # A third with few turns moves by chance: its output tok/s changes with each turn that lands in it or not.
    turns = f"{first.turns} and {last.turns} turns"
    caveat = (
        f"; only {turns} in the two thirds (a third needs {DRIFT_MIN_TURNS}): changes this size are within chance, "
        "soak longer to call a drift"
        if min(first.turns, last.turns) < DRIFT_MIN_TURNS
        else f" ({turns})"
    )
    return [
        f"soak drift over {span:.0f} s at {data.agents} agents (first third → last third): "
        f"output {first.output_tps:.1f} → {last.output_tps:.1f} tok/s ({_pct(first.output_tps, last.output_tps)}), "
        f"TTFT p50 {_fmt(first.ttft_s.p50)} → {_fmt(last.ttft_s.p50)} ({_pct(first.ttft_s.p50, last.ttft_s.p50)}), "
        f"prefix hit {_fmt_rate(_hit(first))} → {_fmt_rate(_hit(last))}, "
        f"peak KV {_fmt_rate(first.peak_kv_usage)} → {_fmt_rate(last.peak_kv_usage)}{caveat}"
    ]


def _hit(s: LevelSummary) -> float | None:
    return s.prefix_hit_rate_effective


def _fmt(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.3f}s"


def _fmt_rate(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.1%}"


class GpuMonitor:
    """Samples NVML (power W, temperature °C, SM clock MHz per GPU) in the background, when there is a GPU."""

    def __init__(self, interval_s: float = 5.0) -> None:
        self.interval_s = interval_s
        self.samples: list[dict[str, float]] = []
        self.unavailable: str | None = None
        self._nvml: Any = None
        self._handles: list[Any] = []
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        try:
            nvml = importlib.import_module("pynvml")
            nvml.nvmlInit()
            self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        except ModuleNotFoundError:
            self.unavailable = "NVML not sampled: the pynvml module (nvidia-ml-py) is not installed"
            return
        except Exception as exc:  # NVMLError and friends: no driver, no GPU
            self.unavailable = f"NVML not sampled: no NVIDIA GPU found ({type(exc).__name__})"
            return
        if not self._handles:
            self.unavailable = "NVML not sampled: no NVIDIA GPU found"
            return
        self._nvml = nvml
        self._task = asyncio.ensure_future(self._loop())

    async def _loop(self) -> None:
        nvml = self._nvml
        while True:
            for i, h in enumerate(self._handles):
                self.samples.append(
                    {
                        "gpu": float(i),
                        "power_w": nvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
                        "temperature_c": float(nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU)),
                        "sm_clock_mhz": float(nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM)),
                    }
                )
            await asyncio.sleep(self.interval_s)

    async def stop(self) -> list[str]:
        """Stop sampling; sentences for the run's notes."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()
        if self.unavailable:
            return [self.unavailable]
        notes = []
        for gpu in sorted({int(s["gpu"]) for s in self.samples}):
            mine = [s for s in self.samples if int(s["gpu"]) == gpu]
            third = max(1, len(mine) // 3)
            a, b = mine[:third], mine[-third:]

            def mean(rows: list[dict[str, float]], key: str) -> float:
                return sum(r[key] for r in rows) / len(rows)

            notes.append(
                f"GPU {gpu}: power {mean(a, 'power_w'):.0f} → {mean(b, 'power_w'):.0f} W, temperature "
                f"{mean(a, 'temperature_c'):.0f} → {mean(b, 'temperature_c'):.0f} °C, SM clock "
                f"{mean(a, 'sm_clock_mhz'):.0f} → {mean(b, 'sm_clock_mhz'):.0f} MHz (first → last third)"
            )
        return notes
