"""A streamed body handed to the client read by read from the connection's callback (``transport.stream_to``, issue
16) makes the same record as the same bytes read by the client's task (the in-process transport's path).

Each case is served twice: over a real loopback socket as HTTP/1.1 chunked pieces with a pause between them (so each
piece is its own read, cut wherever the case cuts it, mid-event included), and by ``MockTransport`` from the same
pieces. The records must agree on everything the bytes decide: outcome, error kind, text, reasoning, tool calls,
usage and the number of token-bearing chunks.
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any
from unittest import mock

import pytest
from aiohttp.client_proto import ResponseHandler

from agentload.endpoint.client import ChatClient, FixedDeadlines
from agentload.endpoint.records import ErrorKind, Outcome, RequestRecord
from agentload.endpoint.transport import AiohttpTransport
from tests.hostile import serving, split, sse

# No max_tokens: these servers stream far more than any cap would allow, and what is tested is how the reads are
# handed over, not the overrun cut (tests/test_hostile_streams.py).
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def chunk(**delta: Any) -> bytes:
    return json.dumps({"choices": [{"index": 0, "delta": delta}]}).encode()


USAGE = json.dumps(
    {
        "choices": [],
        "usage": {"prompt_tokens": 5, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 2}},
    }
).encode()
CALL = chunk(tool_calls=[{"index": 0, "id": "c1", "function": {"name": "search", "arguments": '{"q": '}}])
CALL_MORE = chunk(tool_calls=[{"index": 0, "function": {"arguments": '"tides"}'}}])

CASES = {
    "text": sse([chunk(role="assistant", content=""), chunk(content="Hel"), chunk(content="lo"), USAGE, b"[DONE]"]),
    "reasoning-then-text": sse([chunk(reasoning_content="hm"), chunk(content="ok"), USAGE, b"[DONE]"]),
    "tool-call": sse([CALL, CALL_MORE, USAGE, b"[DONE]"]),
    "error-event": sse([chunk(content="a"), b'{"error": {"message": "out of memory"}}', chunk(content="b")]),
    "not-json": sse([chunk(content="a"), b"{nope", chunk(content="b"), b"[DONE]"]),
    "wrong-type": sse([chunk(content="a"), json.dumps({"choices": "oops"}).encode(), b"[DONE]"]),
    "no-done": sse([chunk(content="a"), chunk(content="b")]),
}


@asynccontextmanager
async def http_server(answer: Callable[[asyncio.StreamWriter], Awaitable[None]]) -> AsyncIterator[str]:
    """A loopback server that reads a request and lets ``answer`` write the response; every answer has ended and
    its socket is closed when the block exits (a client that hung up early included)."""
    answers: list[asyncio.Task[None]] = []

    async def serve(writer: asyncio.StreamWriter) -> None:
        try:
            await answer(writer)
        except ConnectionError:
            pass  # the client hung up first
        finally:
            writer.close()

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        task = asyncio.ensure_future(serve(writer))
        answers.append(task)
        await task

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
    finally:
        await asyncio.gather(*answers, return_exceptions=True)
        server.close()
        await server.wait_closed()


HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def http_chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


@asynccontextmanager
async def chunked_server(pieces: list[bytes], *, cut_off: bool) -> AsyncIterator[str]:
    """Answers with ``pieces`` as HTTP chunks, 5 ms apart; ``cut_off``: the connection closes before the last."""

    async def answer(writer: asyncio.StreamWriter) -> None:
        writer.write(HEAD)
        for piece in pieces:
            writer.write(http_chunk(piece))
            await writer.drain()
            await asyncio.sleep(0.005)
        if not cut_off:
            writer.write(b"0\r\n\r\n")
        await writer.drain()

    async with http_server(answer) as url:
        yield url


async def over_the_socket(pieces: list[bytes], *, cut_off: bool = False) -> RequestRecord:
    async with chunked_server(pieces, cut_off=cut_off) as url:
        client = ChatClient(url, transport=AiohttpTransport(), api_key_env=None)
        try:
            return await client.chat(BODY)
        finally:
            await client.aclose()


async def in_process(pieces: list[bytes], *, cut_off: bool = False) -> RequestRecord:
    client = ChatClient("http://127.0.0.1:9", transport=serving(200, pieces, break_after=len(pieces) if cut_off
                                                                  else None), api_key_env=None)  # fmt: skip
    return await client.chat(BODY)


def what_the_bytes_decide(r: RequestRecord) -> tuple[Any, ...]:
    calls = [(c.id, c.name, c.arguments) for c in r.tool_calls]
    return (r.outcome, r.error, r.content, r.reasoning, calls, r.prompt_tokens, r.completion_tokens,
            r.cached_tokens, len(r.chunk_times))  # fmt: skip


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("cuts", ["events", "bytes"])
async def test_a_pushed_stream_makes_the_record_the_task_read_one_makes(name: str, cuts: str) -> None:
    body = CASES[name]
    if cuts == "events":
        pieces = [p + b"\n\n" for p in body.split(b"\n\n") if p]
    else:  # cut anywhere, mid-event and mid-line included
        pieces = split(body, random.Random(name).sample(range(1, len(body)), 5))
    pushed, pulled = await over_the_socket(pieces), await in_process(pieces)
    assert what_the_bytes_decide(pushed) == what_the_bytes_decide(pulled)
    if pushed.outcome is Outcome.OK:
        assert len(pushed.chunk_times) > 0
        assert pushed.chunk_times == sorted(pushed.chunk_times)
        assert pushed.t_sent <= pushed.t_first_token  # type: ignore[operator]


async def test_a_connection_lost_mid_body_is_a_broken_stream_on_both_paths() -> None:
    pieces = [p + b"\n\n" for p in CASES["text"].split(b"\n\n") if p][:2]
    pushed, pulled = await over_the_socket(pieces, cut_off=True), await in_process(pieces, cut_off=True)
    assert (pushed.outcome, pushed.error) == (pulled.outcome, pulled.error) == (Outcome.STREAM_ERROR, ErrorKind.RESET)
    assert pushed.content == pulled.content == "Hel"


async def test_a_stream_given_up_by_its_task_is_no_longer_handed_over() -> None:
    # The client's idle rule cancels the task that waits for the pushed body: the connection is closed and nothing
    # arrives at the record after it was made.
    async def answer(writer: asyncio.StreamWriter) -> None:
        writer.write(HEAD + http_chunk(sse([chunk(content="a")])))
        await writer.drain()
        await asyncio.sleep(1.0)  # silent past the idle budget
        writer.write(http_chunk(sse([chunk(content="late")])))
        await writer.drain()

    async with http_server(answer) as url:
        client = ChatClient(url, transport=AiohttpTransport(), api_key_env=None, policy=FixedDeadlines(idle_s=0.2))
        try:
            record = await client.chat(BODY)
            await asyncio.sleep(1.2)  # the late chunk has come and gone
        finally:
            await client.aclose()
    assert (record.outcome, record.error) == (Outcome.TIMEOUT, ErrorKind.IDLE_TIMEOUT)
    assert record.content == "a"
    assert len(record.chunk_times) == 1


async def test_a_read_that_pauses_the_connection_is_handed_over_in_order() -> None:
    # A read past aiohttp's high-water mark pauses the connection, and handing it over resumes the connection from
    # inside that hand-over (the resume parses whatever bytes the pause held, and lands in the hand-over again):
    # every word must come through once, in order. aiohttp 3.14 reads 256 KiB at most and pauses at 512 KiB, so a
    # 16 KiB buffer (32 KiB high water; aiohttp 3.10's was 128 KiB) makes reads of the usual size pause. The server
    # is a thread, so it fills the socket while the client's loop is held once.
    words = [f"w{i:06d} " for i in range(60_000)]
    body = sse([chunk(content=w) for w in words] + [b"[DONE]"])
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            got = b""
            while b"\r\n\r\n" not in got:
                got += conn.recv(65536)
            conn.sendall(HEAD + http_chunk(body) + b"0\r\n\r\n")

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    paused = 0
    pause, params = ResponseHandler.pause_reading, ResponseHandler.set_response_params

    def counting(self: ResponseHandler) -> None:
        nonlocal paused
        paused += 1
        pause(self)

    def small_buffer(self: ResponseHandler, **kwargs: Any) -> None:
        params(self, **{**kwargs, "read_bufsize": 16 * 1024})

    client = ChatClient(f"http://127.0.0.1:{listener.getsockname()[1]}/v1", transport=AiohttpTransport(),
                        api_key_env=None)  # fmt: skip
    try:
        with (
            mock.patch.object(ResponseHandler, "pause_reading", counting),
            mock.patch.object(ResponseHandler, "set_response_params", small_buffer),
        ):
            asyncio.get_running_loop().call_later(0.05, time.sleep, 0.3)  # the client falls behind, once
            record = await client.chat(BODY)
    finally:
        await client.aclose()
        server.join(10)
        listener.close()
    assert paused, "no read passed the high-water mark: the test does not test the resume"
    assert record.ok, record.error_message
    assert record.content == "".join(words)
    assert len(record.chunk_times) == len(words)
