"""Streams a careless or hostile server sends, and how long each may hold a request or a level.

Deadlines count tokens, not bytes: SSE comments (``: ping``) are counted on the record, never progress; a stream past
its ``max_tokens`` is cut as an overrun; a level's window is a cap, its edges cutting (and recording) what outlives
their grace. Everything runs in virtual time, so the deadlines are exact and no test waits for them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import orjson

from agentload.bench.analysis import LevelData, summarise
from agentload.bench.runner import edge_grace_s, run_level
from agentload.bench.target import Target
from agentload.clock import LoopClock, run_virtual
from agentload.endpoint.client import ChatClient, CutScope, FixedDeadlines, cut_scope, overrun_limit
from agentload.endpoint.records import ErrorKind, Outcome, RequestRecord
from agentload.endpoint.transport import MockRequest, MockResponse, MockTransport
from agentload.workload.registry import get_workload

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def _token(i: int) -> bytes:
    chunk = {"choices": [{"index": 0, "delta": {"content": f" w{i}"}, "finish_reason": None}]}
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


@dataclass
class Hostile(MockResponse):
    """A 200 SSE response that sends ``tokens`` tokens (0.1 s apart), then, forever, a token or a ``: ping``."""

    tokens: int = 0
    then: str = "ping"  # "ping": keep-alive comments every second; "token": tokens every 0.1 s
    sent_tokens: int = 0

    async def chunks(self) -> AsyncIterator[bytes]:
        for i in range(self.tokens):
            await asyncio.sleep(0.1)
            self.sent_tokens += 1
            yield _token(i)
        i = self.tokens
        while True:
            if self.then == "ping":
                await asyncio.sleep(1.0)
                yield b": ping\n\n"
            else:
                await asyncio.sleep(0.1)
                self.sent_tokens += 1
                yield _token(i)
                i += 1


def _client(response: Hostile, **deadlines: float) -> ChatClient:
    async def handler(request: MockRequest) -> MockResponse:
        return response

    return ChatClient("http://mock.invalid", transport=MockTransport(handler), policy=FixedDeadlines(**deadlines),
                      api_key_env=None)  # fmt: skip


def _chat(client: ChatClient, **fields: object) -> RequestRecord:
    async def go() -> RequestRecord:
        return await client.chat({**BODY, **fields})

    record: RequestRecord = run_virtual(go())
    return record


def test_a_stream_that_never_ends_is_cut_once_past_max_tokens() -> None:
    response = Hostile(status=200, then="token")
    record = _chat(_client(response, total_s=3600.0), max_tokens=20)
    assert (record.outcome, record.error) == (Outcome.STREAM_ERROR, ErrorKind.OVERRUN)
    assert len(record.chunk_times) == overrun_limit(20) + 1  # cut at the first chunk past the limit
    assert record.latency < 10.0  # not the hour of the total deadline: 37 tokens 0.1 s apart
    assert "max_tokens 20" in record.error_message
    assert not record.transient  # the same request would overrun again


def test_a_stream_within_its_max_tokens_margin_is_not_cut() -> None:
    """A server that sends a few chunks more than asked (a finish chunk, split tokens) is within the margin."""
    limit = overrun_limit(20)
    response = Hostile(status=200, tokens=limit, then="ping")
    record = _chat(_client(response, idle_s=5.0), max_tokens=20)
    assert record.error is ErrorKind.IDLE_TIMEOUT  # it went quiet after ``limit`` tokens: no overrun
    assert len(record.chunk_times) == limit


def test_with_no_max_tokens_a_stream_that_never_ends_meets_the_total_deadline() -> None:
    record = _chat(_client(Hostile(status=200, then="token"), total_s=30.0))
    assert record.error is ErrorKind.TOTAL_TIMEOUT
    assert 30.0 <= record.latency < 30.5


def test_keep_alive_comments_are_counted_and_never_reset_the_first_token_deadline() -> None:
    record = _chat(_client(Hostile(status=200, then="ping"), first_token_s=30.0), max_tokens=50)
    assert (record.outcome, record.error) == (Outcome.TIMEOUT, ErrorKind.FIRST_TOKEN_TIMEOUT)
    assert 30.0 <= record.latency < 30.5
    assert record.keepalives >= 29  # one a second
    assert "keep-alive" in record.error_message
    assert record.t_first_byte is not None
    assert record.t_first_token is None


def test_keep_alive_comments_never_reset_the_idle_deadline() -> None:
    record = _chat(_client(Hostile(status=200, tokens=5, then="ping"), idle_s=10.0), max_tokens=50)
    assert record.error is ErrorKind.IDLE_TIMEOUT
    assert len(record.chunk_times) == 5
    silent = record.t_done - record.chunk_times[-1]
    assert 10.0 <= silent < 10.5  # ten pings arrived meanwhile, none of them progress
    assert record.keepalives >= 9


def test_a_cut_request_ends_at_once_with_a_record_of_its_own_kind() -> None:
    client = _client(Hostile(status=200, tokens=3, then="ping"), first_token_s=600.0, idle_s=600.0)
    scope = CutScope()

    async def go() -> tuple[RequestRecord, int, int]:
        cut_scope.set(scope)
        task = asyncio.ensure_future(client.chat({**BODY, "max_tokens": 50}))
        await asyncio.sleep(5.0)
        in_flight = scope.in_flight
        n = scope.cut("the level ended")
        return await task, n, in_flight

    record, n, in_flight = run_virtual(go())
    assert (in_flight, n, scope.in_flight, scope.cut_total) == (1, 1, 0, 1)
    assert (record.outcome, record.error) == (Outcome.CANCELLED, ErrorKind.CUT)
    assert "the level ended" in record.error_message
    assert 5.0 <= record.latency < 5.5
    assert len(record.chunk_times) == 3  # what came before the cut is kept
    assert not record.transient


# -- a level's window is a cap ----------------------------------------------------------------------------------
def _keepalive_server() -> tuple[MockTransport, list[Hostile]]:
    """/health ready, /metrics empty, and every chat request answered with keep-alives and never a token."""
    streams: list[Hostile] = []

    async def handler(req: MockRequest) -> MockResponse:
        if req.url.endswith("/chat/completions"):
            streams.append(Hostile(status=200, headers={"Content-Type": "text/event-stream"}, then="ping"))
            return streams[-1]
        if req.url.endswith("/health"):
            return MockResponse(status=200, chunks_script=[(0.0, b"ok")])
        if req.url.endswith("/metrics"):
            return MockResponse(status=200, chunks_script=[(0.0, b"# nothing\n")])
        return MockResponse(status=404)

    return MockTransport(handler), streams


def test_a_level_against_a_server_that_never_answers_ends_at_its_window_plus_grace() -> None:
    transport, streams = _keepalive_server()
    target = Target(transport, "http://mock.invalid", "m", "mock", virtual=True)
    warmup, window = 5.0, 20.0
    grace = edge_grace_s(window)

    async def level() -> tuple[LevelData, float]:
        t0 = LoopClock().now()
        data = await run_level(target, get_workload("synthetic"), agents=3, context=1024, level=0, run_id="r",
                               run_t0=t0, warmup_s=warmup, window_s=window)  # fmt: skip
        return data, LoopClock().now() - t0

    data, took = run_virtual(level())
    summary = summarise(data)
    # Every request sent has its record, and the ones the edges cut say so.
    assert len(data.records) == len(streams) > 0
    cut = [r for r in data.records if r.error is ErrorKind.CUT]
    assert len(cut) == data.cut_requests > 0
    assert all(r.outcome is Outcome.CANCELLED and r.keepalives > 0 for r in cut)
    # The window measured is the window plus at most the end edge's grace, and the level is bounded as a whole:
    # warm-up, the start edge's grace, the window, the end edge's grace, the turns after it (another grace).
    assert window <= summary.window_s <= window + grace + 1.0
    assert took <= warmup + 3 * grace + window + 10.0
    assert any("were cut" in note for note in data.notes)
