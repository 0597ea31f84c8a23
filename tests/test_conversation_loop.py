"""The one conversation loop (agent/loop.converse) and the kernel's shape compiled from bench's (sim/virtual)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

from agentload.agent.loop import EXHAUSTED, STOPPED, End, Ending, Next, Request, TurnLog, converse
from agentload.agent.shape import AgenticShape
from agentload.capacity.planner import AgentShape
from agentload.clock import LoopClock, run_virtual
from agentload.endpoint.records import Outcome, RequestIds, RequestRecord
from agentload.errors import ConfigError
from agentload.sim.curve import held_agent
from agentload.sim.tokens import extend_block_hashes
from agentload.sim.virtual import SessionShape, _Session
from agentload.workload.agentic import SizeStreams, grow_turn_sizes


class Backend:
    """Answers every request at once; ``fail_at`` turns fail after one retried attempt."""

    def __init__(self, clock: LoopClock, fail_at: frozenset[int] = frozenset()) -> None:
        self.clock = clock
        self.fail_at = fail_at
        self.sent: list[tuple[float, int, Mapping[str, Any]]] = []

    async def complete(self, body: Mapping[str, Any], ids: RequestIds) -> list[RequestRecord]:
        now = self.clock.now()
        self.sent.append((now, ids.turn, body))
        if ids.turn in self.fail_at:
            bad = RequestRecord(ids=ids, t_sent=now, t_done=now, outcome=Outcome.CONNECT_ERROR)
            return [bad, bad]
        return [RequestRecord(ids=ids, t_sent=now, t_done=now, content=f"reply {ids.turn}")]


class Scripted:
    """A conversation of ``turns`` turns with the given pauses; records what the loop showed it."""

    def __init__(self, pauses: list[float], *, until: float | None = None, log: bool = False) -> None:
        self.pauses = pauses
        self.until = until
        self.log = log
        self.seen: list[tuple[int, int, bool]] = []  # (turn, attempts, final ok)
        self.asked: list[int] = []

    def request(self, turn: int) -> Request | None:
        self.asked.append(turn)
        return Request({"turn": turn}, RequestIds(agent="a", turn=turn))

    async def reply(self, turn: int, records: list[RequestRecord]) -> Next | End:
        self.seen.append((turn, len(records), records[-1].ok))
        log = TurnLog(round=turn, records=records) if self.log else None
        if not records[-1].ok:
            return End("failed", log)
        if turn >= len(self.pauses):
            return End("done", log)
        if self.until is not None:
            return Next(until=self.until, slice_s=1.0, log=log)
        return Next(self.pauses[turn], log=log)


def test_turns_follow_each_other_after_their_pauses_and_end_when_the_conversation_says() -> None:
    async def main() -> tuple[Ending, Backend, Scripted]:
        clock = LoopClock()
        backend, conv = Backend(clock), Scripted([2.0, 0.0, 3.5])
        return await converse(conv, backend, clock), backend, conv

    ending, backend, conv = run_virtual(main())
    assert ending == Ending("done", 4)
    # Sent at 0, after 2 s, at once, after 3.5 s more: 0, 2, 2, 5.5.
    assert [(t, turn) for t, turn, _ in backend.sent] == [(0.0, 0), (2.0, 1), (2.0, 2), (5.5, 3)]
    assert conv.seen == [(0, 1, True), (1, 1, True), (2, 1, True), (3, 1, True)]


def test_a_failed_turn_hands_the_conversation_every_attempt() -> None:
    async def main() -> tuple[Ending, Scripted]:
        clock = LoopClock()
        conv = Scripted([1.0, 1.0, 1.0])
        return await converse(conv, Backend(clock, fail_at=frozenset({1})), clock), conv

    ending, conv = run_virtual(main())
    assert ending == Ending("failed", 2)
    assert conv.seen == [(0, 1, True), (1, 2, False)]  # the retry and the final attempt, nothing after


def test_a_stop_during_a_pause_ends_the_conversation_before_the_next_request() -> None:
    async def main() -> tuple[Ending, Backend, float]:
        clock = LoopClock()
        backend, conv = Backend(clock), Scripted([10.0, 10.0])

        def stop() -> bool:
            return clock.now() >= 4.0

        ending = await converse(conv, backend, clock, should_stop=stop)
        return ending, backend, clock.now()

    ending, backend, now = run_virtual(main())
    assert ending == Ending(STOPPED, 1)
    assert [turn for _, turn, _ in backend.sent] == [0]
    assert now == 10.0  # a pause is slept whole, the stop seen after it


def test_a_wait_until_a_time_sees_a_stop_within_one_slice() -> None:
    async def main() -> tuple[Ending, float]:
        clock = LoopClock()
        conv = Scripted([0.0, 0.0], until=100.0)

        def stop() -> bool:
            return clock.now() >= 3.5

        ending = await converse(conv, Backend(clock), clock, should_stop=stop)
        return ending, clock.now()

    ending, now = run_virtual(main())
    assert ending == Ending(STOPPED, 1)
    assert now == 4.0  # slices of 1 s: awake at 1, 2, 3, 4 — the first to see the stop at 3.5


def test_a_wait_until_a_time_already_past_sends_at_once() -> None:
    async def main() -> Backend:
        clock = LoopClock()
        backend = Backend(clock)
        await converse(Scripted([0.0, 0.0], until=0.0), backend, clock, should_stop=lambda: False)
        return backend

    assert [t for t, _, _ in run_virtual(main()).sent] == [0.0, 0.0, 0.0]


def test_no_next_request_ends_exhausted_and_a_resumed_conversation_starts_at_its_turn() -> None:
    class Capped(Scripted):
        def request(self, turn: int) -> Request | None:
            return super().request(turn) if turn < 5 else None

    async def main() -> tuple[Ending, Capped]:
        clock = LoopClock()
        conv = Capped([0.0] * 10)
        return await converse(conv, Backend(clock), clock, first_turn=3), conv

    ending, conv = run_virtual(main())
    assert ending == Ending(EXHAUSTED, 5)
    assert [turn for turn, _, _ in conv.seen] == [3, 4]  # asked for turn 5 too, which had no request


def test_on_turn_gets_each_turn_log_before_the_pause_sync_or_async() -> None:
    got: list[tuple[str, int, float]] = []

    async def main() -> None:
        clock = LoopClock()

        def sync_hook(t: TurnLog) -> None:
            got.append(("sync", t.round, clock.now()))

        async def async_hook(t: TurnLog) -> None:
            got.append(("async", t.round, clock.now()))

        await converse(Scripted([5.0], log=True), Backend(clock), clock, on_turn=sync_hook)
        await converse(Scripted([5.0], log=True), Backend(clock), clock, on_turn=async_hook)
        await converse(Scripted([5.0], log=False), Backend(clock), clock, on_turn=sync_hook)  # no logs: not called

    run_virtual(main())
    assert got == [("sync", 0, 0.0), ("sync", 1, 5.0), ("async", 0, 5.0), ("async", 1, 10.0)]


# -- the kernel's shape, compiled from bench's ------------------------------------------------------------------


def test_the_planners_held_agent_compiles_to_the_kernel_shape_the_curve_always_ran() -> None:
    # The curve's session before it was built from AgenticShape: context less one reply (its prompt plus its
    # reply peak at the planned context), the plan's 2,000 / 1,000 / 400 / 2 s.
    assert SessionShape.from_agentic(held_agent(8192, AgentShape())) == SessionShape(
        context=8192 - 400, system_tokens=2000, turn_input_tokens=1000, output_tokens=400, think_s=2.0, growth="hold"
    )
    agent = AgentShape(system_tokens=3000, output_tokens=250, think_s=0.0)
    assert SessionShape.from_agentic(held_agent(40960, agent)) == SessionShape(
        context=40960 - 250, system_tokens=3000, turn_input_tokens=1000, output_tokens=250, think_s=0.0, growth="hold"
    )


def test_a_plan_with_no_room_for_a_turn_is_one_clear_error() -> None:
    # 2,000 system + 1,000 input + 2 × 400 output = 3,800: a 3,800-token context leaves no opening of its own.
    with pytest.raises(ConfigError, match="no room"):
        held_agent(3800, AgentShape())


def test_benchs_default_shapes_compile_to_their_mean_turns() -> None:
    # agentic at 8,192 (workload.agentic's docstring rule): opening 0.3 × 8192 → 2,457, a third of it system
    # (819), + 3 template tokens = 2,460; 43 turns of (8192 − 2457) / 43 = 133.4 tokens; mean prompt
    # (2457 + 8192 − 133.4) / 2 = 5,257.8; reply 5257.8 / 131 = 40.1; tool result 133.4 − 40.1 − 3 = 90.2, + 3
    # template tokens = 93 in the kernel. Pause: lognormal means 1.0·e^0.5 + 0.5·e^0.125 = 1.6487 + 0.5666.
    grow = SessionShape.from_agentic(AgenticShape.published(8192, "grow"))
    assert (grow.context, grow.start_context, grow.system_tokens) == (8192, 2460, 819)
    assert (grow.turn_input_tokens, grow.output_tokens) == (93, 40)
    assert grow.think_s == pytest.approx(2.2153, abs=1e-4)
    # agentic-hold: the opening leaves one exchange plus a reply of twice the mean:
    # 8192 − 819 − 3 − round(2 × 40.1 + 90.2) − 3 = 7,197 − 1 → prefix 7,196, opening 8,018; the kernel's context
    # is the opening plus one turn (93 + 40) = 8,151.
    hold = SessionShape.from_agentic(AgenticShape.published(8192, "hold"))
    assert (hold.context, hold.start_context, hold.growth) == (8151, None, "hold")
    assert hold.context + hold.output_tokens <= 8192  # prompt + reply peak under the target


def test_a_grow_kernel_session_climbs_and_restarts_where_the_agentic_driver_would() -> None:
    # With no spread every draw is the mean, so the driver's turn sizes (grow_turn_sizes, the very draws of
    # AgenticDriver) and the kernel's prompts compiled from the same shape must agree turn for turn, restarts
    # included (~40 turns per session at these sizes, so 120 turns cross two restarts).
    shape = AgenticShape.published(8192, "grow", output_sigma=0, tool_result_sigma=0, tool_latency_sigma=0)
    driver = grow_turn_sizes(shape, SizeStreams(shape, seed=0, index=0))
    expected = [next(driver) for _ in range(120)]
    kernel_shape = SessionShape.from_agentic(shape)
    system: list[int] = np.random.default_rng(1).integers(0, 1000, kernel_shape.system_tokens).tolist()
    session = _Session(0, kernel_shape, system, extend_block_hashes([], system, 16), 16)
    got: list[tuple[int, int]] = []
    last: list[int] | None = None
    for _ in range(120):
        prompt, _hashes = session.next_prompt(last)
        got.append((len(prompt), kernel_shape.output_tokens))
        last = session.fresh(kernel_shape.output_tokens)
    assert got == expected
    assert sum(1 for p, _ in got if p == shape.opening_tokens) >= 3  # it did restart
    assert max(p + o for p, o in got) <= 8192
