"""The streaming chat client: one OpenAI-compatible request in, one ``RequestRecord`` out, never an exception.

SSE is parsed by us (``wire.py``) on top of a ``Transport``; every token-bearing chunk's arrival is timed (where the
bytes came off the socket, not when the parse reached them, so a burst of chunks is not stamped in parse order); tool
calls are assembled from their streamed deltas; usage comes from the server's final chunk
(``stream_options.include_usage``) or is counted and marked as counted. Every field read from a chunk or body is
type- and range-checked as it is read (``wire``; a server is untrusted input): a hostile chunk, a body that is not
HTTP or an event that never ends is a failed record of kind ``malformed``, never an exception out of ``chat``.

Deadlines are phase-aware (docs/background.md §8) and owned by a ``StallPolicy``: CONNECT (until the status line),
FIRST_TOKEN (until the first content or tool-call token — a role-only chunk is not progress, since vLLM sends
it before a long prefill), IDLE (between tokens), and a TOTAL cap. When a phase's budget runs out the policy may
grant more time (the watchdog does while the server says the request is still queued, prefilling or warming
up); otherwise the request is cancelled and recorded as a timeout of that phase. Timers are ``loop.call_at``
handles re-armed per chunk — cheaper than a task or ``wait_for`` per read, which matters at 1,000 streams.

Only content is progress: SSE comments and empty events (keep-alives a proxy sends for a dead engine as readily as
for a slow one) reset no deadline; they are counted on the record and named in a timeout's message. A stream that
goes past its ``max_tokens`` (``overrun_limit``) is cut as an ``overrun``: a server that ignores the cap, or a
reply that never ends, cannot hold an agent for the total deadline. And the load that sent a request can end it
(``CutScope``: a bench level's window), which still returns its record.
"""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

import orjson

from agentload.clock import LoopClock
from agentload.endpoint import wire
from agentload.endpoint.records import (
    ErrorKind,
    Outcome,
    RequestIds,
    RequestRecord,
    ToolCallRecord,
    UsageSource,
)
from agentload.endpoint.redact import SECRETS, redact_optional
from agentload.endpoint.transport import (
    AiohttpTransport,
    ConnectFailed,
    MalformedResponse,
    Response,
    StreamBroken,
    Transport,
)
from agentload.endpoint.wire import MalformedField, SSEParser, SSETooLong, Usage

# More parallel tool calls than any model emits; an index beyond it is a broken stream, not a call to keep.
_MAX_TOOL_CALLS = 1024


