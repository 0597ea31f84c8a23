"""``agentload probe``, the chat client's timing and usage, and /metrics scraping against a real vLLM."""

from __future__ import annotations

import math
import random

import pytest

from agentload.endpoint.client import ChatClient
from agentload.endpoint.records import Outcome, RequestRecord
from agentload.workload.agentic import WORDS
from tests.integration.harness.runs import counter_increase, missing_metrics
from tests.integration.harness.runs import probe as run_probe
from tests.integration.vllm import BLOCK_TOKENS, FIGURES, MAX_MODEL_LEN, MODEL, POOL_BLOCKS, VllmServer

# The names vLLM exposes (vllm/v1/metrics/loggers.py; counters with _total); probe lists histograms once, by base name.
VLLM_METRICS = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:cache_config_info",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:num_preemptions_total",
    "vllm:request_success_total",
    "vllm:prompt_tokens_cached_total",
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:request_prefill_time_seconds",
)


def words(n: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n))


def test_probe_reports_the_pool_and_concurrency_vllm_logged_at_startup(vllm: VllmServer) -> None:
    probe = run_probe(vllm.url)
    logged_tokens, logged_concurrency = vllm.startup_line()
    assert probe["engine"] == "vllm"
    assert probe["block_size"] == BLOCK_TOKENS
    assert probe["pool_tokens"] == logged_tokens == POOL_BLOCKS * BLOCK_TOKENS
    assert probe["max_context"] == MAX_MODEL_LEN
    # vLLM's "Maximum concurrency" is computed in blocks: pool blocks ÷ blocks one max-length request needs.
    blocks = probe["pool_tokens"] // probe["block_size"]
    concurrency = blocks / math.ceil(probe["max_context"] / probe["block_size"])
    assert round(concurrency, 2) == logged_concurrency
    assert probe["prefix_caching"] is True
    assert probe["reports_cached_tokens"] is True  # the server runs with --enable-prompt-tokens-details
    assert probe["cached_tokens_advice"] is None
    assert probe["model"] == MODEL
    FIGURES["probe"] = (
        f"engine {probe['engine']} {probe['version']}, pool {probe['pool_tokens']:,} tokens "
        f"(log: {logged_tokens:,}), block {probe['block_size']}, max concurrency {concurrency:.2f}x "
        f"(log: {logged_concurrency:.2f}x), max_running {probe['max_running']}"
    )


def test_probe_lists_the_vllm_metric_names(vllm: VllmServer) -> None:
    missing, names = missing_metrics(vllm.url, VLLM_METRICS)
    assert not missing, f"vLLM 0.32 exposes no {missing}; it has {sorted(n for n in names if 'vllm' in n)}"


async def test_usage_reports_cached_tokens_on_a_repeated_prompt_and_timing_is_stamped(vllm: VllmServer) -> None:
    prompt = words(900, seed=1)
    body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": 32}
    client = ChatClient(vllm.url)
    try:
        first = await client.chat(body)
        second = await client.chat(body)
    finally:
        await client.aclose()
    for record in (first, second):
        assert record.outcome is Outcome.OK, record.error_message
        assert record.completion_tokens == 32  # the model cannot stop early (build_model.py)
        assert record.ttft is not None
        assert 0 < record.ttft < record.latency
        # At most one gap per pair of the 32 tokens; fewer when vLLM's detokenizer holds back a token that ends
        # mid-way through a UTF-8 character (random byte-level tokens do) and sends it with the next one.
        assert 16 <= len(record.itl()) <= 31
        assert sorted(record.chunk_times) == record.chunk_times
    # The agentic workload's words are one token each on this tokenizer, so sizes mean what they say.
    assert 900 <= first.prompt_tokens <= 900 + 20
    assert first.cached_tokens == 0
    # Only whole 128-token blocks are cached, and the lookup stops short of the last prompt token.
    assert second.cached_tokens == (second.prompt_tokens - 1) // BLOCK_TOKENS * BLOCK_TOKENS
    assert second.ttft is not None
    assert first.ttft is not None
    FIGURES["client"] = (
        f"prompt {first.prompt_tokens} tokens: cached {first.cached_tokens} then {second.cached_tokens}; "
        f"TTFT {first.ttft * 1000:.0f} ms then {second.ttft * 1000:.0f} ms; "
        f"ITL p50 {second.itl_percentiles()['p50'] * 1000:.1f} ms"
    )


async def test_prefix_hits_from_usage_agree_with_the_server_counters(vllm: VllmServer) -> None:
    """The hit rate a client computes from usage equals vLLM's own prefix-cache counters over the same requests."""
    rng = random.Random(2)
    shared = words(600, seed=3)

    async def send(client: ChatClient) -> list[RequestRecord]:
        records = []
        for i in range(12):
            tail = words(rng.randint(50, 400), seed=100 + i)
            content = shared + " " + tail if i % 3 else tail
            body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 8}
            records.append(await client.chat(body))
        return records

    records, increase = await counter_increase(vllm.url, send)
    assert all(r.outcome is Outcome.OK for r in records)
    prompt = sum(r.prompt_tokens for r in records)
    cached = sum(r.cached_tokens or 0 for r in records)
    usage_rate = cached / prompt
    keys = ("prefix_hits", "prefix_queries")
    assert all(k in increase for k in keys), sorted(increase)
    hits, queries = (increase[k] for k in keys)
    server_rate = hits / queries
    assert queries == pytest.approx(prompt)
    assert abs(usage_rate - server_rate) <= 0.01
    assert 0.2 < usage_rate < 0.9  # the shared prefix really was hit, and not everything was
    FIGURES["prefix hit rate, 12 requests"] = f"usage {usage_rate:.4f}, server counters {server_rate:.4f}"
