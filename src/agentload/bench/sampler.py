"""Samples the server's /metrics through the whole run (default 1 Hz), normalised across engines.

The server's own counters are the ground truth for throughput, prefix-cache reuse and preemptions; sampling
them during the run (not only before and after, as the source benchmark did) is what shows *when* the KV cache
filled and the hit rate fell. Histogram buckets (queue time) are kept raw for percentile deltas per level.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from dataclasses import dataclass, field

from agentload.bench.results import ServerSample
from agentload.endpoint.scrape import MetricsSnapshot, parse_metrics
from agentload.endpoint.transport import Transport, TransportError
from agentload.errors import EndpointError
from agentload.vtime import LoopClock

QUEUE_HISTOGRAM = "vllm:request_queue_time_seconds_bucket"


@dataclass
class RawSample:
    sample: ServerSample
    queue_buckets: dict[float, float] = field(default_factory=dict)  # upper bound → cumulative count


def to_sample(snapshot: MetricsSnapshot, t: float) -> RawSample:
    norm = snapshot.normalised()
    recomputed = [s.value for s in snapshot.named("agentload_sim:recomputed_prompt_tokens_total")]
    sample = ServerSample(
        t=t,
        running=norm.get("running"),
        waiting=norm.get("waiting"),
        kv_usage=norm.get("kv_usage"),
        prompt_tokens=norm.get("prompt_tokens"),
        generation_tokens=norm.get("generation_tokens"),
        prefix_queries=norm.get("prefix_queries"),
        prefix_hits=norm.get("prefix_hits"),
        preemptions=norm.get("preemptions"),
        recomputed_tokens=sum(recomputed) if recomputed else None,
    )
    buckets: dict[float, float] = {}
    for s in snapshot.named(QUEUE_HISTOGRAM):
        # A hostile or broken exporter's bucket (a bound that is no number, a NaN or negative count) is dropped
        # rather than poisoning the percentile deltas or ending the run (issue 15).
        try:
            bound = float(s.labels.get("le", ""))
        except ValueError:
            continue
        if math.isnan(bound) or not math.isfinite(s.value) or s.value < 0:
            continue
        buckets[bound] = buckets.get(bound, 0.0) + s.value
    return RawSample(sample, buckets)


class MetricsSampler:
    """Background scraper; ``samples`` grows as the run goes. A server without /metrics yields no samples.

    Every scrape has a deadline (``timeout_s``): a frozen server accepts the connection and never answers, and a
    scrape without one hung the whole bench — the window's edges wait for their sample (issue 15, item 1).
    """

    def __init__(
        self, transport: Transport, server_url: str, *, interval_s: float = 1.0, t0: float = 0.0, timeout_s: float = 5.0
    ) -> None:
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        self._transport = transport
        self._url = server_url.rstrip("/").removesuffix("/v1") + "/metrics"
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.t0 = t0
        self.samples: list[RawSample] = []
        self.failures = 0
        self._task: asyncio.Task[None] | None = None
        self._clock = LoopClock()

    async def sample_once(self) -> RawSample | None:
        try:
            async with asyncio.timeout(self.timeout_s):
                resp = await self._transport.send("GET", self._url, None, {})
                try:
                    body = await resp.read()
                finally:
                    resp.close()
            if resp.status != 200:
                self.failures += 1
                return None
            raw = to_sample(parse_metrics(body.decode("utf-8", "replace"), self._url), self._clock.now() - self.t0)
        except (TransportError, EndpointError, TimeoutError):
            self.failures += 1
            return None
        self.samples.append(raw)
        return raw

    async def _loop(self) -> None:
        while True:
            await self.sample_once()
            await asyncio.sleep(self.interval_s)

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
