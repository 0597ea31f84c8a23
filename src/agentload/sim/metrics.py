"""/metrics in Prometheus text with vLLM's own metric names, from the engine's live state.

The names are those of ``vllm/v1/metrics/loggers.py`` (docs/background.md §3).

Gauges and counters are read from the engine when scraped (a custom collector), so they can never drift from
what the engine did; latency histograms are observed as requests progress. Names: prometheus_client appends
``_total`` to counters in the exposition, as vLLM's do. Two extension counters are ours and prefixed
``agentload_sim:`` so they can never be mistaken for vLLM's.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from agentload.capacity.profile import ServingProfile
from agentload.sim.engine import Engine, SimRequest

# vLLM's bucket edges (seconds) for the request-level histograms.
_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0)  # fmt: skip
_REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                    240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip


class _EngineCollector(Collector):
    def __init__(self, engine: Engine, profile: ServingProfile, labels: dict[str, str]) -> None:
        self.engine = engine
        self.profile = profile
        self.labels = labels

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        g = GaugeMetricFamily(name, doc, labels=list(self.labels))
        g.add_metric(list(self.labels.values()), value)
        return g

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        c = CounterMetricFamily(name, doc, labels=list(self.labels))
        c.add_metric(list(self.labels.values()), value)
        return c

    def collect(self) -> Iterator[Metric]:
        e, s, p = self.engine, self.engine.stats, self.profile
        yield self._gauge("vllm:num_requests_running", "Number of requests in model execution batches.", e.num_running)
        yield self._gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", e.num_waiting)
        yield self._gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", e.kv.usage)
        info = InfoMetricFamily("vllm:cache_config", "Information of the LLMEngine CacheConfig")
        info.add_metric(
            [],
            {
                "block_size": str(p.block_size),
                "num_gpu_blocks": str(p.num_blocks),
                "num_cpu_blocks": str(p.offload_blocks),
                "cache_dtype": "auto" if p.kv_dtype.value == "bf16" else p.kv_dtype.value,
                "gpu_memory_utilization": str(p.gpu_memory_utilization),
                "enable_prefix_caching": str(p.enable_prefix_caching),
            },
        )
        yield info
        yield self._counter("vllm:prompt_tokens", "Number of prefill tokens processed.", s.prompt_tokens)
        yield self._counter("vllm:generation_tokens", "Number of generation tokens processed.", s.generation_tokens)
        yield self._counter(
            "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.", s.prefix_queries
        )
        yield self._counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", s.prefix_hits
        )
        yield self._counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", s.preemptions)
        success = CounterMetricFamily(
            "vllm:request_success",
            "Count of successfully processed requests.",
            labels=[*self.labels, "finished_reason"],
        )
        for reason in ("stop", "length", "abort"):
            success.add_metric([*self.labels.values(), reason], s.finished.get(reason, 0))
        yield success
        yield self._counter(
            "agentload_sim:recomputed_prompt_tokens",
            "Prefill tokens computed again after a preemption (simulator extension).",
            s.recomputed_tokens,
        )
        if p.offload_blocks:
            # vLLM's names for a KV connector's tier: its queries are every prompt token scheduled (as the GPU
            # cache's), its hits the tokens loaded from the tier rather than recomputed.
            yield self._counter(
                "vllm:external_prefix_cache_queries",
                "External prefix cache queries from KV connector cross-instance cache sharing, in terms of number "
                "of queried tokens.",
                s.prefix_queries,
            )
            yield self._counter(
                "vllm:external_prefix_cache_hits",
                "External prefix cache hits from KV connector cross-instance cache sharing, in terms of number of "
                "cached tokens.",
                s.offload_hit_tokens,
            )
        yield self._counter(
            "agentload_sim:offload_hit_tokens",
            "Prompt tokens loaded from the CPU offload tier instead of recomputed (simulator extension).",
            s.offload_hit_tokens,
        )


class SimMetrics:
    """The server's metric registry: engine state plus request-latency histograms."""

    def __init__(self, engine: Engine, profile: ServingProfile, model_name: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        labels = {"model_name": model_name, "engine": "0"}
        self.registry.register(_EngineCollector(engine, profile, labels))
        names = list(labels)

        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, names, buckets=buckets, registry=self.registry)

        self._ttft = hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                          _TTFT_BUCKETS).labels(**labels)  # fmt: skip
        self._itl = hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                         _ITL_BUCKETS).labels(**labels)  # fmt: skip
        self._e2e = hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                         _REQUEST_BUCKETS).labels(**labels)  # fmt: skip
        self._queue = hist("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.",
                           _REQUEST_BUCKETS).labels(**labels)  # fmt: skip
        self._prefill = hist("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase.",
                             _REQUEST_BUCKETS).labels(**labels)  # fmt: skip
        self._decode = hist("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase.",
                            _REQUEST_BUCKETS).labels(**labels)  # fmt: skip

    def observe_token(self, gap_s: float) -> None:
        self._itl.observe(gap_s)

    def observe_first_token(self, req: SimRequest) -> None:
        if req.first_token is not None:
            self._ttft.observe(req.first_token - req.arrival)
            if req.first_scheduled is not None:
                self._queue.observe(req.first_scheduled - req.arrival)
                self._prefill.observe(req.first_token - req.first_scheduled)

    def observe_finished(self, req: SimRequest) -> None:
        if req.finished_at is not None:
            self._e2e.observe(req.finished_at - req.arrival)
            if req.first_token is not None:
                self._decode.observe(req.finished_at - req.first_token)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
