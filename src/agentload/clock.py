"""Time behind an object, so the simulator and anything time-based run in real or virtual time.

``RealClock`` is wall time for the HTTP server. ``VirtualClock`` is a discrete-event scheduler in the style of
simpy's core: events sit in a heap keyed on ``(time, priority, counter)``, so two events at the same instant run
in a fixed, documented order (lower priority first, then the order they were scheduled) — never in an order that
depends on hashing or object identity (vidur's event base, whose tie key is always None, is the counter-example).
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import Callable
from typing import Protocol


class Clock(Protocol):
    """Time as everything outside the engine-only driver sees it: the one clock protocol.

    ``RealClock`` (wall time) and ``vtime.LoopClock`` (the running loop's time, virtual on a ``VirtualTimeLoop``)
    implement it; ``VirtualClock`` below is the engine-only driver's event scheduler, not a clock to sleep on.
    """

    def now(self) -> float:
        """Seconds since an arbitrary, fixed origin."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` of this clock's time."""
        ...


class RealClock:
    """Monotonic wall time; ``sleep`` really waits."""

    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


# Priorities for events that fall on the same instant. An engine step finishing first lets its tokens reach the
# agents before an agent that wakes at that instant submits its next turn, like a server's step completing before
# a client's timer fires.
PRIORITY_ENGINE = 0
PRIORITY_AGENT = 1


class VirtualClock:
    """Discrete-event virtual time: ``call_at`` schedules, ``run`` executes events in order."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._queue: list[tuple[float, int, int, Callable[[], None]]] = []
        self._counter = 0

    def now(self) -> float:
        return self._now

    def call_at(self, when: float, callback: Callable[[], None], priority: int = PRIORITY_AGENT) -> None:
        """Run ``callback`` at virtual time ``when`` (never earlier than now)."""
        self._counter += 1
        heapq.heappush(self._queue, (max(when, self._now), priority, self._counter, callback))

    def call_later(self, delay: float, callback: Callable[[], None], priority: int = PRIORITY_AGENT) -> None:
        self.call_at(self._now + delay, callback, priority)

    def pending(self) -> int:
        return len(self._queue)

    def next_time(self) -> float | None:
        """When the earliest scheduled event is due (None if nothing is scheduled)."""
        return self._queue[0][0] if self._queue else None

    def run(self, until: float | None = None) -> None:
        """Execute events in (time, priority, counter) order until none are left or ``until`` is reached."""
        while self._queue:
            when = self._queue[0][0]
            if until is not None and when > until:
                self._now = until
                return
            _, _, _, callback = heapq.heappop(self._queue)
            self._now = when
            callback()
        if until is not None:
            self._now = max(self._now, until)
