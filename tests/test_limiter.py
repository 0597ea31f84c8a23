"""The agent gate and the width policies: admission order, parking, and the auto controller's decisions."""

from __future__ import annotations

import asyncio
import itertools
import random
from dataclasses import dataclass
from typing import Any

import pytest

from agentload.errors import ConfigError
from agentload.fleet.limiter import (
    AdaptiveWidth,
    AgentGate,
    FixedWidth,
    GateView,
    LimitChange,
    Limiter,
    Mode,
    TurnSample,
    make_policy,
    time_weighted_limit,
)

# -- the gate ---------------------------------------------------------------------------------------------------


async def test_gate_admits_up_to_the_limit_in_priority_order() -> None:
    gate = AgentGate(2)
    admitted: list[str] = []

    async def agent(name: str, priority: tuple[int, ...]) -> None:
        await gate.enter(name, priority)
        admitted.append(name)

    await gate.enter("a", (1, 0))
    await gate.enter("b", (1, 1))
    waiters = [
        asyncio.create_task(agent("new", (1, 5))),
        asyncio.create_task(agent("parked", (0, 9))),  # started work goes first
        asyncio.create_task(agent("new2", (1, 6))),
    ]
    await asyncio.sleep(0)
    assert gate.view() == GateView(live=2, queued=3)
    gate.leave("a")
    await asyncio.sleep(0)
    assert admitted == ["parked"]
    gate.set_limit(4)  # widening wakes waiters at once
    await asyncio.sleep(0)
    assert admitted == ["parked", "new", "new2"]
    assert gate.view() == GateView(live=4, queued=0)
    await asyncio.gather(*waiters)


async def test_a_cancelled_waiter_does_not_keep_a_slot() -> None:
    gate = AgentGate(1)
    await gate.enter("a", (0,))
    waiter = asyncio.create_task(gate.enter("b", (0,)))
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    gate.leave("a")
    await gate.enter("c", (0,))
    assert gate.is_live("c")
    assert not gate.is_live("b")
    assert gate.view() == GateView(live=1, queued=0)


async def test_the_queued_count_follows_admissions_cancellations_and_parks() -> None:
    """``view`` keeps its count as waiters come and go; checked against the queue itself, once the waiters have
    run, through a seeded random mix of entries, cancellations (before and in the tick of admission), leaves, parks
    and widths."""
    rng = random.Random(7)
    gate = AgentGate(2)
    tasks: dict[str, asyncio.Task[Any]] = {}
    for step in range(400):
        name = f"a{rng.randrange(12)}"
        roll = rng.random()
        if roll < 0.35 and name not in tasks:
            tasks[name] = asyncio.create_task(gate.enter(name, (rng.randrange(3),)))
        elif roll < 0.5 and name in tasks:
            tasks.pop(name).cancel()
        elif roll < 0.7:
            gate.leave(name)
        elif roll < 0.8 and gate.is_live(name):
            tasks[name] = asyncio.create_task(gate.yield_if_over(name, (0,)))
        elif roll < 0.9:
            gate.set_limit(rng.randrange(1, 5))
        for _ in range(rng.randrange(3)):
            await asyncio.sleep(0)  # sometimes several actions in one tick, before any waiter runs
        if rng.random() < 0.5:
            continue
        for _ in range(3):
            await asyncio.sleep(0)  # a cancelled waiter's task sees its cancellation on its next step
        for done in [n for n, t in tasks.items() if t.done()]:
            del tasks[done]
        pending = sum(1 for *_, fut, _ in gate._queue if not fut.done())
        assert gate.view().queued == pending, step
    for t in tasks.values():
        t.cancel()
    await asyncio.gather(*tasks.values(), return_exceptions=True)
    assert gate.view().queued == 0


async def test_narrowing_parks_agents_at_their_next_turn_boundary() -> None:
    gate = AgentGate(3)
    for name in "abc":
        await gate.enter(name, (1,))
    gate.set_limit(1)
    assert gate.over_limit()
    a = asyncio.create_task(gate.yield_if_over("a", (0,)))
    b = asyncio.create_task(gate.yield_if_over("b", (0,)))
    await asyncio.sleep(0)
    assert not a.done()
    assert not b.done()
    assert gate.view() == GateView(live=1, queued=2)
    assert await gate.yield_if_over("c", (0,)) is False  # at the limit: c keeps its slot
    gate.leave("c")
    await asyncio.sleep(0)
    assert a.done()
    assert a.result() is True
    assert not b.done()
    assert gate.parked_total == 2
    gate.set_limit(2)
    await asyncio.sleep(0)
    assert b.done()
    assert gate.view() == GateView(live=2, queued=0)


