"""Chunk arrival stamps come from where the bytes arrive, not from when the reading task got to them.

A loopback server writes SSE events with pauses between them and notes the loop time of each write; the reader
waits until all of them have arrived before it reads. Stamps taken at read time would all equal that late read;
the transport's stamps must instead fall between each event's write and the next one. asyncio runs socket
callbacks before due timers in a loop iteration, so an event's ``data_received`` runs before the server's next
write however loaded the machine is: the bounds below do not depend on timing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest
from aiohttp import web
from aiohttp.client_proto import ResponseHandler
from aiohttp.test_utils import TestServer

from agentload.endpoint import transport as transport_module
from agentload.endpoint.client import ChatClient
from agentload.endpoint.transport import AiohttpTransport
from agentload.endpoint.wire import SSEParser


def _event(text: str) -> bytes:
    return b'data: {"choices":[{"delta":{"content":"' + text.encode() + b'"}}]}\n\n'


@asynccontextmanager
async def serving(handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> AsyncIterator[str]:
    """A loopback server answering chat completions with ``handler``; yields its ``/v1`` URL."""
    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield f"http://127.0.0.1:{server.port}/v1"
    finally:
        await server.close()


@asynccontextmanager
async def paced_server(events: list[bytes], gap_s: float, sent: list[float]) -> AsyncIterator[str]:
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        loop = asyncio.get_running_loop()
        for ev in events:
            sent.append(loop.time())
            await resp.write(ev)
            await asyncio.sleep(gap_s)
        sent.append(loop.time())
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async with serving(handler) as url:
        yield url


async def test_a_reader_that_falls_behind_still_gets_each_event_its_arrival_time() -> None:
    events = [_event(t) for t in ("a", "b", "c")]
    sent: list[float] = []
    async with paced_server(events, 0.15, sent) as url:
        transport = AiohttpTransport()
        try:
            resp = await transport.send("POST", f"{url}/chat/completions", b"{}", {})
            await asyncio.sleep(0.8)  # every event is in aiohttp's buffer before the first read
            read_at = asyncio.get_running_loop().time()
            parser = SSEParser()
            stamped: list[tuple[float, bytes]] = []
            async for t, data in resp.timed_chunks():  # type: ignore[attr-defined]
                stamped += [(t, ev) for ev in parser.feed(data)]
            resp.close()
        finally:
            await transport.aclose()
    assert [ev for _, ev in stamped][:3] == [e[6:-2] for e in events]
    for i in range(3):
        assert sent[i] <= stamped[i][0] < sent[i + 1], (i, sent, stamped)
        assert stamped[i][0] < read_at


async def test_the_chat_client_records_the_transport_arrival_stamps() -> None:
    events = [_event(t) for t in ("x", "y", "z")]
    sent: list[float] = []
    async with paced_server(events, 0.05, sent) as url:
        client = ChatClient(url, api_key_env=None)
        try:
            record = await client.chat({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
        finally:
            await client.aclose()
    assert record.ok, record.error_message
    assert record.content == "xyz"
    assert len(record.chunk_times) == 3
    for i, t in enumerate(record.chunk_times):
        assert sent[i] <= t < sent[i + 1]
    assert record.t_first_token == record.chunk_times[0]


async def test_a_long_stream_keeps_only_the_marks_not_yet_read() -> None:
    # 700 events, each its own socket read (a gap between writes), read as they come: well past MARKS_KEPT.
    n = 700
    events = [_event(f"t{i}") for i in range(n)]
    sent: list[float] = []
    async with paced_server(events, 0.001, sent) as url:
        transport = AiohttpTransport()
        try:
            resp = await transport.send("POST", f"{url}/chat/completions", b"{}", {})
            parser = SSEParser()
            stamped: list[tuple[float, bytes]] = []
            peak = 0
            async for t, data in resp.timed_chunks():  # type: ignore[attr-defined]
                stamped += [(t, ev) for ev in parser.feed(data)]
                peak = max(peak, len(resp._marks))  # type: ignore[attr-defined]
            resp.close()
        finally:
            await transport.aclose()
    assert [ev for _, ev in stamped][:n] == [e[6:-2] for e in events]
    # Each read adds two floats; without the drop the list would end with ≥ 2 × 700 of them.
    assert peak <= 600  # MARKS_KEPT (512) plus the reads that came in while one piece was handled
    # The drop keeps every stamp right: each event between its write and the next write.
    for i in range(n):
        assert sent[i] <= stamped[i][0] < sent[i + 1], (i, sent[i], stamped[i][0], sent[i + 1])


@pytest.fixture(params=["kernel", "select"])
def stamping(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each stamping the transport has: the kernel's receive stamp (Linux), and the select's (elsewhere)."""
    if request.param == "kernel":
        if not transport_module._KERNEL_STAMPS:
            pytest.skip("the kernel's receive stamps are read on Linux x86-64 and arm64 only")
    else:
        monkeypatch.setattr(transport_module, "_KERNEL_STAMPS", False)
    return str(request.param)


