"""What the server says about its own state, polled in the background for the stall watchdog and the fleet.

A ``SignalPoller`` asks one server, every ``interval_s``, the few endpoints its engine offers and folds the answers
into one ``ServerSignals``: is it ready, how many requests are running and waiting, how full is the KV cache, how
many llama.cpp slots are busy, and did anything answer at all. The watchdog (``watchdog.py``) reads only the
latest readings, so a timer callback never waits on the network (the client's ``StallPolicy.extend`` must not
block).

Per-engine adapters (docs/background.md §3-4), chosen by the ``engine`` the probe found:

==================  =========================================  ================================================
engine              polled                                     read
==================  =========================================  ================================================
vllm, agentload-    ``/health``, ``/metrics``                  200 ready / 503 not; running, waiting, KV usage,
sim, sglang                                                    token and preemption counters (``scrape``'s
                                                               normalised names)
llamacpp            ``/health``, ``/metrics``, ``/slots``      503 while loading the model; busy / total slots
ollama              ``/api/ps``                                models loaded (none loaded = loading on demand)
openai-compatible   ``/health``                                any HTTP answer proves the server is alive
None (auto)         ``/health``, ``/metrics`` (+ ``/slots``    the metric prefix names the engine
                    once the metrics say llama.cpp)
==================  =========================================  ================================================

Any HTTP status counts as an answer (a 404 from a hosted API still proves the process is up): ``responding`` and
``last_response_age()`` are what the dead-server rule needs, "no answer from the server for N seconds".
``wait_until_ready`` is for a fleet's start: vLLM serves no HTTP while it loads, which no per-request rule can tell
from a dead server.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from agentload.clock import Clock, RealClock
from agentload.endpoint.scrape import EndpointResponseError, MetricsSnapshot, parse_metrics
from agentload.endpoint.scrape import base_url as server_root
from agentload.endpoint.transport import AiohttpTransport, Transport, TransportError, get
from agentload.endpoint.wire import MalformedField, loads
from agentload.errors import EndpointTimeoutError

ENGINES = ("vllm", "sglang", "llamacpp", "ollama", "agentload-sim", "openai-compatible")

# What each engine is polled for. The simulator serves vLLM's endpoints and metric names.
_PATHS: dict[str | None, tuple[str, ...]] = {
    "vllm": ("/health", "/metrics"),
    "agentload-sim": ("/health", "/metrics"),
    "sglang": ("/health", "/metrics"),
    "llamacpp": ("/health", "/metrics", "/slots"),
    "ollama": ("/api/ps",),
    "openai-compatible": ("/health",),
    None: ("/health", "/metrics"),
}


class ServerSignals(BaseModel):
    """One poll of the server; a field is None when the engine does not expose it (or did not answer)."""

    model_config = ConfigDict(frozen=True)

    t: float  # client clock (the same monotonic clock the chat client stamps records with)
    engine: str | None = None
    responding: bool  # any endpoint gave any HTTP answer within the poll timeout
    ready: bool | None = None  # /health 200 → True, 503 → False; Ollama: a model is loaded
    warming: bool = False  # not ready and not yet ready since it came up: loading weights, compiling
    running: int | None = None
    waiting: int | None = None
    kv_usage: float | None = None  # 0-1
    slots_busy: int | None = None  # llama.cpp /slots
    slots_total: int | None = None
    prompt_tokens: float | None = None  # counters: their growth shows the engine is making progress
    generation_tokens: float | None = None
    preemptions: float | None = None

    @property
    def progress(self) -> float | None:
        """Tokens the engine has processed so far (prompt + generated), or None without counters."""
        if self.prompt_tokens is None and self.generation_tokens is None:
            return None
        return (self.prompt_tokens or 0.0) + (self.generation_tokens or 0.0)

    @property
    def busy(self) -> bool:
        """The server says some request is queued, running or holding a slot."""
        return (self.waiting or 0) > 0 or (self.running or 0) > 0 or (self.slots_busy or 0) > 0


_Answer = tuple[int, bytes]

# Called after every poll that asked /metrics, with the reading and the parsed scrape (None: no usable answer).
# The bench's level timeline (``bench.sampler``) is one: the server is scraped by one poller, not two.
MetricsListener = Callable[[ServerSignals, MetricsSnapshot | None], None]


def _health(status: int) -> bool | None:
    if 200 <= status < 300:
        return True
    if status in (404, 405, 401, 403):
        return None  # no such endpoint, or it wants a key: says nothing about readiness
    return False  # 503 while loading (llama.cpp, SGLang, the simulator); 5xx when the engine died (vLLM)


def _snapshot(answer: _Answer | None) -> MetricsSnapshot | None:
    """The /metrics answer parsed once (for the signals and for every subscriber), or None without one."""
    if answer is None or answer[0] != 200:
        return None
    try:
        return parse_metrics(answer[1].decode("utf-8", errors="replace"))
    except EndpointResponseError:
        return None


def _metrics(snapshot: MetricsSnapshot) -> dict[str, Any]:
    values = snapshot.normalised()  # NaN, infinite and negative readings are already left out there

    def count(key: str) -> int | None:
        return None if key not in values else round(values[key])

    return {
        "engine": snapshot.engine,
        "running": count("running"),
        "waiting": count("waiting"),
        "kv_usage": values.get("kv_usage"),
        "prompt_tokens": values.get("prompt_tokens"),
        "generation_tokens": values.get("generation_tokens"),
        "preemptions": values.get("preemptions"),
    }


def _json(body: bytes) -> Any:
    try:
        return loads(body)
    except MalformedField:
        return None


def _slots(body: bytes) -> dict[str, Any]:
    data = _json(body)
    if not isinstance(data, list):
        return {}
    slots = [s for s in data if isinstance(s, Mapping)]
    # Newer llama-server says is_processing; older builds a state (0 idle, 1 processing).
    busy = sum(1 for s in slots if s.get("is_processing") is True or s.get("state") not in (None, 0))
    return {"slots_busy": busy, "slots_total": len(slots)}


def _ollama_ps(body: bytes) -> dict[str, Any]:
    data = _json(body)
    models = data.get("models") if isinstance(data, Mapping) else None
    if not isinstance(models, list):
        return {}
    # Ollama loads a model on the first request that names it and says nothing while it does; an empty /api/ps is
    # the only hint that a pending request waits for a load [uncertain: whether a model that is still loading is
    # listed varies by version].
    return {"ready": bool(models)}


class SignalPoller:
    """Polls one server's health and metrics in the background; ``latest`` never blocks."""

    def __init__(
        self,
        base_url: str,
        *,
        engine: str | None = None,
        interval_s: float = 1.0,
        transport: Transport | None = None,
        timeout_s: float | None = None,
        clock: Clock | None = None,
        history_limit: int = 4096,
    ) -> None:
        if engine is not None and engine not in ENGINES:
            raise ValueError(f"unknown engine {engine!r}; one of {', '.join(ENGINES)}")
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        self.url = str(server_root(base_url)).rstrip("/")
        self.engine = engine
        self.interval_s = interval_s
        # An answer slower than this counts as none; longer than the interval so a busy server's slow /metrics
        # (vLLM renders it on the API server's event loop) is still an answer.
        self.timeout_s = timeout_s if timeout_s is not None else max(5.0, 2 * interval_s)
        self._owns_transport = transport is None
        self.transport: Transport = transport or AiohttpTransport(connect_timeout_s=self.timeout_s)
        self.clock: Clock = clock or RealClock()
        self.history: list[ServerSignals] = []
        self._history_limit = history_limit
        self._started_at = self.clock.now()
        self._last_answer_t: float | None = None
        self._last_answer: ServerSignals | None = None
        self._ready_since_up = False
        self._task: asyncio.Task[None] | None = None
        self._listeners: list[MetricsListener] = []
        self.polls = 0

    def subscribe(self, listener: MetricsListener) -> Callable[[], None]:
        """Hand every /metrics scrape to ``listener`` as well; returns the call that stops it."""
        self._listeners.append(listener)

        def unsubscribe() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return unsubscribe

    @property
    def latest(self) -> ServerSignals | None:
        return self.history[-1] if self.history else None

    @property
    def last_answer(self) -> ServerSignals | None:
        """The latest reading in which the server answered (its figures are the freshest we have)."""
        return self._last_answer

    def last_response_age(self) -> float:
        """Seconds since the server last answered anything (since the poller started if it never has).

        0 while the poller has neither started nor polled: having asked nothing is no evidence that the server is
        dead, and a forgotten ``start()`` must not make every slow request look like one on a dead server.
        """
        if self._task is None and self.polls == 0:
            return 0.0
        since = self._last_answer_t if self._last_answer_t is not None else self._started_at
        return max(0.0, self.clock.now() - since)

    def at(self, t: float) -> ServerSignals | None:
        """The last answered reading taken at or before ``t`` (None when history does not reach back so far)."""
        i = bisect.bisect_right(self.history, t, key=lambda s: s.t)
        while i > 0:
            i -= 1
            if self.history[i].responding:
                return self.history[i]
        return None

    async def start(self) -> None:
        if self._task is None:
            self._started_at = self.clock.now()
            self._task = asyncio.create_task(self._run(), name=f"agentload-signals {self.url}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._owns_transport:
            await self.transport.aclose()

    async def wait_until_ready(self, timeout_s: float) -> ServerSignals:
        """Poll until the server says it is ready (or, with no readiness endpoint, answers at all).

        For a fleet's start: vLLM does not serve HTTP at all while it loads (a refused connection looks like a dead
        server to the watchdog), so the first turns should wait here, with a cap as long as a cold start can be.
        """
        deadline = self.clock.now() + timeout_s
        while True:
            sig = await self.poll_once()
            if sig.ready or (sig.responding and sig.ready is None):
                return sig
            left = deadline - self.clock.now()
            if left <= 0:
                state = "not ready" if sig.responding else "not answering"
                raise EndpointTimeoutError(f"{self.url} is still {state} after {timeout_s:g} s")
            await asyncio.sleep(min(self.interval_s, left))

    async def _run(self) -> None:
        while True:
            began = self.clock.now()
            await self.poll_once()
            await asyncio.sleep(max(0.0, self.interval_s - (self.clock.now() - began)))

    async def _get(self, path: str) -> _Answer | None:
        try:
            status, _, body = await get(self.transport, self.url + path, self.timeout_s)
        except (TransportError, TimeoutError):
            return None
        return status, body

    async def poll_once(self) -> ServerSignals:
        """Ask every endpoint of the engine's adapter once, concurrently, and record the reading."""
        paths = _PATHS[self.engine]
        answers = dict(zip(paths, await asyncio.gather(*(self._get(p) for p in paths)), strict=True))
        snapshot = _snapshot(answers.get("/metrics"))
        sig = self._read(answers, snapshot)
        self._record(sig)
        if "/metrics" in answers:
            for listener in list(self._listeners):
                listener(sig, snapshot)
        return sig

    def _read(self, answers: Mapping[str, _Answer | None], snapshot: MetricsSnapshot | None) -> ServerSignals:
        fields: dict[str, Any] = {"engine": self.engine}
        responding = any(a is not None for a in answers.values())
        health = answers.get("/health")
        if health is not None:
            fields["ready"] = _health(health[0])
        if snapshot is not None:
            found = _metrics(snapshot)
            detected = found.pop("engine", None)
            if self.engine is None and detected is not None:
                # Auto mode learns the engine from its metric prefix; llama.cpp adds /slots from the next poll on.
                self.engine = detected
            fields.update({k: v for k, v in found.items() if v is not None})
        slots = answers.get("/slots")
        if slots is not None and slots[0] == 200:
            fields.update(_slots(slots[1]))
        ps = answers.get("/api/ps")
        if ps is not None and ps[0] == 200:
            fields.update(_ollama_ps(ps[1]))
        fields["engine"] = self.engine
        ready = fields.get("ready")
        if not responding:
            self._ready_since_up = False  # gone silent: whatever comes back next starts up again
        elif ready:
            self._ready_since_up = True
        if ready is False:
            # Loading until it has been ready once since it came up; not ready after that means unhealthy (vLLM
            # answers /health 5xx when its engine died), which is no reason to wait. Ollama loads on demand, any
            # time, so "nothing loaded" always counts as loading there.
            fields["warming"] = self.engine == "ollama" or not self._ready_since_up
        return ServerSignals(t=self.clock.now(), responding=responding, **fields)

    def _record(self, sig: ServerSignals) -> None:
        self.polls += 1
        self.history.append(sig)
        if len(self.history) > 2 * self._history_limit:
            del self.history[: len(self.history) - self._history_limit]  # amortised trim, bisect stays valid
        if sig.responding:
            self._last_answer_t = sig.t
            self._last_answer = sig