def overrun_limit(max_tokens: int) -> int:
    """Token-bearing chunks past which a stream asked for ``max_tokens`` is cut as an overrun.

    A chunk carries at least one token (vLLM, SGLang and llama.cpp stream one a chunk; speculative decoding sends
    several), so counting chunks never overstates the output. The margin covers what a server may stream beside
    the capped tokens: a final chunk with the finish reason, a reasoning parser's split of one token in two.
    """
    return max_tokens + max(16, max_tokens // 10)


class Phase(StrEnum):
    CONNECT = "connect"
    FIRST_TOKEN = "first_token"
    IDLE = "idle"


class StallPolicy(Protocol):
    """Decides how long each phase may take and whether to wait longer when it runs out."""

    total_s: float

    def budget(self, phase: Phase, prompt_tokens: int) -> float:
        """Seconds the phase may take before ``extend`` is asked."""
        ...

    def extend(self, phase: Phase, waited: float) -> float | None:
        """More seconds to wait, or None to give up (must not block: read signals gathered in the background)."""
        ...

    def observe(self, record: RequestRecord) -> None:
        """Learn from a finished request (e.g. the prefill rate)."""
        ...


@dataclass
class FixedDeadlines:
    """Plain deadlines that never extend — what most harnesses have, and the baseline the watchdog beats."""

    connect_s: float = 30.0
    first_token_s: float = 600.0
    idle_s: float = 120.0
    total_s: float = 3600.0

    def budget(self, phase: Phase, prompt_tokens: int) -> float:
        return {Phase.CONNECT: self.connect_s, Phase.FIRST_TOKEN: self.first_token_s, Phase.IDLE: self.idle_s}[phase]

    def extend(self, phase: Phase, waited: float) -> float | None:
        return None

    def observe(self, record: RequestRecord) -> None:
        return None


class CutScope:
    """The requests in flight under one owner (a bench level), which it can cut at once.

    A cut request ends like a timed-out one — its task is cancelled where it waits, ``chat`` returns a record — with
    outcome ``cancelled`` and error ``cut``: the load ended it, not the server. A level cuts what is still in flight
    when its window's grace runs out, so a stalled or endless stream cannot stretch the level past its window.
    Requests join the scope set in ``cut_scope`` when they start (tasks inherit it from where they were created).
    """

    def __init__(self) -> None:
        self._guards: set[_Guard] = set()
        self.cut_total = 0

    @property
    def in_flight(self) -> int:
        return len(self._guards)

    def add(self, guard: _Guard) -> None:
        self._guards.add(guard)

    def discard(self, guard: _Guard) -> None:
        self._guards.discard(guard)

    def cut(self, why: str) -> int:
        """Cut every request in flight, saying ``why`` on its record; how many were cut."""
        n = sum(1 for g in list(self._guards) if g.cut(why))
        self.cut_total += n
        return n


cut_scope: ContextVar[CutScope | None] = ContextVar("agentload_cut_scope", default=None)


_KIND = {
    Phase.CONNECT: ErrorKind.CONNECT_TIMEOUT,
    Phase.FIRST_TOKEN: ErrorKind.FIRST_TOKEN_TIMEOUT,
    Phase.IDLE: ErrorKind.IDLE_TIMEOUT,
}


# Who watches a request's stream as it arrives (the fleet dashboard's live preview), set once for a run (its agents'
# tasks inherit it). It is handed the request's ids and accumulator once, when the request starts, and reads the
# accumulator on its own schedule — its text, its tool calls, ``done`` at the end: nothing per chunk or per reply.
stream_watch: ContextVar[Callable[[RequestIds | None, _Acc], None] | None] = ContextVar("stream_watch", default=None)


class _Guard:
    """Phase timers that cancel the request's task when a phase runs out and the policy grants no more time.

    The idle timer is lazy: a chunk only stores its time in ``last``; when the timer fires it re-arms itself for
    ``last + budget`` if progress came meanwhile. Re-arming a loop timer per chunk costs ~8 µs (a heap push plus
    a cancelled handle left in the heap), which is most of the client's budget at 1,000 streams.
    """

    def __init__(self, policy: StallPolicy) -> None:
        self.policy = policy
        self.loop = asyncio.get_running_loop()
        self.task = asyncio.current_task()
        self.phase = Phase.CONNECT
        self.phase_start = 0.0
        self.budget = 0.0
        self.last = 0.0  # time of the latest progress in this phase
        self.fired: ErrorKind | None = None
        self.cut_reason = ""
        self._timer: asyncio.TimerHandle | None = None
        self._total: asyncio.TimerHandle | None = None

    def start_total(self, seconds: float) -> None:
        self._total = self.loop.call_later(seconds, self._fire, ErrorKind.TOTAL_TIMEOUT)

    def arm(self, phase: Phase, seconds: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self.phase = phase
        self.phase_start = self.last = self.loop.time()
        self.budget = seconds
        self._timer = self.loop.call_at(self.last + seconds, self._expired)

    def _expired(self) -> None:
        now = self.loop.time()
        # The tolerance matters on a VirtualTimeLoop, whose clock can land a hair short of a timer's deadline:
        # without it the timer would re-arm at the same instant forever.
        if now - self.last < self.budget - 1e-6:
            self._timer = self.loop.call_at(self.last + self.budget, self._expired)
            return
        # Between tokens what the policy judges is this silence, not the stream's age: measured from the phase's
        # start, a stream older than the watchdog's idle_s was given up at its first pause of a check's length
        # (a small model decoding on two busy cores: 512-token replies cut at 60-75 s on a 2 s gap).
        silent_since = self.last if self.phase is Phase.IDLE else self.phase_start
        more = self.policy.extend(self.phase, now - silent_since)
        if more is not None and more > 0:
            self._timer = self.loop.call_at(now + more, self._expired)
            return
        self._fire(_KIND[self.phase])

    def _fire(self, kind: ErrorKind) -> bool:
        if self.fired is None and self.task is not None:
            self.fired = kind
            self.task.cancel()
            return True
        return False

    def cut(self, why: str) -> bool:
        """End the request now on its owner's behalf (``CutScope``); False when it was already ending."""
        self.cut_reason = why
        return self._fire(ErrorKind.CUT)

    def disarm(self) -> None:
        for t in (self._timer, self._total):
            if t is not None:
                t.cancel()


class _Acc:
    """Mutable accumulation of one request; compiled into the immutable record at the end."""

    # Slots: a live dashboard reads every request in flight at each flush (``dashboard.state.LiveState.refresh``),
    # and a slotted object's fields sit in the object itself, not in a dict beside it: fewer cold lines per read.
    __slots__ = ("calls", "chunk_times", "content", "done", "error", "error_message", "finish_reason", "http_status",
                 "keepalives", "outcome", "reasoning", "record", "retry_after", "t_first_byte", "t_first_token",
                 "t_headers", "t_sent", "usage")  # fmt: skip

    def __init__(self, t_sent: float) -> None:
        self.t_sent = t_sent
        self.t_headers: float | None = None
        self.t_first_byte: float | None = None
        self.t_first_token: float | None = None
        self.chunk_times: list[float] = []
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, dict[str, str]] = {}
        self.finish_reason: str | None = None
        self.usage: Usage | None = None
        self.outcome = Outcome.OK
        self.error: ErrorKind | None = None
        self.error_message = ""
        self.http_status: int | None = None
        self.retry_after: float | None = None
        self.keepalives = 0
        self.done = False
        self.record: RequestRecord | None = None  # compiled at the end (not for a request cancelled on the way)

    def fail(self, outcome: Outcome, error: ErrorKind, message: str) -> None:
        if self.outcome is Outcome.OK:
            self.outcome, self.error, self.error_message = outcome, error, message


def _retry_after(headers: Mapping[str, str]) -> float | None:
    value = headers.get("Retry-After") or headers.get("retry-after")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None  # an HTTP date: rare for LLM servers; the caller's backoff applies
    # "nan" and "inf" parse as floats; a NaN wait would reach asyncio.sleep, so they count as no header.
    return max(0.0, seconds) if math.isfinite(seconds) else None


def _error_message(body: bytes) -> str:
    try:
        data = wire.loads(body)
    except MalformedField:
        return body[:200].decode("utf-8", "replace")
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict):
            return str(err.get("message", err))[:500]
        return str(data.get("message", err))[:500]
    return str(data)[:200]


