"""endpoint.backend.RetryingBackend: every injected fault becomes a resend of the same turn, with the right wait,
and nothing more."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import pytest

from agentload.agent.loop import AgentSpec, run_agent
from agentload.agent.tools import Tool, ToolRegistry
from agentload.endpoint.backend import RetryingBackend, TurnCancelled
from agentload.endpoint.client import ChatClient, FixedDeadlines
from agentload.endpoint.records import ErrorKind, Outcome, RequestIds, RequestRecord
from agentload.endpoint.signals import SignalPoller
from agentload.endpoint.transport import ConnectFailed, MockRequest, MockResponse, MockTransport
from agentload.endpoint.watchdog import Watchdog
from agentload.sim.faults import parse_fault
from tests.fakeclock import ManualClock
from tests.simserver import running_sim

RecordingSleeper = ManualClock  # virtual waits: records what the backend asked for and returns at once


def sse(*events: Mapping[str, Any]) -> bytes:
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"


def reply(content: str = "", calls: list[dict[str, Any]] | None = None) -> MockResponse:
    delta: dict[str, Any] = {"content": content} if content else {"tool_calls": calls or []}
    usage = {"prompt_tokens": 10, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 0}}
    body = sse(
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
        {"choices": [{"index": 0, "delta": delta}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls" if calls else "stop"}]},
        {"choices": [], "usage": usage},
    )
    return MockResponse(headers={"Content-Type": "text/event-stream"}, chunks_script=[(0.0, body)])


def error(status: int, headers: Mapping[str, str] | None = None) -> MockResponse:
    body = json.dumps({"error": {"message": f"status {status}"}}).encode()
    return MockResponse(status=status, headers=dict(headers or {}), chunks_script=[(0.0, body)])


def scripted(*responses: MockResponse | Exception) -> MockTransport:
    """A server that gives these responses in order (an exception is raised, as a refused connection is)."""
    queue = list(responses)

    async def handler(request: MockRequest) -> MockResponse:
        item = queue.pop(0)
        if isinstance(item, Exception):
            raise item
        return item

    return MockTransport(handler)


BODY: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}


# -- the retry rules ---------------------------------------------------------------------------------------------
async def test_the_same_body_is_resent_and_every_attempt_is_returned_numbered() -> None:
    transport = scripted(error(503), ConnectFailed("refused"), reply("hi"))
    sleeper = RecordingSleeper()
    backend = RetryingBackend(ChatClient("http://127.0.0.1:9", transport=transport), clock=sleeper)
    records = await backend.complete(BODY, RequestIds(agent="a", turn=3))
    assert [r.outcome for r in records] == [Outcome.HTTP_ERROR, Outcome.CONNECT_ERROR, Outcome.OK]
    assert [(r.ids.agent, r.ids.turn, r.ids.attempt) for r in records] == [("a", 3, 0), ("a", 3, 1), ("a", 3, 2)]
    assert len({r.body for r in transport.requests}) == 1  # byte-identical resends
    assert len(sleeper.slept) == 2
    assert backend.stats.retried == {"http_503": 1, "connect": 1}
    assert backend.stats.gave_up == {}


async def test_a_client_error_is_not_retried() -> None:
    backend = RetryingBackend(
        ChatClient("http://127.0.0.1:9", transport=scripted(error(400))), clock=RecordingSleeper()
    )
    records = await backend.complete(BODY, RequestIds())
    assert [r.http_status for r in records] == [400]
    assert backend.stats.gave_up == {"not_transient": 1}


async def test_retry_after_is_honoured_never_early_and_a_very_long_one_ends_the_turn() -> None:
    sleeper = RecordingSleeper()
    transport = scripted(error(429, {"Retry-After": "7"}), reply("ok"), error(429, {"Retry-After": "3600"}))
    backend = RetryingBackend(ChatClient("http://127.0.0.1:9", transport=transport), clock=sleeper)
    records = await backend.complete(BODY, RequestIds())
    assert [r.ok for r in records] == [False, True]
    assert len(sleeper.slept) == 1
    assert 7.0 <= sleeper.slept[0] <= 7.7  # never earlier than asked, at most 10% later (spreads a herd)
    records = await backend.complete(BODY, RequestIds())  # an hour: a quota, not a blip
    assert [r.retry_after_s for r in records] == [3600.0]
    assert backend.stats.gave_up == {"retry_after_too_long": 1}


async def test_backoff_doubles_with_equal_jitter_and_the_attempts_run_out() -> None:
    sleeper = RecordingSleeper()
    transport = scripted(*[error(503)] * 5)
    backend = RetryingBackend(
        ChatClient("http://127.0.0.1:9", transport=transport), clock=sleeper, rng=random.Random(1)
    )
    records = await backend.complete(BODY, RequestIds())
    assert len(records) == 5
    ceilings = [0.5, 1.0, 2.0, 4.0]
    assert len(sleeper.slept) == 4
    for slept, ceiling in zip(sleeper.slept, ceilings, strict=True):
        assert ceiling / 2 <= slept <= ceiling
    assert sum(sleeper.slept) <= 7.5  # refused connections end within 7.5 s of backoff with the defaults
    assert backend.stats.gave_up == {"max_attempts": 1}


def test_backoff_is_capped() -> None:
    backend = RetryingBackend(ChatClient("http://127.0.0.1:9", transport=scripted()), max_backoff_s=30)
    failed = RequestRecord(t_sent=0, t_done=0, outcome=Outcome.CONNECT_ERROR, error=ErrorKind.CONNECT)
    waits = [backend.delay(20, failed) for _ in range(50)]
    assert all(w is not None and 15 <= w <= 30 for w in waits)


def test_bad_settings_are_refused() -> None:
    client = ChatClient("http://127.0.0.1:9", transport=scripted())
    with pytest.raises(ValueError, match="max_attempts"):
        RetryingBackend(client, max_attempts=0)
    with pytest.raises(ValueError, match="backoff"):
        RetryingBackend(client, base_backoff_s=5, max_backoff_s=1)


async def test_an_agent_with_tools_loses_and_repeats_nothing_across_failed_attempts() -> None:
    call = [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2}'}}]
    broken = reply(calls=call)
    broken.break_after = 0  # a reset before any byte of the body
    transport = scripted(broken, reply(calls=call), error(429, {"Retry-After": "0"}), error(502), reply("4"))
    tools = ToolRegistry.of(
        [Tool("add", "add two", {"type": "object"}, lambda args: str(int(args["a"]) + 2))]  # runs once per call
    )
    backend = RetryingBackend(ChatClient("http://127.0.0.1:9", transport=transport), clock=RecordingSleeper())
    spec = AgentSpec(agent_id="a1", model="m", messages=[{"role": "user", "content": "2 + 2?"}])
    transcript = await run_agent(spec, backend, tools, RecordingSleeper())
    assert transcript.stop_reason == "answer"
    assert transcript.final_content == "4"
    assert [len(t.records) for t in transcript.turns] == [2, 3]
    roles = [m["role"] for m in transcript.messages()]
    assert roles == ["user", "assistant", "tool", "assistant"]
    sent = [json.loads(r.body or b"{}")["messages"] for r in transport.requests]
    assert sent[0] == sent[1] == [spec.messages[0]]  # the failed attempt changed nothing
    assert sent[2] == sent[3] == sent[4]
    assert [m["role"] for m in sent[4]] == ["user", "assistant", "tool"]  # one assistant, one tool result
    assert sent[4][2]["content"] == "4"


# -- against the simulator's fault injection ---------------------------------------------------------------------
@asynccontextmanager
async def resilient(url: str, *, silence_s: float = 10.0) -> AsyncIterator[RetryingBackend]:
    """Retries behind the watchdog; ``silence_s`` is its first-token and idle deadline.

    Generous by default, so on a busy machine a slow but healthy reply is never cut and retried (that would add an
    attempt the fault count does not explain); the stall test shortens it so a stall is noticed in about a second.
    """
    poller = SignalPoller(url, engine="agentload-sim", interval_s=0.1, timeout_s=max(0.5, silence_s / 2))
    await poller.start()
    dog = Watchdog(
        signals=poller, connect_s=max(2.0, silence_s), first_token_floor_s=silence_s, idle_s=silence_s, check_s=0.1,
        total_s=60,
    )  # fmt: skip
    client = ChatClient(url, policy=dog)
    try:
        yield RetryingBackend(client, max_attempts=8, base_backoff_s=0.01, max_backoff_s=0.05, rng=random.Random(0))
    finally:
        await client.aclose()
        await poller.stop()


def expected_failure(kind: str, record: RequestRecord) -> bool:
    match kind:
        case "reset":
            return record.error is ErrorKind.RESET
        case "malformed":
            return record.error is ErrorKind.MALFORMED
        case "stall":
            return record.error in (ErrorKind.FIRST_TOKEN_TIMEOUT, ErrorKind.IDLE_TIMEOUT)
        case "http429":
            return record.http_status == 429 and record.retry_after_s == 0.2
        case _:
            return record.http_status == int(kind.removeprefix("http"))


@pytest.mark.parametrize("fault", ["reset:0.4", "http503:0.4", "http500:0.4", "http429:0.4:0.2", "stall:0.4:30",
                                   "malformed:0.4"])  # fmt: skip
async def test_every_turn_succeeds_under_injected_faults_with_one_extra_attempt_per_fault(fault: str) -> None:
    turns = 12
    spec = parse_fault(fault)
    stall = spec.kind == "stall"
    async with (
        running_sim("laptop", faults=[spec], seed=7) as (server, url),
        resilient(url, silence_s=1.0 if stall else 10.0) as backend,
    ):
        results = [
            await backend.complete(
                {"model": server.model_name, "messages": [{"role": "user", "content": f"turn {i}"}], "max_tokens": 12},
                RequestIds(agent="a", turn=i),
            )
            for i in range(turns)
        ]
    injected = server.faults.injected.get(spec.kind, 0)
    assert injected >= 2, "the seed must inject this fault more than once for the test to mean anything"
    assert all(records[-1].ok for records in results)
    attempts = sum(len(records) for records in results)
    if stall:
        # A 1 s deadline can also cut a healthy reply the busy machine delayed; that is one more timeout retried,
        # never a lost or repeated turn.
        assert attempts >= turns + injected
    else:
        assert attempts == turns + injected
    for records in results:
        assert [r.ids.attempt for r in records] == list(range(len(records)))
        assert all(expected_failure(spec.kind, r) for r in records[:-1]), [r.error_message for r in records]
        assert all(r.transient for r in records[:-1])
        if spec.kind == "http429":
            for failed, retry in itertools.pairwise(records):
                assert retry.t_sent - failed.t_done >= 0.2  # Retry-After honoured
    assert backend.stats.gave_up == {}


async def test_without_retries_the_same_faults_fail_turns() -> None:
    # The contrast that makes the test above mean something: the same seed, one attempt each.
    async with running_sim("laptop", faults=[parse_fault("reset:0.4")], seed=7) as (server, url):
        client = ChatClient(url, policy=FixedDeadlines(first_token_s=5, idle_s=5))
        backend = RetryingBackend(client, max_attempts=1)
        body = {"model": server.model_name, "max_tokens": 12}
        finals = [
            (await backend.complete({**body, "messages": [{"role": "user", "content": f"x{i}"}]}, RequestIds(turn=i)))[
                -1
            ]
            for i in range(12)
        ]
        await client.aclose()
    assert sum(not r.ok for r in finals) == server.faults.injected["reset"] >= 2


async def test_a_turn_cancelled_on_its_resend_carries_the_attempts_that_had_ended() -> None:
    """The cancel that ends a turn mid-retry carries its earlier attempts, and keeps its own message."""
    resent = asyncio.Event()

    async def handler(request: MockRequest) -> MockResponse:
        if resent.is_set():
            raise AssertionError("no third request: the turn was cancelled on the second")
        if len(transport.requests) == 1:
            return error(503)
        resent.set()
        await asyncio.Event().wait()  # the resend's response never comes: only the cancel ends it
        raise AssertionError("unreachable")

    transport = MockTransport(handler)
    backend = RetryingBackend(ChatClient("http://127.0.0.1:9", transport=transport), clock=RecordingSleeper())
    turn = asyncio.ensure_future(backend.complete(BODY, RequestIds(agent="a", turn=2)))
    await resent.wait()
    turn.cancel("the run stopped")
    with pytest.raises(TurnCancelled) as raised:
        await turn
    assert raised.value.args == ("the run stopped",)
    assert [(r.ids.attempt, r.http_status) for r in raised.value.attempts] == [(0, 503)]
    assert len(transport.requests) == 2  # the attempt in flight was sent, and has no record: its response never ended


class _Alive:
    """A stall policy's dead-server rule that never says dead (a restart the rule has not yet judged)."""

    total_s = 3600.0

    def budget(self, phase: Any, prompt_tokens: int) -> float:
        return 30.0

    def extend(self, phase: Any, waited: float) -> float | None:
        return None

    def observe(self, record: RequestRecord) -> None:
        return None

    def server_dead(self) -> bool:
        return False


