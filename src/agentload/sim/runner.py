"""Drives the engine in real time for the HTTP server: one asyncio task steps it and wakes the streams.

Each step's effects are computed at once and made visible when the step's modelled duration has passed on the
wall clock, so a client sees tokens at the times the step-time model says. If the host falls behind (a very
short modelled step, a busy core), steps run back to back and the simulated server is slower than modelled —
never faster.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from agentload.clock import LoopClock
from agentload.sim.engine import Engine, SimRequest, StepResult


class Delivery:
    """Where the engine loop tells one HTTP handler that its request produced tokens."""

    __slots__ = ("event", "last_token_at", "req")

    def __init__(self, req: SimRequest) -> None:
        self.req = req
        self.event = asyncio.Event()
        self.last_token_at: float | None = None


class EngineRunner:
    def __init__(
        self,
        engine: Engine,
        *,
        clock: LoopClock | None = None,
        cold_start_s: float = 0.0,
        on_step: Callable[[StepResult], None] | None = None,
    ) -> None:
        self.engine = engine
        # The loop's clock: wall time on a normal loop, simulated time on a VirtualTimeLoop (sim.inprocess).
        self.clock = clock or LoopClock()
        self.cold_start_s = cold_start_s
        self.ready = asyncio.Event()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._on_step = on_step
        self.started_at = 0.0

    @property
    def is_ready(self) -> bool:
        return self.ready.is_set()

    async def start(self) -> None:
        self.started_at = self.clock.now()
        self._task = asyncio.create_task(self._run(), name="agentload-sim-engine")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def submit(self, req: SimRequest) -> Delivery:
        delivery = Delivery(req)
        req.handle = delivery
        self.engine.add(req)
        self._wake.set()
        return delivery

    def abort(self, req: SimRequest) -> None:
        self.engine.abort(req)

    async def _run(self) -> None:
        if self.cold_start_s > 0:
            # Model load, compilation and graph capture: nothing is served meanwhile, as in vLLM.
            await asyncio.sleep(self.cold_start_s)
        self.ready.set()
        engine = self.engine
        clock = self.clock
        loop_sleep = asyncio.sleep
        planned: float | None = None  # when the next step should start: the previous step's modelled end
        while True:
            if not engine.has_work():
                planned = None
                self._wake.clear()
                await self._wake.wait()
                continue
            now = clock.now()
            # Steps run back to back on the modelled timeline: a step starts at the previous one's planned end,
            # not at the moment the loop woke up (asyncio timers fire a millisecond or two late, and those delays
            # would otherwise add up step after step). Only when the host has fallen behind by more than a few
            # milliseconds does the timeline slip to now.
            started = planned if planned is not None and now - planned < 0.005 else now
            result = engine.step(started)
            if result.batch.num_requests == 0:
                planned = None
                # Nothing could be scheduled (every waiting request needs more blocks than exist right now);
                # wait for an abort or a new arrival rather than spin.
                self._wake.clear()
                await self._wake.wait()
                continue
            planned = result.end
            delay = result.end - clock.now()
            await loop_sleep(delay if delay > 0 else 0)
            for req in result.emitted:
                delivery = req.handle
                if isinstance(delivery, Delivery):
                    delivery.event.set()
            if self._on_step is not None:
                self._on_step(result)
