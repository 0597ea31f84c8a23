"""Read what a server says about itself, and time streamed completions against it.

* ``/metrics`` is parsed with prometheus_client's own text parser into plain samples, plus a small normalised view
  (running, waiting, KV usage, token and cache counters) that means the same on vLLM, SGLang and llama.cpp
  (docs/background.md §3-4).
* The KV pool is read from the engine, never estimated: vLLM's ``vllm:cache_config_info`` labels
  ``num_gpu_blocks`` and ``block_size`` (the simulator emits them exactly as vLLM does); SGLang's
  ``max_total_num_tokens`` and ``page_size`` from ``/get_server_info`` (``/server_info`` on newer versions);
  llama.cpp's ``/props`` (``total_slots`` × per-slot ``n_ctx``). A server that offers none of these gets one error
  naming what it lacks.
* ``/v1/models`` gives the served model id and, on vLLM and the simulator, ``max_model_len``.
* Every figure is checked where it is read (a server is untrusted input): a NaN / infinite / negative gauge is left out
  of the normalised view, a line of garbage in /metrics costs that line only, and a pool figure that is missing, of the
  wrong type or impossible (a page larger than the pool, ``total_slots: -4``) is one ``ServerCapabilityError`` sentence
  naming it, never a pydantic or arithmetic error.
* ``ServerProbe.stream_completion`` times one streamed ``/v1/completions`` request chunk by chunk (what
  calibration measures). It is deliberately minimal; the fleet's streaming client should take it over.

``ServerProbe`` sends through the ``Transport`` seam like every other component (no HTTP session of its own), so
calibration signs its requests the same way and can run against the simulator in process. The transport's errors
never leave this module: they become the ``EndpointError`` branch of ``agentload.errors`` (the error classes are
re-exported here for callers).
Server-info bodies can carry secrets (SGLang echoes its own API key), so only the numbers needed are taken from
them and no body is ever quoted in an error.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import aclosing, contextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel, ConfigDict, Field
from yarl import URL

from agentload.endpoint.redact import redact_url
from agentload.endpoint.transport import (
    AiohttpTransport,
    ConnectFailed,
    MalformedResponse,
    Transport,
    TransportError,
    get,
    refused,
    signed_transport,
)
from agentload.endpoint.wire import MAX_TOKENS, MalformedField, loads
from agentload.errors import (
    ConfigError,
    EndpointError,
    EndpointResponseError,
    EndpointTimeoutError,
    EndpointUnreachableError,
    ServerCapabilityError,
)

__all__ = [
    "EndpointError",
    "EndpointResponseError",
    "EndpointTimeoutError",
    "EndpointUnreachableError",
    "MetricsSnapshot",
    "Sample",
    "ServedModel",
    "ServerCapabilityError",
    "ServerPool",
    "ServerProbe",
    "StopRule",
    "StreamTiming",
    "base_url",
    "parse_metrics",
]


# -- what a server says ---------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Sample:
    """One Prometheus sample: the exposed name (counters keep ``_total``), its labels and value."""

    name: str
    labels: Mapping[str, str]
    value: float


# Engine-agnostic names → each engine's sample name (docs/background.md §3-4). vLLM's KV gauge was gpu_cache_usage_perc
# before the V1 engine renamed it.
_NORMALISED: dict[str, dict[str, tuple[str, ...]]] = {
    "vllm": {
        "running": ("vllm:num_requests_running",),
        "waiting": ("vllm:num_requests_waiting",),
        "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        "prompt_tokens": ("vllm:prompt_tokens_total",),
        "generation_tokens": ("vllm:generation_tokens_total",),
        "prefix_queries": ("vllm:prefix_cache_queries_total",),
        "prefix_hits": ("vllm:prefix_cache_hits_total",),
        "preemptions": ("vllm:num_preemptions_total",),
        # A KV connector's tier (vLLM's native CPU offloading, LMCache): prompt tokens it was asked for and the
        # ones it loaded instead of their being recomputed, counted apart from the GPU prefix cache's. An LMCache
        # build that exports only its own counters into vLLM's /metrics gives its hit tokens.
        "external_queries": ("vllm:external_prefix_cache_queries_total",),
        "external_hits": ("vllm:external_prefix_cache_hits_total", "lmcache:num_hit_tokens_total"),
        # Seconds requests spent in their prefill and in their decode phase (the histograms' sums).
        "prefill_time_s": ("vllm:request_prefill_time_seconds_sum",),
        "decode_time_s": ("vllm:request_decode_time_seconds_sum",),
    },
    "sglang": {
        "running": ("sglang:num_running_reqs",),
        "waiting": ("sglang:num_queue_reqs",),
        "kv_usage": ("sglang:token_usage",),
        "prompt_tokens": ("sglang:prompt_tokens_total",),
        "generation_tokens": ("sglang:generation_tokens_total",),
        "cache_hit_rate": ("sglang:cache_hit_rate",),
    },
    # llama-server (checked against a real one's /metrics, tests/data/llamacpp/metrics.txt). Its prompt_tokens_total
    # counts the prompt tokens it *processed* ("excluding cached tokens"), unlike vLLM's, which counts them all;
    # prompt_tokens_cached_total counts those reused from a slot, so the two add up to every prompt token and the
    # slot cache's hit rate is cached ÷ (processed + cached) — prefix_queries below. llama.cpp reports no KV usage
    # gauge and no preemptions (a slot never loses its KV mid-request).
    "llamacpp": {
        "running": ("llamacpp:requests_processing",),
        "waiting": ("llamacpp:requests_deferred",),
        "prompt_tokens": ("llamacpp:prompt_tokens_total",),
        "generation_tokens": ("llamacpp:tokens_predicted_total",),
        "prefix_hits": ("llamacpp:prompt_tokens_cached_total",),
    },
}
# Normalised figures that are sums of an engine's samples: key → (engine, names added up).
_SUMMED: dict[str, tuple[str, tuple[str, ...]]] = {
    "prefix_queries": ("llamacpp", ("llamacpp:prompt_tokens_total", "llamacpp:prompt_tokens_cached_total")),
}
# Gauges that are a share per engine instance are averaged over instances (data-parallel ranks); the rest add up.
_AVERAGED = frozenset({"kv_usage", "cache_hit_rate"})


def _plausible(key: str, value: float) -> bool:
    """Every normalised figure is a finite count or a 0-1 share; anything else says nothing true about the server."""
    if not math.isfinite(value) or value < 0:
        return False
    return value <= 1.0 if key in _AVERAGED else True


def prefix_hit_rate(
    queries0: float | None, hits0: float | None, queries1: float | None, hits1: float | None
) -> float | None:
    """The prefix cache's hit rate between two scrapes, from its token counters (hits ÷ queries added): None when a
    counter is missing, no prompt token was looked up in between, or a counter went backwards (a server restart),
    so a chart shows a gap rather than a made-up rate."""
    if queries0 is None or hits0 is None or queries1 is None or hits1 is None:
        return None
    dq, dh = queries1 - queries0, hits1 - hits0
    return dh / dq if dq > 0 and dh >= 0 else None


@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    """One scrape of /metrics."""

    samples: tuple[Sample, ...]

    @property
    def engine(self) -> str | None:
        """Which engine's metric names these are (vllm, sglang, llamacpp), or None."""
        for sample in self.samples:
            prefix = sample.name.split(":", 1)[0]
            if ":" in sample.name and prefix in _NORMALISED:
                return prefix
        return None

    def named(self, name: str) -> list[Sample]:
        return [s for s in self.samples if s.name == name]

    def normalised(self) -> dict[str, float]:
        """The engine's gauges and counters under engine-agnostic names (summed over label sets)."""
        table = _NORMALISED.get(self.engine or "", {})
        out: dict[str, float] = {}
        for key, names in table.items():
            for name in names:
                values = [s.value for s in self.named(name)]
                if values and all(_plausible(key, v) for v in values):
                    out[key] = sum(values) / len(values) if key in _AVERAGED else sum(values)
                    break
        for key, (engine, parts) in _SUMMED.items():
            if engine == self.engine:
                found = [[s.value for s in self.named(name)] for name in parts]
                if all(found) and all(_plausible(key, v) for vs in found for v in vs):
                    out[key] = sum(sum(vs) for vs in found)
        return out


