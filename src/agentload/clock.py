"""Time behind an object, so the simulator and anything time-based run in real or virtual time.

One clock protocol (``Clock``: ``now`` + ``sleep``) with one default, ``LoopClock``: the running event loop's
time — monotonic wall time on asyncio's own loop, simulated time on a ``VirtualTimeLoop``. ``RealClock`` is wall
time read directly, for code that runs outside a loop or must not follow a virtual one.

**Virtual time for asyncio code** (the agents, the fleet and the client run in simulated seconds, not wall
seconds): ``VirtualTimeLoop`` is an asyncio event loop whose ``time()`` is virtual and whose selector, when nothing
is ready, jumps the clock to the next timer instead of sleeping (the idea of trio's autojump clock and of the
``looptime`` pytest plugin). A thirty-minute think time then costs no wall time, and everything that reads the
loop's clock — asyncio.sleep, timeouts, ``LoopClock`` — sees the simulated time. Only for runs with no real I/O:
an in-process transport to the simulated server (``sim.inprocess``). A socket would be polled, never waited for,
while virtual time runs ahead. Work handed to a thread (``asyncio.to_thread``: a checkpoint's fsync) is waited for
in real time and takes no virtual time, so a run's outcome does not depend on how long the disk took.

**The engine-only driver's event scheduler**: ``VirtualClock`` is a discrete-event scheduler in the style of
simpy's core: events sit in a heap keyed on ``(time, priority, counter)``, so two events at the same instant run
in a fixed, documented order (lower priority first, then the order they were scheduled) — never in an order that
depends on hashing or object identity (vidur's event base, whose tie key is always None, is the counter-example).
"""

from __future__ import annotations

import asyncio
import heapq
import selectors
import time
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any, Protocol, TypeVar, TypeVarTuple

_T = TypeVar("_T")
_Ts = TypeVarTuple("_Ts")
# How long (real seconds) a virtual-time loop waits for a thread's work before its clock moves on regardless.
THREAD_WAIT_S = 30.0


class Clock(Protocol):
    """Time as everything outside the engine-only driver sees it: the one clock protocol.

    ``LoopClock`` (the default: the running loop's time, virtual on a ``VirtualTimeLoop``) and ``RealClock`` (wall
    time) implement it; ``VirtualClock`` below is the engine-only driver's event scheduler, not a clock to sleep on.
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


class LoopClock:
    """The running event loop's clock: monotonic wall time normally, virtual time on a VirtualTimeLoop.

    asyncio's default loop reads time.monotonic(), so in real runs this agrees with RealClock and with
    timestamps taken in other processes on the same machine.
    """

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


# -- virtual time for asyncio code -------------------------------------------------------------------------------------


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
        if self._loop.threads_busy:
            # Work handed to a thread (an fsync, a file write) takes no virtual time: wait for it for real, or the
            # clock would run ahead by however long the thread happened to take — a run's outcome then depends on
            # the machine's load. Bounded, so a thread that never returns cannot hang the loop.
            events = super().select(THREAD_WAIT_S)
            if events:
                return events
        self._loop.advance(timeout)
        return events


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop on virtual time; run a coroutine on it with ``run_virtual(coro)``."""

    def __init__(self) -> None:
        self._virtual_now = 0.0
        self._in_threads = 0
        super().__init__(selector=_JumpingSelector(self))

    def time(self) -> float:
        return self._virtual_now

    @property
    def threads_busy(self) -> bool:
        """Whether work this loop handed to an executor (``asyncio.to_thread``) has not finished yet."""
        return self._in_threads > 0

    def run_in_executor(self, executor: Executor | None, func: Callable[[*_Ts], _T], *args: *_Ts) -> asyncio.Future[_T]:
        future = super().run_in_executor(executor, func, *args)
        self._in_threads += 1
        future.add_done_callback(self._thread_done)
        return future

    def _thread_done(self, _future: asyncio.Future[Any]) -> None:
        self._in_threads -= 1

    def advance(self, seconds: float) -> None:
        self._virtual_now += seconds


def run_virtual(coro: Any) -> Any:
    """``asyncio.run`` on a fresh VirtualTimeLoop."""
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        return runner.run(coro)


# -- the engine-only driver's event scheduler --------------------------------------------------------------------------
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
