"""The server's /metrics through the whole run (the connection's monitor, default 1 Hz), normalised across engines.

The server's own counters are the ground truth for throughput, prefix-cache reuse and preemptions; sampling
them during the run (not only before and after, as the source benchmark did) is what shows *when* the KV cache
filled and the hit rate fell. Histogram buckets (queue time) are kept raw for percentile deltas per level.
What one scrape becomes (``ServerSample``, ``to_sample``) is ``endpoint.samples``: the fleet keeps the same
samples, and profiles do not import each other.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from agentload.endpoint.samples import RawSample, to_sample
from agentload.endpoint.scrape import MetricsSnapshot
from agentload.endpoint.signals import ServerSignals, SignalPoller


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
