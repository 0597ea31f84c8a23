"""The simulator's /metrics as a Prometheus client parses it: vLLM's names (counters with ``_total``), its labels,
the cache-config info, counters that follow what the engine did, and histograms that put each latency in the
bucket vLLM's edges give it. Figures are hand arithmetic on a two-turn conversation."""

from __future__ import annotations

import random

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agentload.capacity.profile import ServingProfile, parse_profile
from agentload.sim.engine import Engine, SimRequest
from agentload.sim.metrics import SimMetrics

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"


def _profile(kv_dtype: str = "") -> ServingProfile:
    return parse_profile(
        f"""
name = "tiny"
gpu = "h100"
max_model_len = 512
max_num_batched_tokens = 256
max_num_seqs = 8
model = "qwen2.5-0.5b"
{kv_dtype}
[kv_pool]
num_blocks = 64
""",
        "test",
    )


def _drain(engine: Engine, metrics: SimMetrics, now: float) -> float:
    while engine.has_work():
        res = engine.step(now)
        for req in res.emitted:
            if req.num_output == 1:
                metrics.observe_first_token(req)
        for req in res.finished:
            metrics.observe_finished(req)
        now = res.end
    return now


def _samples(metrics: SimMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


LABELS = (("engine", "0"), ("model_name", MODEL))


def _with(**extra: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((*LABELS, *extra.items())))


@pytest.fixture
def two_turns() -> tuple[Engine, SimMetrics]:
    """Turn 1: a 64-token prompt (4 full blocks of 16), 4 tokens out. Turn 2: the same 64 tokens plus 16 new, 2 out
    — its first 4 blocks are a prefix-cache hit."""
    profile = _profile()
    engine = Engine(profile)
    metrics = SimMetrics(engine, profile, MODEL)
    rng = random.Random(7)
    prompt = [rng.randrange(100_000) for _ in range(64)]
    engine.add(SimRequest("turn-1", prompt, [1, 2, 3, 4], 0.0))
    now = _drain(engine, metrics, 0.0)
    engine.add(SimRequest("turn-2", [*prompt, *range(16)], [5, 6], now))
    _drain(engine, metrics, now)
    return engine, metrics


def test_counters_carry_vllm_names_labels_and_the_conversations_figures(two_turns: tuple[Engine, SimMetrics]) -> None:
    _, metrics = two_turns
    s = _samples(metrics)
    assert s[("vllm:prompt_tokens_total", LABELS)] == 64 + 80  # every prompt token, cached or computed
    assert s[("vllm:generation_tokens_total", LABELS)] == 4 + 2
    assert s[("vllm:prefix_cache_queries_total", LABELS)] == 64 + 80
    assert s[("vllm:prefix_cache_hits_total", LABELS)] == 64  # turn 2's four full blocks
    assert s[("vllm:num_preemptions_total", LABELS)] == 0
    assert s[("vllm:request_success_total", _with(finished_reason="length"))] == 2
    assert s[("vllm:request_success_total", _with(finished_reason="stop"))] == 0
    assert s[("vllm:request_success_total", _with(finished_reason="abort"))] == 0
    # Ours are prefixed so a reader can never take them for vLLM's.
    assert s[("agentload_sim:recomputed_prompt_tokens_total", LABELS)] == 0
    assert s[("agentload_sim:offload_hit_tokens_total", LABELS)] == 0


def test_gauges_are_read_live_at_each_scrape() -> None:
    profile = _profile()
    engine = Engine(profile)
    metrics = SimMetrics(engine, profile, MODEL)
    engine.add(SimRequest("a", list(range(100, 132)), [1] * 8, 0.0))
    engine.add(SimRequest("b", list(range(200, 232)), [1] * 8, 0.0))
    res = engine.step(0.0)
    s = _samples(metrics)
    assert s[("vllm:num_requests_running", LABELS)] == 2
    assert s[("vllm:num_requests_waiting", LABELS)] == 0
    # Two 32-token prompts hold 2 blocks of 16 each: 4 of the 63 a 64-block pool caches (its first is vLLM's null
    # block, and vLLM's usage divides by the other 63); the first output token's KV is written by the next step,
    # which allocates its slot, as vLLM's scheduler does.
    assert s[("vllm:kv_cache_usage_perc", LABELS)] == pytest.approx(4 / 63)
    _drain(engine, metrics, res.end)
    after = _samples(metrics)
    assert after[("vllm:num_requests_running", LABELS)] == 0
    assert after[("vllm:kv_cache_usage_perc", LABELS)] == 0  # cached blocks are free blocks, as in vLLM


def test_cache_config_info_holds_the_pool() -> None:
    s = _samples(SimMetrics(Engine(_profile()), _profile(), MODEL))
    info = [labels for (name, labels), value in s.items() if name == "vllm:cache_config_info" and value == 1]
    assert len(info) == 1
    fields = dict(info[0])
    assert fields["block_size"] == "16"
    assert fields["num_gpu_blocks"] == "64"
    assert fields["num_cpu_blocks"] == "0"
    assert fields["cache_dtype"] == "auto"  # bf16 KV is vLLM's "auto"
    assert fields["enable_prefix_caching"] == "True"


def test_an_fp8_cache_is_named_as_vllm_names_it() -> None:
    profile = _profile('kv_cache_dtype = "fp8"')
    s = _samples(SimMetrics(Engine(profile), profile, MODEL))
    info = next(dict(labels) for (name, labels) in s if name == "vllm:cache_config_info")
    assert info["cache_dtype"] == "fp8"


def test_each_latency_lands_in_vllms_bucket() -> None:
    profile = _profile()
    engine = Engine(profile)
    metrics = SimMetrics(engine, profile, MODEL)
    req = SimRequest("r", [1, 2, 3], [1, 2], arrival=10.0)
    req.first_scheduled = 10.5  # half a second queued
    req.first_token = 10.53  # then 30 ms of prefill: TTFT 0.53 s
    req.finished_at = 12.0
    metrics.observe_first_token(req)
    metrics.observe_finished(req)
    metrics.observe_token(0.012)
    s = _samples(metrics)

    def bucket(name: str, le: str) -> float:
        return s[(f"vllm:{name}_bucket", _with(le=le))]

    # TTFT 0.53: above the 0.5 edge, within 0.75.
    assert (bucket("time_to_first_token_seconds", "0.5"), bucket("time_to_first_token_seconds", "0.75")) == (0, 1)
    assert s[("vllm:time_to_first_token_seconds_sum", LABELS)] == pytest.approx(0.53)
    # Queue 0.5 s: Prometheus buckets are ≤ le, so 0.5 counts in the 0.5 bucket, not only above it.
    assert (bucket("request_queue_time_seconds", "0.3"), bucket("request_queue_time_seconds", "0.5")) == (0, 1)
    # Prefill 0.03 s: below the request histograms' first edge (0.3 s).
    assert bucket("request_prefill_time_seconds", "0.3") == 1
    # End to end 2.0 s; ITL 12 ms between the 0.01 and 0.025 edges.
    assert (bucket("e2e_request_latency_seconds", "1.5"), bucket("e2e_request_latency_seconds", "2.0")) == (0, 1)
    assert (bucket("inter_token_latency_seconds", "0.01"), bucket("inter_token_latency_seconds", "0.025")) == (0, 1)
    assert bucket("inter_token_latency_seconds", "+Inf") == 1


def test_a_request_without_a_first_token_or_an_end_observes_nothing() -> None:
    profile = _profile()
    metrics = SimMetrics(Engine(profile), profile, MODEL)
    req = SimRequest("never-ran", [1, 2, 3], [1], arrival=0.0)
    metrics.observe_first_token(req)
    metrics.observe_finished(req)
    s = _samples(metrics)
    assert s[("vllm:time_to_first_token_seconds_count", LABELS)] == 0
    assert s[("vllm:e2e_request_latency_seconds_count", LABELS)] == 0


def test_queue_and_prefill_need_the_scheduling_time() -> None:
    profile = _profile()
    metrics = SimMetrics(Engine(profile), profile, MODEL)
    req = SimRequest("r", [1], [1], arrival=0.0)
    req.first_token = 0.2  # scheduled time unknown: TTFT only
    metrics.observe_first_token(req)
    s = _samples(metrics)
    assert s[("vllm:time_to_first_token_seconds_count", LABELS)] == 1
    assert s[("vllm:request_queue_time_seconds_count", LABELS)] == 0
    assert s[("vllm:request_prefill_time_seconds_count", LABELS)] == 0
