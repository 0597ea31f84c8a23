"""What kind of server is at a URL, and how wide a fleet it can take: ``agentload probe`` and the run preflight.

``probe`` asks the endpoints engines are known by, all at once, and reads what each says (docs/background.md §3-4):

* the engine, from the simulator's ``/version``, the metric prefix on ``/metrics`` (``vllm:``, ``sglang:``,
  ``llamacpp:``), ``owned_by`` on ``/v1/models``, llama.cpp's ``/props``, SGLang's server info, Ollama's
  ``/api/version`` and ``/api/ps``, and the ``Server`` header; what matched is kept in ``evidence``;
* model, max context, the KV pool and block size, prefix caching, parallel slots and max running requests, read
  with ``endpoint.scrape``'s parsers so the figures mean the same as ``agentload calibrate``'s;
* whether usage reports cached tokens: one tiny request sent twice (the second can hit the first's prefix), then
  ``usage.prompt_tokens_details.cached_tokens`` — null on vLLM without ``--enable-prompt-tokens-details`` and on
  SGLang without ``--enable-cache-report``, and the advice says so.

``preflight`` turns a probe into the width a ``parallel`` or ``auto`` run starts with and why ("llama.cpp has 4
slots", "pool ÷ planned context ≈ 24 agents"), and warns when a requested width exceeds what the server holds.

Every request goes through the ``Transport`` seam, so tests script any engine in process. The API key is read from
the environment into request headers only; no body a server returns is quoted (SGLang's server info carries its
own key).
"""

from __future__ import annotations

import asyncio
import math
import os
import uuid
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agentload.endpoint.client import ChatClient, FixedDeadlines
from agentload.endpoint.output import length_control
from agentload.endpoint.records import RequestRecord, UsageSource
from agentload.endpoint.scrape import (
    EndpointError as ScrapeError,
)
from agentload.endpoint.scrape import (
    MetricsSnapshot,
    ServerPool,
    _int,
    _llamacpp_pool,
    _positive,
    _sglang_pool,
    _vllm_pool,
    parse_metrics,
)
from agentload.endpoint.scrape import base_url as server_root
from agentload.endpoint.transport import (
    AiohttpTransport,
    ConnectFailed,
    Transport,
    TransportError,
    get,
    refused,
    signed_transport,
)
from agentload.endpoint.wire import MalformedField, loads
from agentload.errors import ConfigError, EndpointTimeoutError, EndpointUnreachableError

Engine = Literal["vllm", "sglang", "llamacpp", "ollama", "agentload-sim", "openai-compatible"]

ENGINE_LABELS: dict[str, str] = {
    "vllm": "vLLM",
    "sglang": "SGLang",
    "llamacpp": "llama.cpp",
    "ollama": "Ollama",
    "agentload-sim": "the agentload simulator",
    "openai-compatible": "the server",
}

# Which server flag makes usage report cached tokens, per engine (None: no known way).
CACHED_TOKENS_ADVICE: dict[str, str | None] = {
    "vllm": "start vLLM with --enable-prompt-tokens-details",
    "sglang": "start SGLang with --enable-cache-report",
    "agentload-sim": "start agentload sim with --prompt-tokens-details (vLLM's flag: --enable-prompt-tokens-details)",
    "llamacpp": "use a newer llama-server: recent builds fill usage.prompt_tokens_details.cached_tokens [uncertain]",
    "ollama": "Ollama's OpenAI-compatible API does not report cached tokens",
    "openai-compatible": None,
}

# Endpoints asked for detection; absent ones answer 404 and cost a round trip each, asked concurrently.
_PATHS = (
    "/v1/models",
    "/health",
    "/version",
    "/metrics",
    "/props",
    "/slots",
    "/get_server_info",
    "/server_info",
    "/api/version",
    "/api/ps",
)
_NOISE_PREFIXES = ("python_", "process_")  # prometheus_client's default collectors: not the engine's


