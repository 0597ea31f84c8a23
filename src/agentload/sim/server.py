"""The simulated server's HTTP front (aiohttp.web): an OpenAI-compatible API shaped like vLLM's, or llama.cpp's.

Endpoints: ``POST /v1/chat/completions`` and ``POST /v1/completions`` (streaming SSE and not), ``GET /v1/models``,
``GET /health``, ``POST /tokenize``, ``GET /metrics``. Bad input gets an OpenAI-style JSON error with the right
status and the server keeps serving; nothing the client sends can make it print a traceback into a response.

A slot profile (``slots = N``, llama.cpp's ``-np N``) is served with llama-server's face instead (sim/llamacpp.py):
``/props``, ``/slots``, llama.cpp's own ``POST /completion``, ``llamacpp:`` metrics, ``/tokenize`` taking
``content``, ``/v1/models`` owned by ``llamacpp``, no ``/version`` (llama-server has none; ``/props`` names the
simulator in ``build_info``). ``SimConfig.api`` chooses the face explicitly.

Connections are bounded in time (a client is untrusted): ``app_runner`` closes a connection that sends no complete
request within ``idle_timeout_s`` (aiohttp's keep-alive timer, which also runs before the first request), a body
that does not arrive within ``body_timeout_s`` gets 408, and a client that goes away mid-response is one log line.
"""

from __future__ import annotations

import array
import asyncio
import ctypes
import itertools
import json
import logging
import random
import time
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from aiohttp import web

from agentload import __version__
from agentload.capacity.profile import ServingProfile
from agentload.errors import BadRequestError, ConfigError, ContextLengthError, ModelNotFoundError, RequestError
from agentload.sim import llamacpp
from agentload.sim.behaviour import Behaviour, FillerBehaviour, Piece, Turn, guarded, hold_eos, truncate
from agentload.sim.chat import (
    NO_PADS,
    ChatRequest,
    CompletionRequest,
    Message,
    TemplatePads,
    _Common,
    load_json,
    parse_body,
    render_chat,
    render_chat_parts,
)
from agentload.sim.engine import Engine, SimRequest, StepResult
from agentload.sim.faults import MIN_GAP_S, UNENDING, FaultInjector, FaultSpec
from agentload.sim.metrics import SimMetrics
from agentload.sim.runner import Delivery, EngineRunner
from agentload.sim.tokens import profile_tokenizer, token_id

log = logging.getLogger("agentload.sim")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class SimConfig:
    profile: ServingProfile
    behaviour: Behaviour = field(default_factory=FillerBehaviour)
    served_model_name: str | None = None
    cold_start_s: float = 0.0
    faults: list[FaultSpec] = field(default_factory=list)
    seed: int = 0
    # vLLM fills usage.prompt_tokens_details only with --enable-prompt-tokens-details; the simulator does by
    # default because agentload's measurements want it, and can mimic the default-off server.
    prompt_tokens_details: bool = True
    # Benchmarks of client timing: each streamed content token's text becomes the server's monotonic clock at
    # the moment it was written ("1234.567890 "), so a client on this machine can measure its own lag exactly.
    stamp_chunks: bool = False
    # uvicorn (vLLM's server) closes idle keep-alive connections after 5 s; aiohttp's AppRunner default is an hour,
    # which let 1,000 idle or half-sent connections pile up. Long enough for an agent's think time between turns.
    idle_timeout_s: float = 15.0
    body_timeout_s: float = 30.0
    # Whose API the server mimics: "auto" is llama.cpp's for a slot profile (llama-server -np N), vLLM's otherwise.
    api: Literal["auto", "vllm", "llamacpp"] = "auto"
    # A body larger than this gets 413 before it is read whole. vLLM (uvicorn) sets no such limit and refuses a
    # huge prompt only once parsed, by its context length (400); this bound only keeps the simulator's own memory
    # finite, well above any prompt a profile's context admits.
    max_body_bytes: int = 64 * 2**20


def with_max_model_len(profile: ServingProfile, max_model_len: int) -> ServingProfile:
    """The profile served at another --max-model-len (the pool stays; one request must still fit in it)."""
    if max_model_len <= 0:
        raise ConfigError("--max-model-len must be positive")
    need = profile.layout.blocks_per_request(max_model_len)
    if need > profile.num_blocks:
        raise ConfigError(
            f"--max-model-len {max_model_len} needs {need} KV blocks per request but the pool has "
            f"{profile.num_blocks}; lower it"
        )
    return replace(profile, max_model_len=max_model_len)