class ChatClient:
    """Streams chat completions from one OpenAI-compatible base URL (``.../v1``)."""

    def __init__(
        self,
        base_url: str,
        *,
        transport: Transport | None = None,
        policy: StallPolicy | None = None,
        api_key_env: str | None = "OPENAI_API_KEY",
        clock: LoopClock | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        if not self.base_url.endswith("/v1"):
            self.base_url += "/v1"
        self.transport: Transport = transport or AiohttpTransport()
        self.policy: StallPolicy = policy or FixedDeadlines()
        # The loop's clock: time.monotonic() on a normal loop (comparable across processes), virtual on a
        # VirtualTimeLoop.
        self.clock = clock or LoopClock()
        self._headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        key = os.environ.get(api_key_env) if api_key_env else None
        if key:
            # Kept only in the headers sent to the server: never in a record, a log line or a result file.
            self._headers["Authorization"] = f"Bearer {key}"
            SECRETS.add(key)

    async def aclose(self) -> None:
        await self.transport.aclose()

    async def chat(
        self,
        body: Mapping[str, Any],
        *,
        ids: RequestIds | None = None,
        policy: StallPolicy | None = None,
        prompt_tokens_hint: int = 0,
        headers: Mapping[str, str] | None = None,
    ) -> RequestRecord:
        """Send one chat completion (streamed unless ``body['stream']`` is False) and record what happened;
        ``headers`` go with it besides the client's own."""
        policy = policy or self.policy
        stream = bool(body.get("stream", True))
        payload = dict(body)
        payload["stream"] = stream
        if stream:
            opts = dict(payload.get("stream_options") or {})
            opts.setdefault("include_usage", True)
            payload["stream_options"] = opts
        raw = wire.dumps(payload)
        acc = _Acc(self.clock.now())
        if (watch := stream_watch.get()) is not None:
            watch(ids, acc)
        guard = _Guard(policy)
        guard.start_total(policy.total_s)
        guard.arm(Phase.CONNECT, policy.budget(Phase.CONNECT, prompt_tokens_hint))
        scope = cut_scope.get()
        if scope is not None:
            scope.add(guard)
        resp: Response | None = None
        try:
            sent = {**self._headers, **headers} if headers else self._headers
            resp = await self.transport.send("POST", f"{self.base_url}/chat/completions", raw, sent)
            acc.t_headers = self.clock.now()
            acc.http_status = resp.status
            guard.arm(Phase.FIRST_TOKEN, policy.budget(Phase.FIRST_TOKEN, prompt_tokens_hint))
            if resp.status != 200:
                acc.retry_after = _retry_after(resp.headers)
                message = _error_message(await resp.read()) or f"HTTP {resp.status} with an empty body"
                acc.fail(Outcome.HTTP_ERROR, ErrorKind.HTTP_STATUS, message)
            elif stream:
                await self._consume_stream(resp, acc, guard, policy, prompt_tokens_hint, payload)
            else:
                self._consume_body(await resp.read(), acc)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if guard.fired is None or task is None:
                raise
            task.uncancel()
            after = f"after {self.clock.now() - acc.t_sent:.1f} s"
            if guard.fired is ErrorKind.CUT:
                acc.fail(Outcome.CANCELLED, ErrorKind.CUT, f"cut {after}: {guard.cut_reason}")
            else:
                # Keep-alives are named: a server that sent nothing but ``: ping`` is alive and not answering.
                pings = f" (the server sent {acc.keepalives} keep-alive comment(s) and no token)" if (
                    acc.keepalives and acc.t_first_token is None) else ""  # fmt: skip
                acc.fail(Outcome.TIMEOUT, guard.fired, f"{guard.fired.value.replace('_', ' ')} {after}{pings}")
        except ConnectFailed as exc:
            acc.fail(Outcome.CONNECT_ERROR, ErrorKind.CONNECT, str(exc))
        except StreamBroken as exc:
            acc.fail(Outcome.STREAM_ERROR, ErrorKind.RESET, str(exc))
        except MalformedResponse as exc:
            acc.fail(Outcome.STREAM_ERROR, ErrorKind.MALFORMED, f"malformed HTTP from the server: {exc}")
        finally:
            guard.disarm()
            if scope is not None:
                scope.discard(guard)
            if resp is not None:
                resp.close()
        record = self._compile(acc, payload, ids or RequestIds(), stream)
        acc.record = record  # for a watcher (``stream_watch``): the request is over, and this is what it was
        # The pieces are joined into the record: freed now, as they would be with no watcher holding the accumulator
        # until its next read (a live dashboard's next flush), so that watching a run does not change what the run
        # keeps in memory while it goes on.
        acc.content.clear()
        acc.reasoning.clear()
        policy.observe(record)
        return record

    async def _consume_stream(
        self,
        resp: Response,
        acc: _Acc,
        guard: _Guard,
        policy: StallPolicy,
        prompt_hint: int,
        payload: Mapping[str, Any],
    ) -> None:
        parser = SSEParser()
        idle = policy.budget(Phase.IDLE, prompt_hint)
        # Only content resets a deadline (a token, a tool-call delta): keep-alive comments are counted, never
        # progress. A stream past its max_tokens is cut as an overrun; with no cap asked, the total deadline and
        # the owner's cut (a level's window) are what bound it.
        asked = payload.get("max_completion_tokens", payload.get("max_tokens"))
        limit = overrun_limit(asked) if isinstance(asked, int) and not isinstance(asked, bool) and asked > 0 else None

        def feed(t: float, data: bytes) -> bool:
            """One read of the body, arrived at ``t``, folded into ``acc``; False once nothing more is wanted."""
            if acc.t_first_byte is None:
                acc.t_first_byte = t
            try:
                events = parser.feed(data)
                acc.keepalives = parser.comments
                for event in events:
                    if event == b"[DONE]":
                        acc.done = True
                        continue
                    if self._apply_event(event, acc):
                        acc.chunk_times.append(t)
                        if acc.t_first_token is None:
                            acc.t_first_token = t
                            guard.arm(Phase.IDLE, idle)
                        else:
                            guard.last = guard.loop.time()
                        if limit is not None and len(acc.chunk_times) > limit:
                            acc.fail(Outcome.STREAM_ERROR, ErrorKind.OVERRUN,
                                     f"the stream went past max_tokens {asked} ({len(acc.chunk_times)} "
                                     f"token chunks, with no end): cut")  # fmt: skip
                            return False
                    if acc.outcome is not Outcome.OK:
                        return False
            except (MalformedField, SSETooLong) as exc:
                acc.fail(Outcome.STREAM_ERROR, ErrorKind.MALFORMED, f"malformed SSE data: {exc}")
                return False
            return True

        # Arrival stamps taken where the bytes reach the socket (the kernel's receive stamp on Linux), on the loop's
        # clock, and each read folded in right there (transport's stream_to: no task woken per chunk); a transport
        # without it, or a client on another clock, is read here and stamped as each read is taken.
        stream_to = getattr(resp, "stream_to", None)
        if stream_to is not None and type(self.clock) is LoopClock:
            await stream_to(feed)
        else:
            async for data in resp.chunks():
                if not feed(self.clock.now(), data):
                    break
        if not acc.done and acc.outcome is Outcome.OK:
            acc.fail(Outcome.STREAM_ERROR, ErrorKind.RESET, "the stream ended before [DONE]")

    @classmethod
    def _apply_event(cls, event: bytes, acc: _Acc) -> bool:
        """Fold one ``data:`` payload into ``acc``; True when it carried a token. MalformedField for bad fields."""
        try:
            obj = orjson.loads(event)  # wire.loads without its wrapper: this runs once per chunk
        except orjson.JSONDecodeError as exc:
            raise MalformedField(f"{event[:80]!r} is not JSON ({exc})") from exc
        if not isinstance(obj, dict):
            raise MalformedField(f"an event is a JSON {type(obj).__name__}, not an object")
        if "error" in obj:
            err = obj["error"]
            msg = err.get("message", err) if isinstance(err, dict) else err
            acc.fail(Outcome.SERVER_ERROR, ErrorKind.SERVER, str(msg)[:500] or "an error event with no message")
            return False
        usage = obj.get("usage")
        if usage:
            acc.usage = Usage.read(usage)
        return cls._apply_choices(obj.get("choices"), acc)

    @staticmethod
    def _apply_choices(choices: Any, acc: _Acc) -> bool:
        """Fold one chunk's choices into ``acc``; True when it carried a token (text, reasoning or tool call).

        Every field is type-checked as it is read, so a hostile chunk becomes MalformedField here and never a
        TypeError later, when the record is compiled. The per-chunk fields are checked inline (a helper call per
        field cost ~1 µs a chunk, a pydantic model far more); the rarer tool-call deltas use ``wire``.
        """
        if choices is None:
            return False
        if not isinstance(choices, list):
            raise wire.wrong("choices", choices, "an array")
        if not choices:
            return False
        token = False
        choice = choices[0]
        if not isinstance(choice, dict):
            raise wire.wrong("choices[0]", choice, "an object")
        delta = choice.get("delta")
        if delta is None:
            delta = {}
        elif not isinstance(delta, dict):
            raise wire.wrong("delta", delta, "an object")
        text = delta.get("content")
        if text is not None:
            if not isinstance(text, str):
                raise wire.wrong("delta.content", text, "a string")
            if text:
                acc.content.append(text)
                token = True
        if "reasoning_content" in delta or "reasoning" in delta:
            think = wire.text(delta.get("reasoning_content"), "delta.reasoning_content") or wire.text(
                delta.get("reasoning"), "delta.reasoning"
            )
            if think:
                acc.reasoning.append(think)
                token = True
        if "tool_calls" in delta:
            token = ChatClient._apply_tool_calls(delta["tool_calls"], acc) or token
        finish = choice.get("finish_reason")
        if finish is not None:
            if not isinstance(finish, str):
                raise wire.wrong("finish_reason", finish, "a string")
            if finish:
                acc.finish_reason = finish
        return token

    @staticmethod
    def _apply_tool_calls(deltas: Any, acc: _Acc) -> bool:
        token = False
        for tc in wire.sequence(deltas, "delta.tool_calls") or ():
            tc = wire.mapping(tc, "a tool call") or {}
            index = wire.index(tc.get("index", 0), "a tool call's index", _MAX_TOOL_CALLS)
            call = acc.calls.setdefault(index, {"id": "", "name": "", "arguments": ""})
            call_id = wire.text(tc.get("id"), "a tool call's id")
            if call_id:
                call["id"] = call_id
            fn = wire.mapping(tc.get("function"), "a tool call's function") or {}
            name = wire.text(fn.get("name"), "a tool call's name")
            if name:
                call["name"] += name
            arguments = wire.text(fn.get("arguments"), "a tool call's arguments")
            if arguments:
                call["arguments"] += arguments
            token = True
        return token

    def _consume_body(self, body: bytes, acc: _Acc) -> None:
        t = self.clock.now()
        acc.t_first_byte = t
        try:
            obj = wire.mapping(wire.loads(body), "the body")
            choices = wire.sequence((obj or {}).get("choices"), "choices")
            if not obj or not choices:
                raise MalformedField("no choices")
            choice = wire.mapping(choices[0], "choices[0]") or {}
            message = wire.mapping(choice.get("message"), "message") or {}
            content = wire.text(message.get("content"), "message.content") or ""
            reasoning = wire.text(message.get("reasoning_content"), "message.reasoning_content") or wire.text(
                message.get("reasoning"), "message.reasoning"
            )
            calls: dict[int, dict[str, str]] = {}
            tool_calls = wire.sequence(message.get("tool_calls"), "message.tool_calls") or ()
            if len(tool_calls) > _MAX_TOOL_CALLS:
                raise MalformedField(f"{len(tool_calls)} tool calls")
            for i, tc in enumerate(tool_calls):
                tc = wire.mapping(tc, "a tool call") or {}
                fn = wire.mapping(tc.get("function"), "a tool call's function") or {}
                calls[i] = {
                    "id": wire.text(tc.get("id"), "a tool call's id") or "",
                    "name": wire.text(fn.get("name"), "a tool call's name") or "",
                    "arguments": wire.text(fn.get("arguments"), "a tool call's arguments") or "",
                }
            finish = wire.text(choice.get("finish_reason"), "finish_reason")
            usage = Usage.read(obj["usage"]) if obj.get("usage") else None
        except MalformedField as exc:
            acc.fail(Outcome.STREAM_ERROR, ErrorKind.MALFORMED, f"malformed response body: {exc}")
            return
        acc.t_first_token = t
        acc.done = True
        acc.content.append(content)
        acc.reasoning.append(reasoning or "")
        acc.calls = calls
        acc.finish_reason = finish
        acc.usage = usage

    def _compile(self, acc: _Acc, payload: Mapping[str, Any], ids: RequestIds, stream: bool) -> RequestRecord:
        usage = acc.usage
        cached: int | None = None
        if usage is not None:
            source = UsageSource.SERVER
            prompt = usage.prompt_tokens or 0
            completion = usage.completion_tokens or 0
            cached = usage.cached_tokens
        else:
            # No usage object: count what we can and say so. Output: one token per token-bearing chunk (exact
            # for vLLM-style servers that stream one token per chunk); prompt: characters / 4, a rough guess.
            source = UsageSource.COUNTED
            completion = len(acc.chunk_times)
            prompt = len(wire.dumps(payload.get("messages", ""))) // 4
        # A server (or a model that was shown the key) may echo a secret back in a reply: masked here, where the
        # record is made, like an error body — the record is what is written, and what the agent sends back next.
        mask = SECRETS.redact_whole
        calls = [
            ToolCallRecord(id=c["id"], name=c["name"], arguments=mask(c["arguments"]))
            for _, c in sorted(acc.calls.items())
        ]
        asked = payload.get("max_completion_tokens", payload.get("max_tokens"))
        return RequestRecord(
            ids=ids,
            model=str(payload.get("model") or ""),
            requested_tokens=asked if isinstance(asked, int) and not isinstance(asked, bool) else None,
            stream=stream,
            t_sent=acc.t_sent,
            t_headers=acc.t_headers,
            t_first_byte=acc.t_first_byte,
            t_first_token=acc.t_first_token,
            t_done=self.clock.now(),
            chunk_times=acc.chunk_times,
            prompt_tokens=prompt,
            completion_tokens=completion,
            cached_tokens=cached,
            usage_source=source,
            finish_reason=acc.finish_reason,
            content=mask("".join(acc.content)),
            reasoning=mask("".join(acc.reasoning)),
            tool_calls=calls,
            outcome=acc.outcome,
            error=acc.error,
            error_message=redact_optional(acc.error_message),  # a server's error body may echo the key
            http_status=acc.http_status,
            retry_after_s=acc.retry_after,
            keepalives=acc.keepalives,
        )