async def test_refused_connections_are_ridden_out_past_the_attempts_but_only_up_to_their_bound() -> None:
    """A server that refuses while its rule says it is there is resent to past ``max_attempts``, until
    ``max_ride_out_s`` from the first refusal — counted from a refusal at time 0.0 too."""
    clock = ManualClock(0.0)
    transport = scripted(*[ConnectFailed("refused")] * 50)
    client = ChatClient("http://127.0.0.1:9", transport=transport, policy=_Alive())
    backend = RetryingBackend(client, max_attempts=3, max_backoff_s=2.0, max_ride_out_s=10.0, clock=clock)
    records = await backend.complete(BODY, RequestIds(agent="a"))
    assert len(records) > 3  # past the attempts: the rule did not say the server was gone
    assert all(r.outcome is Outcome.CONNECT_ERROR for r in records)
    assert 10.0 <= clock.t <= 10.0 + 2.0  # ended at the bound (one backoff past it at most), not never
    assert backend.stats.gave_up == {"max_attempts": 1}


class _DiesAt(_Alive):
    """A dead-server rule that says dead from ``at`` on (of ``clock``): a server silent past the rule's bound."""

    def __init__(self, clock: ManualClock, at: float) -> None:
        self.clock, self.at = clock, at

    def server_dead(self) -> bool:
        return self.clock.t >= self.at


async def test_a_backoff_ends_when_the_rule_says_dead_not_when_it_was_due_to() -> None:
    """The rule fires in the middle of a long backoff: the turn gives up within a second of it, whatever the
    jitter drew — not at the backoff's end, when a server back by then would have ridden out an outage the rule
    calls a death."""
    for seed in range(20):
        clock = ManualClock(0.0)
        transport = scripted(*[ConnectFailed("refused")] * 50)
        client = ChatClient("http://127.0.0.1:9", transport=transport, policy=_DiesAt(clock, 20.0))
        backend = RetryingBackend(client, max_attempts=3, max_backoff_s=30.0, clock=clock, rng=random.Random(seed))
        records = await backend.complete(BODY, RequestIds(agent="a"))
        assert all(r.outcome is Outcome.CONNECT_ERROR for r in records)
        assert 20.0 <= clock.t <= 21.0, seed
        assert backend.stats.gave_up == {"server_dead": 1}
        assert backend.stats.slept_s == pytest.approx(clock.t)
