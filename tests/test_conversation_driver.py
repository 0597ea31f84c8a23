"""An agent's conversations run by agent/loop.ConversationDriver; workloads only produce them.

The structural half reads the workload modules with ``ast``: a module that defines conversations (a class with
``request`` and ``reply``) must not call what runs them (``converse``, ``pause``, ``wait_until``, ``run_agent``),
so a turn never goes from the loop into the workload and back into the loop (the call-back
``benchmarks/turn_modules.py`` used to find between agent/loop and workload/agentic). The behavioural half pins
what the driver does with the steps an agent yields: run a conversation and send back its ending, wait (a stop
during the wait ends the agent), spawn open-loop conversations and wait for them before it ends.
"""

from __future__ import annotations

import ast
import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentload.agent.loop import (
    STOPPED,
    ConversationDriver,
    End,
    Ending,
    Next,
    Request,
    Spawn,
    Steps,
    Wait,
    Whole,
)
from agentload.clock import LoopClock, run_virtual
from agentload.endpoint.records import Outcome, RequestIds, RequestRecord

WORKLOAD = Path(__file__).resolve().parents[1] / "src" / "agentload" / "workload"
RUNS_CONVERSATIONS = {"converse", "pause", "wait_until", "run_agent"}


def _defines_conversation(tree: ast.Module) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            methods = {n.name for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
            if {"request", "reply"} <= methods:
                return True
    return False


def _loop_names_used(tree: ast.Module) -> set[str]:
    """Names imported from agentload.agent.loop, and attributes read off the module itself."""
    used: set[str] = set()
    aliases: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "agentload.agent.loop":
            used |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module == "agentload.agent":
            aliases |= {a.asname or a.name for a in node.names if a.name == "loop"}
        elif isinstance(node, ast.Import):
            aliases |= {a.asname or a.name for a in node.names if a.name == "agentload.agent.loop"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            used.add(node.attr)
    return used


def test_no_workload_module_that_defines_conversations_runs_them() -> None:
    producers = []
    for path in sorted(WORKLOAD.glob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        if not _defines_conversation(tree):
            continue
        producers.append(path.stem)
        calls = _loop_names_used(tree) & RUNS_CONVERSATIONS
        assert not calls, f"workload/{path.stem} defines conversations and calls {sorted(calls)} of agent/loop"
    # The check is only worth something while it sees the workloads that have conversations.
    assert {"agentic", "trace"} <= set(producers), producers


class Backend:
    """Answers at once after ``latency_s``; fails the turns of agents named in ``fail``."""

    def __init__(self, clock: LoopClock, latency_s: float = 0.0, fail: frozenset[str] = frozenset()) -> None:
        self.clock = clock
        self.latency_s = latency_s
        self.fail = fail
        self.sent: list[tuple[float, str]] = []

    async def complete(self, body: Mapping[str, Any], ids: RequestIds) -> list[RequestRecord]:
        t = self.clock.now()
        self.sent.append((t, ids.agent))
        if self.latency_s:
            await self.clock.sleep(self.latency_s)
        if ids.agent in self.fail:
            return [RequestRecord(ids=ids, t_sent=t, t_done=self.clock.now(), outcome=Outcome.CONNECT_ERROR)]
        return [RequestRecord(ids=ids, t_sent=t, t_done=self.clock.now(), content="ok")]


class OneShot:
    def __init__(self, name: str) -> None:
        self.name = name

    def request(self, turn: int) -> Request:
        return Request({}, RequestIds(agent=self.name, turn=turn))

    async def reply(self, turn: int, records: list[RequestRecord]) -> Next | End:
        return End("done" if records[-1].ok else "failed")


@dataclass
class Ctx:
    backend: Backend
    clock: LoopClock
    stop_at: float = float("inf")

    def should_stop(self) -> bool:
        return self.clock.now() >= self.stop_at


@dataclass
class Scripted:
    """Yields the given steps; keeps what the driver sent back."""

    steps: list[Any]
    agent_id: str = "a"
    answers: list[Ending | None] = field(default_factory=list)

    def conversations(self, ctx: Ctx) -> Steps:
        for step in self.steps:
            self.answers.append((yield step))


def test_the_suite_and_the_fleet_yield_their_conversations_and_never_run_them() -> None:
    # The suite's sessions (and bench's suite workload) and the fleet's agents are agents of ConversationDriver too:
    # no module of theirs runs a conversation (one driver shape).
    src = WORKLOAD.parent
    checked = []
    for path in sorted([*(src / "suite").glob("*.py"), *(src / "fleet").glob("*.py"), WORKLOAD / "suite.py"]):
        calls = _loop_names_used(ast.parse(path.read_text(), filename=str(path))) & RUNS_CONVERSATIONS
        assert not calls, f"{path.relative_to(src)} calls {sorted(calls)} of agent/loop"
        checked.append(path.stem)
    assert {"runner", "turns", "suite"} <= set(checked)


def test_a_conversation_is_run_and_its_ending_sent_back_and_a_wait_is_slept() -> None:
    async def go() -> tuple[Scripted, Backend]:
        clock = LoopClock()
        backend = Backend(clock)
        agent = Scripted([OneShot("x"), Wait(5.0), OneShot("y")])
        await ConversationDriver(agent).run(Ctx(backend, clock))
        return agent, backend

    agent, backend = run_virtual(go())
    assert [a.reason if a else None for a in agent.answers] == ["done", None, "done"]
    assert [(t, a) for t, a in backend.sent] == [(0.0, "x"), (5.0, "y")]


def test_a_stop_during_a_wait_ends_the_agent_without_its_next_step() -> None:
    async def go() -> tuple[Scripted, Backend]:
        clock = LoopClock()
        backend = Backend(clock)
        agent = Scripted([OneShot("x"), Wait(until=100.0, slice_s=1.0), OneShot("never")])
        await ConversationDriver(agent).run(Ctx(backend, clock, stop_at=10.0))
        return agent, backend

    agent, backend = run_virtual(go())
    assert [a for _, a in backend.sent] == ["x"]
    assert len(agent.answers) == 1  # the generator was closed at the wait, never resumed past it


def test_spawned_conversations_overlap_and_the_agent_ends_after_them() -> None:
    ended: list[tuple[str, float]] = []

    async def go() -> float:
        clock = LoopClock()
        backend = Backend(clock, latency_s=10.0)
        slots = asyncio.Semaphore(2)

        def on_end(name: str) -> Any:
            return lambda end: ended.append((name if end.reason != STOPPED else "stopped", clock.now()))

        agent = Scripted([Spawn(OneShot(n), slots, on_end(n)) for n in ("a", "b", "c")])
        await ConversationDriver(agent).run(Ctx(backend, clock))
        return clock.now()

    finished = run_virtual(go())
    # Two slots: a and b start at 0 together, c when one of them gives its slot back at 10; the driver returns
    # only after c's reply at 20.
    assert ended == [("a", 10.0), ("b", 10.0), ("c", 20.0)]
    assert finished == 20.0


def test_the_agentic_workload_hands_its_agents_to_the_driver() -> None:
    from agentload.workload.agentic import AgenticDriver, AgenticWorkload

    [driver] = AgenticWorkload("grow").agents(1, context=4096, seed=0)
    assert isinstance(driver, ConversationDriver)
    assert isinstance(driver.agent, AgenticDriver)
    assert driver.agent_id == "agent-0"


def test_a_spawned_conversations_bug_is_raised_and_its_siblings_are_awaited() -> None:
    class Broken(OneShot):
        async def reply(self, turn: int, records: list[RequestRecord]) -> Next | End:
            raise RuntimeError("a bug in the conversation")

    cancelled: list[str] = []

    class Slow(OneShot):
        async def reply(self, turn: int, records: list[RequestRecord]) -> Next | End:
            try:
                await asyncio.sleep(1000)
            except asyncio.CancelledError:
                cancelled.append(self.name)
                raise
            return End("done")

    async def go() -> str:
        clock = LoopClock()
        backend = Backend(clock, latency_s=1.0)
        slots = asyncio.Semaphore(4)
        # The bug surfaces at 1 s; the agent would go on spawning after its 5 s wait, and "slow" never ends.
        agent = Scripted([Spawn(Slow("slow"), slots, lambda end: None), Spawn(Broken("bad"), slots, lambda end: None),
                          Wait(5.0), Spawn(OneShot("never"), slots, lambda end: None)])  # fmt: skip
        try:
            await ConversationDriver(agent).run(Ctx(backend, clock))
        except RuntimeError as exc:
            assert [a for _, a in backend.sent] == ["slow", "bad"]
            return str(exc)
        return "no error"

    assert run_virtual(go()) == "a bug in the conversation"
    assert cancelled == ["slow"]  # cancelled and awaited before the driver returned, not left running


class Turns(OneShot):
    """``count`` turns, a ``pause_s`` pause after each but the last."""

    def __init__(self, name: str, count: int, pause_s: float) -> None:
        super().__init__(name)
        self.count = count
        self.pause_s = pause_s

    async def reply(self, turn: int, records: list[RequestRecord]) -> Next | End:
        return End("done") if turn + 1 == self.count else Next(pause_s=self.pause_s)


def test_a_whole_conversation_runs_to_its_end_through_the_stop_and_a_plain_one_does_not() -> None:
    async def go(step: Any) -> tuple[Scripted, Backend]:
        clock = LoopClock()
        backend = Backend(clock)
        agent = Scripted([step, OneShot("next")])
        await ConversationDriver(agent).run(Ctx(backend, clock, stop_at=1.5))
        return agent, backend

    whole, sent = run_virtual(go(Whole(Turns("w", 4, 1.0))))
    # The stop at 1.5 s did not cut it; whether to start the next conversation is the agent's to decide.
    assert sent.sent == [(0.0, "w"), (1.0, "w"), (2.0, "w"), (3.0, "w"), (3.0, "next")]
    assert [a.reason if a else None for a in whole.answers] == ["done", "done"]
    plain, sent = run_virtual(go(Turns("p", 4, 1.0)))
    assert sent.sent == [(0.0, "p"), (1.0, "p"), (2.0, "next")]
    assert plain.answers[0] == Ending(STOPPED, 2)


def test_what_a_conversation_raises_is_raised_in_the_agent_which_may_go_on_or_not() -> None:
    class Broken(OneShot):
        async def reply(self, turn: int, records: list[RequestRecord]) -> Next | End:
            raise RuntimeError(f"{self.name} broke")

    caught: list[str] = []

    class Careful(Scripted):
        def conversations(self, ctx: Ctx) -> Steps:
            try:
                yield Broken("first")
            except RuntimeError as exc:  # kept as data: the agent goes on
                caught.append(str(exc))
            self.answers.append((yield OneShot("after")))
            yield Broken("second")  # not caught: it leaves the driver

    async def go() -> tuple[Careful, Backend, str]:
        clock = LoopClock()
        backend = Backend(clock)
        agent = Careful([])
        try:
            await ConversationDriver(agent).run(Ctx(backend, clock))
        except RuntimeError as exc:
            return agent, backend, str(exc)
        return agent, backend, "no error"

    agent, backend, raised = run_virtual(go())
    assert caught == ["first broke"]
    assert [a.reason if a else None for a in agent.answers] == ["done"]
    assert [a for _, a in backend.sent] == ["first", "after", "second"]
    assert raised == "second broke"


def test_a_cancel_is_raised_in_the_agent_at_its_yield_and_one_it_asked_for_may_be_taken_back() -> None:
    # The fleet's restart: the agent cancels its own task to abandon the conversation in flight, takes the cancel
    # back (``uncancel``) and yields the conversation again; a cancel it did not ask for still ends it.
    seen: list[str] = []

    class Restarting(Scripted):
        restart = True

        def conversations(self, ctx: Ctx) -> Steps:
            task = asyncio.current_task()
            assert task is not None
            self.task = task
            while True:
                try:
                    self.answers.append((yield Turns(f"try{len(seen)}", 3, 1.0)))
                    return
                except asyncio.CancelledError:
                    seen.append("cancelled")
                    if not self.restart or task.uncancel() > 0:
                        raise

    async def go() -> tuple[Restarting, Backend, bool]:
        clock = LoopClock()
        backend = Backend(clock, latency_s=1.0)
        agent = Restarting([])
        running = asyncio.ensure_future(ConversationDriver(agent).run(Ctx(backend, clock)))
        await clock.sleep(1.5)
        agent.task.cancel()  # a restart, in the first try's pause after its first turn
        await clock.sleep(2.2)
        agent.restart = False
        running.cancel()  # the run's end: not taken back
        await asyncio.gather(running, return_exceptions=True)
        return agent, backend, running.cancelled()

    agent, backend, cancelled = run_virtual(go())
    assert seen == ["cancelled", "cancelled"]
    assert agent.answers == []  # neither try ended
    # The second try starts at once; the run's end lands in its second request, and is not taken back.
    assert backend.sent == [(0.0, "try0"), (1.5, "try1"), (3.5, "try1")]
    assert cancelled
