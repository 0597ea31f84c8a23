"""The realistic tier model (build_model.py ``--variant realistic``) acts like real models where the tiny one is kind.

Real tokenizers count agentload's words at more than one token each, and real models stop long before the
``max_tokens`` a workload asks for unless told ``ignore_eos``. These tests pin that the second server does
both, and that ``ignore_eos`` with ``min_tokens`` still gives exact lengths, so later tests can measure how agentload
copes with a model that does not do what the word count and ``max_tokens`` promise.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import urllib.request

import numpy as np

from agentload.endpoint.client import ChatClient
from agentload.endpoint.records import Outcome, RequestRecord, UsageSource
from agentload.workload.agentic import words
from tests.integration.harness.runs import probe as run_probe
from tests.integration.vllm import (
    BLOCK_TOKENS,
    FIGURES,
    MAX_MODEL_LEN,
    POOL_BLOCKS,
    REALISTIC_MODEL,
    VllmServer,
)

PROMPT_WORDS = 600
REPLY_MAX = 200
EXACT = 64


def tokenize(server: VllmServer, prompt: str) -> int:
    """The server's own token count of ``prompt`` (vLLM's /tokenize, no chat template)."""
    body = json.dumps({"model": server.model, "prompt": prompt}).encode()
    req = urllib.request.Request(f"{server.url}/tokenize", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        count: int = json.loads(resp.read())["count"]
        return count


async def chats(server: VllmServer, bodies: list[dict[str, object]]) -> list[RequestRecord]:
    """The bodies, two at a time (a busy 2-core machine; the point is the lengths, not the speed)."""
    client = ChatClient(server.url)
    gate = asyncio.Semaphore(2)

    async def one(body: dict[str, object]) -> RequestRecord:
        async with gate:
            return await client.chat(body)

    try:
        records = await asyncio.gather(*(one(b) for b in bodies))
    finally:
        await client.aclose()
    for record in records:
        assert record.outcome is Outcome.OK, record.error_message
        assert record.usage_source is UsageSource.SERVER  # lengths as the server counted them
    return list(records)


def prompt(seed: int, n: int) -> str:
    return words(np.random.default_rng(seed), n)


def body(server: VllmServer, content: str, max_tokens: int, **extra: object) -> dict[str, object]:
    messages = [{"role": "user", "content": content}]
    return {"model": server.model, "messages": messages, "max_tokens": max_tokens, **extra}


async def test_agentload_words_cost_more_than_one_token_each(vllm_realistic: VllmServer) -> None:
    text = prompt(1, PROMPT_WORDS)
    count = tokenize(vllm_realistic, text)
    (record,) = await chats(vllm_realistic, [body(vllm_realistic, text, 1)])
    per_word = count / PROMPT_WORDS
    # Real tokenizers land at ~1.3 tokens per English word; the build aims at 1.4-1.6. Above 2.0 would mean the
    # tokenizer lost whole words it was trained on (byte-level pieces), not a realistic split.
    assert 1.3 <= per_word <= 2.0, f"{count} tokens for {PROMPT_WORDS} words"
    # The chat adds only the ChatML frame (role markers, newlines) around the same tokens.
    assert count < record.prompt_tokens <= count + 20
    FIGURES["realistic tokens per word"] = (
        f"{per_word:.3f} ({count} tokens for {PROMPT_WORDS} agentload words; chat prompt {record.prompt_tokens})"
    )


async def test_replies_stop_early_without_ignore_eos(vllm_realistic: VllmServer) -> None:
    records = await chats(vllm_realistic, [body(vllm_realistic, prompt(100 + i, 80), REPLY_MAX) for i in range(20)])
    lengths = [r.completion_tokens for r in records]
    mean = statistics.mean(lengths)
    # The build sets a stop probability of 1/7 a step: a geometric mean of ~7 tokens, so 20 replies average well
    # under 30 % of the 200 asked for, and each ends on the stop token: one in ~2 × 10^13 would run to 200.
    assert mean < 0.3 * REPLY_MAX, lengths
    assert all(r.finish_reason == "stop" for r in records), [r.finish_reason for r in records]
    assert all(1 <= n <= REPLY_MAX for n in lengths)
    FIGURES["realistic early stop"] = (
        f"mean {mean:.1f} completion tokens of {REPLY_MAX} asked (20 replies: min {min(lengths)}, "
        f"max {max(lengths)}, all ended on the stop token)"
    )


async def test_ignore_eos_with_min_tokens_gives_exact_lengths(vllm_realistic: VllmServer) -> None:
    exact = {"min_tokens": EXACT, "ignore_eos": True}
    records = await chats(
        vllm_realistic, [body(vllm_realistic, prompt(200 + i, 80), EXACT, **exact) for i in range(10)]
    )
    lengths = [r.completion_tokens for r in records]
    assert lengths == [EXACT] * 10
    assert all(r.finish_reason == "length" for r in records)
    FIGURES["realistic ignore_eos"] = f"10 of 10 replies exactly {EXACT} completion tokens"


def test_probe_reports_the_pool_and_model(vllm_realistic: VllmServer) -> None:
    probe = run_probe(vllm_realistic.url)
    logged_tokens, _ = vllm_realistic.startup_line()
    assert probe["engine"] == "vllm"
    assert probe["model"] == REALISTIC_MODEL
    assert probe["block_size"] == BLOCK_TOKENS
    assert probe["pool_tokens"] == logged_tokens == POOL_BLOCKS * BLOCK_TOKENS
    assert probe["max_context"] == MAX_MODEL_LEN
    assert probe["prefix_caching"] is True
    FIGURES["realistic probe"] = (
        f"model {probe['model']}, pool {probe['pool_tokens']:,} tokens (log: {logged_tokens:,}), "
        f"block {probe['block_size']}, max context {probe['max_context']}"
    )
