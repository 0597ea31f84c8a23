"""Virtual time for asyncio code: the same agents, fleet and client run in simulated seconds, not wall seconds.

``VirtualTimeLoop`` is an asyncio event loop whose ``time()`` is virtual and whose selector, when nothing is
ready, jumps the clock to the next timer instead of sleeping (the idea of trio's autojump clock and of the
``looptime`` pytest plugin). A thirty-minute think time then costs no wall time, and everything that reads the
loop's clock — asyncio.sleep, timeouts, ``LoopClock`` — sees the simulated time.

Only for runs with no real I/O: an in-process transport to the simulated server (``sim.inprocess``). A socket
would be polled, never waited for, while virtual time runs ahead.
"""

from __future__ import annotations

import asyncio
import selectors
from typing import Any


class _JumpingSelector(selectors.DefaultSelector):
    def __init__(self, loop: VirtualTimeLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        events = super().select(0)
        if events or timeout == 0:
            return events
        if timeout is None:
            # Nothing is scheduled at all: only another thread can wake us, so wait for real.
            return super().select(None)
        self._loop.advance(timeout)
        return events


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop on virtual time; run a coroutine on it with ``run_virtual(coro)``."""

    def __init__(self) -> None:
        self._virtual_now = 0.0
        super().__init__(selector=_JumpingSelector(self))

    def time(self) -> float:
        return self._virtual_now

    def advance(self, seconds: float) -> None:
        self._virtual_now += seconds


def run_virtual(coro: Any) -> Any:
    """``asyncio.run`` on a fresh VirtualTimeLoop."""
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        return runner.run(coro)


class LoopClock:
    """The running event loop's clock: monotonic wall time normally, virtual time on a VirtualTimeLoop.

    asyncio's default loop reads time.monotonic(), so in real runs this agrees with RealClock and with
    timestamps taken in other processes on the same machine.
    """

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))