_PARSE_ERRORS = (ValueError, TypeError, IndexError)


def _samples(text: str) -> tuple[Sample, ...]:
    return tuple(
        Sample(s.name, dict(s.labels), float(s.value)) for family in text_string_to_metric_families(text)
        for s in family.samples
    )  # fmt: skip


def parse_metrics(text: str, source: str = "/metrics") -> MetricsSnapshot:
    """Prometheus text exposition → samples (prometheus_client's parser, so escaping and labels are exact).

    prometheus_client refuses the whole text for one bad line; a proxy's or a buggy exporter's stray line should
    cost only that line, so on failure each line is parsed alone (comments dropped: a sample's name does not
    depend on its TYPE line). Text in which no line parses is not Prometheus text.
    """
    try:
        return MetricsSnapshot(_samples(text))
    except _PARSE_ERRORS as exc:
        first = exc
    kept: list[Sample] = []
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            try:
                kept.extend(_samples(line + "\n"))
            except _PARSE_ERRORS:
                continue
    if not kept:
        raise EndpointResponseError(f"{source} is not Prometheus text: {first}") from first
    return MetricsSnapshot(tuple(kept))


class ServerPool(BaseModel):
    """The KV pool as the engine itself reports it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    engine: str
    num_blocks: int = Field(gt=0)
    block_size: int = Field(gt=0)
    source: str = Field(description="where the figures were read")
    exact: bool = Field(description="False when the engine has no paged pool and blocks are an equivalent")
    cache_dtype: str | None = None
    prefix_caching: bool | None = None
    max_num_seqs: int | None = Field(default=None, gt=0)
    max_model_len: int | None = Field(default=None, gt=0, description="when the pool's source states it")

    @property
    def tokens(self) -> int:
        return self.num_blocks * self.block_size


class ServedModel(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    root: str | None = None
    max_model_len: int | None = Field(default=None, gt=0)


# Asked after every text chunk of a stream with (chunks so far, arrival time): True ends the stream there.
StopRule = Callable[[int, float], bool]


@dataclass(frozen=True, slots=True)
class StreamTiming:
    """One streamed completion as the client saw it, in the event loop's seconds (monotonic wall time; simulated
    time on a virtual-time loop, so a calibration against the in-process simulator measures its model exactly)."""

    sent_at: float
    token_times: tuple[float, ...]  # arrival of every chunk that carried text
    prompt_tokens: int | None  # from the usage chunk, when the server sends one
    cached_tokens: int | None
    completion_tokens: int | None

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.sent_at if self.token_times else None


def base_url(url: str) -> URL:
    """The server's root URL: http(s) with a host, no trailing ``/v1`` or slash, no credentials."""
    try:
        parsed = URL(url.strip())
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"--url {redact_url(url)!r} is not a URL: {exc}") from exc
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ConfigError(f"--url {redact_url(url)!r}: give the server as http://HOST:PORT")
    path = parsed.path.rstrip("/")
    path = path.removesuffix("/v1")
    return parsed.with_user(None).with_path(path).with_query(None).with_fragment(None)


