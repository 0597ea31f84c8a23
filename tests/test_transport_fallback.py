"""The client on each arrival-stamp path (``transport.stamp_path``), the public-API one included.

The transport stamps a read where its bytes arrive by standing in for asyncio's socket read (the kernel's stamp) or
by wrapping the loop's selector; ``read`` uses public asyncio only. These tests stream real SSE responses from a
loopback server through ``ChatClient`` + ``AiohttpTransport`` with the decision forced to ``read`` (in process: the
module's decision is patched, not the environment) and left as it is, and check the records, the stamps' order
(never their speed) and, on ``read``, that no private part of asyncio was replaced or wrapped.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import socket
import subprocess
import sys
from asyncio import selector_events
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiohttp import web

from agentload.endpoint import transport as transport_module
from agentload.endpoint.client import ChatClient
from agentload.endpoint.records import RequestRecord, UsageSource
from agentload.endpoint.transport import AiohttpTransport, Response, StampChoice, stamp_path
from tests.test_arrival_stamps import serving

_WORDS = ["Hel", "lo", ",", " wor", "ld", "!", " again"]
_PROMPT_TOKENS = 11


def _chunk(obj: str) -> bytes:
    return b"data: " + obj.encode() + b"\n\n"


def _delta(text: str, finish: str | None = None) -> bytes:
    end = "null" if finish is None else f'"{finish}"'
    return _chunk(f'{{"choices":[{{"index":0,"delta":{{"content":"{text}"}},"finish_reason":{end}}}]}}')


@asynccontextmanager
async def sse_server() -> AsyncIterator[str]:
    """A loopback chat server: a role chunk, one content chunk a word (some paced, some written together), the
    last with ``finish_reason``, a usage chunk, ``[DONE]``. Yields its ``/v1`` URL."""

    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(_chunk('{"choices":[{"index":0,"delta":{"role":"assistant"},"finish_reason":null}]}'))
        for i, word in enumerate(_WORDS[:4]):  # one write each, a loop turn apart: several reads
            await resp.write(_delta(word))
            await asyncio.sleep(0.005 if i % 2 else 0)
        # The rest in one write: several chunks in one read, which share its stamp.
        tail = [_delta(w) for w in _WORDS[4:-1]] + [_delta(_WORDS[-1], "stop")]
        usage = f'{{"choices":[],"usage":{{"prompt_tokens":{_PROMPT_TOKENS},"completion_tokens":{len(_WORDS)}}}}}'
        await resp.write(b"".join(tail) + _chunk(usage))
        await asyncio.sleep(0)
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async with serving(handler) as url:
        yield url


class _Watching:
    """``AiohttpTransport``, noting each response's asyncio transport and connection protocol."""

    def __init__(self) -> None:
        self.inner = AiohttpTransport()
        self.connections: list[tuple[Any, Any]] = []  # (asyncio transport, aiohttp protocol)

    async def send(self, method: str, url: str, body: bytes | None, headers: Mapping[str, str]) -> Response:
        resp = await self.inner.send(method, url, body, headers)
        conn = resp._resp.connection  # type: ignore[attr-defined]
        assert conn is not None
        self.connections.append((conn.protocol.transport, conn.protocol))
        return resp

    async def aclose(self) -> None:
        await self.inner.aclose()


def _check_record(record: RequestRecord) -> None:
    assert record.ok, record.error_message
    assert record.content == "".join(_WORDS)
    assert len(record.chunk_times) == len(_WORDS)
    assert record.finish_reason == "stop"
    assert record.usage_source is UsageSource.SERVER
    assert (record.prompt_tokens, record.completion_tokens) == (_PROMPT_TOKENS, len(_WORDS))
    # In order, never before the request was sent, nor after the record was made; no speed asserted.
    times = record.chunk_times
    assert all(a <= b for a, b in itertools.pairwise(times)), times
    assert record.t_sent <= times[0], (record.t_sent, times)
    assert times[-1] <= record.t_done
    assert record.t_first_token == times[0]
    assert record.t_first_byte is not None
    assert record.t_sent <= record.t_first_byte <= times[0]


# asyncio's own socket read (private: looked up here only to check that it is still the one in use).
_ASYNCIO_READ = selector_events._SelectorSocketTransport._read_ready__data_received  # type: ignore[attr-defined]


def _untouched(raw: Any, proto: Any) -> None:
    """Nothing of asyncio's replaced on this connection: its read is asyncio's own bound method, its socket not
    asked for the kernel's stamps, and the handler holds no selector wrapper."""
    read = raw._read_ready_cb
    assert read.__func__ is _ASYNCIO_READ, read
    assert read.__self__ is raw
    assert proto._raw is None
    assert proto._stamp is None
    if transport_module._KERNEL_STAMPS:
        sock = raw.get_extra_info("socket")
        assert sock.getsockopt(socket.SOL_SOCKET, transport_module._SO_TIMESTAMPNS) == 0


