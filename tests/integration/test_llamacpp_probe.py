"""``agentload probe``, the client's usage and /metrics scraping against a real llama-server.

The figures probe reports are checked against what the server itself says on /props and /slots (read here with
plain urllib, not through agentload), and the prompt-cache reuse a client computes from usage against the
server's own counter of prompt tokens it processed.
"""

from __future__ import annotations

import json
import random

import pytest

from agentload.endpoint.client import ChatClient
from agentload.endpoint.records import Outcome, RequestRecord
from agentload.workload.words import WORDS
from tests.integration.harness.runs import counter_increase, missing_metrics
from tests.integration.harness.runs import probe as run_probe
from tests.integration.llamacpp import ALIAS, FIGURES, SLOT_CONTEXT, SLOTS, LlamaServer

# The names llama-server exposes with --metrics that agentload reads (scrape.py's llamacpp table).
LLAMACPP_METRICS = (
    "llamacpp:prompt_tokens_total",
    "llamacpp:tokens_predicted_total",
    "llamacpp:requests_processing",
    "llamacpp:requests_deferred",
)


def words(n: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n))


def test_probe_reports_the_slots_and_context_the_server_states(llamacpp: LlamaServer) -> None:
    props = json.loads(llamacpp.get("/props"))
    slots = json.loads(llamacpp.get("/slots"))
    probe = run_probe(llamacpp.url)
    # What the server says, against what it was started with (-np SLOTS, -c SLOTS × SLOT_CONTEXT).
    assert props["total_slots"] == SLOTS
    assert len(slots) == SLOTS
    assert {s["n_ctx"] for s in slots} == {SLOT_CONTEXT}
    # What probe says, against the server.
    assert probe["engine"] == "llamacpp"
    assert probe["parallel_slots"] == props["total_slots"] == len(slots)
    assert probe["max_running"] == len(slots)
    assert probe["max_context"] == props["default_generation_settings"]["n_ctx"] == slots[0]["n_ctx"]
    assert probe["pool_tokens"] == sum(s["n_ctx"] for s in slots)
    assert probe["block_size"] is None  # no paged pool: the pool is an equivalent, not blocks
    assert probe["model"] == ALIAS
    assert probe["output_length_control"] is not None
    FIGURES["probe"] = (
        f"engine {probe['engine']} {probe['version']}, slots {probe['parallel_slots']} (/props total_slots "
        f"{props['total_slots']}, /slots {len(slots)}), context {probe['max_context']} per slot (/slots n_ctx "
        f"{slots[0]['n_ctx']}), pool {probe['pool_tokens']} tokens, reports cached tokens "
        f"{probe['reports_cached_tokens']}"
    )


def test_probe_lists_the_llamacpp_metric_names(llamacpp: LlamaServer) -> None:
    missing, names = missing_metrics(llamacpp.url, LLAMACPP_METRICS)
    assert not missing, f"llama-server exposes no {missing}; it has {sorted(names)}"


async def test_usage_cached_tokens_agree_with_the_servers_processed_prompt_counter(llamacpp: LlamaServer) -> None:
    """Σ (prompt − cached) over usage equals the increase of llamacpp:prompt_tokens_total (tokens it processed).

    One agent at a time, so each request lands in a slot llama.cpp picks by prompt similarity: a request that
    continues an earlier conversation finds it in its slot; an unrelated one is processed in full.
    """
    rng = random.Random(7)
    conversations = [words(rng.randint(300, 700), seed=10 + i) for i in range(3)]

    async def send(client: ChatClient) -> list[RequestRecord]:
        records = []
        for turn in range(4):
            for i, history in enumerate(conversations):
                body = {"model": ALIAS, "messages": [{"role": "user", "content": history}], "max_tokens": 8,
                        "ignore_eos": True, "n_predict": 8}  # fmt: skip
                records.append(await client.chat(body))
                conversations[i] = history + " " + words(rng.randint(40, 120), seed=100 * turn + i)
        return records

    records, increase = await counter_increase(llamacpp.url, send)
    assert all(r.outcome is Outcome.OK for r in records), [r.error_message for r in records]
    assert all(r.cached_tokens is not None for r in records), "llama-server sent no usage.prompt_tokens_details"
    prompt = sum(r.prompt_tokens for r in records)
    cached = sum(r.cached_tokens or 0 for r in records)
    processed = increase["prompt_tokens"]
    usage_rate = cached / prompt
    server_rate = 1.0 - processed / prompt
    FIGURES["prompt-cache hit rate, 12 requests on 3 conversations"] = (
        f"usage {usage_rate:.4f} ({cached} of {prompt} prompt tokens cached), server {server_rate:.4f} "
        f"(llamacpp:prompt_tokens_total +{processed:.0f} processed)"
    )
    assert abs(usage_rate - server_rate) <= 0.01
    # 3 conversations on 3 slots: every turn after the first finds its conversation in its slot.
    assert 0.5 < usage_rate < 1.0
    assert all(r.completion_tokens == 8 for r in records)  # exact lengths: ignore_eos + n_predict


@pytest.mark.parametrize("repeat", [2])
async def test_a_repeated_prompt_is_served_from_its_slot(llamacpp: LlamaServer, repeat: int) -> None:
    prompt = words(900, seed=1)
    body = {"model": ALIAS, "messages": [{"role": "user", "content": prompt}], "max_tokens": 16}
    client = ChatClient(llamacpp.url)
    try:
        records = [await client.chat(body) for _ in range(repeat)]
    finally:
        await client.aclose()
    first, second = records
    assert first.outcome is Outcome.OK, first.error_message
    # One token per agentload word (build_model.py), plus the chat template's few.
    assert 900 <= first.prompt_tokens <= 900 + 20
    # The whole prompt but its last token (which llama.cpp re-evaluates to sample from) comes from the slot.
    assert second.cached_tokens == second.prompt_tokens - 1
    FIGURES["client"] = (
        f"prompt {first.prompt_tokens} tokens: cached {first.cached_tokens} then {second.cached_tokens}; "
        f"TTFT {(first.ttft or 0) * 1000:.0f} ms then {(second.ttft or 0) * 1000:.0f} ms"
    )