class ProbeResult(BaseModel):
    """What one server said about itself."""

    model_config = ConfigDict(frozen=True)

    url: str
    engine: Engine
    evidence: list[str] = Field(default_factory=list, description="what identified the engine")
    version: str | None = None
    model: str | None = None
    models: list[str] = Field(default_factory=list)
    max_context: int | None = None
    pool_tokens: int | None = None
    block_size: int | None = None
    pool_source: str | None = None
    prefix_caching: bool | None = None
    reports_cached_tokens: bool | None = None
    cached_tokens_advice: str | None = None
    metrics_url: str | None = None
    metric_names: list[str] = Field(default_factory=list)
    parallel_slots: int | None = None
    max_running: int | None = None
    # How agentload asks this engine for exact output lengths (``endpoint.output``); None: it cannot.
    output_length_control: str | None = None
    notes: list[str] = Field(default_factory=list)


def served_model(result: ProbeResult, given: str | None) -> str:
    """The model to request: ``given`` (``--model``), else the one model the server lists on /v1/models.

    None listed, or several, is a ``ConfigError`` that says to name one with ``--model`` (and lists them): a
    command that picked the first of several would measure a model nobody chose.
    """
    if given:
        return given
    if len(result.models) == 1:
        return result.models[0]
    if not result.models:
        raise ConfigError(f"{result.url} lists no model on /v1/models: name the one to request with --model")
    raise ConfigError(
        f"{result.url} serves {len(result.models)} models ({', '.join(result.models)}): name one with --model"
    )


class Preflight(BaseModel):
    """The width a run starts with, why, and what to beware of."""

    model_config = ConfigDict(frozen=True)

    start_width: int
    reason: str
    warnings: list[str] = Field(default_factory=list)
    holds: int | None = Field(default=None, description="agents the server holds at the planned context, if known")


