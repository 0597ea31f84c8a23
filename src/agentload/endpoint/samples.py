"""One scrape of the server's /metrics as a point of a timeline, normalised across engines.

Below every profile that keeps such a timeline: bench's level sampler (``bench.sampler.MetricsSampler``) and its
results, the fleet's ``server.jsonl`` (``fleet.samples``), the run directory's ``samples.jsonl`` and CSV export
(``store``) and the report's figures all hold the same ``ServerSample``, so none of them has to reach into another
profile for it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict

from agentload.endpoint.scrape import MetricsSnapshot

QUEUE_HISTOGRAM = "vllm:request_queue_time_seconds_bucket"


class ServerSample(BaseModel):
    """One scrape of the server's /metrics, normalised across engines (None where the engine has no such metric)."""

    model_config = ConfigDict(frozen=True)

    t: float  # client clock, seconds since the run started
    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None  # 0–1
    prompt_tokens: float | None = None  # counters (cumulative)
    generation_tokens: float | None = None
    prefix_queries: float | None = None
    prefix_hits: float | None = None
    preemptions: float | None = None
    recomputed_tokens: float | None = None  # simulator extension
    external_queries: float | None = None  # a KV connector's tier (CPU offload, LMCache): prompt tokens asked
    external_hits: float | None = None  # ... and loaded from it instead of recomputed
    prefill_time_s: float | None = None  # seconds requests spent in prefill (sum of the histogram)
    decode_time_s: float | None = None  # ... and in decode


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
        external_queries=norm.get("external_queries"),
        external_hits=norm.get("external_hits"),
        prefill_time_s=norm.get("prefill_time_s"),
        decode_time_s=norm.get("decode_time_s"),
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
