"""The simulator's default tokenizer counts text as a real BPE tokenizer does, and its server refuses what a real
one would: counts checked against a real tokenizer's (tests/data/tokens_reference.json), no tokenizer needed here."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agentload.capacity.profile import load_profile
from agentload.sim.bpe import BpeTokenizer
from agentload.sim.server import SimConfig, SimServer
from agentload.sim.tokens import split_tokens, token_id, tokenize
from tests.simserver import running_sim
from tests.test_server_http import post

REFERENCE = json.loads((Path(__file__).parent / "data" / "tokens_reference.json").read_text(encoding="utf-8"))
MODEL = "Qwen/Qwen3-235B-A22B"  # qwen3-235b-gb300: a 40,960-token context


@pytest.mark.parametrize("kind", sorted(REFERENCE["texts"]))
def test_counts_land_within_ten_percent_of_a_real_bpe_tokenizer(kind: str) -> None:
    ref = REFERENCE["texts"][kind]
    text, real = ref["text"], ref["tokens"]
    simulated = len(tokenize(text))
    assert abs(simulated - real) <= 0.10 * real, (kind, simulated, real)
    # A token a word would miss JSON by far: the reference set has teeth.
    if kind == "json_compact":
        assert len(text.split()) < 0.1 * real


def test_the_reference_covers_each_kind_of_text() -> None:
    assert set(REFERENCE["texts"]) == {"prose", "json_pretty", "json_compact", "python", "digits"}
    assert "SmolLM2" in REFERENCE["note"]


def test_a_text_costs_the_sum_of_its_parts_split_before_a_special_token() -> None:
    """The server tokenizes a chat prompt message by message (each starts with ``<|im_start|>``) and caches each."""
    text = REFERENCE["texts"]["python"]["text"]
    whole = tokenize(text)
    parts = ["<|im_start|>user\n", text, "<|im_end|>\n", "<|im_start|>assistant\n"]
    assert tokenize("".join(parts)) == [t for p in parts for t in tokenize(p)]
    # Ids are the token texts' own: the same in any process, for any tokenizer instance.
    assert BpeTokenizer().tokenize(text) == whole == [token_id(t) for t in split_tokens(text)]


def _tool_result(chars: int) -> str:
    """A JSON tool result of about ``chars`` characters: records with ids, numbers, dates and short texts."""
    rng = random.Random(5)
    rows: list[dict[str, Any]] = []
    while sum(len(json.dumps(r)) + 2 for r in rows) < chars:
        rows.append(
            {
                "id": f"evt_{rng.getrandbits(40):010x}",
                "user_id": rng.randint(10_000, 99_999_999),
                "amount": round(rng.uniform(0, 10_000), 2),
                "created_at": f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:00:00Z",
                "status": rng.choice(["ok", "pending", "failed", "refunded"]),
                "tags": rng.sample(["billing", "api", "retry", "batch", "eu", "us"], 2),
                "note": " ".join(rng.choices(["the", "payment", "was", "sent", "to", "a", "new", "account"], k=6)),
            }
        )
    return json.dumps(rows)


async def test_a_long_json_tool_result_is_past_a_40k_context_and_refused_as_vllm_refuses_it() -> None:
    result = _tool_result(235_000)
    assert 234_000 < len(result) < 236_500
    assert len(result.split()) < 40_960  # a token a word would have let it through
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a billing assistant."},
        {"role": "user", "content": "Why did my payments fail?"},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "list_events", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": result},
    ]  # fmt: skip
    async with running_sim() as (server, url), aiohttp.ClientSession() as http:
        assert server.profile.max_model_len == 40_960
        status, counted = await post(http, f"{url}/tokenize", {"model": MODEL, "messages": messages})
        assert status == 200
        assert counted["count"] > 50_000  # JSON at about four characters a token or less
        status, body = await post(http, f"{url}/v1/chat/completions", {"model": MODEL, "messages": messages})
        assert status == 400
        assert body["error"]["code"] == 400
        assert "maximum context length is 40960 tokens" in body["error"]["message"]
        assert f"{counted['count']} in the messages" in body["error"]["message"]
        # A quarter of it fits, and is counted the same by usage and /tokenize.
        messages[-1]["content"] = result[: len(result) // 4]
        body_ok = {"model": MODEL, "messages": messages, "max_tokens": 8}
        status, answer = await post(http, f"{url}/v1/chat/completions", body_ok)
        assert status == 200
        _, counted = await post(http, f"{url}/tokenize", {"model": MODEL, "messages": messages})
        assert answer["usage"]["prompt_tokens"] == counted["count"]


async def test_a_tool_call_costs_its_serialized_name_and_arguments() -> None:
    tools = [{"type": "function", "function": {"name": "list_favorites", "parameters": {"type": "object"}}}]
    body = {"model": MODEL, "messages": [{"role": "user", "content": "my favourites?"}], "tools": tools,
            "tool_choice": {"type": "function", "function": {"name": "list_favorites"}}}  # fmt: skip
    server = SimServer(SimConfig(profile=load_profile("qwen3-235b-gb300")))
    call = '<tool_call>\n{"name": "list_favorites", "arguments": {}}\n</tool_call>'
    async with running_sim() as (_, url), aiohttp.ClientSession() as http:
        status, answer = await post(http, f"{url}/v1/chat/completions", body)
        assert status == 200
        assert answer["choices"][0]["message"]["tool_calls"][0]["function"] == {
            "name": "list_favorites",
            "arguments": "{}",
        }
        # What the call costs as text (about 17 tokens on a Qwen or SmolLM2 vocabulary), not two tokens.
        # (generated piece by piece: the arguments' "{}" and the call's closing "}" are not merged into one token)
        assert answer["usage"]["completion_tokens"] == len(server.tokenizer.tokenize(call)) + 1
        assert answer["usage"]["completion_tokens"] >= 12
        # A cap cuts the call's tokens there, with a "length" finish.
        status, capped = await post(http, f"{url}/v1/chat/completions", {**body, "max_tokens": 5})
        assert status == 200
        assert capped["usage"]["completion_tokens"] == 5
        assert capped["choices"][0]["finish_reason"] == "length"
