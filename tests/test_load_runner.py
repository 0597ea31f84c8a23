"""The one runner's lifecycle: start, stop, grace, cancel, a lost server, a driver bug, strategies.

Every test runs on the virtual-time loop, so "a turn takes 3 s" costs nothing and every time below is exact: the
figures are the sleeps the fake drivers are written with, not anything the runner computes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from agentload.clock import LoopClock, run_virtual
from agentload.errors import ConfigError
from agentload.fleet.limiter import AgentGate
from agentload.load.runner import End, LoadHandle, LoadOutcome, ServerLost, StopSignal, run_load
from agentload.load.strategy import AllAtOnce, Gated
from tests.test_import_graph import build_graph

CLOCK = LoopClock()


@dataclass
class Ctx:
    stop: StopSignal = field(default_factory=StopSignal)

    def should_stop(self) -> bool:
        return self.stop.is_set()


@dataclass
class Turns:
    """Turns of ``turn_s`` seconds until told to stop (or ``turns`` of them); logs what happened to it."""

    agent_id: str
    turn_s: float = 3.0
    turns: int | None = None
    started: float | None = None
    completed: int = 0
    ended: float | None = None
    cancelled_at: float | None = None

    async def run(self, ctx: Ctx) -> None:
        self.started = CLOCK.now()
        try:
            while not ctx.should_stop() and (self.turns is None or self.completed < self.turns):
                await CLOCK.sleep(self.turn_s)
                self.completed += 1
        except asyncio.CancelledError:
            self.cancelled_at = CLOCK.now()
            raise
        self.ended = CLOCK.now()


def others_left() -> set[asyncio.Task[Any]]:
    return asyncio.all_tasks() - {asyncio.current_task()}


def run(coro: Any) -> Any:
    return run_virtual(coro)


# -- ending ---------------------------------------------------------------------------------------------------
def test_without_a_body_the_load_ends_when_the_last_driver_does() -> None:
    drivers = [Turns("a", turn_s=2.0, turns=3), Turns("b", turn_s=5.0, turns=1)]

    async def go() -> tuple[LoadOutcome, set[asyncio.Task[Any]]]:
        out = await run_load(drivers, Ctx())
        return out, others_left()

    out, left = run(go())
    assert out.ended is End.DONE
    assert out.lost is None
    assert out.cancelled == 0
    assert out.wall_s == pytest.approx(6.0)  # a: 3 turns × 2 s; b: 1 × 5 s
    assert [d.completed for d in drivers] == [3, 1]
    assert left == set()


def test_the_body_decides_the_end_and_the_turn_in_flight_finishes_within_the_grace() -> None:
    drivers = [Turns(f"d{i}") for i in range(3)]  # 3 s turns: at t=10 each is 1 s into its fourth turn
    ctx = Ctx()

    async def body(load: LoadHandle) -> None:
        await CLOCK.sleep(10.0)
        load.stop()

    out = run(run_load(drivers, ctx, stop=ctx.stop, body=body, grace_s=5.0))
    assert out.ended is End.BODY
    assert out.cancelled == 0
    assert [d.completed for d in drivers] == [4, 4, 4]  # the fourth turn, in flight at the stop, completed
    assert [d.ended for d in drivers] == [pytest.approx(12.0)] * 3
    assert out.wall_s == pytest.approx(12.0)


def test_a_grace_shorter_than_the_turn_in_flight_cancels_it() -> None:
    drivers = [Turns(f"d{i}") for i in range(2)]
    ctx = Ctx()

    async def body(load: LoadHandle) -> None:
        await CLOCK.sleep(10.0)  # the runner sets the stop signal itself once the body returns

    out = run(run_load(drivers, ctx, stop=ctx.stop, body=body, grace_s=1.0))
    assert ctx.should_stop()
    assert out.ended is End.BODY
    assert out.cancelled == 2
    assert [d.completed for d in drivers] == [3, 3]
    assert [d.cancelled_at for d in drivers] == [pytest.approx(11.0)] * 2  # 10 s + 1 s of grace


def test_with_a_body_drivers_that_finish_early_do_not_end_the_load() -> None:
    drivers = [Turns("short", turns=1)]
    seen: list[bool] = []

    async def body(load: LoadHandle) -> None:
        await CLOCK.sleep(8.0)
        seen.append(load.all_done())

    out = run(run_load(drivers, Ctx(), body=body))
    assert out.ended is End.BODY
    assert out.wall_s == pytest.approx(8.0)
    assert seen == [True]


def test_the_timer_stops_the_load_and_with_no_grace_cancels_at_once() -> None:
    drivers = [Turns(f"d{i}") for i in range(4)]
    ctx = Ctx()
    out = run(run_load(drivers, ctx, stop=ctx.stop, stop_after_s=10.0))
    assert out.ended is End.TIMER
    assert out.cancelled == 4
    assert [d.cancelled_at for d in drivers] == [pytest.approx(10.0)] * 4
    assert [d.completed for d in drivers] == [3, 3, 3, 3]


def test_a_timer_that_fires_after_every_driver_ended_cancels_nothing() -> None:
    out = run(run_load([Turns("a", turns=1)], Ctx(), stop_after_s=60.0))
    assert out.ended is End.DONE
    assert out.cancelled == 0
    assert out.wall_s == pytest.approx(3.0)


# -- a lost server --------------------------------------------------------------------------------------------
@dataclass
class LostAt:
    at: float
    why: str = "the server refused connections for 20 s"

    async def wait_lost(self) -> str:
        await CLOCK.sleep(self.at)
        return self.why


def test_a_server_lost_mid_level_ends_it_at_once_whatever_the_grace() -> None:
    drivers = [Turns(f"d{i}") for i in range(3)]

    async def body(load: LoadHandle) -> None:
        await CLOCK.sleep(100.0)

    async def go() -> tuple[LoadOutcome, set[asyncio.Task[Any]]]:
        out = await run_load(drivers, Ctx(), body=body, liveness=LostAt(7.0), grace_s=60.0)
        return out, others_left()

    out, left = run(go())
    assert out.ended is End.LOST
    assert out.lost == "the server refused connections for 20 s"
    assert out.cancelled == 3
    assert out.wall_s == pytest.approx(7.0)
    assert [d.cancelled_at for d in drivers] == [pytest.approx(7.0)] * 3
    assert left == set()  # the body, the watch and the drivers were all awaited


def test_a_server_lost_during_the_grace_period_ends_the_grace() -> None:
    drivers = [Turns("slow", turn_s=30.0)]

    async def body(load: LoadHandle) -> None:
        await CLOCK.sleep(5.0)

    out = run(run_load(drivers, Ctx(), body=body, liveness=LostAt(12.0), grace_s=60.0))
    assert out.ended is End.LOST
    assert out.wall_s == pytest.approx(12.0)
    assert drivers[0].cancelled_at == pytest.approx(12.0)


@dataclass
class MeetsDeadServer:
    agent_id: str
    at: float

    async def run(self, ctx: Ctx) -> None:
        await CLOCK.sleep(self.at)
        raise ServerLost(f"{self.agent_id}: connection refused")


def test_a_driver_that_meets_a_dead_server_stops_everyone_and_is_not_raised() -> None:
    drivers: list[Any] = [Turns("a"), MeetsDeadServer("b", 4.0), MeetsDeadServer("c", 5.0), Turns("d")]
    out = run(run_load(drivers, Ctx(), stop_after_s=100.0))
    assert out.ended is End.LOST
    assert out.lost == "b: connection refused"
    assert out.cancelled == 3
    assert out.wall_s == pytest.approx(4.0)
    assert drivers[0].cancelled_at == pytest.approx(4.0)


# -- bugs -----------------------------------------------------------------------------------------------------
@dataclass
class Buggy:
    agent_id: str
    at: float

    async def run(self, ctx: Ctx) -> None:
        await CLOCK.sleep(self.at)
        raise RuntimeError(f"{self.agent_id} is broken")


def test_a_driver_bug_is_raised_after_every_other_task_was_cancelled_and_awaited() -> None:
    others = [Turns("a"), Turns("b")]
    seen: dict[str, Any] = {}

    async def go() -> None:
        try:
            await run_load([others[0], Buggy("x", 4.0), others[1]], Ctx(), liveness=LostAt(1000.0))
        except RuntimeError as exc:
            seen["error"] = str(exc)
            seen["at"] = CLOCK.now()
            seen["left"] = others_left()

    run(go())
    assert seen["error"] == "x is broken"
    assert seen["at"] == pytest.approx(4.0)  # at once, not at the end of a level
    assert [d.cancelled_at for d in others] == [pytest.approx(4.0)] * 2  # cancelled before the raise
    assert seen["left"] == set()


@dataclass
class BuggyInSteps(Buggy):
    """Breaks at ``at`` too, but gets there in two sleeps: a driver that breaks at the same instant as a ``Buggy``
    started with it ends after it in that instant (its second timer was set later)."""

    async def run(self, ctx: Ctx) -> None:
        await CLOCK.sleep(self.at / 2)
        await CLOCK.sleep(self.at / 2)
        raise RuntimeError(f"{self.agent_id} is broken")


def test_of_two_drivers_broken_in_one_instant_the_first_in_the_drivers_order_is_raised() -> None:
    # The runner reports the drivers done at a wake in the drivers' order, not in the order they ended: the first
    # driver ends last here, and its error is the one raised.
    seen: dict[str, Any] = {}

    async def go() -> None:
        try:
            await run_load([BuggyInSteps("first", 4.0), Turns("a"), Buggy("third", 4.0)], Ctx())
        except RuntimeError as exc:
            seen["error"] = str(exc)
            seen["left"] = others_left()

    run(go())
    assert seen["error"] == "first is broken"
    assert seen["left"] == set()


def test_many_drivers_ending_one_at_a_time_each_end_once_and_the_load_ends_with_the_last() -> None:
    drivers = [Turns(f"agent-{i}", turn_s=0.5 + i * 0.01, turns=2) for i in range(300)]

    async def go() -> LoadOutcome:
        return await run_load(drivers, Ctx())

    outcome = run(go())
    assert outcome.ended is End.DONE
    assert outcome.cancelled == 0
    assert [d.completed for d in drivers] == [2] * 300
    assert outcome.wall_s == pytest.approx(max(d.ended or 0.0 for d in drivers)) == pytest.approx(2 * (0.5 + 2.99))


def test_a_bug_in_the_body_is_raised_after_the_drivers_were_cancelled() -> None:
    drivers = [Turns("a")]

    async def body(load: LoadHandle) -> None:
        await CLOCK.sleep(2.0)
        raise ValueError("the window's arithmetic")

    with pytest.raises(ValueError, match="arithmetic"):
        run(run_load(drivers, Ctx(), body=body, grace_s=30.0))
    assert drivers[0].cancelled_at == pytest.approx(2.0)


@dataclass
class BreaksOnCancel:
    agent_id: str

    async def run(self, ctx: Ctx) -> None:
        try:
            await CLOCK.sleep(1000.0)
        except asyncio.CancelledError:
            raise OSError("disk full while saving") from None


def test_a_driver_whose_cleanup_breaks_on_cancel_is_a_bug_too() -> None:
    with pytest.raises(OSError, match="disk full"):
        run(run_load([BreaksOnCancel("a")], Ctx(), stop_after_s=5.0))


# -- all at once ----------------------------------------------------------------------------------------------
def test_all_at_once_starts_every_driver_together_or_staggered_over_the_window_given() -> None:
    together = [Turns(f"t{i}", turns=1) for i in range(4)]
    run(run_load(together, Ctx()))
    assert [d.started for d in together] == [0.0, 0.0, 0.0, 0.0]

    staggered = [Turns(f"s{i}", turns=1) for i in range(4)]

    async def go() -> float:
        t0 = CLOCK.now()
        await run_load(staggered, Ctx(), strategy=AllAtOnce(stagger_s=1.0))
        return t0

    t0 = run(go())
    assert [d.started - t0 for d in staggered if d.started is not None] == [0.0, 0.25, 0.5, 0.75]  # i/4 of 1 s


def test_a_negative_stagger_is_refused() -> None:
    with pytest.raises(ConfigError, match="negative"):
        AllAtOnce(stagger_s=-1.0)


def test_no_drivers_and_no_body_is_an_empty_load() -> None:
    out = run(run_load([], Ctx()))
    assert out.ended is End.DONE
    assert out.cancelled == 0
    assert out.wall_s == 0.0


# -- gated ----------------------------------------------------------------------------------------------------
@dataclass
class Member:
    """A gated driver: one turn of ``turn_s``; logs when it started and ended, and whether it was announced."""

    agent_id: str
    group: str = "g"
    depends_on: Sequence[str] = ()
    settled: bool = False
    rank: tuple[int, ...] = (0,)
    proceed: bool = True
    turn_s: float = 3.0
    log: list[tuple[float, str, str]] = field(default_factory=list)

    def announce(self) -> None:
        self.log.append((CLOCK.now(), self.agent_id, "announced"))

    async def ready(self) -> bool:
        if not self.proceed:
            self.log.append((CLOCK.now(), self.agent_id, "skipped"))
        return self.proceed

    def priority(self) -> tuple[int, ...]:
        return self.rank

    async def run(self, ctx: object) -> None:
        self.log.append((CLOCK.now(), self.agent_id, "start"))
        await CLOCK.sleep(self.turn_s)

    async def done(self) -> None:
        self.log.append((CLOCK.now(), self.agent_id, "done"))


class CountingGate(AgentGate):
    """The fleet's gate, keeping the most agents it ever held at once."""

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self.most = 0

    async def enter(self, agent: str, priority: tuple[int, ...]) -> None:
        await super().enter(agent, priority)
        self.most = max(self.most, self.view().live)