async def test_a_burst_over_many_streams_is_stamped_as_it_arrived_not_in_the_order_it_was_read(stamping: str) -> None:
    # Twenty streams get one event each in the same loop iteration (as one vLLM engine step writes to every running
    # stream), then the loop is held 300 ms, so every read happens after that. The kernel stamps each event when it
    # reached the client's socket: between its write and the hold's end. Without them, each read is stamped with
    # the return of the select that found all twenty sockets readable: one stamp, after the hold, however long
    # each recv and parse took in between.
    streams = 20
    arrived = asyncio.Event()
    release = asyncio.Event()
    waiting = 0
    before: dict[bytes, float] = {}
    held_until: list[float] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        nonlocal waiting
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        waiting += 1
        if waiting == streams:
            arrived.set()
        await release.wait()
        loop = asyncio.get_running_loop()
        tag = f"burst{len(before)}".encode()
        before[tag] = loop.time()
        await resp.write(_event(tag.decode()))
        if len(before) == streams:
            # 300 ms, not 50: on a loaded machine the kernel may hand loopback delivery to its ksoftirqd thread, and
            # CI once saw the burst stamped 50 ms after its write, 0.2 ms after a 50 ms hold ended.
            time.sleep(0.3)  # noqa: ASYNC251  (the loop held busy on purpose: the reads wait for the next select)
            held_until.append(loop.time())
        await seen.wait()  # the stream's end is written once every burst was read, so no read takes both
        await resp.write(b"data: [DONE]\n\n")
        return resp

    stamps: dict[bytes, float] = {}
    seen = asyncio.Event()
    async with serving(handler) as base:
        transport = AiohttpTransport()
        try:
            url = f"{base}/chat/completions"
            resps = await asyncio.gather(*(transport.send("POST", url, b"{}", {}) for _ in range(streams)))
            await arrived.wait()
            release.set()
            readers = [resp.timed_chunks() for resp in resps]  # type: ignore[attr-defined]
            for reader in readers:
                parser = SSEParser()
                async for t, data in reader:
                    burst = [ev for ev in parser.feed(data) if b"burst" in ev]
                    if burst:
                        stamps[burst[0].split(b'"')[-2]] = t
                        break
            seen.set()
            for reader, resp in zip(readers, resps, strict=True):
                async for _ in reader:
                    pass
                resp.close()
        finally:
            await transport.aclose()
    assert sorted(stamps) == sorted(before)
    if stamping == "kernel":
        # Each as it arrived: not before its write (a millisecond's slack for turning the kernel's wall-clock stamp
        # into loop time), and — the burst arriving during the hold — before the hold ended, when the loop first got
        # to read them. Not every one: on a loaded machine the kernel can defer a loopback delivery past even a
        # 300 ms hold (CI saw burst0 stamped 0.2 ms after it ended), and then its arrival *was* after the hold.
        for tag, t in stamps.items():
            assert before[tag] - 1e-3 <= t, (tag, before[tag], t)
        during = [t for t in stamps.values() if t < held_until[0]]
        assert len(during) >= len(stamps) // 2, (sorted(stamps.values()), held_until[0])
    else:
        assert len(set(stamps.values())) == 1, sorted(stamps.values())
        assert min(stamps.values()) >= held_until[0]  # seen after the loop was free again, not before the bytes


