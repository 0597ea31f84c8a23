"""The recording proxy: forwards every request to the upstream server unchanged and records chat completions.

**Forwarding.** Any method and path goes to the upstream's base URL plus the request's path and query, with the
request's headers (the client's ``Authorization`` included: it is sent on, never stored, logged or printed) less
the hop-by-hop ones (RFC 9110 §7.6.1: ``Connection`` and the headers it names, ``Keep-Alive``, ``TE``,
``Transfer-Encoding``, ``Upgrade``, ``Proxy-*``) and ``Host``. The answer's status, headers (less the same) and
bytes come back as they arrive: a stream is written on chunk by chunk, nothing is buffered but an incomplete
event of a stream whose usage chunk the proxy removes (below). Bodies are passed compressed or not, as they came.
An upstream that cannot be reached is a 502 with an OpenAI-style error body naming the proxy.

**Two changes to a chat completion request**, so that it can be recorded:

* ``Accept-Encoding`` is sent as ``identity``, so the answer is plain text the proxy can read.
* A streamed request that did not ask for usage gets ``stream_options.include_usage: true`` added, and the
  usage-only chunk that causes (``"choices": []`` with ``usage``, the last before ``[DONE]``) is removed from
  what the client sees. The other chunks are the server's, byte for byte (vLLM also adds ``"usage": null`` to
  them once usage is asked for).

**Recording** happens after the reply has been passed on: the prompt is tokenized by the upstream
(``record/tokens.py``) only then, so the client's request does not wait for it, and a request the proxy has
seen already (the same messages, tools and model) is not tokenized again. Only completed 200 answers are
recorded; an error status, a broken stream or a client that went away is forwarded as it was and counted.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from agentload.endpoint.probe import PROBE_HEADER
from agentload.record.sessions import PARENT_HEADER, SESSION_HEADER, Session, SessionBook
from agentload.record.tokens import APPROX, APPROX_BYTES_PER_TOKEN, BlockHasher, UpstreamTokenizer
from agentload.record.writer import RecordedRequest, TraceWriter

HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection", "te", "trailer",
     "trailers", "transfer-encoding", "upgrade", "host", "content-length"}
)  # fmt: skip
MAX_BODY_BYTES = 256 * 2**20  # a request body larger than this is refused (413): a 2M-token prompt is ~10 MB
TOKEN_CACHE = 1024  # tokenized prompts kept, so a retried request is not tokenized twice
_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")


def forwarded_headers(headers: Mapping[str, str]) -> CIMultiDict[str]:
    """``headers`` less the hop-by-hop ones and those ``Connection`` names."""
    named = {h.strip().lower() for h in headers.get("Connection", "").split(",") if h.strip()}
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in headers.items():
        low = name.lower()
        if low not in HOP_BY_HOP and low not in named:
            out.add(name, value)
    return out


@dataclass
class Reply:
    """What the proxy read of an answer: usage, finish reason, tool calls, model, text (for ``--keep-text``)."""

    usage: dict[str, Any] | None = None
    stop: str | None = None
    tool_calls: set[int] = field(default_factory=set)
    model: str | None = None
    text: list[str] = field(default_factory=list)
    chunks: int = 0  # content or tool-call chunks of a stream (vLLM sends about one a token)

    def read_chunk(self, obj: Any) -> None:
        if not isinstance(obj, dict):
            return
        if isinstance(obj.get("usage"), dict):
            self.usage = obj["usage"]
        if isinstance(obj.get("model"), str):
            self.model = obj["model"]
        choices = obj.get("choices")
        for choice in choices if isinstance(choices, list) else []:
            if not isinstance(choice, dict):
                continue
            if isinstance(choice.get("finish_reason"), str):
                self.stop = choice["finish_reason"]
            delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else choice.get("message")
            if not isinstance(delta, dict):
                continue
            content = delta.get("content")
            calls = delta.get("tool_calls")
            if isinstance(content, str) and content:
                self.text.append(content)
                self.chunks += 1
            if isinstance(calls, list):
                self.chunks += bool(calls)
                for n, call in enumerate(calls):
                    index = call.get("index", n) if isinstance(call, dict) else n
                    self.tool_calls.add(index if isinstance(index, int) else n)


def _event_data(event: bytes) -> Any:
    """The JSON of one SSE event's ``data:`` lines (None for ``[DONE]``, a comment or a malformed one)."""
    lines = [line[5:].lstrip() for line in event.splitlines() if line.startswith(b"data:")]
    if not lines:
        return None
    data = b"\n".join(lines)
    if data.strip() == b"[DONE]":
        return None
    try:
        return json.loads(data)
    except ValueError:
        return None


def _usage_only(obj: Any) -> bool:
    return isinstance(obj, dict) and obj.get("choices") == [] and isinstance(obj.get("usage"), dict)