async def _run_client(check: Callable[[_Watching], None], concurrent: int = 3) -> list[RequestRecord]:
    """Requests through ChatClient: some at once (one connection each), then one more (a pooled connection);
    ``check`` looks at the connections before the client closes them."""
    watching = _Watching()
    async with sse_server() as url:
        client = ChatClient(url, transport=watching, api_key_env=None)
        try:
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}
            records = list(await asyncio.gather(*(client.chat(body) for _ in range(concurrent))))
            records.append(await client.chat(body))
            check(watching)
            return records
        finally:
            await client.aclose()


@pytest.fixture(params=["read", "default"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The public path forced (the module's decision, patched in process), or the decision as made at import."""
    if request.param == "read":
        monkeypatch.setattr(transport_module, "_STAMPS", transport_module._choose("read"))
    return str(request.param)


async def test_the_client_records_real_streams_on_each_stamp_path(path: str) -> None:
    loop = asyncio.get_running_loop()
    selector = loop._selector  # type: ignore[attr-defined]
    assert not isinstance(selector, transport_module._SelectStamp)  # a fresh loop per test
    used = stamp_path(loop).path
    if path == "read":
        assert used == "read"

    def check(watching: _Watching) -> None:
        assert len(watching.connections) == 4
        assert len({id(raw) for raw, _ in watching.connections}) >= 3  # the three at once had one each
        if used == "read":
            assert loop._selector is selector  # type: ignore[attr-defined]
            for raw, proto in watching.connections:
                _untouched(raw, proto)
        elif used == "kernel":  # the decision is what the connections did
            assert loop._selector is selector  # type: ignore[attr-defined]
            for raw, proto in watching.connections:
                assert raw._read_ready_cb.__func__ is transport_module._StampingHandler._read_stamped
                assert proto._raw is raw
        else:
            assert used == "select"
            stamping = loop._selector  # type: ignore[attr-defined]
            assert isinstance(stamping, transport_module._SelectStamp)
            assert stamping._inner is selector
            for raw, proto in watching.connections:
                assert raw._read_ready_cb.__func__ is _ASYNCIO_READ
                assert proto._stamp is stamping

    records = await _run_client(check)
    assert len(records) == 4
    for record in records:
        _check_record(record)


def test_the_automatic_choice_falls_back_when_asyncio_s_internals_are_not_what_it_expects(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # No socket read of asyncio's to stand in for: not the kernel's stamps.
    monkeypatch.setattr(transport_module, "_ASYNCIO_READ", None)
    choice = transport_module._choose(None)
    assert choice.path != "kernel"
    assert "_read_ready__data_received" in choice.reason or "SO_TIMESTAMPNS" in choice.reason
    # Nor a way to count a select's bytes: the public path.
    monkeypatch.setattr(transport_module, "fcntl", None)
    choice = transport_module._choose(None)
    assert choice.path == "read", choice
    assert "stamped at the read" in choice.reason


def test_a_loop_without_asyncio_s_selector_is_stamped_at_the_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transport_module, "_STAMPS", StampChoice("select", "as if chosen at import"))
    loop = asyncio.new_event_loop()
    try:
        assert stamp_path(loop).path == "select"
        monkeypatch.delattr(loop, "_selector")
        choice = stamp_path(loop)
        assert choice.path == "read", choice
        assert transport_module._select_stamp(loop) is None  # and the connection wraps nothing
    finally:
        monkeypatch.undo()
        loop.close()
    assert stamp_path().path == transport_module._STAMPS.path  # no loop named: the decision as made


async def test_without_the_internals_each_connection_falls_to_the_read_and_touches_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The decision says "kernel" (as made at import), but the connection finds neither asyncio's socket read nor
    # FIONREAD: each connection falls through, by itself, to stamping at the read, and still records right.
    monkeypatch.setattr(transport_module, "_STAMPS", StampChoice("kernel", "as if chosen at import"))
    monkeypatch.setattr(transport_module, "_ASYNCIO_READ", None)
    monkeypatch.setattr(transport_module, "fcntl", None)
    loop = asyncio.get_running_loop()
    selector = loop._selector  # type: ignore[attr-defined]

    def check(watching: _Watching) -> None:
        assert loop._selector is selector  # type: ignore[attr-defined]
        assert watching.connections
        for raw, proto in watching.connections:
            _untouched(raw, proto)

    for record in await _run_client(check, concurrent=2):
        _check_record(record)


def test_the_setting_caps_the_choice_and_sets_aside_what_it_does_not_know(monkeypatch: pytest.MonkeyPatch) -> None:
    assert transport_module._choose(" READ ").path == "read"
    assert transport_module._choose("select").path in {"select", "read"}
    assert transport_module._choose("").path == transport_module._choose("auto").path
    monkeypatch.setattr(transport_module, "_KERNEL_STAMPS", False)
    assert transport_module._choose("kernel").path in {"select", "read"}  # at most: never one that is not there
    unknown = transport_module._choose("public")  # read at import: ignored with a reason, never a traceback
    assert unknown.path == transport_module._choose("auto").path
    assert "AGENTLOAD_STAMPS='public'" in unknown.reason


def test_the_environment_variable_is_read_at_import() -> None:
    code = "from agentload.endpoint.transport import stamp_path; print(stamp_path().path)"
    env = {**os.environ, "AGENTLOAD_STAMPS": "read"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "read"
