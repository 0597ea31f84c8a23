"""The simulated server over raw HTTP: errors, health and cold start, faults, metrics, tokenize, oracle."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agentload.errors import ConfigError
from agentload.sim.behaviour import OracleBehaviour
from agentload.sim.faults import FaultSpec, parse_fault
from agentload.suite.app import oracle_book
from agentload.workload.words import WORDS
from tests.simserver import running_sim
from tests.test_calibrate import QUICK_PROFILE

MODEL = "Qwen/Qwen3-235B-A22B"


def chat(content: str = "hello", **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 4, **extra}


async def post(http: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with http.post(url, data=data, headers={"Content-Type": "application/json"}) as r:
        text = await r.text()
        try:
            return r.status, json.loads(text)
        except json.JSONDecodeError:
            return r.status, text


async def drain(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any], client_timeout: aiohttp.ClientTimeout | None
) -> None:
    """Read a streamed response to its end."""
    async with http.post(f"{url}/v1/chat/completions", json=body, timeout=client_timeout) as r:
        async for _ in r.content:
            pass


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b"[1, 2]", 400, "JSON object"),
        ({"model": MODEL}, 400, "messages"),
        ({"model": MODEL, "messages": []}, 400, "messages"),
        ({"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}, 400, "role"),
        (chat(max_tokens=-3), 400, "max_tokens"),
        (chat(n=2), 400, "n"),
        (chat(max_tokens=40_960), 400, "maximum context length"),
        (chat(content="word " * 41_000), 400, "maximum context length"),
        ({**chat(), "model": "gpt-unknown"}, 404, "does not exist"),
    ],
)
async def test_bad_input_gets_openai_error_and_server_keeps_serving(body: Any, status: int, needle: str) -> None:
    async with running_sim() as (_, url), aiohttp.ClientSession() as http:
        got, payload = await post(http, f"{url}/v1/chat/completions", body)
        assert got == status
        assert isinstance(payload, dict)
        assert needle in payload["error"]["message"]
        assert payload["error"]["code"] == status
        assert "Traceback" not in json.dumps(payload)
        ok, good = await post(http, f"{url}/v1/chat/completions", chat())
        assert ok == 200
        assert good["usage"]["completion_tokens"] == 4


async def test_unknown_route_and_method_are_json_errors() -> None:
    async with running_sim() as (_, url), aiohttp.ClientSession() as http:
        async with http.get(f"{url}/v1/nothing") as r:
            assert r.status == 404
            assert "error" in await r.json()
        async with http.get(f"{url}/v1/chat/completions") as r:
            assert r.status == 405
            assert "error" in await r.json()


async def test_models_and_tokenize_agree_with_usage() -> None:
    async with running_sim() as (_, url), aiohttp.ClientSession() as http:
        async with http.get(f"{url}/v1/models") as r:
            models = await r.json()
        assert models["data"][0]["id"] == MODEL
        assert models["data"][0]["max_model_len"] == 40_960
        body = chat("count these few words please")
        _, tok = await post(http, f"{url}/tokenize", {"model": MODEL, "messages": body["messages"]})
        _, resp = await post(http, f"{url}/v1/chat/completions", body)
        assert tok["count"] == resp["usage"]["prompt_tokens"] == len(tok["tokens"])
        status, err = await post(http, f"{url}/tokenize", {"model": MODEL})
        assert status == 400
        assert "prompt" in err["error"]["message"]


async def test_a_calibrated_tokenizer_counts_prompts_and_resent_replies_in_its_own_tokens(tmp_path: Path) -> None:
    path = tmp_path / "split.toml"
    path.write_text(QUICK_PROFILE)  # its [tokenizer] makes half of all words two or three tokens
    text = " ".join(WORDS)
    async with running_sim(str(path)) as (_, url), aiohttp.ClientSession() as http:
        first = [{"role": "user", "content": text}]
        _, tok = await post(http, f"{url}/tokenize", {"model": "quick", "messages": first})
        body = {"model": "quick", "messages": first, "max_tokens": 200, "ignore_eos": True}
        _, resp = await post(http, f"{url}/v1/chat/completions", body)
        assert tok["count"] == resp["usage"]["prompt_tokens"]
        # Most of agentload's words are one token, the rest two or three: well over one token a word.
        assert resp["usage"]["prompt_tokens"] > 1.4 * len(WORDS)
        reply = resp["choices"][0]["message"]["content"]
        assert resp["usage"]["completion_tokens"] == 200
        again = [*first, {"role": "assistant", "content": reply}, {"role": "user", "content": "next"}]
        _, more = await post(http, f"{url}/tokenize", {"model": "quick", "messages": again})
    # Generated a token a word, the reply is counted in the split's tokens when the next prompt carries it.
    assert more["count"] - tok["count"] > 1.2 * 200


async def test_metrics_expose_vllm_names() -> None:
    async with running_sim() as (_, url), aiohttp.ClientSession() as http:
        await post(http, f"{url}/v1/chat/completions", chat())
        async with http.get(f"{url}/metrics") as r:
            text = await r.text()
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        'vllm:cache_config_info{block_size="16"',
        'num_gpu_blocks="62359"',
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:num_preemptions_total",
        'vllm:request_success_total{engine="0",finished_reason="length"',
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_bucket",
        "vllm:e2e_request_latency_seconds_bucket",
        "vllm:request_queue_time_seconds_bucket",
        "vllm:request_prefill_time_seconds_bucket",
    ):
        assert name in text, name
    assert "vllm:generation_tokens_total{" in text
    gen = next(ln for ln in text.splitlines() if ln.startswith("vllm:generation_tokens_total{"))
    assert float(gen.rsplit(" ", 1)[1]) == 4.0


async def test_cold_start_health_not_ready_and_no_bytes_until_warm() -> None:
    async with running_sim(cold_start_s=0.6) as (_, url), aiohttp.ClientSession() as http:
        async with http.get(f"{url}/health") as r:
            assert r.status == 503
        t0 = time.monotonic()
        async with http.post(f"{url}/v1/chat/completions", json=chat(stream=True)) as r:
            headers_at = time.monotonic() - t0
            body = await r.text()
        assert headers_at >= 0.5  # not even headers while cold
        assert "[DONE]" in body
        async with http.get(f"{url}/health") as r:
            assert r.status == 200


async def test_fault_http429_has_retry_after() -> None:
    async with (
        running_sim(faults=[FaultSpec("http429", 1.0, 2.0)]) as (_, url),
        aiohttp.ClientSession() as http,
        http.post(f"{url}/v1/chat/completions", json=chat()) as r,
    ):
        assert r.status == 429
        assert r.headers["Retry-After"] == "2"


@pytest.mark.parametrize(("kind", "status"), [("http500", 500), ("http503", 503)])
async def test_fault_http_errors(kind: str, status: int) -> None:
    async with running_sim(faults=[parse_fault(f"{kind}:1")]) as (_, url), aiohttp.ClientSession() as http:
        code, payload = await post(http, f"{url}/v1/chat/completions", chat())
        assert code == status
        assert "injected" in payload["error"]["message"]


async def test_fault_malformed_sse_line() -> None:
    async with (
        running_sim(faults=[parse_fault("malformed:1")]) as (_, url),
        aiohttp.ClientSession() as http,
        http.post(f"{url}/v1/chat/completions", json=chat(stream=True, max_tokens=8)) as r,
    ):
        body = await r.text()
    bad = [ln for ln in body.splitlines() if ln.startswith("data: {") and not ln.rstrip().endswith("}")]
    assert len(bad) == 1
    assert "[DONE]" in body


async def test_fault_reset_breaks_the_stream() -> None:
    async with running_sim(faults=[parse_fault("reset:1")]) as (_, url), aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.ClientError):
            await drain(http, url, chat(stream=True, max_tokens=30), None)
        # ...and the server is still serving afterwards (faults hit every request here, so check health).
        async with http.get(f"{url}/health") as r:
            assert r.status == 200


async def test_fault_stall_goes_silent_mid_stream() -> None:
    async with running_sim(faults=[parse_fault("stall:1:30")]) as (server, url), aiohttp.ClientSession() as http:
        timeout = aiohttp.ClientTimeout(sock_read=0.5)
        with pytest.raises(asyncio.TimeoutError):
            await drain(http, url, chat(stream=True, max_tokens=30), timeout)
        await asyncio.sleep(0.05)
    assert server.faults.injected == {"stall": 1}


@pytest.mark.parametrize("text", ["stall", "bogus:0.1", "reset:2", "reset:x", "stall:0.5:-1", "http429:0.1:1:extra"])
def test_bad_fault_flags_are_config_errors(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_fault(text)


async def test_oracle_plays_scenarios_and_known_bad() -> None:
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    msgs = [
        {"role": "system", "content": "You help. [agentload:scenario=tool-roundtrip]"},
        {"role": "user", "content": "capital of Peru"},
    ]
    good = OracleBehaviour(oracle_book())
    bad = OracleBehaviour(oracle_book(), known_bad="invent-tool")
    async with running_sim(behaviour=good) as (_, url), aiohttp.ClientSession() as http:
        _, r = await post(http, f"{url}/v1/chat/completions", {"model": MODEL, "messages": msgs, "tools": tools})
        call = r["choices"][0]["message"]["tool_calls"][0]
        assert call["function"]["name"] == "lookup"
        assert json.loads(call["function"]["arguments"]) == {"query": "capital of Peru"}
        follow = [
            *msgs,
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": "Lima"},
        ]
        _, r2 = await post(http, f"{url}/v1/chat/completions", {"model": MODEL, "messages": follow, "tools": tools})
        assert r2["choices"][0]["message"]["content"] == "The tool returned: Lima"
        assert r2["choices"][0]["finish_reason"] == "stop"
    async with running_sim(behaviour=bad) as (_, url), aiohttp.ClientSession() as http:
        _, r = await post(http, f"{url}/v1/chat/completions", {"model": MODEL, "messages": msgs, "tools": tools})
        assert r["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "search_the_web"


def test_oracle_rejects_unknown_known_bad_and_bad_rate() -> None:
    with pytest.raises(ConfigError, match="known:"):
        OracleBehaviour(oracle_book(), known_bad="nonsense")
    with pytest.raises(ConfigError):
        OracleBehaviour(oracle_book(), error_rate=1.5)


async def test_client_disconnect_aborts_request_and_frees_blocks() -> None:
    async with running_sim() as (server, url), aiohttp.ClientSession() as http:
        r = await http.post(f"{url}/v1/chat/completions", json=chat(stream=True, max_tokens=20_000))
        # Read until a token has arrived, so the request is certainly inside the engine, then hang up.
        while True:
            line = await r.content.readline()
            if b'"content":"' in line and b'"role"' not in line:
                break
        assert server.engine.num_running == 1
        r.close()
        for _ in range(100):
            if not server.engine.has_work():
                break
            await asyncio.sleep(0.05)
        assert not server.engine.has_work()
        assert server.engine.kv.usage == 0.0
        assert server.engine.stats.finished.get("abort") == 1


async def test_stall_before_the_first_token_still_delivers_every_token() -> None:
    # Wherever the stall strikes, the six tokens are generated long before it ends (~2 ms steps).
    async with (
        running_sim(faults=[parse_fault("stall:1:0.5")], seed=3) as (server, url),
        aiohttp.ClientSession() as http,
        http.post(f"{url}/v1/chat/completions", json=chat(stream=True, max_tokens=6)) as r,
    ):
        body = await r.text()
    contents = [ln for ln in body.splitlines() if '"content":"' in ln and '"role"' not in ln]
    assert len(contents) == 6
    assert "[DONE]" in body
    assert server.faults.injected == {"stall": 1}
