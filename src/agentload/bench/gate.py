"""Quiet window edges: both prefix-hit rates of a level cover the same requests (issue 9).

vLLM counts a prompt in ``prefix_cache_queries`` / ``_hits`` when it is *scheduled*; usage arrives when the
request *finishes* (domain.md §12). A window whose edges cut through requests in flight gives the server's counter
delta and the usage sums different sets of requests, and past the knee — where a turn waits seconds for its
prefill — they drift apart by several points. So at each edge the level closes this gate: new requests wait, the
ones in flight finish, the counters are sampled with nothing in flight, and the gate opens again. Then every
request of the window is wholly inside it, on both sides of the comparison.

Waiting requests are released with the spacing they arrived with (each one waits the drain's length and no
more), so the agents come back in their own phases rather than as one synchronised burst.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from agentload.clock import Clock


@dataclass
class QuiesceGate:
    clock: Clock
    in_flight: int = 0
    _closed_at: float | None = None
    _opened: asyncio.Event = field(default_factory=asyncio.Event)
    _idle: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self._opened.set()
        self._idle.set()

    async def enter(self) -> None:
        """Before a request is sent: wait while the gate is closed, then count it in flight."""
        if self._closed_at is not None:
            arrived = self.clock.now()
            closed_at = self._closed_at
            await self._opened.wait()
            # Keep this request's offset from the moment the gate closed, shifted by the drain.
            if arrived > closed_at:
                await self.clock.sleep(arrived - closed_at)
        self.in_flight += 1
        self._idle.clear()

    def leave(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()

    def close(self) -> None:
        self._closed_at = self.clock.now()
        self._opened.clear()

    def open(self) -> None:
        self._closed_at = None
        self._opened.set()

    async def drained(self, timeout_s: float) -> bool:
        """Wait until nothing is in flight (True), or ``timeout_s`` (False: the edge is not quiet)."""
        if self.in_flight == 0:
            return True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True