# -- fetching ---------------------------------------------------------------------------------------------------
class _Answer:
    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, headers: Mapping[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        if self.status != 200:
            return None
        try:
            return loads(self.body)
        except MalformedField:
            return None


async def _get(transport: Transport, url: str, headers: Mapping[str, str], timeout_s: float) -> _Answer | BaseException:
    try:
        status, got, body = await get(transport, url, timeout_s, headers)
    except (TransportError, TimeoutError) as exc:
        return exc
    return _Answer(status, dict(got), body)


# -- reading ----------------------------------------------------------------------------------------------------
def _metric_names(snapshot: MetricsSnapshot) -> list[str]:
    """Metric names as a person would search for them: one per histogram, counters with their ``_total``."""
    raw = {s.name for s in snapshot.samples if not s.name.startswith(_NOISE_PREFIXES)}
    histograms = {n.removesuffix("_bucket") for n in raw if n.endswith("_bucket")}
    names = set(histograms)
    for name in raw:
        base = name
        for suffix in ("_bucket", "_sum", "_count", "_created"):
            base = base.removesuffix(suffix)
        if base in histograms or name.endswith("_created"):
            continue
        names.add(name)
    return sorted(names)


def _cards(data: Any) -> list[Mapping[str, Any]]:
    cards = data.get("data") if isinstance(data, Mapping) else None
    if not isinstance(cards, list):
        return []
    return [c for c in cards if isinstance(c, Mapping) and isinstance(c.get("id"), str)]


_BY_PREFIX: dict[str, Engine] = {"vllm": "vllm", "sglang": "sglang", "llamacpp": "llamacpp"}


# llama-server renders a request's tools through the model's chat template; a template with no tools in it (the
# SmolLM2-135M-Instruct GGUF's ChatML, for one) makes it drop them without an error, so a tool test then scores the
# template, not the model. /props says so in chat_template_caps; a build without that field is not flagged.
TEMPLATE_DROPS_TOOLS = (
    "the chat template llama-server serves has no tools in it (/props chat_template_caps.supports_tools false): a "
    "request's tools are dropped, so the model never sees them; serve it with --jinja and a template that renders "
    "tools (--chat-template-file) before judging its tool calls"
)


def _template_drops_tools(answers: Mapping[str, _Answer]) -> bool:
    props = _json_at(answers, "/props")
    caps = props.get("chat_template_caps") if isinstance(props, Mapping) else None
    return isinstance(caps, Mapping) and caps.get("supports_tools") is False


def _json_at(answers: Mapping[str, _Answer], *paths: str) -> Any:
    """The first JSON object or list among ``paths`` that answered 200, or None."""
    for path in paths:
        answer = answers.get(path)
        data = answer.json() if answer is not None else None
        if isinstance(data, Mapping | list):
            return data
    return None


def _detect(
    answers: Mapping[str, _Answer], snapshot: MetricsSnapshot | None, evidence: list[str]
) -> tuple[Engine, str | None]:
    """The engine and its version string, recording what matched (most specific evidence first)."""
    cards = _cards(_json_at(answers, "/v1/models"))
    owned = str(cards[0].get("owned_by") or "") if cards else ""
    version_data = _json_at(answers, "/version")
    has_version = isinstance(version_data, Mapping) and "version" in version_data
    version = str(version_data["version"])[:100] if has_version else None
    ollama = _json_at(answers, "/api/version")
    ps = _json_at(answers, "/api/ps")
    props = _json_at(answers, "/props")
    info = _json_at(answers, "/get_server_info", "/server_info")
    server = " ".join(a.headers.get("Server", a.headers.get("server", "")) for a in answers.values()).lower()

    # The simulator serves vLLM's metric names, so it must be recognised before the metric prefix is read.
    if (version or "").startswith("agentload-sim") or owned == "agentload-sim":
        evidence.append("/version or /v1/models owned_by names agentload-sim")
        return "agentload-sim", version
    prefix = snapshot.engine if snapshot is not None else None
    if prefix in _BY_PREFIX:
        evidence.append(f"/metrics uses the {prefix}: prefix")
        return _BY_PREFIX[prefix], version
    if owned in _BY_PREFIX:
        evidence.append(f"/v1/models owned_by {owned!r}")
        return _BY_PREFIX[owned], version
    if isinstance(props, Mapping) and ("total_slots" in props or "default_generation_settings" in props):
        evidence.append("/props with total_slots (llama-server)")
        return "llamacpp", version
    if isinstance(info, Mapping) and ("max_total_num_tokens" in info or "server_args" in info):
        evidence.append("SGLang server info")
        return "sglang", version
    if isinstance(ollama, Mapping) or (isinstance(ps, Mapping) and isinstance(ps.get("models"), list)):
        evidence.append("/api/version or /api/ps (Ollama's own API)")
        return "ollama", str(ollama["version"]) if isinstance(ollama, Mapping) and "version" in ollama else None
    if "llama.cpp" in server:
        evidence.append("Server header llama.cpp")
        return "llamacpp", version
    evidence.append("no engine-specific endpoint answered: a generic OpenAI-compatible API")
    return "openai-compatible", version


def _pool(
    engine: Engine, answers: Mapping[str, _Answer], snapshot: MetricsSnapshot | None, notes: list[str]
) -> ServerPool | None:
    try:
        if snapshot is not None and engine in ("vllm", "agentload-sim"):
            return _vllm_pool(snapshot)
        if engine == "sglang":
            for path in ("/get_server_info", "/server_info"):
                info = _json_at(answers, path)
                if isinstance(info, Mapping):
                    return _sglang_pool(info, path)
        if engine == "llamacpp":
            props = _json_at(answers, "/props")
            if isinstance(props, Mapping):
                return _llamacpp_pool(props)
    except ScrapeError as exc:
        notes.append(f"KV pool not readable: {exc}")
    return None


def _sglang_prefix_caching(answers: Mapping[str, _Answer]) -> bool | None:
    info = _json_at(answers, "/get_server_info", "/server_info")
    if not isinstance(info, Mapping):
        return None
    args = info.get("server_args")
    flag = (args if isinstance(args, Mapping) else info).get("disable_radix_cache")
    return (not flag) if isinstance(flag, bool) else None


def _slots(answers: Mapping[str, _Answer]) -> int | None:
    props = _json_at(answers, "/props")
    total = _positive(_int(props.get("total_slots"))) if isinstance(props, Mapping) else None
    if total:
        return total
    slots = _json_at(answers, "/slots")
    return len(slots) if isinstance(slots, list) and slots else None


def _ollama_context(answers: Mapping[str, _Answer], model: str | None) -> int | None:
    ps = _json_at(answers, "/api/ps")
    loaded = ps.get("models") if isinstance(ps, Mapping) else None
    for entry in loaded if isinstance(loaded, list) else ():
        if isinstance(entry, Mapping) and (model is None or entry.get("name") == model or entry.get("model") == model):
            return _positive(_int(entry.get("context_length")))
    return None


# Marks agentload's own test requests (the cached-token test), so a recording proxy (``agentload record``) in front
# of the server forwards them without taking them for an agent's session.
PROBE_HEADER = "X-Agentload-Probe"


async def _cached_tokens_test(
    client: ChatClient, model: str | None, notes: list[str]
) -> tuple[bool | None, bool | None]:
    """(reports cached tokens, evidence of prefix caching) from one tiny prompt sent twice."""
    # ~80 tokens, unique per probe so the first request cannot hit an earlier probe's blocks; long enough to fill
    # whole 16-token blocks, which is all a paged prefix cache can hit.
    words = " ".join(f"w{i}" for i in range(40))
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": f"agentload probe {uuid.uuid4().hex}: {words}. Reply with OK."}],
        "max_tokens": 1,
        "temperature": 0,
    }
    if model is not None:
        body["model"] = model
    records: list[RequestRecord] = []
    for _ in range(2):
        record = await client.chat(body, headers={PROBE_HEADER: "cached-tokens"})
        if not record.ok:
            # The status and error class only: a server's error text can echo request headers.
            what = f"HTTP {record.http_status}" if record.http_status not in (None, 200) else str(record.error)
            notes.append(f"the cached-token test request failed ({what}); cached-token reporting unknown")
            return None, None
        records.append(record)
    if all(r.usage_source is UsageSource.COUNTED for r in records):
        notes.append("the server sent no usage object in the stream; cached-token reporting unknown")
        return None, None
    reported = [r.cached_tokens for r in records if r.cached_tokens is not None]
    if not reported:
        return False, None
    return True, (True if reported[-1] > 0 else None)


