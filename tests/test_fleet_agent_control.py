"""Stopping and restarting one agent of a running fleet (``FleetRunner.stop_agent`` / ``restart_agent``), with a
scripted backend that holds a chosen turn in flight until the test lets it go: so the stop or the restart lands
exactly while that turn is being answered, on a busy machine too (nothing here is timed).

Every claim is read from the checkpoint log, which refuses a turn lost or committed twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from agentload.clock import LoopClock
from agentload.endpoint.records import RequestIds, RequestRecord, ToolCallRecord
from agentload.errors import ConfigError
from agentload.fleet.checkpoint import LOG, CheckpointLog, load_log
from agentload.fleet.config import expand, parse_fleet
from agentload.fleet.limiter import Limiter, Mode, make_policy
from agentload.fleet.runner import FleetRunner
from agentload.fleet.turns import AgentState

FLEET = """
name = "ctl"
[defaults]
tools = ["search"]
tool_choice = "required"
max_rounds = 4
max_tokens = 8
think_time_s = 0.0
context_tokens = 200
tool_result_tokens = 20

[[tasks]]
id = "w"
prompt = "Work item {replica}."
count = 3

[[tasks]]
id = "after"
prompt = "Sum up."
depends_on = ["w"]
max_rounds = 2
"""


class Scripted:
    """Answers every turn with a search call; the turn ``hold`` = (agent, round) waits for ``release`` (its first
    attempt only), and ``held`` is set while it waits."""

    def __init__(self, hold: tuple[str, int] | None = None) -> None:
        self.hold = hold
        self.held = asyncio.Event()
        self.release = asyncio.Event()
        self.sent: list[tuple[str, int]] = []

    async def complete(self, body: Mapping[str, Any], ids: RequestIds) -> list[RequestRecord]:
        self.sent.append((ids.agent, ids.turn))
        if (ids.agent, ids.turn) == self.hold and self.sent.count((ids.agent, ids.turn)) == 1:
            self.held.set()
            await self.release.wait()
        call = ToolCallRecord(id=f"c{ids.turn}", name="search", arguments='{"query": "x"}')
        return [RequestRecord(ids=ids, t_sent=1.0, t_first_token=1.1, t_done=1.2, prompt_tokens=100 + ids.turn,
                              completion_tokens=4, tool_calls=[call])]  # fmt: skip


class Events:
    def __init__(self) -> None:
        self.states: dict[str, list[str]] = {}

    def agent(self, agent: str, state: AgentState, *, rounds: int | None = None, detail: str = "") -> None:
        self.states.setdefault(agent, []).append(state.value)

    def turn(self, agent: str, turn: Any) -> None:
        return None

    def limiter(self, stats: Any) -> None:
        return None


def _runner(tmp_path: Path, backend: Scripted, segment: int = 0) -> tuple[FleetRunner, CheckpointLog, Events]:
    plans = expand(parse_fleet(FLEET))
    log = CheckpointLog(tmp_path / LOG, sync=False)
    events = Events()
    runner = FleetRunner(
        plans,
        backend=backend,
        limiter=Limiter(make_policy(Mode.PARALLEL, 3, max_width=len(plans))),
        log=log,
        state=load_log(tmp_path / LOG),
        clock=LoopClock(),
        workspaces=tmp_path / "ws",
        model="m",
        segment=segment,
        progress=events,
    )
    return runner, log, events


def _rounds(tmp_path: Path) -> dict[str, list[int]]:
    state = load_log(tmp_path / LOG, repair=False)  # raises on a turn lost or repeated
    return {a: [t.round for t in lines] for a, lines in state.turns.items()}


async def test_restart_abandons_the_turn_in_flight_and_goes_on_from_the_last_committed(tmp_path: Path) -> None:
    backend = Scripted(hold=("w.1", 2))
    runner, log, events = _runner(tmp_path, backend)
    run = asyncio.create_task(runner.run())
    await asyncio.wait_for(backend.held.wait(), 30)
    assert _rounds(tmp_path)["w.1"] == [0, 1]  # round 2 is in flight, uncommitted
    runner.restart_agent("w.1")
    outcome = await asyncio.wait_for(run, 30)
    log.close()
    assert not outcome.stopped_early
    assert backend.sent.count(("w.1", 2)) == 2  # the abandoned attempt, then the one that was committed
    assert backend.sent.count(("w.1", 3)) == 1
    assert _rounds(tmp_path) == {"w.0": [0, 1, 2, 3], "w.1": [0, 1, 2, 3], "w.2": [0, 1, 2, 3], "after": [0, 1]}
    state = load_log(tmp_path / LOG, repair=False)
    assert {a: x.outcome for a, x in state.finished.items()} == {"w.0": "done", "w.1": "done", "w.2": "done",
                                                                 "after": "done"}  # fmt: skip
    # The committed round 2 is the second attempt's: the abandoned one left nothing in the log.
    assert len(state.turns["w.1"][2].turn.records) == 1
    assert events.states["w.1"].count("running") >= 2


async def test_stop_commits_the_turn_in_flight_then_holds_the_agent_and_its_dependents(tmp_path: Path) -> None:
    backend = Scripted(hold=("w.1", 1))
    runner, log, events = _runner(tmp_path, backend)
    run = asyncio.create_task(runner.run())
    await asyncio.wait_for(backend.held.wait(), 30)
    runner.stop_agent("w.1")
    runner.stop_agent("w.1")  # idempotent
    with pytest.raises(ConfigError, match="is stopping"):
        runner.restart_agent("w.1")
    backend.release.set()
    outcome = await asyncio.wait_for(run, 30)
    log.close()
    assert not outcome.stopped_early
    # w.1's turn in flight was committed, then it stopped; its dependent never started; the others finished.
    assert _rounds(tmp_path) == {"w.0": [0, 1, 2, 3], "w.1": [0, 1], "w.2": [0, 1, 2, 3]}
    state = load_log(tmp_path / LOG, repair=False)
    assert sorted(state.finished) == ["w.0", "w.2"]  # no outcome for w.1 or "after": both resumable
    assert ("w.1", 2) not in backend.sent
    assert events.states["w.1"][-1] == "stopped"
    assert events.states["after"][-1] == "stopped"
    assert runner.held == {"w.1", "after"}

    # The resume (a new segment on the same log) continues w.1 from round 2, then runs its dependent.
    again = Scripted()
    runner2, log2, _ = _runner(tmp_path, again, segment=1)
    await asyncio.wait_for(runner2.run(), 30)
    log2.close()
    assert again.sent == [("w.1", 2), ("w.1", 3), ("after", 0), ("after", 1)]
    assert _rounds(tmp_path) == {"w.0": [0, 1, 2, 3], "w.1": [0, 1, 2, 3], "w.2": [0, 1, 2, 3], "after": [0, 1]}
    assert len(load_log(tmp_path / LOG, repair=False).finished) == 4


async def test_a_stop_during_the_last_round_lets_the_agent_finish(tmp_path: Path) -> None:
    backend = Scripted(hold=("w.1", 3))  # max_rounds = 4: round 3 is its last, whatever the model answers
    runner, log, events = _runner(tmp_path, backend)
    run = asyncio.create_task(runner.run())
    await asyncio.wait_for(backend.held.wait(), 30)
    runner.stop_agent("w.1")
    backend.release.set()
    outcome = await asyncio.wait_for(run, 30)
    log.close()
    assert not outcome.stopped_early
    # Its last round was committed and the conversation ended there: done, not held as stopped.
    assert _rounds(tmp_path) == {"w.0": [0, 1, 2, 3], "w.1": [0, 1, 2, 3], "w.2": [0, 1, 2, 3], "after": [0, 1]}
    state = load_log(tmp_path / LOG, repair=False)
    assert {a: x.outcome for a, x in state.finished.items()} == {"w.0": "done", "w.1": "done", "w.2": "done",
                                                                 "after": "done"}  # fmt: skip
    assert "stopped" not in events.states["w.1"]
    assert runner.held == set()


class Swallowing(Scripted):
    """Like the client's timeout guard firing in the tick a restart cancels: the cancel is taken for its own,
    ``uncancel()``ed, and the turn goes on (answered)."""

    async def complete(self, body: Mapping[str, Any], ids: RequestIds) -> list[RequestRecord]:
        try:
            return await super().complete(body, ids)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            assert task is not None
            task.uncancel()
            self.hold = None
            return await super().complete(body, ids)


async def test_a_restart_swallowed_by_a_timeout_is_a_no_op_and_forgotten(tmp_path: Path) -> None:
    backend = Swallowing(hold=("w.1", 2))
    runner, log, _ = _runner(tmp_path, backend)
    run = asyncio.create_task(runner.run())
    await asyncio.wait_for(backend.held.wait(), 30)
    runner.restart_agent("w.1")
    assert runner.restarting == {"w.1"}
    outcome = await asyncio.wait_for(run, 30)
    log.close()
    assert not outcome.stopped_early
    assert runner.restarting == set()
    assert _rounds(tmp_path) == {"w.0": [0, 1, 2, 3], "w.1": [0, 1, 2, 3], "w.2": [0, 1, 2, 3], "after": [0, 1]}
    assert len(load_log(tmp_path / LOG, repair=False).finished) == 4


async def test_an_agent_stopped_before_it_starts_never_sends(tmp_path: Path) -> None:
    backend = Scripted(hold=("w.0", 0))
    runner, log, events = _runner(tmp_path, backend)
    run = asyncio.create_task(runner.run())
    await asyncio.wait_for(backend.held.wait(), 30)
    runner.stop_agent("after")  # waiting for its dependencies
    backend.release.set()
    await asyncio.wait_for(run, 30)
    log.close()
    assert all(agent != "after" for agent, _ in backend.sent)
    assert "after" not in load_log(tmp_path / LOG, repair=False).finished
    assert events.states["after"][-1] == "stopped"


async def test_unknown_or_ended_agents_are_refused(tmp_path: Path) -> None:
    backend = Scripted(hold=("w.2", 3))
    runner, log, _ = _runner(tmp_path, backend)
    run = asyncio.create_task(runner.run())
    await asyncio.wait_for(backend.held.wait(), 30)
    try:
        with pytest.raises(ConfigError, match="no agent 'nobody'"):
            runner.stop_agent("nobody")
        with pytest.raises(ConfigError, match="no agent 'nobody'"):
            runner.restart_agent("nobody")
        with pytest.raises(ConfigError, match="not running"):
            runner.restart_agent("after")  # waiting for w.2
        for _ in range(2000):  # w.0 and w.1 finish while w.2 is held
            if {"w.0", "w.1"} <= set(runner.outcomes):
                break
            await asyncio.sleep(0.01)
        with pytest.raises(ConfigError, match=r"already ended \(done\)"):
            runner.stop_agent("w.0")
        with pytest.raises(ConfigError, match=r"already ended \(done\)"):
            runner.restart_agent("w.0")
    finally:
        backend.release.set()
        await asyncio.wait_for(run, 30)
        log.close()
    assert _rounds(tmp_path)["after"] == [0, 1]


async def _until(check: Any) -> None:
    for _ in range(20000):
        if check():
            return
        await asyncio.sleep(0)
    raise AssertionError("never happened")


async def test_a_restart_while_parked_queues_again_and_sends_the_round_once(tmp_path: Path) -> None:
    backend = Scripted(hold=("w.1", 1))
    runner, log, events = _runner(tmp_path, backend)
    run = asyncio.create_task(runner.run())
    await asyncio.wait_for(backend.held.wait(), 30)
    gate = runner.limiter.gate
    gate.set_limit(0)  # narrowed to nothing: w.1 parks at its next turn boundary
    backend.release.set()
    await asyncio.wait_for(_until(lambda: events.states["w.1"][-1] == "parked"), 30)
    assert not gate.is_live("w.1")  # parked: it gave its slot back
    runner.restart_agent("w.1")
    # The restart abandons the wait for a slot and queues again, before its round 2 is sent.
    await asyncio.wait_for(_until(lambda: events.states["w.1"][-2:] == ["parked", "parked"]), 30)
    assert ("w.1", 2) not in backend.sent
    assert runner.restarting == set()
    gate.set_limit(3)
    outcome = await asyncio.wait_for(run, 30)
    log.close()
    assert not outcome.stopped_early
    assert backend.sent.count(("w.1", 2)) == 1  # never sent while parked, sent once after
    assert _rounds(tmp_path) == {"w.0": [0, 1, 2, 3], "w.1": [0, 1, 2, 3], "w.2": [0, 1, 2, 3], "after": [0, 1]}
    assert events.states["w.1"][-3:] == ["parked", "running", "done"]


async def test_only_the_restarts_cancel_is_taken_back_not_the_runs(tmp_path: Path) -> None:
    # A restart and the run's own cancel in the same tick (as when the run ends just then): the agent must end with
    # the run, not start over (a cancel taken back by mistake would keep a run from ending).
    backend = Scripted(hold=("w.1", 2))
    runner, log, _ = _runner(tmp_path, backend)
    runner.stop = asyncio.Event()
    run = asyncio.create_task(runner.run())
    await asyncio.wait_for(backend.held.wait(), 30)
    agent_task = runner.attempts["w.1"]
    runner.restart_agent("w.1")
    agent_task.cancel()  # the run's cancel, before the agent wakes to the restart's
    runner.stop.set()
    outcome = await asyncio.wait_for(run, 30)
    log.close()
    assert outcome.stopped_early
    assert agent_task.cancelled()
    assert backend.sent.count(("w.1", 2)) == 1  # not sent again: the agent did not start over
    assert _rounds(tmp_path)["w.1"] == [0, 1]
    assert "w.1" not in load_log(tmp_path / LOG, repair=False).finished  # no outcome: resumable
