"""Virtual and real clocks: the event order of the virtual clock is part of the simulator's determinism."""

from __future__ import annotations

import asyncio
import time

import pytest

from agentload.clock import PRIORITY_AGENT, PRIORITY_ENGINE, RealClock, VirtualClock, run_virtual


def test_ties_resolve_by_time_then_priority_then_scheduling_order() -> None:
    clock = VirtualClock()
    order: list[str] = []

    def note(name: str) -> None:
        order.append(name)

    # Scheduled deliberately out of order.
    clock.call_at(2.0, lambda: note("t2-agent-a"), PRIORITY_AGENT)
    clock.call_at(1.0, lambda: note("t1-agent-a"), PRIORITY_AGENT)
    clock.call_at(2.0, lambda: note("t2-engine"), PRIORITY_ENGINE)
    clock.call_at(1.0, lambda: note("t1-agent-b"), PRIORITY_AGENT)
    clock.call_at(1.0, lambda: note("t1-engine-a"), PRIORITY_ENGINE)
    clock.call_at(2.0, lambda: note("t2-agent-b"), PRIORITY_AGENT)
    clock.call_at(1.0, lambda: note("t1-engine-b"), PRIORITY_ENGINE)
    clock.call_at(0.5, lambda: note("t0.5"), PRIORITY_AGENT)
    clock.run()
    assert order == [
        "t0.5",
        "t1-engine-a",
        "t1-engine-b",
        "t1-agent-a",
        "t1-agent-b",
        "t2-engine",
        "t2-agent-a",
        "t2-agent-b",
    ]


def test_event_scheduled_for_now_runs_after_those_already_due() -> None:
    clock = VirtualClock()
    order: list[str] = []

    def first() -> None:
        order.append("first")
        # Same instant and priority as "second", but scheduled later: it runs after it.
        clock.call_at(clock.now(), lambda: order.append("late"))
        # An engine-priority event at the same instant jumps ahead of already-queued agent events.
        clock.call_at(clock.now(), lambda: order.append("engine"), PRIORITY_ENGINE)

    clock.call_at(1.0, first)
    clock.call_at(1.0, lambda: order.append("second"))
    clock.run()
    assert order == ["first", "engine", "second", "late"]


def test_the_past_is_clamped_to_now() -> None:
    clock = VirtualClock(start=5.0)
    seen: list[float] = []
    clock.call_at(1.0, lambda: seen.append(clock.now()))
    clock.call_later(-3.0, lambda: seen.append(clock.now()))
    clock.run()
    assert seen == [5.0, 5.0]


def test_run_until_stops_before_later_events_and_keeps_them() -> None:
    clock = VirtualClock()
    seen: list[float] = []
    for t in (1.0, 2.0, 3.0):
        clock.call_at(t, lambda: seen.append(clock.now()))
    clock.run(until=2.5)
    assert seen == [1.0, 2.0]
    assert clock.now() == 2.5
    assert clock.pending() == 1
    clock.run(until=10.0)
    assert seen == [1.0, 2.0, 3.0]
    assert clock.now() == 10.0
    assert clock.pending() == 0


def test_an_event_exactly_at_until_runs() -> None:
    clock = VirtualClock()
    seen: list[str] = []
    clock.call_at(2.0, lambda: seen.append("at"))
    clock.run(until=2.0)
    assert seen == ["at"]


def test_next_time_peeks_at_the_earliest_event() -> None:
    clock = VirtualClock()
    assert clock.next_time() is None
    clock.call_at(3.0, lambda: None)
    clock.call_at(2.0, lambda: None, PRIORITY_ENGINE)
    assert clock.next_time() == 2.0
    clock.run(until=2.5)
    assert clock.next_time() == 3.0


def test_call_later_is_relative_to_the_virtual_now() -> None:
    clock = VirtualClock()
    seen: list[float] = []
    clock.call_at(10.0, lambda: clock.call_later(0.25, lambda: seen.append(clock.now())))
    clock.run()
    assert seen == [10.25]


async def test_real_clock_is_monotonic_and_sleeps() -> None:
    clock = RealClock()
    t0 = clock.now()
    await clock.sleep(0.02)
    t1 = clock.now()
    assert t1 - t0 >= 0.015
    # A negative delay does not raise and returns promptly.
    await asyncio.wait_for(clock.sleep(-1.0), timeout=1.0)
    assert clock.now() >= t1


@pytest.mark.parametrize("until", [None, 100.0])
def test_run_with_nothing_scheduled(until: float | None) -> None:
    clock = VirtualClock(start=3.0)
    clock.run(until=until)
    assert clock.now() == (3.0 if until is None else until)


def test_a_thread_s_work_takes_no_virtual_time() -> None:
    """While a thread works (a checkpoint's fsync), the virtual clock waits for it instead of jumping to the next
    timer: else a run's outcome would depend on how long the disk or the machine took."""
    order: list[tuple[str, float]] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()

        async def thread() -> None:
            await asyncio.to_thread(time.sleep, 0.2)
            order.append(("thread", loop.time()))

        async def timer() -> None:
            await asyncio.sleep(50)
            order.append(("timer", loop.time()))

        await asyncio.gather(thread(), timer())

    run_virtual(main())
    assert order == [("thread", 0.0), ("timer", 50.0)]