# -- the probe --------------------------------------------------------------------------------------------------
async def probe(
    url: str,
    *,
    model: str | None = None,
    api_key_env: str = "OPENAI_API_KEY",
    transport: Transport | None = None,
    timeout_s: float = 10.0,
) -> ProbeResult:
    """Identify the server at ``url`` and read its capacity figures (see the module docstring).

    With no ``transport``, the probe signs its own with the key and ``url``'s credentials (userinfo, ``?api_key=``)
    and works on the URL without them, so every path it asks — /metrics and /health too — carries the same
    credentials and none reaches the result.
    """
    own = transport is None
    headers = {"Accept": "application/json"}
    key = os.environ.get(api_key_env) if api_key_env else None
    if transport is None:
        server, transport = signed_transport(url, key, AiohttpTransport(connect_timeout_s=timeout_s))
        url = server.base
    elif key:
        headers["Authorization"] = f"Bearer {key}"  # headers only: never in the result, an error or a note
    root = str(server_root(url)).rstrip("/")
    client = ChatClient(
        root,
        transport=transport,
        api_key_env=api_key_env,
        policy=FixedDeadlines(connect_s=timeout_s, first_token_s=60.0, idle_s=30.0, total_s=120.0),
    )
    try:
        fetched = await asyncio.gather(*(_get(transport, root + p, headers, timeout_s) for p in _PATHS))
        failures = [a for a in fetched if isinstance(a, BaseException)]
        if len(failures) == len(_PATHS):
            if all(isinstance(f, ConnectFailed) for f in failures):
                reason = "connection refused" if any(refused(f) for f in failures) else str(failures[0])
                raise EndpointUnreachableError(f"cannot reach {root}: {reason}")
            raise EndpointTimeoutError(f"{root} accepted the connection but answered nothing within {timeout_s:g} s")
        answers = {p: a for p, a in zip(_PATHS, fetched, strict=True) if isinstance(a, _Answer) and a.status != 404}
        return await _read(root, answers, model, client)
    finally:
        if own:
            await transport.aclose()