def events(drivers: Sequence[Member], what: str) -> list[tuple[float, str]]:
    logs = {id(d.log): d.log for d in drivers}  # drivers may share one log
    # By time; within one instant in the order they happened.
    return sorted(((t, a) for log in logs.values() for t, a, w in log if w == what), key=lambda e: e[0])


def test_the_gate_holds_the_width_and_admits_in_priority_order() -> None:
    log: list[tuple[float, str, str]] = []
    # Five 3 s agents through a gate of width 2; e has the best priority, a the worst.
    ranks = {"a": (9,), "b": (1,), "c": (2,), "d": (3,), "e": (0,)}
    drivers = [Member(a, rank=r, log=log) for a, r in ranks.items()]
    gate = CountingGate(2)
    out = run(run_load(drivers, None, strategy=Gated(gate, clock=CLOCK)))
    assert gate.most == 2
    # All five arrive in one instant, in list order: a and b find room, c, d and e queue and are let in by
    # priority as slots free up — e, then c (at 3 s), then d (at 6 s).
    assert [a for _, a in events(drivers, "start")] == ["a", "b", "e", "c", "d"]
    assert [t for t, _ in events(drivers, "start")] == [0.0, 0.0, 3.0, 3.0, 6.0]
    assert out.wall_s == pytest.approx(9.0)  # ⌈5 / 2⌉ rounds of 3 s


