"""Virtual time for asyncio (``clock.VirtualTimeLoop``): sleeps, timeouts and gathers run on simulated seconds, the
clock jumps straight to the next timer, and ready work runs before the clock moves. Counted,
never timed: a thirty-minute think costs no wall time, which the test checks by the clock the loop reports."""

from __future__ import annotations

import asyncio

import pytest

from agentload.clock import LoopClock, VirtualTimeLoop, run_virtual


def test_a_long_sleep_is_a_jump_of_the_virtual_clock() -> None:
    async def think() -> float:
        clock = LoopClock()
        await clock.sleep(1800.0)  # thirty minutes of an agent's think time
        return clock.now()

    assert run_virtual(think()) == pytest.approx(1800.0)


def test_concurrent_sleepers_wake_in_order_at_their_own_times() -> None:
    async def scenario() -> list[tuple[str, float]]:
        clock = LoopClock()
        woke: list[tuple[str, float]] = []

        async def agent(name: str, wait: float) -> None:
            await clock.sleep(wait)
            woke.append((name, clock.now()))

        await asyncio.gather(agent("c", 30.0), agent("a", 10.0), agent("b", 20.0))
        return woke

    assert run_virtual(scenario()) == [("a", 10.0), ("b", 20.0), ("c", 30.0)]


def test_a_timeout_fires_in_virtual_time() -> None:
    async def scenario() -> tuple[bool, float]:
        clock = LoopClock()
        try:
            async with asyncio.timeout(5.0):
                await clock.sleep(3600.0)
        except TimeoutError:
            return True, clock.now()
        return False, clock.now()

    assert run_virtual(scenario()) == (True, pytest.approx(5.0))


def test_a_negative_sleep_is_no_sleep() -> None:
    async def scenario() -> float:
        clock = LoopClock()
        await clock.sleep(-3.0)
        return clock.now()

    assert run_virtual(scenario()) == 0.0


def test_ready_work_runs_before_the_clock_moves() -> None:
    async def scenario() -> list[float]:
        clock = LoopClock()
        seen: list[float] = []

        async def busy() -> None:
            for _ in range(100):
                seen.append(clock.now())
                await asyncio.sleep(0)  # yields, but nothing waits on a timer: no time passes

        await busy()
        return seen

    assert set(run_virtual(scenario())) == {0.0}


def test_each_run_starts_at_zero() -> None:
    async def now() -> float:
        await asyncio.sleep(7.0)
        return asyncio.get_running_loop().time()

    assert run_virtual(now()) == 7.0
    assert run_virtual(now()) == 7.0  # a fresh loop, a fresh clock


def test_advance_moves_the_loops_time() -> None:
    loop = VirtualTimeLoop()
    try:
        assert loop.time() == 0.0
        loop.advance(2.5)
        assert loop.time() == 2.5
    finally:
        loop.close()