def _int(value: Any) -> int | None:
    """An int from a label or JSON value ("4096", 4096, 4096.0); None for anything else ("None", null, "x")."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and len(value) < 20:  # int() of a 10,000-digit label is slow and never a real figure
        try:
            return int(value)
        except ValueError:
            return None
    return None


def _figure(value: int | None, what: str, source: str, *, limit: int = MAX_TOKENS) -> int | None:
    """A pool figure that, when present, is a positive integer no larger than ``limit``."""
    if value is not None and not 0 < value <= limit:
        raise ServerCapabilityError(f"{source} gives {what} = {value}, not a number from 1 to {limit:,}")
    return value


def _vllm_pool(snapshot: MetricsSnapshot) -> ServerPool | None:
    infos = snapshot.named("vllm:cache_config_info")
    if not infos:
        return None
    labels = infos[0].labels
    blocks, block_size = _int(labels.get("num_gpu_blocks")), _int(labels.get("block_size"))
    if not blocks or not block_size or blocks <= 0 or block_size <= 0:
        raise ServerCapabilityError(
            "vllm:cache_config_info has no usable num_gpu_blocks / block_size labels "
            f"(got {labels.get('num_gpu_blocks')!r:.40} / {labels.get('block_size')!r:.40}); is the engine still "
            "starting?"
        )
    where = "vllm:cache_config_info"
    _figure(block_size, "block_size", where, limit=1 << 20)
    _figure(blocks * block_size, "num_gpu_blocks × block_size", where)
    caching = labels.get("enable_prefix_caching")
    return ServerPool(
        engine="vllm",
        num_blocks=blocks,
        block_size=block_size,
        source="vllm:cache_config_info on /metrics",
        exact=True,
        cache_dtype=labels.get("cache_dtype"),
        prefix_caching=None if caching is None else caching.lower() == "true",
    )


def _sglang_pool(info: Mapping[str, Any], source: str) -> ServerPool | None:
    """SGLang's server info: the figures sit at the top level on older versions, in internal_states on newer."""
    places: list[Mapping[str, Any]] = [info]
    states = info.get("internal_states")
    if isinstance(states, list):
        places += [s for s in states if isinstance(s, Mapping)]
    args = info.get("server_args")
    if isinstance(args, Mapping):
        places.append(args)

    def first(key: str) -> int | None:
        for place in places:
            value = _int(place.get(key))
            if value is not None and value > 0:  # 0 / -1 mean "unset" in some places: look further
                return _figure(value, key, source)
        return None

    tokens = first("max_total_num_tokens")
    if tokens is None:
        return None
    # SGLang's radix cache is paged with page_size tokens per page (1 unless --page-size is set).
    page = first("page_size") or 1
    if page > tokens:
        raise ServerCapabilityError(
            f"{source} gives page_size = {page}, larger than the whole pool (max_total_num_tokens = {tokens})"
        )
    return ServerPool(
        engine="sglang",
        num_blocks=tokens // page,
        block_size=page,
        source=f"max_total_num_tokens from {source}",
        exact=True,
        max_num_seqs=first("max_running_requests"),
        max_model_len=first("context_length"),
    )