# -- fixed widths -----------------------------------------------------------------------------------------------


def test_sequential_and_parallel_never_move() -> None:
    seq = make_policy(Mode.SEQUENTIAL, 7, max_width=10)
    par = make_policy(Mode.PARALLEL, 6, max_width=10)
    assert (seq.initial(), par.initial()) == (1, 6)
    for policy in (seq, par):
        limiter = Limiter(policy)
        for i in range(20):
            limiter.observe(_sample(f"a{i}", sent=i, ttft=100.0, loss=0.9))
            assert limiter.tick(float(i), _Gauges(waiting=50, kv_usage=1.0)) is None
        assert limiter.statistics().history == []
    with pytest.raises(ConfigError):
        FixedWidth(Mode.PARALLEL, 0)


# -- the adaptive width -----------------------------------------------------------------------------------------


@dataclass
class _Gauges:
    waiting: float | None = 0.0
    kv_usage: float | None = 0.3


def _sample(
    agent: str,
    *,
    sent: float,
    ttft: float = 0.05,
    loss: float | None = 0.0,
    first: bool = False,
    prev_done: float | None = -1.0,
    ok: bool = True,
) -> TurnSample:
    reusable = 0 if first else 8000
    cached = None if loss is None else round(reusable * (1 - loss))
    return TurnSample(
        agent=agent,
        sent=sent,
        done=sent + ttft + 0.1,
        ttft=ttft,
        new_tokens=8000 if first else 100,
        reusable_tokens=reusable,
        cached_tokens=0 if first else cached,
        prev_done=None if first else prev_done,
        ok=ok,
    )


def _round(
    limiter: Limiter, t: float, *, ttft: float = 0.05, loss: float | None = 0.0, gauges: _Gauges | None = None
) -> LimitChange | None:
    """Every live agent sends one turn at ``t``; the limiter decides at ``t + 1``."""
    live = limiter.gate.view().live
    for i in range(live):
        limiter.observe(_sample(f"a{i}", sent=t, ttft=ttft, loss=loss, prev_done=t - 1))
    return limiter.tick(t + 1.0, gauges or _Gauges())


async def _fill(limiter: Limiter, agents: int) -> list[asyncio.Task[None]]:
    """Queue ``agents`` agents at the gate; those beyond the limit wait (demand for a wider limit)."""
    tasks = [asyncio.create_task(limiter.gate.enter(f"a{i}", (1, i))) for i in range(agents)]
    await asyncio.sleep(0)
    return tasks


async def _drain(tasks: list[asyncio.Task[None]]) -> None:
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_auto_widens_one_agent_per_clean_round_while_agents_queue() -> None:
    limiter = Limiter(AdaptiveWidth(2, max_limit=6))
    tasks = await _fill(limiter, 10)
    t = 0.0
    change = _round(limiter, t)  # no TTFT baseline yet, but zero prefix loss is evidence enough
    assert change is not None
    assert change.new == 3
    limits = [limiter.limit]
    for _ in range(8):
        t += 5
        _round(limiter, t)
        await asyncio.sleep(0)
        limits.append(limiter.limit)
    assert limits[-1] == 6  # capped at max_limit
    assert all(b - a in (0, 1) for a, b in itertools.pairwise(limits))
    assert all(c.reason.startswith("widen:") for c in limiter.statistics().history)
    await _drain(tasks)


async def test_auto_does_not_widen_without_demand() -> None:
    limiter = Limiter(AdaptiveWidth(4))
    tasks = await _fill(limiter, 3)  # fewer agents than the limit
    for k in range(5):
        assert _round(limiter, 5.0 * k) is None
    assert limiter.limit == 4
    await _drain(tasks)