@dataclass
class Plan:
    """A chat request as the proxy forwards and records it."""

    body: dict[str, Any]
    raw: bytes  # what is sent on
    stream: bool
    injected: bool  # include_usage was added by the proxy
    session: Session
    arrived: float
    think_time: float | None
    new_messages: list[Any]


@dataclass
class Counts:
    recorded: int = 0
    failed: int = 0  # chat requests forwarded but not recorded (an error status, a broken stream, a client gone)


class RecordingProxy:
    """The aiohttp application: ``app()`` to serve; ``start``/``stop`` open and close the upstream session."""

    def __init__(
        self,
        upstream: str,
        writer: TraceWriter,
        *,
        keep_text: bool = False,
        progress: Callable[[int, int, int], None] = lambda _r, _s, _f: None,
        hasher: BlockHasher | None = None,
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self.writer = writer
        self.keep_text = keep_text
        self.progress = progress
        self.book = SessionBook()
        self.hasher = hasher or BlockHasher(writer.block_size)
        self.counts = Counts()
        self._session: aiohttp.ClientSession | None = None
        self.tokenizer: UpstreamTokenizer | None = None
        self._token_cache: OrderedDict[bytes, asyncio.Future[tuple[list[int], str]]] = OrderedDict()
        self._pending: set[asyncio.Task[None]] = set()
        self._writing: asyncio.Task[None] | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)
        return app

    async def _start(self, _app: web.Application) -> None:
        # No total timeout: a long generation may stream for many minutes, as it would without the proxy.
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)
        self._session = aiohttp.ClientSession(
            timeout=timeout, auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar()
        )
        self.tokenizer = UpstreamTokenizer(self._session, self.upstream)
        self._writing = asyncio.create_task(self.writer.keep_written(self.book.sessions))

    async def _stop(self, _app: web.Application) -> None:
        if self._pending:
            await asyncio.wait(set(self._pending), timeout=30)
        if self._writing is not None:
            self._writing.cancel()
            await asyncio.gather(self._writing, return_exceptions=True)
        await self.writer.close(self.book.sessions)
        if self._session is not None:
            await self._session.close()

    # -- forwarding ----------------------------------------------------------------------------------------------

    async def handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        headers = forwarded_headers(request.headers)
        plan = (
            self._plan(request, raw)
            if request.method == "POST" and request.path.endswith("/chat/completions")
            else None
        )
        if plan is not None:
            headers["Accept-Encoding"] = "identity"
            raw = plan.raw
        assert self._session is not None
        url = self.upstream + str(request.rel_url)
        try:
            upstream = await self._session.request(
                request.method, url, headers=headers, data=raw or None, allow_redirects=False,
                skip_auto_headers=("Accept-Encoding", "User-Agent"),  # only the client's own go on
            )  # fmt: skip
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            if plan is not None:
                self._failed()
            reason = type(exc).__name__
            return web.json_response(
                {"error": {"message": f"agentload record: the upstream could not be reached ({reason})",
                           "type": "BadGateway", "code": 502}},
                status=502,
            )  # fmt: skip
        async with upstream:
            out_headers = forwarded_headers(upstream.headers)
            if plan is None or upstream.status != 200:
                if plan is not None:
                    self._failed()
                return await self._pass(request, upstream, out_headers)
            if plan.stream and upstream.content_type == "text/event-stream":
                return await self._stream(request, upstream, out_headers, plan)
            body = await upstream.read()
            reply = Reply()
            try:
                reply.read_chunk(json.loads(body))
            except ValueError:
                self._failed()
            else:
                self._finish(plan, reply, request.headers)
            return web.Response(status=upstream.status, reason=upstream.reason, body=body, headers=out_headers)

    async def _pass(
        self, request: web.Request, upstream: aiohttp.ClientResponse, headers: CIMultiDict[str]
    ) -> web.StreamResponse:
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason, headers=headers)
        if upstream.content_length is not None:
            response.content_length = upstream.content_length
        await response.prepare(request)
        try:
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
        except (aiohttp.ClientError, ConnectionError):
            return response  # the upstream or the client went away: the client sees the answer cut, as it was
        await response.write_eof()
        return response

    async def _stream(
        self, request: web.Request, upstream: aiohttp.ClientResponse, headers: CIMultiDict[str], plan: Plan
    ) -> web.StreamResponse:
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason, headers=headers)
        await response.prepare(request)
        reply = Reply()
        pending = b""
        try:
            async for chunk in upstream.content.iter_any():
                pending += chunk
                events = _EVENT_END.split(pending)
                ends = [m.group() for m in _EVENT_END.finditer(pending)]
                pending = events.pop()
                kept = b""
                for event, end in zip(events, ends, strict=True):
                    obj = _event_data(event)
                    reply.read_chunk(obj)
                    if not (plan.injected and _usage_only(obj)):
                        kept += event + end
                # A stream the client asked usage of passes as it came; else only whole events are written.
                out = chunk if not plan.injected else kept
                if out:
                    await response.write(out)
            if pending and not plan.injected:
                reply.read_chunk(_event_data(pending))
            elif pending:
                await response.write(pending)
        except (aiohttp.ClientError, ConnectionError):
            self._failed()
            return response
        await response.write_eof()
        if reply.stop is None:
            self._failed()  # the stream ended without a finish reason: not a completed request
        else:
            self._finish(plan, reply, request.headers)
        return response

    # -- recording -----------------------------------------------------------------------------------------------

    def _plan(self, request: web.Request, raw: bytes) -> Plan | None:
        if PROBE_HEADER in request.headers:
            return None  # agentload's own test request (``agentload run``'s probe): forwarded, not an agent's
        try:
            body = json.loads(raw)
        except ValueError:
            return None
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or not body["messages"]:
            return None
        now = asyncio.get_running_loop().time()
        session = self.book.assign(
            body["messages"], now, name=request.headers.get(SESSION_HEADER), parent=request.headers.get(PARENT_HEADER)
        )
        think = None if session.previous_end is None else max(0.0, now - session.previous_end)
        stream = body.get("stream") is True
        options = body.get("stream_options")
        injected = stream and not (isinstance(options, dict) and options.get("include_usage") is True)
        if injected:
            body = {**body, "stream_options": {**(options if isinstance(options, dict) else {}), "include_usage": True}}
            raw = json.dumps(body).encode()
        new = body["messages"][session.continued :] if self.keep_text else []
        return Plan(body, raw, stream, injected, session, now, think, new)

    def _failed(self) -> None:
        self.counts.failed += 1
        self._report()

    def _report(self) -> None:
        sessions = len({r.session for r in self.writer.requests})
        self.progress(self.counts.recorded, sessions, self.counts.failed)

    def _finish(self, plan: Plan, reply: Reply, headers: Mapping[str, str]) -> None:
        ended = asyncio.get_running_loop().time()
        plan.session.previous_end = ended
        # Only the credentials the upstream needs travel to its tokenizer; nothing of them is kept.
        auth = {k: v for k, v in headers.items() if k.lower() in ("authorization", "x-api-key", "api-key")}
        task = asyncio.create_task(self._record(plan, reply, ended, auth))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    def _tokens(self, body: dict[str, Any], auth: dict[str, str]) -> asyncio.Future[tuple[list[int], str]]:
        key = hashlib.blake2b(
            json.dumps([body.get("model"), body.get("messages"), body.get("tools")], sort_keys=True).encode(),
            digest_size=16,
        ).digest()
        future = self._token_cache.get(key)
        if future is None:
            assert self.tokenizer is not None
            future = asyncio.ensure_future(self.tokenizer.tokens(body, auth))
            self._token_cache[key] = future
            while len(self._token_cache) > TOKEN_CACHE:
                self._token_cache.popitem(last=False)
        else:
            self._token_cache.move_to_end(key)
        return future

    async def _record(self, plan: Plan, reply: Reply, ended: float, auth: dict[str, str]) -> None:
        body = plan.body
        if not isinstance(body.get("model"), str) and reply.model:  # older vLLM's /tokenize requires the model
            body = {**body, "model": reply.model}
        tokens, method = await self._tokens(body, auth)
        usage = reply.usage or {}
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        fields: dict[str, Any] = {"type": "s" if plan.stream else "n"}
        if _count(prompt) and _count(completion, zero=True):
            fields |= {"in": prompt, "out": completion, "usage": "server"}
        else:  # no usage from the server: the tokenizer's count, the stream's chunks or the text's bytes
            out = reply.chunks if plan.stream else -(-len("".join(reply.text).encode()) // APPROX_BYTES_PER_TOKEN)
            fields |= {"in": max(1, len(tokens)), "out": out, "usage": "estimated"}
        if method == APPROX:
            fields["approx_tokens"] = True  # its hashes are of the approximation (tokens.py), not the server's
        hash_ids = self.hasher.hash_ids(tokens)
        fields["hash_ids"] = hash_ids[: fields["in"] // self.hasher.block_size]
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        if _count(cached, zero=True):
            fields["cached"] = cached
        if plan.think_time is not None:
            fields["think_time"] = round(plan.think_time, 6)
        fields["api_time"] = round(ended - plan.arrived, 6)
        fields["stop"] = reply.stop
        fields["tool_calls"] = len(reply.tool_calls)
        model = reply.model or plan.body.get("model")
        if isinstance(model, str):
            fields["model"] = model
        if self.keep_text:
            fields["messages"] = plan.new_messages
            fields["reply"] = "".join(reply.text)
        self.writer.add(RecordedRequest(plan.session.key, plan.arrived, fields))
        self.counts.recorded += 1
        self._report()


def _count(value: Any, *, zero: bool = False) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and (value >= 0 if zero else value > 0)
