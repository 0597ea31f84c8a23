"""``agentload record``'s proxy against the simulator on 127.0.0.1: what passes through, and what is recorded."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from agentload.endpoint.client import ChatClient
from agentload.endpoint.probe import probe
from agentload.endpoint.records import RequestIds
from agentload.record import writer as writer_module
from agentload.record.app import RecordSettings, make_proxy
from agentload.record.proxy import RecordingProxy
from agentload.record.sessions import PARENT_HEADER, SESSION_HEADER, Session
from agentload.record.tokens import APPROX, LLAMACPP, VLLM
from agentload.record.writer import RecordedRequest, TraceWriter
from agentload.store.atomic import write_atomic
from agentload.workload.conversation_trace import load_conversation_trace
from tests.simserver import running_sim

PROFILE = "llama-8b-h100"  # prefills in milliseconds
KEY = "sk-record-test-0123456789abcdef"
SYSTEM = {"role": "system", "content": "You are a careful engineer. Answer briefly and use the tools you are given."}
SECRET_TEXT = "zanzibar-quokka"  # a word of the prompt that must not reach the file without --keep-text


@asynccontextmanager
async def recording(upstream: str, out: Path, **options: Any) -> AsyncIterator[tuple[RecordingProxy, str]]:
    """The proxy in front of ``upstream``, writing ``out``; the trace is written a last time on the way out."""
    settings = RecordSettings("127.0.0.1", 0, upstream, out, options.pop("block_size", 16), **options)
    proxy = make_proxy(settings)
    server = TestServer(proxy.app(), host="127.0.0.1")
    await server.start_server()
    try:
        yield proxy, f"http://127.0.0.1:{server.port}"
    finally:
        await server.close()


async def chunks(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[int, list[Any]]:
    """A chat completion's status and its parsed SSE chunks (or its one JSON body), ids and times left out."""
    async with session.post(url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}) as r:
        raw = await r.read()
    if r.content_type != "text/event-stream":
        return r.status, [_stable(json.loads(raw))]
    out = []
    for event in raw.split(b"\n\n"):
        data = event.removeprefix(b"data: ")
        if data.strip():
            out.append(data.decode() if data == b"[DONE]" else _stable(json.loads(data)))
    return r.status, out


def _stable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: v for k, v in obj.items() if k not in ("id", "created")}
    return obj


def conversation(topic: str, turns: int) -> list[list[dict[str, Any]]]:
    """The message lists an agent sends over ``turns`` turns: each the last one, its reply and a new question."""
    messages: list[dict[str, Any]] = [SYSTEM, {"role": "user", "content": f"Tell me about {topic}. {SECRET_TEXT}"}]
    out = [list(messages)]
    for n in range(1, turns):
        messages += [
            {"role": "assistant", "content": f"Here is part {n} about {topic}."},
            {"role": "user", "content": f"Go on about {topic}, part {n + 1}, in more detail please."},
        ]
        out.append(list(messages))
    return out


async def test_streamed_and_whole_answers_and_errors_arrive_as_they_would_directly(tmp_path: Path) -> None:
    async with running_sim(PROFILE) as (_, direct), running_sim(PROFILE) as (_, upstream):
        async with recording(upstream, tmp_path / "t.json") as (proxy, url), aiohttp.ClientSession() as s:
            bodies: list[dict[str, Any]] = [
                {"messages": conversation("bridges", 1)[0], "max_tokens": 24},
                {"messages": conversation("tunnels", 1)[0], "max_tokens": 24, "stream": True},
                {
                    "messages": conversation("roads", 1)[0],
                    "max_tokens": 24,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                },
                {"messages": conversation("ports", 1)[0], "max_tokens": 24, "model": "no-such-model"},
            ]
            for body in bodies:
                assert await chunks(s, url, body) == await chunks(s, direct, body)
            status, (error,) = await chunks(s, url, bodies[-1])
            assert status == 404
            assert "no-such-model" in error["error"]["message"]
            # The proxy added include_usage to the second request and removed the chunk it caused: the client saw
            # no usage, as it asked; the third asked for it and got it.
            _, streamed = await chunks(s, url, bodies[1])
            assert not any(isinstance(c, dict) and "usage" in c for c in streamed)
            _, asked = await chunks(s, url, bodies[2])
            assert any(isinstance(c, dict) and c.get("usage") for c in asked)
            for path in ("/v1/models", "/metrics", "/health"):
                async with s.get(url + path) as via, s.get(upstream + path) as there:
                    assert via.status == there.status == 200
                    assert via.content_type == there.content_type
            async with s.get(url + "/v1/models") as via, s.get(upstream + "/v1/models") as there:
                assert await via.json() == await there.json()
        assert proxy.counts.failed == 2  # the two 404s: forwarded, not recorded
    trace = json.loads((tmp_path / "t.json").read_text())
    requests = [r for c in trace for r in c["requests"]]
    assert len(requests) == 5
    assert {c["tokenizer"] for c in trace} == {VLLM}
    assert all(r["usage"] == "server" and r["stop"] and r["in"] > 0 and r["out"] > 0 for r in requests)
    assert sorted(r["type"] for r in requests) == ["n", "s", "s", "s", "s"]  # bodies 1-3, then 2 and 3 again