async def test_auto_narrows_on_prefix_eviction_and_holds_below_the_cliff() -> None:
    limiter = Limiter(AdaptiveWidth(8, max_limit=16))
    tasks = await _fill(limiter, 16)
    _round(limiter, 0.0)  # clean: baseline, widen to 9
    assert limiter.limit == 9
    await asyncio.sleep(0)
    change = _round(limiter, 5.0, loss=0.45)  # one agent too many: prefixes evicted
    assert change is not None
    assert change.new < 9
    assert "re-prefilled 45% of reusable prefixes" in change.reason
    assert change.prefix_loss == pytest.approx(0.45, abs=0.01)
    narrowed = change.new
    # Agents evicted before the decrease (their previous turn ended before it) show the loss once more on their
    # next turn; that says nothing about the new width and is not held against it.
    for i in range(9):
        limiter.observe(_sample(f"a{i}", sent=7.0, loss=0.45, prev_done=5.5))
    assert limiter.tick(8.0, _Gauges()) is None
    assert limiter.limit == narrowed
    # Clean rounds at the narrower width: widen again only up to just below the width that congested, and
    # re-probe it only after `patience` clean rounds.
    t = 20.0
    history = []
    for _ in range(6):
        _round(limiter, t)
        history.append(limiter.limit)
        t += 5.0
    assert max(history) <= 9
    assert history.count(8) >= 2  # it waited below the cliff before re-probing 9
    await _drain(tasks)


async def test_auto_reads_the_server_queue_but_not_while_a_first_prefill_runs() -> None:
    policy = AdaptiveWidth(6)
    limiter = Limiter(policy)
    tasks = await _fill(limiter, 12)
    _round(limiter, 0.0)
    before = limiter.limit
    # A new agent's first prefill builds a queue: not the width's fault.
    policy.prefill_started("new", 3.0)
    for k in range(6):
        limiter.tick(3.0 + k * 0.5, _Gauges(waiting=6.0))
    change = _round(limiter, 6.0, gauges=_Gauges(waiting=6.0))
    assert change is None or change.new > before  # judged on prefix loss alone: clean
    policy.prefill_finished("new", 7.5)
    before = limiter.limit
    # The same queue with no prefill running narrows.
    for k in range(10):
        limiter.tick(20.0 + k, _Gauges(waiting=6.0))
    change = _round(limiter, 30.0, gauges=_Gauges(waiting=6.0))
    assert change is not None
    assert change.new < before
    assert "6.0 requests waiting at the server" in change.reason
    await _drain(tasks)


async def test_auto_narrows_on_a_ttft_jump_but_tolerates_gradual_growth() -> None:
    limiter = Limiter(AdaptiveWidth(4, max_limit=32))
    tasks = await _fill(limiter, 40)
    ttft = 0.05
    for k in range(6):  # TTFT grows 40% a round (batching): the baseline follows, the width keeps growing
        _round(limiter, 5.0 * k, ttft=ttft, loss=None)
        await asyncio.sleep(0)
        ttft *= 1.4
    grown = limiter.limit
    assert grown >= 7
    change = _round(limiter, 40.0, ttft=ttft * 8, loss=None)  # a cliff: eight times slower at once
    assert change is not None
    assert change.new < grown
    assert "TTFT" in change.reason
    assert change.ttft_ratio is not None
    assert change.ttft_ratio > 4
    await _drain(tasks)


async def test_auto_backs_off_on_refused_turns_and_respects_min_limit() -> None:
    limiter = Limiter(AdaptiveWidth(3, min_limit=2))
    tasks = await _fill(limiter, 6)
    for k in range(5):
        for i in range(3):
            limiter.observe(_sample(f"a{i}", sent=5.0 * k, ok=False, prev_done=5.0 * k - 1))
        limiter.tick(5.0 * k + 1, _Gauges())
    assert limiter.limit == 2
    assert "turns refused, failed or timed out" in limiter.statistics().history[0].reason
    await _drain(tasks)


def test_auto_bounds_are_checked() -> None:
    with pytest.raises(ConfigError):
        AdaptiveWidth(4, min_limit=5, max_limit=3)
    assert AdaptiveWidth(100, max_limit=10).initial() == 10


def test_time_weighted_limit() -> None:
    changes = [LimitChange(t=10, old=2, new=4, reason=""), LimitChange(t=20, old=4, new=8, reason="")]
    assert time_weighted_limit(changes, 2, 0, 10) == 2
    assert time_weighted_limit(changes, 2, 0, 20) == 3
    assert time_weighted_limit(changes, 2, 15, 25) == pytest.approx((4 * 5 + 8 * 5) / 10)
    assert time_weighted_limit(changes, 2, 30, 40) == 8
