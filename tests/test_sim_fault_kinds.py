"""The simulator's unending faults (``comments``, ``comments_mid``, ``endless``) and its bounds on request bodies.

What each kind sends is read on virtual time straight from the transport-neutral API (``open_generation``), so a
stream that goes on for an hour is read in milliseconds; that the unending responses stop when the client goes away
is checked over HTTP, where aiohttp cancels the handler: afterwards no handler task is left and the engine is idle.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import aiohttp
import pytest

from agentload.clock import LoopClock, run_virtual
from agentload.errors import ConfigError, ContextLengthError
from agentload.sim.faults import KINDS, FaultInjector, FaultSpec, parse_fault
from agentload.sim.server import SimConfig, SimServer
from tests.test_server_hostile import CHAT, PATIENCE_S, instant_profile, listening

LONG_S = 3600.0  # how long a virtual-time read follows an unending stream: an hour, far past any client deadline


def _body(*, stream: bool = True, max_tokens: int = 4, content: str = "hi") -> bytes:
    return json.dumps({"messages": [{"role": "user", "content": content}], "stream": stream,
                       "max_tokens": max_tokens}).encode()  # fmt: skip


async def _read_for(server: SimServer, body: bytes, seconds: float) -> tuple[int, dict[str, str], list[bytes]]:
    """Open one generation and collect its body's blocks for ``seconds`` of the loop's time (or to its end)."""
    await server.runner.start()
    try:
        sim = await server.open_generation(body, chat=True)
        blocks: list[bytes] = []

        async def collect() -> None:
            async for block in sim.body:
                blocks.append(block)

        with contextlib.suppress(TimeoutError):  # an unending body: read for the time given
            await asyncio.wait_for(collect(), seconds)
        await sim.body.aclose()
        return sim.status, sim.headers, blocks
    finally:
        await server.runner.stop()


def _server(kind: str, seconds: float | None = None) -> SimServer:
    spec = parse_fault(f"{kind}:1" if seconds is None else f"{kind}:1:{seconds:g}")
    return SimServer(SimConfig(profile=instant_profile(), faults=[spec]))


def _events(blocks: list[bytes]) -> list[str]:
    """The SSE events of a body, comment lines included, in order."""
    return [e for e in b"".join(blocks).decode().split("\n\n") if e]


def test_the_new_kinds_parse_with_their_defaults_and_a_zero_period_is_refused() -> None:
    assert {"comments", "comments_mid", "endless"} <= set(KINDS)
    assert parse_fault("comments:0.5") == FaultSpec("comments", 0.5, 1.0)
    assert parse_fault("comments_mid:1") == FaultSpec("comments_mid", 1.0, 1.0)
    assert parse_fault("endless:0.1") == FaultSpec("endless", 0.1, 0.0)  # 0: the request's own pace
    assert parse_fault("endless:0.1:0.5") == FaultSpec("endless", 0.1, 0.5)
    with pytest.raises(ConfigError, match="period"):
        parse_fault("comments:1:0")


def test_the_draws_of_the_new_kinds_repeat_with_the_seed() -> None:
    specs = [parse_fault("comments:0.2"), parse_fault("endless:0.2"), parse_fault("comments_mid:0.2")]

    def draws(seed: int) -> list[str | None]:
        inj = FaultInjector(specs, seed=seed)
        return [None if (f := inj.draw()) is None else f.kind for _ in range(200)]

    assert draws(5) == draws(5)
    assert set(draws(5)) == {None, "comments", "endless", "comments_mid"}
    assert draws(5) != draws(6)


def test_comments_start_the_stream_then_send_only_comment_lines_at_their_period() -> None:
    server = _server("comments", 2.0)

    async def go() -> tuple[int, dict[str, str], list[bytes], float]:
        t0 = LoopClock().now()
        status, headers, blocks = await _read_for(server, _body(), 59.0)
        return status, headers, blocks, LoopClock().now() - t0

    status, headers, blocks, _took = run_virtual(go())
    assert status == 200
    assert headers["Content-Type"] == "text/event-stream"
    events = _events(blocks)
    assert events
    assert all(e == ": ping" for e in events)
    assert len(events) == 30  # at 0, 2, ..., 58 s
    assert server.engine.stats.finished == {}  # the engine never saw the request
    assert not server.engine.has_work()


def test_comments_on_a_request_that_is_not_streamed_never_answer() -> None:
    status, _headers, blocks = run_virtual(_read_for(_server("comments"), _body(stream=False), LONG_S))
    assert status == 200
    assert b"".join(blocks) == b""


def test_comments_mid_sends_tokens_then_only_comment_lines() -> None:
    server = _server("comments_mid", 1.0)
    status, _headers, blocks = run_virtual(_read_for(server, _body(max_tokens=50), 120.0))
    assert status == 200
    events = _events(blocks)
    first_ping = events.index(": ping")
    assert all(e == ": ping" for e in events[first_ping:])
    assert len(events) - first_ping >= 100  # one a second for the rest of the two minutes
    data = [json.loads(e.removeprefix("data: ")) for e in events[:first_ping]]
    assert all(d["choices"][0]["finish_reason"] is None for d in data)
    assert "[DONE]" not in "".join(events)


@pytest.mark.parametrize("pace", [None, 0.5])
def test_endless_streams_content_past_max_tokens_and_never_finishes(pace: float | None) -> None:
    status, _headers, blocks = run_virtual(_read_for(_server("endless", pace), _body(max_tokens=4), 60.0))
    assert status == 200
    events = _events(blocks)
    assert "data: [DONE]" not in events
    chunks = [json.loads(e.removeprefix("data: ")) for e in events]
    assert all("usage" not in c or c["usage"] is None for c in chunks)
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks)
    content = [c for c in chunks if c["choices"][0]["delta"].get("content")]
    # At most one a decode step (the fallback 20 ms) or one every 0.5 s: far past the 4 tokens asked for.
    assert len(content) >= (100 if pace else 1000)
    if pace:
        assert len(content) <= 60 / pace + 5


async def _handler_tasks() -> int:
    """Tasks other than this test's own: the server's connection handlers (the engine runner's task included)."""
    me = asyncio.current_task()
    return sum(1 for t in asyncio.all_tasks() if t is not me and not t.done())


@pytest.mark.parametrize(
    ("kind", "stream"),
    [("comments", True), ("comments", False), ("comments_mid", True), ("endless", True), ("endless", False)],
)
async def test_an_unending_response_stops_when_the_client_goes_away(kind: str, stream: bool) -> None:
    async with listening(faults=[parse_fault(f"{kind}:1:0.05")]) as (server, port):
        baseline = await _handler_tasks()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        body = _body(stream=stream, max_tokens=4)
        writer.write(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (CHAT.encode(), len(body), body))
        await writer.drain()
        async with asyncio.timeout(PATIENCE_S):
            if stream:
                await reader.readuntil(b": ping" if kind.startswith("comments") else b'"content":"and"')
            else:
                # No byte comes; wait until the request is in the server (its engine has it, or it drew its fault).
                while sum(server.faults.injected.values()) == 0:  # noqa: ASYNC110
                    await asyncio.sleep(0.01)
            assert await _handler_tasks() > baseline  # the handler is running
        writer.close()
        async with asyncio.timeout(PATIENCE_S):
            while await _handler_tasks() > baseline or server.engine.has_work():  # noqa: ASYNC110
                await asyncio.sleep(0.02)


async def test_a_body_over_the_limit_is_413_with_an_openai_error() -> None:
    async with listening(max_body_bytes=4096) as (_server, port), aiohttp.ClientSession() as session:
        async with session.post(f"http://127.0.0.1:{port}{CHAT}", data=_body(content="word " * 2000),
                                headers={"Content-Type": "application/json"}) as resp:  # fmt: skip
            assert resp.status == 413
            err: dict[str, Any] = (await resp.json())["error"]
        assert err["code"] == 413
        assert isinstance(err["message"], str)
        assert err["message"]
        async with session.post(f"http://127.0.0.1:{port}{CHAT}", data=_body(stream=False)) as resp:
            assert resp.status == 200  # and the server goes on serving


async def _refused(server: SimServer, content: str) -> None:
    with pytest.raises(ContextLengthError, match="maximum context length"):
        await server.open_generation(_body(stream=False, content=content), chat=True)


async def test_a_prompt_longer_than_the_context_is_not_kept_in_the_token_cache() -> None:
    server = SimServer(SimConfig(profile=instant_profile(max_model_len=2048)))
    await _refused(server, "many words " * 5000)
    assert len(server._token_cache) == 0
    kept = "a few words " * 100  # over the 256 characters below which a part is not worth keeping
    await server.runner.start()
    try:
        sim = await server.open_generation(_body(stream=False, content=kept), chat=True)
        await sim.body.aclose()
    finally:
        await server.runner.stop()
    assert any(kept in part for part in server._token_cache)