def _llamacpp_pool(props: Mapping[str, Any]) -> ServerPool | None:
    slots = _figure(_int(props.get("total_slots")), "total_slots", "/props", limit=1 << 16)
    settings = props.get("default_generation_settings")
    n_ctx = _int(settings.get("n_ctx")) if isinstance(settings, Mapping) else None
    n_ctx = _figure(n_ctx or _int(props.get("n_ctx")), "n_ctx", "/props")
    if not slots or not n_ctx:
        return None
    _figure(slots * n_ctx, "total_slots × n_ctx", "/props")
    block = 16
    if slots * n_ctx < block:
        raise ServerCapabilityError(f"/props gives total_slots × n_ctx = {slots * n_ctx} tokens, less than one block")
    # llama.cpp gives each slot a fixed share of the context instead of a shared paged pool; the simulator's
    # equivalent is a pool of slots × n_ctx tokens in 16-token blocks with at most `slots` running requests.
    return ServerPool(
        engine="llamacpp",
        num_blocks=slots * n_ctx // block,
        block_size=block,
        source="total_slots × per-slot n_ctx from /props (llama.cpp has no paged pool; an equivalent)",
        exact=False,
        max_num_seqs=slots,
        max_model_len=n_ctx,
    )


def _tokenize_answer(where: str, raw: bytes) -> tuple[int | None, list[Any] | None]:
    """A ``/tokenize`` answer's ``count`` (vLLM, SGLang) and ``tokens`` (all of them; llama.cpp's only), each None
    where the answer has none of that shape; a body that is not JSON is an ``EndpointResponseError``."""
    try:
        answer = loads(raw)
    except MalformedField as exc:
        raise EndpointResponseError(f"{where}: the body is {exc}") from exc
    if not isinstance(answer, Mapping):
        return None, None
    count, tokens = answer.get("count"), answer.get("tokens")
    valid = isinstance(count, int) and not isinstance(count, bool) and count >= 0
    return (count if valid else None), (tokens if isinstance(tokens, list) else None)