def test_the_control_loop_ticks_every_interval_and_can_widen_the_gate() -> None:
    gate = CountingGate(1)
    ticks: list[float] = []

    async def control() -> None:
        ticks.append(CLOCK.now())
        if len(ticks) == 2:
            gate.set_limit(3)

    drivers = [Member(f"m{i}", turn_s=10.0) for i in range(4)]
    run(run_load(drivers, None, strategy=Gated(gate, clock=CLOCK, control=control, interval_s=1.0)))
    assert gate.most == 3
    # m0 alone until the second tick (t=2) widened the gate; then m1, m2 joined; m3 when m0 ended at 10.
    assert [t for t, _ in events(drivers, "start")] == [0.0, 2.0, 2.0, 10.0]
    # One a second until the last agent ended at 20 s (the tick due in that same instant may or may not run);
    # then the loop was cancelled with the load.
    assert ticks == [float(t) for t in range(1, len(ticks) + 1)]
    assert len(ticks) in (19, 20)


def test_dependencies_make_waves_and_a_skipped_driver_still_completes_its_group() -> None:
    log: list[tuple[float, str, str]] = []
    drivers = [
        Member("a1", group="a", turn_s=2.0, log=log),
        Member("a2", group="a", turn_s=5.0, log=log),
        Member("b1", group="b", depends_on=("a",), proceed=False, log=log),  # skipped: its wave ran nonetheless
        Member("c1", group="c", depends_on=("a", "b"), turn_s=1.0, log=log),
    ]
    out = run(run_load(drivers, None, strategy=Gated(AgentGate(8), clock=CLOCK)))
    assert events(drivers, "start") == [(0.0, "a1"), (0.0, "a2"), (5.0, "c1")]  # c waits for the slower a2
    assert events(drivers, "skipped") == [(5.0, "b1")]
    assert [a for _, a in events(drivers, "announced")] == ["a1", "a2", "b1", "c1"]  # announced before waiting
    assert out.ended is End.DONE
    assert out.wall_s == pytest.approx(6.0)