async def test_bytes_that_came_after_the_select_are_stamped_at_their_read_never_before_they_were_sent(
    stamping: str,
) -> None:
    # Event A is written; a task queued behind it writes event B in the next loop iteration — after that
    # iteration's select found A, before the client's read, which gets A and B at once. The read must not take
    # the select's time: B was not there yet. (The loop is held a moment after each write, so each has reached
    # the client's socket by the next step: the order does not depend on the machine's speed.)
    opening, first, second = _event("o"), _event("a"), _event("b")
    b_sent: list[float] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(opening)  # the headers and a first event, read on their own
        await asyncio.sleep(0.2)
        loop = asyncio.get_running_loop()

        async def write_b() -> None:
            b_sent.append(loop.time())
            await resp.write(second)
            time.sleep(0.02)  # noqa: ASYNC251  (B is in the client's socket before its read runs)

        await resp.write(first)
        writing = asyncio.ensure_future(write_b())  # its first step runs in the next iteration, ahead of the reads
        time.sleep(0.02)  # noqa: ASYNC251  (A is in the client's socket before that select: it finds A alone)
        await writing
        await asyncio.sleep(0.2)
        await resp.write(b"data: [DONE]\n\n")
        return resp

    stamped: dict[bytes, float] = {}
    async with serving(handler) as base:
        transport = AiohttpTransport()
        try:
            resp = await transport.send("POST", f"{base}/chat/completions", b"{}", {})
            parser = SSEParser()
            async for t, data in resp.timed_chunks():  # type: ignore[attr-defined]
                for ev in parser.feed(data):
                    stamped[ev] = t
            resp.close()
        finally:
            await transport.aclose()
    assert {first[6:-2], second[6:-2]} <= set(stamped)
    assert stamped[second[6:-2]] >= b_sent[0], (stamped, b_sent)


async def test_reads_that_never_paused_the_connection_feed_the_parser_no_empty_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # aiohttp resumes the connection after every read of the body, paused or not, and its resume feeds the parser an
    # empty read; the transport passes it on only when the connection was paused (one data_received a chunk less).
    empty = 0
    feed = ResponseHandler.data_received

    def counting(self: ResponseHandler, data: bytes) -> None:
        nonlocal empty
        empty += not data
        feed(self, data)

    monkeypatch.setattr(ResponseHandler, "data_received", counting)
    events = [_event(str(i)) for i in range(20)]
    async with paced_server(events, 0.005, []) as url:
        client = ChatClient(url, api_key_env=None)
        try:
            record = await client.chat({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 20})
        finally:
            await client.aclose()
    assert record.ok, record.error_message
    assert record.content == "".join(str(i) for i in range(20))
    assert empty == 0


async def test_a_body_that_paused_the_connection_comes_through_whole_once_read() -> None:
    # 8 MiB in one go to a reader that waits first: aiohttp's buffer passes its high-water mark and pauses the
    # connection; reading must resume it (the skipped resume above is only for a connection that was not paused).
    events = [_event(f"{i:07d}" + "x" * 1000) for i in range(8_000)]
    paused = 0

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b"".join(events) + b"data: [DONE]\n\n")
        return resp

    async with serving(handler) as url:
        transport = AiohttpTransport()
        try:
            resp = await transport.send("POST", f"{url}/chat/completions", b"{}", {})
            await asyncio.sleep(0.5)  # the body fills aiohttp's buffer before the first read
            proto = resp._resp.connection.protocol  # type: ignore[attr-defined]
            paused = proto._reading_paused
            parser = SSEParser()
            got: list[bytes] = []

            async def read() -> None:
                async for data in resp.chunks():
                    got.extend(parser.feed(data))

            await asyncio.wait_for(read(), 60)  # a connection never resumed would wait for ever
            resp.close()
        finally:
            await transport.aclose()
    assert paused, "the reader never paused the connection: the test does not test the resume"
    assert got == [e[6:-2] for e in events] + [b"[DONE]"]


async def test_the_read_is_taken_over_only_from_asyncio_s_own_socket_transport_with_every_part_it_uses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if not transport_module._KERNEL_STAMPS:
        pytest.skip("the kernel's receive stamps are read on Linux x86-64 and arm64 only")
    accepted: list[asyncio.StreamWriter] = []
    arrived = asyncio.Event()

    async def accept(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)  # held open until the checks are done
        arrived.set()

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    loop = asyncio.get_running_loop()
    try:
        port = server.sockets[0].getsockname()[1]
        transport, _ = await loop.create_connection(asyncio.Protocol, "127.0.0.1", port)
        await asyncio.wait_for(arrived.wait(), 30)  # the server's side, to close at the end
        try:
            assert transport_module._kernel_read(transport)  # asyncio's socket transport with its stock read
            # A transport missing a part the mirrored read uses (another Python's) keeps its own read.
            monkeypatch.setattr(transport_module, "_MIRRORED", (*transport_module._MIRRORED, "_no_such_part"))
            assert not transport_module._kernel_read(transport)
            monkeypatch.undo()
            # A read already replaced (or any other transport) is not taken over.
            transport._read_ready_cb = lambda: None  # type: ignore[attr-defined]
            assert not transport_module._kernel_read(transport)
            assert not transport_module._kernel_read(asyncio.BaseTransport())
        finally:
            transport.close()
    finally:
        for writer in accepted:
            writer.close()
            await writer.wait_closed()
        server.close()
        await server.wait_closed()