def error_body(status: int, message: str, err_type: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": err_type, "param": param, "code": status}}


def error_response(status: int, message: str, err_type: str, param: str | None = None) -> web.Response:
    return web.json_response(error_body(status, message, err_type, param), status=status)


# glibc's M_MMAP_THRESHOLD (malloc.h): allocations from this size up get pages of their own, returned when freed.
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 2**20


def _pin_mmap_threshold() -> None:
    """Keep large allocations out of the heap, so the memory of a large request body goes back to the system.

    glibc raises its mmap threshold to the size of the largest mapped block freed (up to 32 MiB) and its trim
    threshold to twice that: after one 20 MB body, the next body's buffers came from the heap and about 40 MB of
    freed heap stayed resident for good (the server grew from 125 to 170 MB on 20 MB bodies it refused). Setting
    the threshold turns that adjustment off. Process-wide, so it is set where the simulator serves HTTP (its own
    process, or the one ``agentload run`` embeds it in), never by the in-process transport. Other C libraries
    have no ``mallopt`` (macOS) or ignore it (musl): nothing to do there.
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)


# What the token cache may hold (texts and their ids): every live conversation of 256 agents at 40k tokens is
# about 100 MB of it, and a bound keeps a stream of distinct prompts from growing the server without end.
TOKEN_CACHE_BYTES = 192 * 2**20


def _cached_size(part: str, ids: array.array[int]) -> int:
    return len(part) + ids.itemsize * len(ids)


class ResetConnection(Exception):
    """Raised by a response body to make the transport drop the connection (the reset fault)."""


@dataclass
class SimResponse:
    """A response independent of the transport: status, headers, and the body as it is produced."""

    status: int
    headers: dict[str, str]
    body: AsyncGenerator[bytes, None]

    @classmethod
    def error(
        cls, status: int, message: str, err_type: str, param: str | None = None, headers: dict[str, str] | None = None
    ) -> SimResponse:
        return cls(
            status,
            {"Content-Type": "application/json", **(headers or {})},
            _once(json.dumps(error_body(status, message, err_type, param)).encode()),
        )


async def _once(data: bytes) -> AsyncGenerator[bytes, None]:
    yield data


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except RequestError as exc:
        return error_response(exc.status, str(exc), type(exc).__name__, exc.param)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_response(exc.status, exc.reason, type(exc).__name__)
    except (ConnectionResetError, asyncio.CancelledError):
        raise
    except Exception:
        log.exception("internal error while serving %s %s", request.method, request.path)
        return error_response(500, "internal error in the simulated server", "InternalServerError")


class SimServer:
    """One simulated server: engine, its real-time runner, metrics, behaviour and faults."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.profile = config.profile
        self.model_name = config.served_model_name or config.profile.served_model_name
        self._aliases = {self.model_name, config.profile.model.name, config.profile.name}
        self.engine = Engine(config.profile)
        self.metrics = SimMetrics(self.engine, config.profile, self.model_name)
        api = config.api
        if api == "llamacpp" and not config.profile.slots:
            raise ConfigError(f"profile {config.profile.name} has no slots: llama.cpp's API needs `slots = N`")
        self.llamacpp = api == "llamacpp" or (api == "auto" and config.profile.slots is not None)
        self.llama_metrics = llamacpp.LlamaCppMetrics(self.engine) if self.llamacpp else None
        self._asked: dict[str, llamacpp.Asked] = {}  # request id → what it asked for (llama.cpp's /slots params)
        self.runner = EngineRunner(self.engine, cold_start_s=config.cold_start_s, on_step=self._on_step)
        self.faults = FaultInjector(config.faults, seed=config.seed)
        self.behaviour = guarded(config.behaviour)  # no reply may become an HTTP 500, whatever a client sends
        self._ids = itertools.count(1)
        # The profile's tokenizer: the word granularity calibrated from a real server's, else the BPE model.
        self.tokenizer = profile_tokenizer(config.profile)
        # ... and its chat template's cost, where calibration counted it (else the simulator's own ChatML).
        template = config.profile.chat_template
        self.pads = NO_PADS if template is None else TemplatePads.fit(*template, plain=self.tokenizer.plain)
        self._token_cache: OrderedDict[str, array.array[int]] = OrderedDict()
        self._token_cache_bytes = 0
        self._created = int(time.time())

    # -- lifecycle ------------------------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(middlewares=[_errors], client_max_size=self.config.max_body_bytes)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_get("/metrics", self.metrics_endpoint)
        if self.llamacpp:
            app.router.add_get("/props", self.props)
            app.router.add_get("/slots", self.slots)
            app.router.add_post("/completion", self.native_completion)
            app.router.add_post("/completions", self.native_completion)
        else:
            app.router.add_get("/version", self.version)
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)
        return app

    def app_runner(self) -> web.AppRunner:
        """An AppRunner for ``app()`` with the connection limits of this config (no access log, no signals).

        A handler is cancelled when its client goes away (aiohttp's default is to let it run on): a response that
        never writes (a stall, the unending faults on a request that is not streamed) would otherwise hold its
        task and its engine request until it ended by itself, or forever.
        """
        return web.AppRunner(self.app(), access_log=None, handle_signals=False,
                             keepalive_timeout=self.config.idle_timeout_s, handler_cancellation=True)  # fmt: skip

    async def _read_body(self, request: web.Request) -> bytes:
        try:
            async with asyncio.timeout(self.config.body_timeout_s):
                return await request.read()
        except TimeoutError:
            raise web.HTTPRequestTimeout(reason="the request body did not arrive in time") from None

    async def _start(self, _app: web.Application) -> None:
        _pin_mmap_threshold()
        await self.runner.start()

    async def _stop(self, _app: web.Application) -> None:
        await self.runner.stop()

    def _on_step(self, result: StepResult) -> None:
        m = self.metrics
        end = result.end
        for req in result.emitted:
            d = req.handle
            if not isinstance(d, Delivery):
                continue
            if d.last_token_at is None:
                m.observe_first_token(req)
            else:
                m.observe_token(end - d.last_token_at)
            d.last_token_at = end
        for req in result.finished:
            m.observe_finished(req)
        if self.llama_metrics is not None:
            self.llama_metrics.on_step(result)

    # -- small endpoints ------------------------------------------------------------------------------------
    async def health(self, _request: web.Request) -> web.Response:
        if self.llamacpp:
            ready = self.runner.is_ready
            body = llamacpp.HEALTH_OK if ready else llamacpp.HEALTH_LOADING
            return web.json_response(body, status=200 if ready else 503)
        if not self.runner.is_ready:
            return error_response(503, "the server is still starting (loading the model)", "ServiceUnavailable")
        return web.Response(status=200)

    async def props(self, _request: web.Request) -> web.Response:
        build = f"agentload-sim {__version__} (llama.cpp slot mode)"
        return web.json_response(llamacpp.props(self.profile, self.model_name, build))

    def slot_states(self) -> list[dict[str, Any]]:
        """llama.cpp's ``/slots`` body (a slot profile only)."""
        return llamacpp.slots(self.engine, self.profile, self._asked)

    async def slots(self, request: web.Request) -> web.Response:
        body = self.slot_states()
        if request.query.get("fail_on_no_slot") and all(s["is_processing"] for s in body):
            return web.json_response(
                {"error": {"code": 503, "message": "no slot available", "type": "unavailable_error"}}, status=503
            )
        return web.json_response(body)

    async def version(self, _request: web.Request) -> web.Response:
        return web.json_response({"version": f"agentload-sim {__version__}"})

    async def models(self, _request: web.Request) -> web.Response:
        if self.llamacpp:
            return web.json_response(llamacpp.models(self.profile, self.model_name, self._created))
        card = {
            "id": self.model_name,
            "object": "model",
            "created": self._created,
            "owned_by": "agentload-sim",
            "root": self.model_name,
            "parent": None,
            "max_model_len": self.profile.max_model_len,
        }
        return web.json_response({"object": "list", "data": [card]})

    async def metrics_endpoint(self, _request: web.Request) -> web.Response:
        if self.llama_metrics is not None:
            return web.Response(
                body=self.llama_metrics.exposition(), headers={"Content-Type": llamacpp.METRICS_CONTENT_TYPE}
            )
        body = self.metrics.exposition()
        return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    async def tokenize(self, request: web.Request) -> web.Response:
        return web.json_response(self.tokenize_body(await self._read_body(request)))

    def tokenize_body(self, raw: bytes) -> dict[str, Any]:
        """``POST /tokenize``'s answer: vLLM's (``prompt`` or ``messages``), or llama.cpp's (``content``)."""
        data = load_json(raw)
        if not isinstance(data, dict):
            raise BadRequestError("request body must be a JSON object")
        if self.llamacpp and "content" in data:
            # llama.cpp's /tokenize: {"content": text, "with_pieces": bool} → {"tokens": [...]}.
            if not isinstance(data["content"], str):
                raise BadRequestError("'content' must be a string", param="content")
            if data.get("with_pieces") is True:
                return {"tokens": [{"id": t, "piece": piece} for t, piece in self.tokenizer.tokenize_pieces(
                    data["content"])]}  # fmt: skip
            return {"tokens": self.tokenizer.tokenize(data["content"])}
        if "messages" in data:
            chat = parse_body(ChatRequest, raw)
            text = render_chat(chat, self.pads)
        elif isinstance(data.get("prompt"), str):
            text = data["prompt"]
        else:
            raise BadRequestError("send 'prompt' (a string) or 'messages'", param="prompt")
        ids = self.tokenizer.tokenize(text)
        return {"count": len(ids), "max_model_len": self.profile.max_model_len, "tokens": ids}

    # -- generation -----------------------------------------------------------------------------------------
    def _check_model(self, body: _Common) -> None:
        if body.model is not None and body.model not in self._aliases:
            raise ModelNotFoundError(f"The model `{body.model}` does not exist.", param="model")

    def _tokenize_parts(self, parts: list[str]) -> list[int]:
        """Tokens of the joined parts, each part's tokens cached: agents resend their whole conversation every
        turn, and re-tokenizing 40k-token prompts dominated the simulator's CPU time."""
        cache = self._token_cache
        out: list[int] = []
        for part in parts:
            kept = cache.get(part)
            if kept is None:
                ids = self.tokenizer.tokenize(part)
                out.extend(ids)
                # Short parts are cheaper to tokenize than to keep; a part longer than the context can be in no
                # prompt the server accepts (a 20 MB body is refused), and keeping it held its text and a list of
                # millions of ints for the life of the server.
                if len(part) > 256 and len(ids) <= self.profile.max_model_len:
                    kept = array.array("I", ids)  # 4 bytes a token, where a list of ints takes 36
                    cache[part] = kept
                    self._token_cache_bytes += _cached_size(part, kept)
                    while self._token_cache_bytes > TOKEN_CACHE_BYTES or len(cache) > 8192:
                        old_part, old_ids = cache.popitem(last=False)
                        self._token_cache_bytes -= _cached_size(old_part, old_ids)
            else:
                cache.move_to_end(part)
                out.extend(kept)
        return out

    def _plan(
        self, body: _Common, prompt_parts: list[str], turn_messages: list[Message], chat: ChatRequest | None
    ) -> tuple[SimRequest, list[Piece], bool]:
        """Tokenize the prompt, check its length, ask the behaviour for a reply, and build the engine request."""
        prompt = self._tokenize_parts(prompt_parts)
        limit = self.profile.max_model_len
        asked = body.output_limit
        if self.llamacpp:
            # llama.cpp's own name for the limit wins over max_tokens (params_from_json); -1 is no limit.
            n_predict = (body.model_extra or {}).get("n_predict")
            if isinstance(n_predict, int) and not isinstance(n_predict, bool) and n_predict != 0:
                asked = n_predict if n_predict > 0 else None
            if len(prompt) + (asked or 1) > limit:
                raise ContextLengthError(
                    f"request ({len(prompt) + (asked or 0)} tokens) exceeds the available context size ({limit} "
                    "tokens), try increasing it",
                    param="messages" if chat is not None else "prompt",
                )
        if len(prompt) + (asked or 1) > limit:
            raise ContextLengthError(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{len(prompt) + (asked or 0)} tokens ({len(prompt)} in the messages, {asked or 0} in the "
                "completion). Please reduce the length of the messages or completion.",
                param="messages" if chat is not None else "prompt",
            )
        n = next(self._ids)
        rng = random.Random(body.seed if body.seed is not None else (self.config.seed << 32) ^ n)
        turn = Turn(
            messages=turn_messages,
            tools=list(chat.tools or []) if chat else [],
            tool_choice=chat.tool_choice if chat else None,
            max_tokens=asked,
            max_output=limit - len(prompt),
            rng=rng,
        )
        pieces = self.behaviour.reply(turn).pieces() or [Piece("content", " ")]
        cap = min(asked or limit, limit - len(prompt))
        # ignore_eos runs to the cap; min_tokens holds the end back until that many (vLLM's sampling params).
        held = cap if body.ignore_eos else min(body.min_tokens, cap)
        pieces = hold_eos(pieces, held, rng)
        pieces, cut = truncate(pieces, cap)
        output = self._output_ids(pieces)
        if len(output) > cap:  # a tool call's markup made it longer than the cap: cut where the cap falls
            output = output[:cap]
            pieces, cut = _cut_pieces(pieces, self._piece_lengths(pieces), cap), True
        # Reaching the cap is a "length" finish even when the reply fit exactly, as vLLM reports max_tokens.
        cut = cut or len(output) >= cap
        req = SimRequest(f"req-{n}", prompt, output, arrival=self.runner.clock.now())
        req.finish_reason = (
            "length" if cut else ("tool_calls" if any(p.kind == "call_start" for p in pieces) else "stop")
        )
        if self.llamacpp:
            self._asked[req.request_id] = llamacpp.Asked(asked or -1, bool(body.stream), bool(body.ignore_eos))
            req.id_slot = llamacpp.id_slot((body.model_extra or {}).get("id_slot"))
        return req, pieces, cut

    def _piece_lengths(self, pieces: list[Piece]) -> list[int]:
        return [len(ids) for ids in self._piece_ids(pieces)]

    def _piece_ids(self, pieces: list[Piece]) -> list[list[int]]:
        """The tokens the model generates for each piece: a text piece is one token (its text is one of the
        tokenizer's), a tool call's start is its serialized opening and name as the tokenizer counts them (the end
        of the call before it first, where one was), and the last call's end is counted with its last piece."""
        out: list[list[int]] = []
        calls = 0
        for p in pieces:
            if p.kind == "call_start":
                text = (_CALL_END + "\n" if calls else "") + p.text
                out.append(self.tokenizer.tokenize(text))
                calls += 1
            else:
                out.append([token_id(p.text)])
        if calls and out:
            out[-1] = out[-1] + self.tokenizer.tokenize(_CALL_END)
        return out

    def _output_ids(self, pieces: list[Piece]) -> list[int]:
        return [t for ids in self._piece_ids(pieces) for t in ids]

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._send(request, await self.open_generation(await self._read_body(request), chat=True))

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._send(request, await self.open_generation(await self._read_body(request), chat=False))

    async def native_completion(self, request: web.Request) -> web.StreamResponse:
        """llama.cpp's own ``POST /completion``: ``prompt``, ``n_predict``, ``stream``, ``ignore_eos``."""
        return await self._send(request, await self.open_native(await self._read_body(request)))

    async def open_native(self, raw: bytes) -> SimResponse:
        """``open_generation`` for a llama.cpp ``/completion`` body, answered in llama.cpp's format."""
        return await self._open(_native_body(raw), chat=False, native=True)

    async def _send(self, request: web.Request, sim: SimResponse) -> web.StreamResponse:
        """Write a SimResponse over HTTP; a ResetConnection from its body aborts the TCP connection.

        A client that hangs up mid-response is routine under load (stop rules, watchdog cancels): one line at INFO,
        where aiohttp would log the ConnectionResetError's whole traceback at ERROR.
        """
        resp = web.StreamResponse(status=sim.status, headers=sim.headers)
        try:
            await resp.prepare(request)
            async for block in sim.body:
                await resp.write(block)
            await resp.write_eof()
        except ResetConnection:
            if request.transport is not None:
                request.transport.abort()
        except ConnectionResetError:
            log.info("the client went away during %s %s; the request was aborted", request.method, request.path)
        except asyncio.CancelledError:
            if request.transport is None or request.transport.is_closing():  # cancelled because the client left
                log.info("the client went away during %s %s; the request was aborted", request.method, request.path)
            raise
        finally:
            await sim.body.aclose()
        return resp

    # -- the transport-neutral API (HTTP above; sim.inprocess calls it without sockets) ----------------------
    async def open_generation(self, raw: bytes, *, chat: bool) -> SimResponse:
        """Validate a chat / completion body and start generating; returns once the response would begin.

        Raises RequestError for bad input (the caller turns it into an OpenAI-style error response). A cold
        server returns only when it is ready: until then the client receives nothing at all.
        """
        return await self._open(raw, chat=chat, native=False)

    async def _open(self, raw: bytes, *, chat: bool, native: bool) -> SimResponse:
        """``open_generation``; ``native`` answers in llama.cpp's ``/completion`` format instead of OpenAI's."""
        if chat:
            cbody: ChatRequest = parse_body(ChatRequest, raw)
            body: _Common = cbody
            self._check_model(body)
            req, pieces, _ = self._plan(body, render_chat_parts(cbody, self.pads), cbody.messages, cbody)
        else:
            pbody: CompletionRequest = parse_body(CompletionRequest, raw)
            body = pbody
            self._check_model(body)
            text = pbody.prompt_text()
            req, pieces, _ = self._plan(body, [text], [Message(role="user", content=text)], None)
        await self.runner.ready.wait()
        fault = self.faults.draw()
        if fault is not None and fault.kind in ("http500", "http503", "http429"):
            return self._fault_response(fault)
        if fault is not None and fault.kind == "comments":
            # The request never reaches the engine: something in front of it keeps the connection warm.
            if not body.stream:
                return SimResponse(200, {"Content-Type": "application/json"}, _never())
            return SimResponse(200, {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"},
                               _pings(fault.seconds))  # fmt: skip
        overhead = self.profile.coefficients.api_overhead_s
        if overhead > 0:
            await asyncio.sleep(overhead)
        req.arrival = self.runner.clock.now()
        delivery = self.runner.submit(req)
        if native:
            text = pbody.prompt_text()
            gen = self._native(req, pieces, delivery, fault, text, stream=bool(body.stream))
            headers = {"Content-Type": "text/event-stream" if body.stream else "application/json"}
        elif body.stream:
            gen = self._stream(body, req, pieces, delivery, fault, chat=chat)
            headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        else:
            gen = self._complete(req, pieces, delivery, fault, chat=chat)
            headers = {"Content-Type": "application/json"}
        return SimResponse(200, headers, self._abort_unfinished(gen, req))

    async def _abort_unfinished(self, gen: AsyncIterator[bytes], req: SimRequest) -> AsyncGenerator[bytes, None]:
        """Pass the body through; if the client goes away first, take the request out of the engine."""
        try:
            async for block in gen:
                yield block
        finally:
            if req.finished_at is None:
                self.runner.abort(req)
            if self.llama_metrics is not None:
                # Counted when the response ends (finished or aborted: llama.cpp counts an aborted task's tokens
                # too), not in the engine's step callback, which can run after the client already has its reply.
                self.llama_metrics.on_finished(req)
            if self._asked:
                # Keep what a request asked while it waits for a slot or runs, and while a slot still shows it as
                # its current or last task; forget it after that.
                shown = {v.task.request_id for v in self.engine.slots.view() if isinstance(v.task, SimRequest)} if (
                    self.engine.slots is not None) else set()  # fmt: skip
                shown |= {r.request_id for r in (*self.engine.waiting, *self.engine.running)}
                for rid in [r for r in self._asked if r not in shown and r != req.request_id]:
                    del self._asked[rid]

    def _fault_response(self, fault: FaultSpec) -> SimResponse:
        if fault.kind == "http429":
            return SimResponse.error(429, "rate limited (injected fault)", "RateLimitError",
                                     headers={"Retry-After": f"{fault.seconds:g}"})  # fmt: skip
        if fault.kind == "http503":
            return SimResponse.error(503, "service unavailable (injected fault)", "ServiceUnavailable")
        return SimResponse.error(500, "internal server error (injected fault)", "InternalServerError")

    def _usage(self, req: SimRequest, completion_tokens: int) -> dict[str, Any]:
        usage: dict[str, Any] = {
            "prompt_tokens": req.prompt_len,
            "total_tokens": req.prompt_len + completion_tokens,
            "completion_tokens": completion_tokens,
            "prompt_tokens_details": None,
        }
        if self.config.prompt_tokens_details:
            usage["prompt_tokens_details"] = {"cached_tokens": req.cached_tokens or 0}
        return usage

    async def _complete(
        self, req: SimRequest, pieces: list[Piece], delivery: Delivery, fault: FaultSpec | None, *, chat: bool
    ) -> AsyncIterator[bytes]:
        while req.finished_at is None and req.finish_reason != "abort":
            await delivery.event.wait()
            delivery.event.clear()
        if fault is not None:
            if fault.kind == "stall":
                await asyncio.sleep(fault.seconds)
            elif fault.kind == "reset":
                raise ResetConnection
            elif fault.kind == "malformed":
                yield b'{"id": "truncated'
                return
            elif fault.kind in UNENDING:
                async for block in _never():  # a body that is never complete: nothing of it is sent
                    yield block
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{req.request_id}"
        finish = req.finish_reason or "stop"
        if chat:
            content = "".join(p.text for p in pieces if p.kind == "content")
            calls = _assemble_calls(pieces, req.request_id)
            message: dict[str, Any] = {"role": "assistant", "content": content or None, "tool_calls": calls}
            choice: dict[str, Any] = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
            obj = "chat.completion"
        else:
            text = "".join(p.text for p in pieces)
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
            obj = "text_completion"
        payload = {
            "id": rid,
            "object": obj,
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [choice],
            "usage": self._usage(req, len(req.output)),
        }
        yield json.dumps(payload).encode()

    async def _native(
        self,
        req: SimRequest,
        pieces: list[Piece],
        delivery: Delivery,
        fault: FaultSpec | None,
        prompt: str,
        *,
        stream: bool,
    ) -> AsyncIterator[bytes]:
        """llama.cpp's ``/completion`` reply: one final object, or SSE events of one token each then the final one
        (no ``[DONE]``), as the recorded llama-server sends them."""

        def event(sent: int, piece: Piece) -> str | None:
            if not stream:
                return None
            body = {"index": 0, "content": piece.text, "tokens": [token_id(piece.text)], "stop": False, "id_slot": -1,
                    "tokens_predicted": sent + 1, "tokens_evaluated": req.prompt_len}  # fmt: skip
            return f"data: {json.dumps(body)}\n\n"

        # A malformed fault ends the reply there (llama.cpp's format has no way to go on after a broken event).
        broken = b'data: {"index":0,"content": \n\n' if stream else b'{"index": 0, "content'
        pacing = _Pacing()
        async for block in self._paced(req, pieces, delivery, fault, event, broken, pacing, end_on_malformed=True):
            yield block
        if pacing.broken:
            return
        n = req.num_output
        cached = req.cached_tokens or 0
        start = req.first_scheduled if req.first_scheduled is not None else req.arrival
        first = req.first_token if req.first_token is not None else start
        end = req.finished_at if req.finished_at is not None else first
        prompt_ms, predicted_ms = (first - start) * 1e3, (end - first) * 1e3
        ask = self._asked.get(req.request_id)
        settings = dict(llamacpp.DEFAULT_PARAMS)
        if ask is not None:
            settings.update(n_predict=ask.n_predict, max_tokens=ask.n_predict, stream=stream, ignore_eos=ask.ignore_eos)
        final = {
            "index": 0,
            "content": "" if stream else "".join(p.text for p in pieces),
            "tokens": [],
            "id_slot": llamacpp.slot_of(self.engine, req),
            "stop": True,
            "model": self.model_name,
            "tokens_predicted": n,
            "tokens_evaluated": req.prompt_len,
            "generation_settings": settings,
            "prompt": prompt,
            "has_new_line": False,
            "truncated": False,
            "stop_type": "limit" if req.finish_reason == "length" else "eos",
            "stopping_word": "",
            "tokens_cached": req.prompt_len + max(0, n - 1),  # the last token is sampled, never decoded
            "timings": {
                "cache_n": cached,
                "prompt_n": req.prompt_len - cached,
                "prompt_ms": prompt_ms,
                "prompt_per_token_ms": prompt_ms / max(1, req.prompt_len - cached),
                "prompt_per_second": (req.prompt_len - cached) / (prompt_ms / 1e3) if prompt_ms > 0 else 0.0,
                "predicted_n": n,
                "predicted_ms": predicted_ms,
                "predicted_per_token_ms": predicted_ms / max(1, n),
                "predicted_per_second": n / (predicted_ms / 1e3) if predicted_ms > 0 else 0.0,
            },
        }
        yield (f"data: {json.dumps(final)}\n\n" if stream else json.dumps(final)).encode()

    async def _paced(
        self,
        req: SimRequest,
        pieces: list[Piece],
        delivery: Delivery,
        fault: FaultSpec | None,
        render: Callable[[int, Piece], str | None],
        broken: bytes,
        pacing: _Pacing,
        *,
        end_on_malformed: bool,
    ) -> AsyncIterator[bytes]:
        """The pieces as the engine makes them, ``render``ed (piece index, piece), with the request's fault struck
        at its point: a stall sleeps, a reset drops the connection, a malformed one sends ``broken`` (and, with
        ``end_on_malformed``, ends there: ``pacing.broken``), comments_mid sends only comment lines from there on.
        Ends when the request finishes or is aborted; with the endless fault, never (more tokens follow the reply).
        """
        sent = 0
        endless = fault is not None and fault.kind == "endless"
        strike = self.faults.mid_stream_point(len(pieces)) if fault is not None and not endless else -1
        while True:
            await delivery.event.wait()
            delivery.event.clear()
            out: list[str] = []
            # Re-read the engine's progress every token: a stall fault sleeps inside this loop, and tokens made
            # meanwhile must still be sent before the stream ends.
            while sent < min(req.num_output, len(pieces)):
                if sent == strike and fault is not None:
                    if out:
                        yield "".join(out).encode()
                        out = []
                    if fault.kind == "stall":
                        await asyncio.sleep(fault.seconds)
                    elif fault.kind == "reset":
                        raise ResetConnection
                    elif fault.kind == "comments_mid":
                        async for block in _pings(fault.seconds):
                            yield block
                    elif fault.kind == "malformed":
                        if end_on_malformed:
                            pacing.broken = True
                            yield broken
                            return
                        out.append(broken.decode())
                    fault = None
                text = render(sent, pieces[sent])
                sent += 1
                if text is not None:
                    out.append(text)
            if out:
                yield "".join(out).encode()
            if req.finished_at is not None or req.finish_reason == "abort":
                break
        if endless and req.finish_reason != "abort":
            async for block in self._endless(req, render, sent, fault):
                yield block

    async def _endless(
        self, req: SimRequest, render: Callable[[int, Piece], str | None], sent: int, fault: FaultSpec | None
    ) -> AsyncIterator[bytes]:
        """Content tokens after the reply, forever: at the fault's period, or at the pace the engine gave this
        request (its mean gap between tokens), a model that never samples its end. The engine has let the request
        go: this load is the stream's alone, the server's counters no longer see it."""
        gap = fault.seconds if fault is not None else 0.0
        if gap <= 0 and req.first_token is not None and req.finished_at is not None and req.num_output > 1:
            gap = (req.finished_at - req.first_token) / (req.num_output - 1)
        gap = max(MIN_GAP_S, gap if gap > 0 else _ENDLESS_GAP_S)
        words = itertools.cycle(_ENDLESS_WORDS)
        while True:
            await asyncio.sleep(gap)
            text = render(sent, Piece("content", next(words)))
            sent += 1
            if text is not None:
                yield text.encode()

    async def _stream(
        self,
        body: _Common,
        req: SimRequest,
        pieces: list[Piece],
        delivery: Delivery,
        fault: FaultSpec | None,
        *,
        chat: bool,
    ) -> AsyncIterator[bytes]:
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{req.request_id}"
        obj = "chat.completion.chunk" if chat else "text_completion"
        head = (
            f'data: {{"id":"{rid}","object":"{obj}","created":{int(time.time())},'
            f'"model":{json.dumps(self.model_name)},"choices":['
        )
        if chat:
            # vLLM sends the role at once; with a long prefill the stream then stays silent (docs/background.md §3).
            yield (head + '{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,'
                   '"finish_reason":null}]}\n\n').encode()  # fmt: skip
        stamp = self.config.stamp_chunks
        calls_started: set[int] = set()

        def chunk(_sent: int, piece: Piece) -> str:
            if stamp and piece.kind == "content":
                piece = Piece("content", f"{time.monotonic():.6f} ")
            return head + _delta(piece, chat, req.request_id, calls_started) + "]}\n\n"

        broken = b'data: {"id": "broken", "choices": [{"delta": \n\n'
        async for block in self._paced(req, pieces, delivery, fault, chunk, broken, _Pacing(), end_on_malformed=False):
            yield block
        finish = req.finish_reason or "stop"
        tail = [
            head + (f'{{"index":0,"delta":{{}},"logprobs":null,"finish_reason":"{finish}"}}' if chat else
                    f'{{"index":0,"text":"","logprobs":null,"finish_reason":"{finish}"}}') + "]}\n\n"
        ]  # fmt: skip
        if body.include_usage:
            usage = json.dumps(self._usage(req, len(req.output)))
            tail.append(head + f'],"usage":{usage}}}\n\n')
        tail.append("data: [DONE]\n\n")
        yield "".join(tail).encode()


_ENDLESS_WORDS = ("and", " then", " again", ",", " once", " more", " ")
_ENDLESS_GAP_S = 0.02  # a decode step, where the request gave no pace of its own (a one-token reply)
_PING = b": ping\n\n"


async def _pings(period_s: float) -> AsyncGenerator[bytes, None]:
    """SSE comment lines, the first at once and then one every ``period_s``, until the client goes away."""
    while True:
        yield _PING
        await asyncio.sleep(max(MIN_GAP_S, period_s))


async def _never() -> AsyncGenerator[bytes, None]:
    """A body that never comes, until the client goes away (a future nobody completes: no timer, so a
    virtual-time loop is not made to run its clock to infinity)."""
    await asyncio.get_running_loop().create_future()
    yield b""  # unreachable: makes this an async generator


class _Pacing:
    """What ``SimServer._paced`` tells its caller after the last piece: whether a malformed fault ended the reply."""

    broken = False


def _native_body(raw: bytes) -> bytes:
    """A llama.cpp ``/completion`` body as the completions request the simulator parses (the fields it honours)."""
    data = load_json(raw)
    if not isinstance(data, dict):
        raise BadRequestError("request body must be a JSON object")
    if "prompt" not in data:
        raise BadRequestError("key 'prompt' not found", param="prompt")
    if not isinstance(data["prompt"], str):
        raise BadRequestError("the simulator takes a text prompt", param="prompt")
    honoured = ("prompt", "n_predict", "max_tokens", "stream", "ignore_eos", "seed", "id_slot")
    kept = {k: data[k] for k in honoured if k in data}
    return json.dumps(kept).encode()


def _delta(piece: Piece, chat: bool, request_id: str, started: set[int]) -> str:
    """One SSE choice object (without the closing brackets) for one generated token."""
    if not chat:
        return f'{{"index":0,"text":{json.dumps(piece.text)},"logprobs":null,"finish_reason":null}}'
    if piece.kind == "content":
        return f'{{"index":0,"delta":{{"content":{json.dumps(piece.text)}}},"logprobs":null,"finish_reason":null}}'
    i = piece.call_index
    if piece.kind == "call_start":
        started.add(i)
        call = (
            f'{{"index":{i},"id":"call_{request_id}_{i}","type":"function",'
            f'"function":{{"name":{json.dumps(piece.name)},"arguments":""}}}}'
        )
    else:
        call = f'{{"index":{i},"function":{{"arguments":{json.dumps(piece.text)}}}}}'
    return f'{{"index":0,"delta":{{"tool_calls":[{call}]}},"logprobs":null,"finish_reason":null}}'


# What closes a tool call after its arguments (sim.chat.render_tool_call): generated, though no client sees it.
_CALL_END = "}\n</tool_call>"


def _cut_pieces(pieces: list[Piece], lengths: list[int], cap: int) -> list[Piece]:
    """The pieces whose tokens all fit in ``cap`` (at least the first: a call's start is never lost)."""
    total, kept = 0, 0
    for n in lengths:
        if total + n > cap and kept:
            break
        total += n
        kept += 1
    return pieces[:kept]


def _assemble_calls(pieces: list[Piece], request_id: str) -> list[dict[str, Any]] | None:
    calls: dict[int, dict[str, Any]] = {}
    for p in pieces:
        if p.kind == "call_start":
            calls[p.call_index] = {
                "id": f"call_{request_id}_{p.call_index}",
                "type": "function",
                "function": {"name": p.name, "arguments": ""},
            }
        elif p.kind == "call_args" and p.call_index in calls:
            calls[p.call_index]["function"]["arguments"] += p.text
    return [calls[i] for i in sorted(calls)] or None