class ServerProbe:
    """One server's models, pool, metrics and timed streams through the ``Transport`` seam.

    Use as ``async with ServerProbe(url) as probe``. Without a ``transport`` it makes an HTTP one (and closes it);
    either way the URL's credentials and ``api_key`` sign every request — /metrics included — through
    ``transport.signed_transport``, and the probe names only the bare URL in results and errors. A given transport
    (the simulator in process, a scripted one in tests) is left open for its owner.
    """

    def __init__(
        self,
        url: str,
        *,
        api_key: str | None = None,
        transport: Transport | None = None,
        connect_timeout_s: float = 10.0,
        read_timeout_s: float = 900.0,
    ) -> None:
        if read_timeout_s <= 0:
            raise ValueError("read_timeout_s must be positive")
        self._owns_transport = transport is None
        # The transport's connection pool is unbounded (one connection per live stream): a pool smaller than the
        # largest batch would queue streams inside the client and corrupt inter-token timings.
        server, self._transport = signed_transport(
            url, api_key, transport or AiohttpTransport(connect_timeout_s=connect_timeout_s)
        )
        self.url = base_url(server.base)
        self._read_timeout = read_timeout_s

    def __repr__(self) -> str:  # never show the key
        return f"ServerProbe({str(self.url)!r})"

    async def __aenter__(self) -> ServerProbe:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._owns_transport:
            await self._transport.aclose()

    def _url(self, path: str) -> str:
        return str(self.url.with_path(self.url.path.rstrip("/") + path))

    @contextmanager
    def _translate(self, what: str) -> Iterator[None]:
        """The transport's errors → ours, naming the request and the server."""
        where = f"{what} on {self.url}"
        try:
            yield
        except ConnectFailed as exc:
            reason = "connection refused" if refused(exc) else str(exc)
            raise EndpointUnreachableError(f"cannot reach {self.url}: {reason}") from exc
        except TimeoutError as exc:  # the read deadline below
            raise EndpointTimeoutError(f"{where}: the server stopped answering (read timeout)") from exc
        except MalformedResponse as exc:
            raise EndpointResponseError(f"{where}: not valid HTTP: {exc}") from exc
        except TransportError as exc:
            raise EndpointError(f"{where}: {type(exc).__name__}: {exc}") from exc

    async def get(self, path: str) -> tuple[int, bytes]:
        """Status and body of ``GET path``; every status is returned, connection failures raise."""
        with self._translate(f"GET {path}"):
            status, _, body = await get(self._transport, self._url(path), self._read_timeout)
        return status, body

    async def post_json(self, path: str, body: Mapping[str, Any]) -> tuple[int, bytes]:
        """Status and body of ``POST path`` with ``body`` as JSON; every status is returned, failures raise."""
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        with self._translate(f"POST {path}"):
            async with asyncio.timeout(self._read_timeout):
                resp = await self._transport.send("POST", self._url(path), json.dumps(body).encode(), headers)
                try:
                    return resp.status, await resp.read()
                finally:
                    resp.close()

    async def _get_json(self, path: str) -> Any | None:
        """The JSON body of ``GET path``, or None when the server has no such endpoint (404/405)."""
        status, body = await self.get(path)
        if status in (404, 405):
            return None
        _raise_for_status(f"GET {path} on {self.url}", status, body)
        try:
            return loads(body)
        except MalformedField as exc:
            raise EndpointResponseError(f"GET {path} on {self.url}: the body is {exc}") from exc

    async def metrics(self) -> MetricsSnapshot:
        status, body = await self.get("/metrics")
        if status in (404, 405):
            raise ServerCapabilityError(
                f"{self.url} has no /metrics (vLLM: drop --disable-log-stats; SGLang: --enable-metrics; "
                "llama.cpp: --metrics)"
            )
        _raise_for_status(f"GET /metrics on {self.url}", status, body)
        return parse_metrics(body.decode("utf-8", errors="replace"), f"/metrics on {self.url}")

    async def models(self) -> list[ServedModel]:
        data = await self._get_json("/v1/models")
        cards = data.get("data") if isinstance(data, Mapping) else None
        if not isinstance(cards, list):
            raise EndpointResponseError(f"GET /v1/models on {self.url}: no model list (is this an OpenAI API?)")
        out = []
        for card in cards:
            if isinstance(card, Mapping) and isinstance(card.get("id"), str):
                root = card.get("root")
                out.append(
                    ServedModel(
                        id=card["id"],
                        root=root if isinstance(root, str) else None,
                        max_model_len=_positive(_int(card.get("max_model_len"))),
                    )
                )
        if not out:
            raise EndpointResponseError(f"GET /v1/models on {self.url}: the server lists no model")
        return out

    async def pool(self) -> ServerPool:
        """The KV pool from the engine's own figures: vLLM metrics, SGLang server info, llama.cpp props."""
        tried: list[str] = []
        try:
            snapshot: MetricsSnapshot | None = await self.metrics()
        except ServerCapabilityError:
            snapshot = None
            tried.append("no /metrics")
        if snapshot is not None:
            pool = _vllm_pool(snapshot)
            if pool is not None:
                return pool
            tried.append("/metrics has no vllm:cache_config_info (labels num_gpu_blocks, block_size)")
        for path in ("/get_server_info", "/server_info"):
            info = await self._get_json(path)
            if isinstance(info, Mapping):
                pool = _sglang_pool(info, path)
                if pool is not None:
                    return pool
                tried.append(f"{path} has no max_total_num_tokens")
                break
        else:
            tried.append("no SGLang /get_server_info")
        props = await self._get_json("/props")
        if isinstance(props, Mapping):
            pool = _llamacpp_pool(props)
            if pool is not None:
                return pool
            tried.append("/props has no total_slots and n_ctx")
        else:
            tried.append("no llama.cpp /props")
        raise ServerCapabilityError(f"cannot read the KV pool of {self.url}: {'; '.join(tried)}")

    async def round_trip(self) -> float:
        """Seconds for one trivial request (``GET /v1/models``): the network and HTTP share of every latency."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        status, body = await self.get("/v1/models")
        elapsed = loop.time() - start
        _raise_for_status(f"GET /v1/models on {self.url}", status, body)
        return elapsed

    async def count_tokens(self, model: str, text: str) -> int | None:
        """The tokens the server's tokenizer makes of ``text`` (no special tokens), from its ``POST /tokenize``
        (vLLM and SGLang take ``prompt``, llama.cpp ``content``); None when it has no such endpoint."""
        where = f"POST /tokenize on {self.url}"
        for body in ({"model": model, "prompt": text, "add_special_tokens": False}, {"content": text}):
            status, raw = await self.post_json("/tokenize", body)
            if status in (404, 405):
                return None
            if status in (400, 422) and "content" not in body:
                continue  # llama.cpp's server wants "content"
            _raise_for_status(where, status, raw)
            count, tokens = _tokenize_answer(where, raw)
            if count is not None:
                return count
            if tokens is not None and (tokens or not text):
                return len(tokens)
            # llama.cpp answers a body without "content" with no tokens: ask it in its own form.
        raise EndpointResponseError(f"{where}: the answer holds neither a token count nor tokens")

    async def count_chat_tokens(self, model: str, messages: Sequence[Mapping[str, str]]) -> int | None:
        """The tokens of ``messages`` as the server's chat template renders them, with the generation prompt, from
        its ``POST /tokenize`` (vLLM's chat form); None when it has no such endpoint or takes no messages there."""
        where = f"POST /tokenize on {self.url}"
        body = {"model": model, "messages": list(messages), "add_generation_prompt": True}
        status, raw = await self.post_json("/tokenize", body)
        if status in (400, 404, 405, 422):
            return None
        _raise_for_status(where, status, raw)
        count, tokens = _tokenize_answer(where, raw)
        if count:
            return count
        if tokens:
            return len(tokens)
        return None  # an answer without a count (llama.cpp ignores "messages"): not this server's chat form

    async def stream_completion(self, body: Mapping[str, Any], stop: StopRule | None = None) -> StreamTiming:
        """POST a streamed ``/v1/completions`` request and time every chunk that carries text.

        ``stop(chunks so far, arrival time)`` is asked after each text chunk; when it says True the response is
        closed there (the server aborts the request) and the timing has no usage.
        """
        data = json.dumps({**body, "stream": True, "stream_options": {"include_usage": True}}).encode()
        usage: Mapping[str, Any] | None = None
        times: list[float] = []
        where = f"POST /v1/completions on {self.url}"
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        with self._translate("POST /v1/completions"):
            # The read deadline is per read, as a socket's would be: moved on by every chunk that arrives.
            async with asyncio.timeout(self._read_timeout) as deadline:
                sent = asyncio.get_running_loop().time()
                resp = await self._transport.send("POST", self._url("/v1/completions"), data, headers)
                try:
                    if resp.status != 200:
                        _raise_for_status(where, resp.status, await resp.read())
                    async with aclosing(_lines(resp.chunks(), deadline, self._read_timeout)) as lines:
                        async for raw, now in lines:
                            line = raw.strip()
                            if not line.startswith(b"data:"):
                                continue
                            payload = line[5:].strip()
                            if payload == b"[DONE]":
                                break
                            event = _event(payload, where)
                            choices = event.get("choices")
                            first = choices[0] if isinstance(choices, list) and choices else None
                            if isinstance(first, Mapping) and first.get("text"):
                                times.append(now)
                                if stop is not None and stop(len(times), now):
                                    break
                            if isinstance(event.get("usage"), Mapping):
                                usage = event["usage"]
                finally:
                    resp.close()  # before the stream's end: the server aborts the request
        details = usage.get("prompt_tokens_details") if usage else None
        return StreamTiming(
            sent_at=sent,
            token_times=tuple(times),
            prompt_tokens=_int(usage.get("prompt_tokens")) if usage else None,
            cached_tokens=_int(details.get("cached_tokens")) if isinstance(details, Mapping) else None,
            completion_tokens=_int(usage.get("completion_tokens")) if usage else None,
        )


async def _lines(
    chunks: AsyncIterator[bytes], deadline: asyncio.Timeout, read_timeout_s: float
) -> AsyncGenerator[tuple[bytes, float]]:
    """The body's lines, each with the loop's time its chunk arrived; every chunk moves the deadline."""
    loop = asyncio.get_running_loop()
    rest = b""
    async for block in chunks:
        now = loop.time()
        deadline.reschedule(loop.time() + read_timeout_s)
        *lines, rest = (rest + block).split(b"\n")
        for line in lines:
            yield line, now
    if rest:
        yield rest, loop.time()


def _positive(value: int | None) -> int | None:
    """A figure only a positive number can be (a context length), else unknown."""
    return value if value is not None and 0 < value <= MAX_TOKENS else None


def _event(payload: bytes, where: str) -> Mapping[str, Any]:
    try:
        event = loads(payload)
    except MalformedField as exc:
        raise EndpointResponseError(f"{where}: a malformed stream event") from exc
    if not isinstance(event, Mapping):
        raise EndpointResponseError(f"{where}: a stream event that is not a JSON object")
    if "error" in event:
        raise EndpointResponseError(f"{where}: the server ended the stream with an error: {_message(event)}")
    return event


def _message(body: Any) -> str:
    """The message of an OpenAI-style error body, cut short (never the whole body: it may hold secrets)."""
    err = body.get("error") if isinstance(body, Mapping) else None
    msg = err.get("message") if isinstance(err, Mapping) else err if isinstance(err, str) else None
    if msg is None and isinstance(body, Mapping):
        msg = body.get("message") or body.get("detail")
    return str(msg)[:300] if msg else "no message"


def _raise_for_status(where: str, status: int, body: bytes) -> None:
    if status < 400:
        return
    try:
        detail = _message(loads(body))
    except MalformedField:
        detail = "no JSON error body"
    hint = " (the server wants an API key)" if status in (401, 403) else ""
    raise EndpointResponseError(f"{where}: HTTP {status}{hint}: {detail}", status=status)