async def test_the_key_never_and_the_text_only_with_keep_text_reach_the_file(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("RECORD_TEST_KEY", KEY)
    for keep in (False, True):
        out = tmp_path / f"keep-{keep}.json"
        async with running_sim(PROFILE) as (_, upstream), recording(upstream, out, keep_text=keep) as (_, url):
            client = ChatClient(url, api_key_env="RECORD_TEST_KEY")
            try:
                for turn, messages in enumerate(conversation("kites", 3)):
                    ids = RequestIds(run="r", level=0, agent="a", turn=turn)
                    record = await client.chat({"messages": messages, "max_tokens": 16}, ids=ids)
                    assert record.ok, record.error
            finally:
                await client.aclose()
        text = out.read_text()
        assert KEY not in text
        assert "Bearer" not in text
        assert (SECRET_TEXT in text) is keep
        assert ("Here is part 2 about kites" in text) is keep  # the new messages of each turn
        (conv,) = json.loads(text)
        assert len(conv["requests"]) == 3


async def test_sessions_by_prefix_by_header_and_subagents_by_parent(tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    async with (
        running_sim(PROFILE) as (_, upstream),
        recording(upstream, out) as (_, url),
        aiohttp.ClientSession() as s,
    ):

        async def send(messages: list[dict[str, Any]], **headers: str) -> None:
            body = {"messages": messages, "max_tokens": 8, "stream": True}
            async with s.post(url + "/v1/chat/completions", json=body, headers=headers) as r:
                assert r.status == 200
                await r.read()

        a, b = conversation("apples", 3), conversation("pears", 2)
        # Two agents interleaved, sharing the system prompt: two sessions, each its own turns in order.
        await send(a[0])
        await send(b[0])
        await send(a[1])
        await send(b[1])
        await send(a[2])
        # Named sessions: the header wins even where the messages repeat another session's.
        await send(a[0], **{SESSION_HEADER: "lead"})
        await send(conversation("plums", 2)[0], **{SESSION_HEADER: "helper", PARENT_HEADER: "lead"})
        await send(conversation("plums", 2)[1], **{SESSION_HEADER: "helper"})
        await send(a[1], **{SESSION_HEADER: "lead"})
    doc = json.loads(out.read_text())
    assert [c["id"] for c in doc] == ["s1", "s2", "lead"]
    assert [len(c["requests"]) for c in doc] == [3, 2, 3]
    lead = doc[2]["requests"]
    assert [e.get("type") for e in lead] == ["s", "subagent", "s"]
    assert lead[1]["agent_id"] == "h:helper"
    assert len(lead[1]["requests"]) == 2
    first, second, third = doc[0]["requests"]
    # Each turn's prompt holds the previous one's: its hashes start with all of the previous turn's.
    assert second["hash_ids"][: len(first["hash_ids"])] == first["hash_ids"]
    assert third["hash_ids"][: len(second["hash_ids"])] == second["hash_ids"]
    assert "think_time" not in first
    assert second["think_time"] >= 0
    assert third["api_time"] > 0
    # The other agent shares only the system prompt's blocks with the first.
    other = doc[1]["requests"][0]["hash_ids"]
    assert 0 < len(set(other) & set(first["hash_ids"])) < len(first["hash_ids"])
    # The file is a conversation trace the replay reads as it is: three trees, the lead's with its subagent.
    trace = load_conversation_trace(out)
    assert [len(t.contexts) for t in trace.trees] == [1, 1, 2]


async def test_an_upstream_without_a_tokenizer_is_hashed_by_the_approximation_and_says_so(tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    async with running_sim(PROFILE) as (_, upstream), recording(upstream, out) as (proxy, url):
        assert proxy.tokenizer is not None
        proxy.tokenizer._base = upstream + "/nothing-here"  # every tokenizer endpoint answers 404
        async with aiohttp.ClientSession() as s:
            for messages in conversation("owls", 2):
                await chunks(s, url, {"messages": messages, "max_tokens": 8})
    (conv,) = json.loads(out.read_text())
    assert conv["tokenizer"] == APPROX
    first, second = conv["requests"]
    assert first["approx_tokens"]
    assert second["approx_tokens"]
    assert first["in"] > 0  # the server's usage still gives the counts
    assert len(first["hash_ids"]) >= 1
    assert second["hash_ids"][:1] == first["hash_ids"][:1]
    load_conversation_trace(out)


async def test_an_unreachable_upstream_is_a_502_naming_the_proxy(tmp_path: Path) -> None:
    async with (
        recording("http://127.0.0.1:9", tmp_path / "t.json") as (proxy, url),
        aiohttp.ClientSession() as s,
        s.post(url + "/v1/chat/completions", json={"messages": [SYSTEM]}) as r,
    ):
        assert r.status == 502
        assert "agentload record" in (await r.json())["error"]["message"]
    assert proxy.counts.failed == 1
    assert not (tmp_path / "t.json").exists()


@pytest.mark.parametrize("block_size", [1, 64])
async def test_hash_ids_never_name_more_tokens_than_the_request(tmp_path: Path, block_size: int) -> None:
    out = tmp_path / "t.json"
    async with (
        running_sim(PROFILE) as (_, upstream),
        recording(upstream, out, block_size=block_size) as (_, url),
        aiohttp.ClientSession() as s,
    ):
        for messages in conversation("rivers", 3):
            await chunks(s, url, {"messages": messages, "max_tokens": 8})
    (conv,) = json.loads(out.read_text())
    for r in conv["requests"]:
        assert len(r["hash_ids"]) * block_size <= r["in"]
        assert len(r["hash_ids"]) == r["in"] // block_size  # the server's tokenizer counts what its usage does
    load_conversation_trace(out)


class _Upstream:
    """A hand-written upstream: it streams one chunk, then waits for the test before sending the rest, and keeps
    the headers each request arrived with."""

    def __init__(self, *, usage: bool = True) -> None:
        self.release = asyncio.Event()
        self.headers: list[dict[str, str]] = []
        self.usage = usage  # whether it honours include_usage

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/tokenize", self.tokenize)
        return app

    async def tokenize(self, _request: web.Request) -> web.Response:
        return web.json_response({"count": 40, "tokens": list(range(40))})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        self.headers.append(dict(request.headers))
        body = await request.json()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "X-Upstream": "yes"})
        await response.prepare(request)
        head = '{"id":"c","object":"chat.completion.chunk","model":"m","choices":'
        await response.write(f'data: {head}[{{"index":0,"delta":{{"content":"first"}}}}]}}\n\n'.encode())
        await self.release.wait()
        self.release.clear()
        tail = f'data: {head}[{{"index":0,"delta":{{}},"finish_reason":"stop"}}]}}\n\n'
        if self.usage and body.get("stream_options", {}).get("include_usage"):
            tail += f'data: {head}[],"usage":{{"prompt_tokens":40,"completion_tokens":2}}}}\n\n'
        await response.write((tail + "data: [DONE]\n\n").encode())
        await response.write_eof()
        return response


@pytest.mark.parametrize(("asks_usage", "gives_usage"), [(False, True), (True, True), (False, False)])
async def test_a_stream_is_passed_on_as_it_arrives_with_the_headers_less_hop_by_hop(
    tmp_path: Path, asks_usage: bool, gives_usage: bool
) -> None:
    upstream = _Upstream(usage=gives_usage)
    server = TestServer(upstream.app(), host="127.0.0.1")
    await server.start_server()
    out = tmp_path / "t.json"
    body: dict[str, Any] = {"model": "m", "messages": [SYSTEM], "stream": True}
    if asks_usage:
        body["stream_options"] = {"include_usage": True}
    headers = {"Authorization": f"Bearer {KEY}", "Accept-Encoding": "gzip", "Keep-Alive": "timeout=5",
               "X-Custom": "kept"}  # fmt: skip
    try:
        async with (
            recording(f"http://127.0.0.1:{server.port}", out, block_size=8) as (_, url),
            aiohttp.ClientSession(auto_decompress=False) as s,
            s.post(url + "/v1/chat/completions", json=body, headers=headers) as r,
        ):
            assert r.headers["X-Upstream"] == "yes"
            # The first chunk arrives while the upstream still holds the rest back: nothing waits for the end.
            first = await r.content.readuntil(b"\n\n")
            assert b'"first"' in first
            upstream.release.set()
            rest = await r.read()
    finally:
        await server.close()
    assert rest.endswith(b"data: [DONE]\n\n")
    assert (b'"usage"' in rest) is (asks_usage and gives_usage)  # the usage chunk the proxy asked for is not passed on
    (seen,) = upstream.headers
    assert seen["Authorization"] == f"Bearer {KEY}"
    assert seen["X-Custom"] == "kept"
    assert "Keep-Alive" not in seen
    assert seen["Accept-Encoding"] == "identity"  # so the proxy can read the answer
    (conv,) = json.loads(out.read_text())
    (request,) = conv["requests"]
    if gives_usage:
        assert (request["in"], request["out"], request["usage"], request["stop"]) == (40, 2, "server", "stop")
    else:  # what is known instead, and marked: the tokenizer's count, the stream's content chunks
        assert (request["in"], request["out"], request["usage"], request["stop"]) == (40, 1, "estimated", "stop")
    assert len(request["hash_ids"]) == 5
    assert KEY not in out.read_text()


class _LlamaServer:
    """llama-server's tokenizer endpoints as it shapes them: /tokenize reads ``content`` only (anything else is 200
    with no tokens), /apply-template renders the messages."""

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_post("/apply-template", self.apply_template)
        app.router.add_post("/v1/chat/completions", self.chat)
        return app

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        words = str(body.get("content", "")).split()
        return web.json_response({"tokens": [len(w) for w in words]})

    async def apply_template(self, request: web.Request) -> web.Response:
        return web.json_response({"prompt": _template((await request.json())["messages"])})

    async def chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        usage = {"prompt_tokens": len(_template(body["messages"]).split()), "completion_tokens": 3}
        message = {"role": "assistant", "content": "one two three"}
        return web.json_response({"choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                                  "usage": usage, "model": "llama"})  # fmt: skip


def _template(messages: list[dict[str, Any]]) -> str:
    return " ".join(f"<{m['role']}> {m['content']}" for m in messages)


async def test_a_llama_server_is_tokenized_through_its_template(tmp_path: Path) -> None:
    server = TestServer(_LlamaServer().app(), host="127.0.0.1")
    await server.start_server()
    out = tmp_path / "t.json"
    try:
        async with (
            recording(f"http://127.0.0.1:{server.port}", out, block_size=4) as (_, url),
            aiohttp.ClientSession() as s,
        ):
            for messages in conversation("moths", 2):
                status, _ = await chunks(s, url, {"messages": messages})
                assert status == 200
    finally:
        await server.close()
    (conv,) = json.loads(out.read_text())
    assert conv["tokenizer"] == LLAMACPP
    first, second = conv["requests"]
    for request in (first, second):
        assert "approx_tokens" not in request
        assert len(request["hash_ids"]) == request["in"] // 4  # the template's tokens, as the server counted them
    assert second["hash_ids"][: len(first["hash_ids"])] == first["hash_ids"]


async def test_a_write_still_running_when_the_proxy_stops_cannot_replace_the_last_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The periodic write runs in a worker thread that cancelling cannot stop: the last write must wait for it,
    or the older document (here one request of two) lands after the whole one."""
    first_started, release = threading.Event(), threading.Event()
    real = write_atomic

    def slow_first(path: Path, text: str) -> None:
        if not first_started.is_set():
            first_started.set()
            release.wait(10)  # held until the last write was asked for
        real(path, text)

    monkeypatch.setattr(writer_module, "write_atomic", slow_first)
    out = tmp_path / "t.json"
    writer = TraceWriter(out, 16, lambda: VLLM)
    sessions = {"a": Session("a", 0, 0.0)}
    keeping = asyncio.create_task(writer.keep_written(sessions))
    writer.add(RecordedRequest("a", 0.0, {"in": 16, "out": 1, "hash_ids": [1]}))
    await asyncio.to_thread(first_started.wait, 10)
    writer.add(RecordedRequest("a", 1.0, {"in": 32, "out": 1, "hash_ids": [1, 2]}))
    keeping.cancel()
    closing = asyncio.create_task(writer.close(sessions))
    await asyncio.sleep(0.05)
    assert not closing.done()  # it waits for the write still running
    release.set()
    await closing
    (conv,) = json.loads(out.read_text())
    assert [r["in"] for r in conv["requests"]] == [16, 32]


async def test_agentload_s_own_probe_through_the_proxy_is_forwarded_not_recorded(tmp_path: Path) -> None:
    """``agentload run --url PROXY`` probes the server first (one tiny prompt, twice): those are not a session."""
    out = tmp_path / "t.json"
    async with running_sim(PROFILE) as (_, upstream), recording(upstream, out) as (proxy, url):
        probed = await probe(url, api_key_env="AGENTLOAD_TEST_NO_KEY")
        async with aiohttp.ClientSession() as s:
            status, _ = await chunks(s, url, {"messages": conversation("moths", 1)[0], "max_tokens": 4})
    assert status == 200
    assert probed.reports_cached_tokens is True  # the probe's requests did reach the server
    (conv,) = json.loads(out.read_text())
    assert len(conv["requests"]) == 1  # the agent's request alone
    assert proxy.counts.recorded == 1
