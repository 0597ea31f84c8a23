"""The one runner: runs agent drivers with one lifecycle, however many a strategy lets run at once.

One load, start to end:

* **start** — every driver in a task of its own, run by the runner once the strategy admits it (``load.strategy``:
  all at once, staggered, or gated with dependencies), whose background loop (a limiter's control) runs alongside;
* **run** — until every driver is done; or, when the profile gives a ``body`` (bench's warm-up and window), until
  the body returns — it decides the end, and may call ``handle.stop()`` itself first; or until ``stop_after_s``;
* **stop** — the ``StopSignal`` is set (drivers read it through their context's ``should_stop``) and they get
  ``grace_s`` to finish the turn in flight; then whatever is left is cancelled, and every task the load started —
  drivers, body, timer, liveness watch, strategy loop — is awaited: nothing outlives the call;
* **lost** — ``liveness.wait_lost()`` returning, or a driver raising ``ServerLost``, ends the load at once, grace
  or not (the server is gone: a turn in flight will not finish); the outcome says why;
* **bug** — any other exception out of a driver, the body or the strategy's loop ends the load at once and is
  raised after the cleanup (per-request failures are data, inside the drivers; run-level failures are
  exceptions — after guidellm's ``scheduler/worker.py``).

The drivers' context is the profile's (bench's level, the suite's accumulator, nothing for fleet agents): the
runner hands it over untouched and only owns the stop signal inside it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol, TypeVar

from agentload.clock import Clock, LoopClock
from agentload.load.collector import collector_for_load
from agentload.load.strategy import AllAtOnce, Strategy

C = TypeVar("C", contravariant=True)


class Driver(Protocol[C]):
    """One agent (``workload.base.AgentDriver`` fits, with its ``LoadContext``)."""

    agent_id: str

    async def run(self, ctx: C) -> None: ...


class Liveness(Protocol):
    """What ends a load whose server is gone (``endpoint.liveness.ServerLiveness`` fits)."""

    async def wait_lost(self) -> str:
        """Return (why) once the server is lost; never while it answers."""
        ...


class ServerLost(Exception):
    """Raised by a driver that met a dead server, to end the whole load at once; never leaves ``run_load``."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


# Set once the load's time is up; a context's ``should_stop`` reads it. A stdlib event, not a class of this
# module: the drivers read it between turns, and a turn this runner started must not call back into it.
StopSignal = asyncio.Event


class End(StrEnum):
    DONE = "done"  # every driver returned
    BODY = "body"  # the profile's body returned
    TIMER = "timer"  # stop_after_s elapsed
    LOST = "lost"  # the server was lost


@dataclass(frozen=True)
class LoadOutcome:
    ended: End
    lost: str | None  # why the server was lost (ended LOST), else None
    cancelled: int  # drivers still running when the load ended, cancelled
    wall_s: float  # on the load's clock


