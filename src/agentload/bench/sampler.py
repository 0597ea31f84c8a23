"""The server's /metrics through the whole run (the connection's monitor, default 1 Hz), normalised across engines.

The server's own counters are the ground truth for throughput, prefix-cache reuse and preemptions; sampling
them during the run (not only before and after, as the source benchmark did) is what shows *when* the KV cache
filled and the hit rate fell. Histogram buckets (queue time) are kept raw for percentile deltas per level.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from agentload.bench.results import ServerSample
from agentload.endpoint.scrape import MetricsSnapshot
from agentload.endpoint.signals import ServerSignals, SignalPoller

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
        # rather than poisoning the percentile deltas or ending the run.
        try:
            bound = float(s.labels.get("le", ""))
        except ValueError:
            continue
        if math.isnan(bound) or not math.isfinite(s.value) or s.value < 0:
            continue
        buckets[bound] = buckets.get(bound, 0.0) + s.value
    return RawSample(sample, buckets)


class MetricsSampler:
    """The level's timeline of /metrics samples; ``samples`` grows as the run goes.

    It scrapes nothing itself: it subscribes to the connection's one server monitor (``endpoint.signals.
    SignalPoller``), whose periodic /metrics poll also feeds the stall watchdog, so a level asks the server once a
    second, not twice. ``sample_once`` asks for a scrape now (the window's quiesced edges need their counters at
    that instant) and returns that scrape's sample. A poll whose /metrics gave no usable answer counts as a failure
    and adds no sample; the poller's deadline keeps a frozen server from hanging an edge.
    """

    def __init__(self, monitor: SignalPoller, *, t0: float = 0.0) -> None:
        self.monitor = monitor
        self.t0 = t0
        self.samples: list[RawSample] = []
        self.failures = 0
        # The last few readings with what each gave, so ``sample_once`` returns its own scrape's sample even when a
        # background poll lands while it waits.
        self._recent: deque[tuple[ServerSignals, RawSample | None]] = deque(maxlen=8)
        self._unsubscribe: Callable[[], None] | None = None

    def _on_scrape(self, sig: ServerSignals, snapshot: MetricsSnapshot | None) -> None:
        raw = None if snapshot is None else to_sample(snapshot, sig.t - self.t0)
        if raw is None:
            self.failures += 1
        else:
            self.samples.append(raw)
        self._recent.append((sig, raw))

    async def sample_once(self) -> RawSample | None:
        subscribed = self._unsubscribe is not None
        if not subscribed:
            self.start()
        try:
            sig = await self.monitor.poll_once()
        finally:
            if not subscribed:
                await self.stop()
        return next((raw for s, raw in reversed(self._recent) if s is sig), None)

    def start(self) -> None:
        if self._unsubscribe is None:
            self._unsubscribe = self.monitor.subscribe(self._on_scrape)

    async def stop(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