async def _read(root: str, answers: Mapping[str, _Answer], model: str | None, client: ChatClient) -> ProbeResult:
    notes: list[str] = []  # in the order each step finds them: what the user reads, top to bottom
    evidence: list[str] = []
    snapshot = _snapshot(root, answers, notes)
    engine, version = _detect(answers, snapshot, evidence)
    if engine == "llamacpp" and version is None:
        version = _llamacpp_build(answers, evidence)
    health = answers.get("/health")
    if health is not None and health.status == 503:
        notes.append("/health says not ready (503): the server is still starting, so some figures may be missing")
    ids, chosen, card = _choose_model(root, answers, model, notes)
    pool = _pool(engine, answers, snapshot, notes)
    max_context = _max_context(engine, answers, chosen, card, pool, notes)
    if pool is not None:
        notes.append(f"KV pool from {pool.source}")
    prefix_caching, slots, max_running = _concurrency(engine, answers, pool, notes)
    reports, hit = await _cached_tokens_test(client, chosen, notes)
    if prefix_caching is None and hit:
        prefix_caching = True
    advice = CACHED_TOKENS_ADVICE.get(engine) if reports is False else None

    return ProbeResult(
        url=root,
        engine=engine,
        evidence=evidence,
        version=version,
        model=chosen,
        models=ids,
        max_context=max_context,
        pool_tokens=pool.tokens if pool is not None else None,
        block_size=pool.block_size if pool is not None and pool.exact else None,
        pool_source=pool.source if pool is not None else None,
        prefix_caching=prefix_caching,
        reports_cached_tokens=reports,
        cached_tokens_advice=advice,
        metrics_url=f"{root}/metrics" if snapshot is not None else None,
        metric_names=_metric_names(snapshot) if snapshot is not None else [],
        parallel_slots=slots,
        max_running=max_running,
        output_length_control=length_control(engine),
        notes=notes,
    )


def _snapshot(root: str, answers: Mapping[str, _Answer], notes: list[str]) -> MetricsSnapshot | None:
    """The server's /metrics, parsed; None where it has none or it is not Prometheus text (a note says so)."""
    metrics = answers.get("/metrics")
    if metrics is None or metrics.status != 200:
        return None
    try:
        return parse_metrics(metrics.body.decode("utf-8", errors="replace"), f"{root}/metrics")
    except ScrapeError:
        notes.append("/metrics answered but is not Prometheus text")
        return None


def _llamacpp_build(answers: Mapping[str, _Answer], evidence: list[str]) -> str | None:
    """llama-server has no /version; /props names its build ("b1-0c1e570"; the simulator's slot mode says so)."""
    props = _json_at(answers, "/props")
    build = props.get("build_info") if isinstance(props, Mapping) else None
    if not isinstance(build, str) or not build:
        return None
    if build.startswith("agentload-sim"):
        evidence.append("/props build_info names agentload-sim: the simulator serving llama.cpp's API")
    return build[:100]


def _choose_model(
    root: str, answers: Mapping[str, _Answer], model: str | None, notes: list[str]
) -> tuple[list[str], str | None, Mapping[str, Any] | None]:
    """The models served, the one the probe reads (``model``, else the first served) and its card, if listed."""
    models_answer = answers.get("/v1/models")
    cards = _cards(_json_at(answers, "/v1/models"))
    if models_answer is not None and models_answer.status in (401, 403):
        notes.append("/v1/models wants an API key (see --api-key-env)")
    ids = [str(c["id"]) for c in cards]
    if model is not None and ids and model not in ids:
        raise ConfigError(f"--model {model!r} is not served at {root}; it serves {', '.join(ids)}")
    chosen = model or (ids[0] if ids else None)
    return ids, chosen, next((c for c in cards if c["id"] == chosen), None)


def _max_context(
    engine: Engine,
    answers: Mapping[str, _Answer],
    chosen: str | None,
    card: Mapping[str, Any] | None,
    pool: ServerPool | None,
    notes: list[str],
) -> int | None:
    """The model's context length: its card's, else the pool's, else (Ollama) the loaded model's."""
    max_context = _positive(_int(card.get("max_model_len"))) if card is not None else None
    if max_context is None and pool is not None:
        max_context = pool.max_model_len
    if max_context is None and engine == "ollama":
        max_context = _ollama_context(answers, chosen)
        if max_context is None:
            notes.append("Ollama states the context length only once the model is loaded (/api/ps)")
    return max_context