class LoadHandle:
    """What a profile's body sees of the load it decides the end of."""

    def __init__(self, signal: StopSignal, tasks: Sequence[asyncio.Task[None]]) -> None:
        self._signal = signal
        self._tasks = tasks

    def stop(self) -> None:
        """Tell the drivers to finish the turn they are in and start no other."""
        self._signal.set()

    def all_done(self) -> bool:
        return all(t.done() for t in self._tasks)

    async def wait_done(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for every driver to end; whether they all did."""
        pending = [t for t in self._tasks if not t.done()]
        if pending and timeout_s > 0:
            await asyncio.wait(pending, timeout=timeout_s)
        return self.all_done()


Body = Callable[[LoadHandle], Awaitable[None]]


class _Wait:
    """``asyncio.wait(pending | aux, return_when=FIRST_COMPLETED)`` for a load, without its cost per task.

    ``asyncio.wait`` puts a callback on every future it waits for and takes it off again at each wake: with N agents
    that made a load O(N²) (1,000 agents, ~550 wakes, half a million callbacks put on and taken off). Here each
    driver's task carries one callback for the whole load, and which drivers are done is read from ``ended``, which
    their coroutines append their index to as they end (a task is done in the very step its coroutine ends in, so
    the list is exactly the drivers done). The few other futures (``aux``) are watched as ``asyncio.wait`` watches
    them. The wake comes at the same turn of the event loop as ``asyncio.wait``'s (a done callback that resolves
    the future the load awaits), and reports the same futures done, so what runs in one instant runs in the same
    order as before (the virtual-time figures depend on it).
    """

    def __init__(self, tasks: Sequence[asyncio.Task[None]], ended: list[int]) -> None:
        self.tasks = tasks
        self.ended = ended
        self._seen = 0  # ``ended[:_seen]`` were reported
        self._wake: asyncio.Future[None] | None = None
        self._pending: set[asyncio.Future[Any]] = set()
        self._aux: list[asyncio.Future[Any]] = []
        for t in tasks:
            t.add_done_callback(self._woken)

    def _woken(self, f: asyncio.Future[Any]) -> None:
        wake = self._wake
        # Only a future this wait watches: a driver already reported done, or an aux future no longer watched,
        # whose callback runs late, would wake the next wait for nothing (``asyncio.wait``'s stale callbacks hold
        # the waiter they were put on for, which is done by then).
        if wake is not None and not wake.done() and (f in self._pending or f in self._aux):
            wake.set_result(None)

    async def first(
        self, pending: set[asyncio.Future[Any]], aux: list[asyncio.Future[Any]]
    ) -> tuple[list[asyncio.Future[Any]], set[asyncio.Future[Any]]]:
        """Wait until one of ``pending`` (drivers' tasks) or ``aux`` is done; return the drivers done since the last
        call, in the drivers' order, and every future of either that is done."""
        if not pending and not aux:
            raise ValueError("nothing to wait for")  # as asyncio.wait: waiting on nothing would never wake
        loop = asyncio.get_running_loop()
        self._wake = wake = loop.create_future()
        self._pending, self._aux = pending, aux
        if self._seen < len(self.ended):  # a driver ended before this wait: it wakes it, as a done future would
            loop.call_soon(self._woken, self.tasks[self.ended[self._seen]])
        for x in aux:
            x.add_done_callback(self._woken)
        try:
            await wake
        finally:
            for x in aux:
                x.remove_done_callback(self._woken)
            self._wake, self._pending, self._aux = None, set(), []
        new = sorted(self.ended[self._seen :])
        self._seen = len(self.ended)
        drivers: list[asyncio.Future[Any]] = [self.tasks[i] for i in new]
        done = set(drivers)
        done.update(x for x in aux if x.done())
        return drivers, done


async def run_load(
    drivers: Sequence[Driver[C]],
    ctx: C,
    *,
    strategy: Strategy | None = None,
    stop: StopSignal | None = None,
    body: Body | None = None,
    liveness: Liveness | None = None,
    stop_after_s: float | None = None,
    grace_s: float = 0.0,
    clock: Clock | None = None,
) -> LoadOutcome:
    """Run ``drivers`` on ``ctx`` through ``strategy`` (all at once by default) until the load ends; see the module."""
    with collector_for_load():  # the cyclic collector set for a load's allocations (``load.collector``)
        return await _run_load(drivers, ctx, strategy, stop, body, liveness, stop_after_s, grace_s, clock)


async def _drive(strategy: Strategy, ctx: C, stopped: list[int], i: int, d: Driver[C]) -> None:
    """One driver's task: admitted by the strategy, run, taken back; its index noted as it ends (``_Wait``)."""
    try:
        # The strategy admits and takes back; the run itself is the runner's (a turn's stack: runner → driver).
        if not await strategy.admit(i, d):
            return
        try:
            await d.run(ctx)
        finally:
            strategy.leave(i, d)
        await strategy.finished(i, d)
    finally:
        stopped.append(i)


class _Ending:
    """The runner's wait until the load ends: what ended it, and the stop's grace once it is stopping.

    It wakes when a driver ends or one of the load's other tasks does (never per turn: a driver runs all its turns
    in its one task).
    """

    def __init__(
        self,
        tasks: list[asyncio.Task[None]],
        control: asyncio.Future[Any] | None,
        body_task: asyncio.Future[None] | None,
        watch: asyncio.Future[str] | None,
        timer: asyncio.Future[None] | None,
        signal: StopSignal,
        grace_s: float,
        clock: Clock,
    ) -> None:
        self.control, self.body_task, self.watch, self.timer = control, body_task, watch, timer
        self.signal, self.grace_s, self.clock = signal, grace_s, clock
        self.grace: asyncio.Future[None] | None = None
        self.pending: set[asyncio.Future[Any]] = set(tasks)
        self.ended: End | None = None
        self.lost: str | None = None
        self.bug: BaseException | None = None
        self.stopping = self.grace_over = False

    async def wait(self, waits: _Wait) -> None:
        """Wait until the load has ended (set ``ended``), or met a bug (set ``bug``); a bug in the body is raised."""
        while True:
            if self.stopping and (self.grace_over or not self.pending):
                break
            if not self.stopping and self.body_task is None and not self.pending:
                self.ended = End.DONE
                break
            # What else can end this wait: a strategy loop that returned is no longer watched (it would wake every
            # wait at once), and after the stop neither the body nor the timer is.
            later = () if self.stopping else (self.body_task, self.timer)
            aux = [x for x in (self.control, self.watch, self.grace, *later) if x is not None]
            aux = [x for x in aux if not x.done()]
            finished, done = await waits.first(self.pending, aux)
            self.pending -= done
            self._failures(finished, done)
            if self.bug is not None:
                break
            if self.lost is None and self.watch is not None and self.watch in done:
                self.lost = self.watch.result()
            if self.lost is not None:
                self.ended = End.LOST
                break
            self._advance(done)

    def _failures(self, finished: list[asyncio.Future[Any]], done: set[asyncio.Future[Any]]) -> None:
        """A driver or the strategy's loop that raised: ``ServerLost`` is the server gone, anything else a bug."""
        for t in (*finished, self.control):
            if t is not None and t in done and not t.cancelled() and (exc := t.exception()) is not None:
                if isinstance(exc, ServerLost):
                    self.lost = self.lost or exc.detail
                else:
                    self.bug = self.bug or exc

    def _advance(self, done: set[asyncio.Future[Any]]) -> None:
        """The body or the timer ending stops the load; a stop starts the grace (none: it is over at once)."""
        if not self.stopping and self.body_task is not None and self.body_task in done:
            self.body_task.result()  # a bug in the profile's own code: raised here, after the finally's cleanup
            self.ended, self.stopping = End.BODY, True
        elif not self.stopping and self.timer is not None and self.timer in done:
            self.ended, self.stopping = End.TIMER, True
        elif self.grace is not None and self.grace in done:
            self.grace_over = True
        if self.stopping and self.grace is None and not self.grace_over:
            self.signal.set()
            if self.grace_s > 0 and self.pending:
                self.grace = asyncio.ensure_future(self.clock.sleep(self.grace_s))
            else:
                self.grace_over = True


async def _run_load(
    drivers: Sequence[Driver[C]],
    ctx: C,
    strategy: Strategy | None,
    stop: StopSignal | None,
    body: Body | None,
    liveness: Liveness | None,
    stop_after_s: float | None,
    grace_s: float,
    clock: Clock | None,
) -> LoadOutcome:
    clock = clock or LoopClock()
    strategy = strategy or AllAtOnce(clock=clock)
    signal = stop or StopSignal()
    t0 = clock.now()
    strategy.prepare(drivers)

    stopped: list[int] = []  # drivers whose coroutine has ended, by index (``_Wait``)
    # Created in this order — drivers, strategy loop, body, watch, timer — so that what runs in one instant runs
    # in a fixed order (the virtual-time figures depend on it).
    tasks = [asyncio.ensure_future(_drive(strategy, ctx, stopped, i, d)) for i, d in enumerate(drivers)]
    loop = strategy.background()
    control = asyncio.ensure_future(loop) if loop is not None else None
    handle = LoadHandle(signal, tasks)
    body_task = asyncio.ensure_future(body(handle)) if body is not None else None
    watch = asyncio.ensure_future(liveness.wait_lost()) if liveness is not None else None
    timer = asyncio.ensure_future(clock.sleep(stop_after_s)) if stop_after_s is not None else None

    ending = _Ending(tasks, control, body_task, watch, timer, signal, grace_s, clock)
    cancelled = 0
    try:
        await ending.wait(_Wait(tasks, stopped))
    finally:
        cancelled = sum(1 for t in tasks if not t.done())
        # Drivers first, in their order (a suite session cancelled keeps its finished tests, in that order).
        everything: list[asyncio.Future[Any]] = [
            x for x in (*tasks, control, body_task, watch, timer, ending.grace) if x is not None
        ]
        for f in everything:
            f.cancel()
        await asyncio.gather(*everything, return_exceptions=True)
    bug = ending.bug
    if bug is None:
        # A driver that failed while being cancelled (its own cleanup broke) is a bug too.
        bug = next((e for t in tasks if not t.cancelled() and (e := t.exception()) is not None
                    and not isinstance(e, ServerLost)), None)  # fmt: skip
    if bug is not None:
        raise bug
    assert ending.ended is not None
    return LoadOutcome(ended=ending.ended, lost=ending.lost, cancelled=cancelled, wall_s=clock.now() - t0)