def test_a_settled_driver_does_not_run_and_its_group_counts_as_done_from_the_start() -> None:
    log: list[tuple[float, str, str]] = []
    drivers = [
        Member("later", group="b", depends_on=("a",), log=log),  # listed first: it must not wait for "early"
        Member("early", group="a", settled=True, log=log),
    ]
    run(run_load(drivers, None, strategy=Gated(AgentGate(1), clock=CLOCK)))
    assert events(drivers, "start") == [(0.0, "later")]
    assert events(drivers, "done") == [(3.0, "later")]
    assert [a for _, a in events(drivers, "announced")] == ["later", "early"]  # each in its turn, settled or not


def test_a_dependency_no_driver_belongs_to_is_refused() -> None:
    with pytest.raises(ConfigError, match="nobody"):
        run(run_load([Member("x", depends_on=("nobody",))], None, strategy=Gated(AgentGate(1), clock=CLOCK)))


def test_a_gated_driver_cancelled_by_the_timer_gives_its_slot_back_and_is_not_done() -> None:
    gate = AgentGate(1)
    drivers = [Member("a", turn_s=10.0), Member("b", turn_s=10.0)]
    out = run(run_load(drivers, None, strategy=Gated(gate, clock=CLOCK), stop_after_s=4.0))
    assert out.ended is End.TIMER
    assert out.cancelled == 2
    assert gate.view().live == 0
    assert gate.view().queued == 0
    assert events(drivers, "done") == []


def test_a_control_interval_must_be_positive() -> None:
    async def control() -> None:
        return None

    with pytest.raises(ConfigError, match="interval"):
        Gated(AgentGate(1), clock=CLOCK, control=control, interval_s=0.0)


def test_the_runner_imports_no_profile_that_runs_on_it() -> None:
    # bench, suite and fleet import load/; workload/ imports suite/ (the suite workload): any of these edges would
    # make a cycle, and the runner would know its callers.
    graph = build_graph()
    assert {b for a, b in graph if a == "load"} <= {"clock", "errors"}
    assert {a for a, b in graph if b == "load"} >= {"bench", "suite", "fleet"}


class BriefLoop(AllAtOnce):
    """All at once, with a background loop that has nothing to do and returns at once."""

    def __init__(self) -> None:
        super().__init__()
        self.ran = False

    def background(self) -> Any:
        async def once() -> None:
            self.ran = True

        return once()


def test_a_strategy_loop_that_returns_does_not_end_the_load_or_wake_it_forever() -> None:
    strategy = BriefLoop()
    out = run(run_load([Turns("a", turns=2)], Ctx(), strategy=strategy))
    assert strategy.ran
    assert out.ended is End.DONE
    assert out.wall_s == pytest.approx(6.0)