def _concurrency(
    engine: Engine, answers: Mapping[str, _Answer], pool: ServerPool | None, notes: list[str]
) -> tuple[bool | None, int | None, int | None]:
    """Prefix caching on?, llama.cpp's slot count, and how many requests the server runs at once, where it says."""
    prefix_caching = pool.prefix_caching if pool is not None else None
    if engine == "sglang" and prefix_caching is None:
        prefix_caching = _sglang_prefix_caching(answers)
    slots = _slots(answers) if engine == "llamacpp" else None
    max_running = pool.max_num_seqs if pool is not None else None
    if engine in ("vllm", "agentload-sim") and max_running is None:
        notes.append("vLLM does not expose max_num_seqs (default 256, or 1024 on large GPUs)")
    if engine == "llamacpp":
        max_running = max_running or slots
        notes.append("llama.cpp reuses each slot's own last prompt (cache_prompt); no shared prefix cache")
        if _template_drops_tools(answers):
            notes.append(TEMPLATE_DROPS_TOOLS)
    return prefix_caching, slots, max_running


# -- preflight --------------------------------------------------------------------------------------------------
DEFAULT_AUTO_START = 4  # with no capacity figure at all: small enough for any server, the limiter widens it


def preflight(result: ProbeResult, *, planned_context: int, requested_width: int | None) -> Preflight:
    """The width a parallel (``requested_width``) or auto (None) run starts with, why, and warnings."""
    if planned_context <= 0:
        raise ConfigError("the planned context per agent must be a positive number of tokens")
    if requested_width is not None and requested_width < 1:
        raise ConfigError("--width must be at least 1")
    label = ENGINE_LABELS[result.engine]
    limits: list[tuple[int, str]] = []
    if result.parallel_slots:
        limits.append((result.parallel_slots, f"{label} has {result.parallel_slots} slots"))
    if result.pool_tokens:
        # A paged pool is allocated in whole blocks, so each agent takes its context rounded up to a block.
        block = result.block_size or 1
        per_agent = math.ceil(planned_context / block) * block
        fits = result.pool_tokens // per_agent
        limits.append(
            (fits, f"pool ÷ planned context ≈ {fits} agents ({result.pool_tokens:,} ÷ {planned_context:,} tokens)")
        )
    if result.max_running and not result.parallel_slots:
        limits.append((result.max_running, f"{label} runs at most {result.max_running} requests at once"))
    warnings: list[str] = []
    if result.max_context is not None and planned_context > result.max_context:
        warnings.append(
            f"the planned context ({planned_context:,} tokens) exceeds the server's max context "
            f"({result.max_context:,}): requests will be refused once a conversation grows past it"
        )
    # The tightest limit; on a tie the one listed first (slots before the pool: the plainer reason).
    holds, why = min(limits, key=lambda limit: limit[0]) if limits else (None, "")
    if holds == 0:
        warnings.append(f"one agent's planned context does not fit the server's KV pool ({why})")
    if result.prefix_caching is False:
        warnings.append("prefix caching is off: every turn re-prefills the whole conversation")
    if result.reports_cached_tokens is False:
        advice = f"; {result.cached_tokens_advice}" if result.cached_tokens_advice else ""
        warnings.append(f"usage does not report cached tokens, so cache hits cannot be measured per request{advice}")

    if requested_width is not None:
        start, reason = requested_width, f"the requested width {requested_width}"
        if holds is not None:
            reason += f"; {why}"
            if requested_width > holds:
                warnings.append(
                    f"the requested width {requested_width} exceeds what the server holds, {why}: expect "
                    "queueing, preemption and re-prefill of evicted conversations"
                )
    elif holds is not None:
        start, reason = max(1, holds), why
    else:
        start = DEFAULT_AUTO_START
        reason = (
            f"{label} states neither slots nor a KV pool; starting at {DEFAULT_AUTO_START} and letting the "
            "limiter find the width"
        )
    return Preflight(start_width=start, reason=reason, warnings=warnings, holds=holds)
