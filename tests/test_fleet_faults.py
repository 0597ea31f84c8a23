"""A fleet under failing turns: a rate-limited turn is the agent's data, not a stop of the run, and a turn cancelled
while it was being retried keeps the attempts it had made (an ``interrupt`` line).

The retry layer is the real ``RetryingBackend`` over a scripted client: no network, no sleeps (backoffs of 0 s), and
every ordering is forced by events, never by time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from agentload.clock import LoopClock
from agentload.endpoint.backend import RetryingBackend
from agentload.endpoint.client import FixedDeadlines, StallPolicy
from agentload.endpoint.records import ErrorKind, Outcome, RequestIds, RequestRecord
from agentload.fleet.checkpoint import LOG, CheckpointLog, LogState, load_log
from agentload.fleet.config import expand, parse_fleet
from agentload.fleet.limiter import Limiter, Mode, make_policy
from agentload.fleet.runner import FleetRunner, SegmentOutcome

Script = Callable[[RequestIds], Awaitable[RequestRecord]]


def _ok(ids: RequestIds) -> RequestRecord:
    return RequestRecord(ids=ids, t_sent=0.0, t_done=0.0, content=f"answer of {ids.agent}")


def _failed(ids: RequestIds, **fields: Any) -> RequestRecord:
    return RequestRecord(ids=ids, t_sent=0.0, t_done=0.0, **fields)


def _too_many(ids: RequestIds) -> RequestRecord:
    return _failed(ids, outcome=Outcome.HTTP_ERROR, error=ErrorKind.HTTP_STATUS, http_status=429, retry_after_s=0.0)


def _refused(ids: RequestIds) -> RequestRecord:
    return _failed(ids, outcome=Outcome.CONNECT_ERROR, error=ErrorKind.CONNECT, error_message="refused")


class _Client:
    """A chat client whose every request is answered by ``script`` (a ``ChatSender``)."""

    policy: StallPolicy = FixedDeadlines()

    def __init__(self, script: Script) -> None:
        self.script = script
        self.sent: list[RequestIds] = []

    async def chat(
        self,
        body: Mapping[str, Any],
        *,
        ids: RequestIds | None = None,
        policy: StallPolicy | None = None,
        prompt_tokens_hint: int = 0,
    ) -> RequestRecord:
        assert ids is not None
        self.sent.append(ids)
        await asyncio.sleep(0)  # the other agents' turns interleave, as a real server's would
        return await self.script(ids)


def _run(tmp_path: Path, script: Script, agents: int) -> tuple[SegmentOutcome, LogState, _Client]:
    fleet = parse_fleet(
        f'[defaults]\nmax_rounds = 1\n[[tasks]]\nid = "s"\nprompt = "p {{replica}}"\ncount = {agents}\n'
    )
    log = CheckpointLog(tmp_path / LOG, sync=False)
    client = _Client(script)

    async def go() -> SegmentOutcome:
        backend = RetryingBackend(client, max_attempts=5, base_backoff_s=0.0, max_backoff_s=0.0, clock=LoopClock())
        runner = FleetRunner(
            expand(fleet),
            backend=backend,
            limiter=Limiter(make_policy(Mode.PARALLEL, agents, max_width=agents)),
            log=log,
            state=LogState(),
            clock=LoopClock(),
            workspaces=tmp_path / "ws",
            model="m",
        )
        return await runner.run()

    try:
        outcome = asyncio.run(go())
    finally:
        log.close()
    return outcome, load_log(tmp_path / LOG), client


def test_a_turn_rate_limited_out_of_its_attempts_fails_that_agent_and_the_fleet_goes_on(tmp_path: Path) -> None:
    async def script(ids: RequestIds) -> RequestRecord:
        return _too_many(ids) if ids.agent == "s.0" else _ok(ids)

    outcome, state, client = _run(tmp_path, script, agents=4)
    assert outcome.server_failure is None  # a 429 is a live server asking for less, not a failed one
    assert not outcome.stopped_early
    assert {a: line.outcome for a, line in state.finished.items()} == {
        "s.0": "failed", "s.1": "done", "s.2": "done", "s.3": "done"}  # fmt: skip
    assert not state.interrupts
    (failed,) = state.turns["s.0"]  # the failed turn is committed, with every attempt it made
    assert [(r.ids.attempt, r.http_status) for r in failed.turn.records] == [(i, 429) for i in range(5)]
    assert len(client.sent) == 5 + 3


def test_a_turn_cancelled_while_it_is_retried_keeps_its_attempts_in_an_interrupt(tmp_path: Path) -> None:
    """s.0 fails once and hangs on its resend; then s.1 finds the server gone, which stops the run and cancels s.0's
    turn: the attempt s.0 had made is in its interrupt line, and its turn is not committed."""
    resent = asyncio.Event()

    async def script(ids: RequestIds) -> RequestRecord:
        if ids.agent == "s.0":
            if ids.attempt == 0:
                return _failed(ids, outcome=Outcome.HTTP_ERROR, error=ErrorKind.HTTP_STATUS, http_status=503)
            resent.set()
            await asyncio.Event().wait()  # a response that never comes: only the run's cancel ends it
        await resent.wait()
        return _refused(ids)

    outcome, state, _ = _run(tmp_path, script, agents=2)
    assert outcome.server_failure is not None
    assert "connect_error: refused" in outcome.server_failure
    assert not state.turns  # neither turn committed: both rounds are sent again on resume
    assert not state.finished
    (gone,) = state.interrupts["s.1"]
    assert [r.outcome for r in gone.records] == [Outcome.CONNECT_ERROR] * 5
    (cancelled,) = state.interrupts["s.0"]
    assert cancelled.round == 0
    assert [(r.ids.attempt, r.http_status) for r in cancelled.records] == [(0, 503)]
    assert "cancelled after 1 attempt(s)" in cancelled.detail
