"""The official openai SDK, unmodified, against the simulated server."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest
from openai import AsyncOpenAI

from agentload.sim.agentmodel import AgentBehaviour
from agentload.sim.tokens import tokenize
from tests.simserver import running_sim

MODEL = "Qwen/Qwen3-235B-A22B"
WEATHER_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def _client(url: str) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{url}/v1", api_key="not-needed", max_retries=0)


async def test_sdk_non_streaming_text_and_usage() -> None:
    async with running_sim() as (_, url), _client(url) as client:
        resp = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Say something."}], max_tokens=12
        )
    assert resp.choices[0].message.role == "assistant"
    assert resp.choices[0].message.content
    assert resp.choices[0].finish_reason == "length"
    assert resp.usage is not None
    assert resp.usage.completion_tokens == 12
    assert resp.usage.prompt_tokens > 0


async def test_sdk_non_streaming_tool_call() -> None:
    async with running_sim() as (_, url), _client(url) as client:
        resp = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Weather in Paris?"}],
            tools=[WEATHER_TOOL],
            tool_choice="required",
        )
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls
    assert calls is not None
    assert len(calls) == 1
    call = calls[0]
    assert call.type == "function"
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "example"}


async def test_sdk_streaming_content_with_usage() -> None:
    async with running_sim() as (_, url), _client(url) as client:
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Stream please."}],
            max_tokens=20,
            stream=True,
            stream_options={"include_usage": True},
        )
        text, finish, usage, chunks = "", None, None, 0
        async for chunk in stream:
            chunks += 1
            if chunk.usage is not None:
                usage = chunk.usage
            for c in chunk.choices:
                text += c.delta.content or ""
                finish = c.finish_reason or finish
    assert finish == "length"
    assert usage is not None
    assert usage.completion_tokens == 20
    assert len(text.split()) == 20
    assert chunks >= 20  # one chunk per token, plus role, finish and usage


async def test_sdk_streaming_tool_call_deltas_assemble() -> None:
    async with running_sim() as (_, url), _client(url) as client:
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Weather in Oslo?"}],
            tools=[WEATHER_TOOL],
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            stream=True,
        )
        names: dict[int, str] = {}
        args: dict[int, str] = {}
        finish = None
        async for chunk in stream:
            for c in chunk.choices:
                finish = c.finish_reason or finish
                for tc in c.delta.tool_calls or []:
                    if tc.function and tc.function.name:
                        names[tc.index] = tc.function.name
                    if tc.function and tc.function.arguments:
                        args[tc.index] = args.get(tc.index, "") + tc.function.arguments
    assert finish == "tool_calls"
    assert names == {0: "get_weather"}
    assert json.loads(args[0]) == {"city": "example"}


async def test_long_prompt_twice_is_cached_and_metrics_agree() -> None:
    long_text = " ".join(f"line{i} of the repository listing" for i in range(1500))
    messages: Any = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": long_text}]
    async with running_sim() as (_, url), _client(url) as client:
        first = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4)
        second = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4)
        async with aiohttp.ClientSession() as http, http.get(f"{url}/metrics") as r:
            metrics = await r.text()
    assert first.usage is not None
    assert second.usage is not None
    prompt = second.usage.prompt_tokens
    assert prompt > 6000
    assert first.usage.prompt_tokens_details is not None
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens_details is not None
    cached = second.usage.prompt_tokens_details.cached_tokens or 0
    assert cached >= 0.9 * prompt
    values = {
        line.split("{")[0]: float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("vllm:prefix_cache")
    }
    assert values["vllm:prefix_cache_queries_total"] == first.usage.prompt_tokens + prompt
    assert values["vllm:prefix_cache_hits_total"] == cached


async def test_conversation_turn_hits_previous_turn_including_reply() -> None:
    """The next turn resends the reply; its tokens were generated and hashed, so they hit too."""
    base: Any = [{"role": "user", "content": " ".join(f"word{i}" for i in range(800))}]
    async with running_sim() as (_, url), _client(url) as client:
        r1 = await client.chat.completions.create(model=MODEL, messages=base, max_tokens=64)
        reply = r1.choices[0].message.content or ""
        turn2: Any = [*base, {"role": "assistant", "content": reply}, {"role": "user", "content": "and now?"}]
        r2 = await client.chat.completions.create(model=MODEL, messages=turn2, max_tokens=4)
    assert r1.usage is not None
    assert r2.usage is not None
    assert r2.usage.prompt_tokens_details is not None
    cached = r2.usage.prompt_tokens_details.cached_tokens or 0
    # Everything but the last partial block and the new user message was seen before (prompt + reply).
    assert cached >= r1.usage.prompt_tokens + 64 - 32


@pytest.mark.parametrize("details", [True, False])
async def test_prompt_tokens_details_flag(details: bool) -> None:
    async with running_sim(prompt_tokens_details=details) as (_, url), _client(url) as client:
        r = await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=2)
    assert r.usage is not None
    assert (r.usage.prompt_tokens_details is not None) is details


async def test_completions_endpoint_stream_and_not() -> None:
    async with running_sim() as (_, url), _client(url) as client:
        r = await client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=7)
        assert r.choices[0].text
        assert r.usage is not None
        assert r.usage.completion_tokens == 7
        stream = await client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=5, stream=True)
        pieces = [c.choices[0].text async for c in stream if c.choices]
    assert len([p for p in pieces if p]) == 5


@pytest.mark.parametrize(
    ("extra", "tokens", "finish"),
    [
        ({}, None, "stop"),  # the agent model's own answer: short, it stops by itself
        ({"ignore_eos": True}, 300, "length"),  # held to the cap, as vLLM's ignore_eos does
        ({"min_tokens": 200}, 200, "stop"),  # the end held back until 200 tokens, then the model stops
    ],
)
async def test_agent_model_honours_ignore_eos_and_min_tokens(
    extra: dict[str, Any], tokens: int | None, finish: str
) -> None:
    async with running_sim(behaviour=AgentBehaviour()) as (_, url), _client(url) as client:
        resp = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Explain how the prefix cache works."}],
            max_tokens=300,
            extra_body=extra,
        )
    assert resp.usage is not None
    content = resp.choices[0].message.content or ""
    if tokens is None:
        assert resp.usage.completion_tokens < 200
    else:
        assert resp.usage.completion_tokens == tokens
    # Re-tokenising the text gives the counted tokens back: the reply is made of the tokenizer's own pieces.
    assert len(tokenize(content)) == resp.usage.completion_tokens
    assert resp.choices[0].finish_reason == finish
