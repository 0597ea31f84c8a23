"""endpoint.scrape: the pool, models and metrics a server reports, timed streams, and errors at the boundary."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from agentload.endpoint.scrape import (
    EndpointResponseError,
    EndpointTimeoutError,
    EndpointUnreachableError,
    ServerCapabilityError,
    ServerProbe,
    base_url,
    parse_metrics,
)
from agentload.errors import ConfigError
from tests.simserver import running_sim

Route = Callable[[web.Request], Awaitable[web.StreamResponse]]


@asynccontextmanager
async def fake_server(routes: dict[str, Route]) -> AsyncIterator[str]:
    """A loopback server answering only ``routes`` (GET unless the path says ``POST /...``); 404 elsewhere."""
    app = web.Application()
    for key, handler in routes.items():
        method, _, path = key.rpartition(" ")
        app.router.add_route(method or "GET", path, handler)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        await server.close()


def json_route(body: Any, status: int = 200) -> Route:
    async def handler(_request: web.Request) -> web.Response:
        return web.json_response(body, status=status)

    return handler


def text_route(text: str) -> Route:
    async def handler(_request: web.Request) -> web.Response:
        return web.Response(text=text, content_type="text/plain")

    return handler


MODELS = json_route({"object": "list", "data": [{"id": "m", "object": "model"}]})


async def test_simulator_pool_models_metrics_and_a_timed_stream() -> None:
    async with running_sim("laptop") as (server, url), ServerProbe(url) as probe:
        pool = await probe.pool()
        assert (pool.engine, pool.num_blocks, pool.block_size, pool.exact) == ("vllm", 4096, 16, True)
        assert pool.num_blocks == server.profile.num_blocks
        assert pool.prefix_caching is True
        assert pool.cache_dtype == "auto"
        [model] = await probe.models()
        assert (model.id, model.max_model_len) == ("Qwen/Qwen2.5-0.5B-Instruct", 16384)
        before = (await probe.metrics()).normalised()
        assert before["running"] == 0
        assert before["generation_tokens"] == 0

        timing = await probe.stream_completion({"prompt": "one two three four", "max_tokens": 5})
        assert timing.prompt_tokens == 4
        assert timing.completion_tokens == 5
        assert len(timing.token_times) == 5
        assert list(timing.token_times) == sorted(timing.token_times)
        assert timing.ttft is not None
        assert timing.ttft > server.profile.coefficients.api_overhead_s
        after = (await probe.metrics()).normalised()
        assert after["generation_tokens"] == 5
        assert after["prompt_tokens"] == 4
        assert await probe.round_trip() > 0


@pytest.mark.parametrize(
    ("routes", "expected"),
    [
        pytest.param(
            {
                "/metrics": text_route("# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 3\n"),
                "/get_server_info": json_route(
                    {"max_total_num_tokens": 123457, "context_length": 32768, "api_key": "sk-secret-1"}
                ),
            },
            ("sglang", 123457, 1, True, None, 32768),
            id="sglang-top-level",
        ),
        pytest.param(
            {
                "/server_info": json_route(
                    {
                        "server_args": {"page_size": 16, "max_running_requests": 48},
                        "internal_states": [{"max_total_num_tokens": 160_000}],
                    }
                )
            },
            ("sglang", 10_000, 16, True, 48, None),
            id="sglang-internal-states",
        ),
        pytest.param(
            {"/props": json_route({"total_slots": 4, "default_generation_settings": {"n_ctx": 8192}})},
            ("llamacpp", 4 * 8192 // 16, 16, False, 4, 8192),
            id="llamacpp-props",
        ),
    ],
)
async def test_pool_from_sglang_and_llamacpp_endpoints(
    routes: dict[str, Route], expected: tuple[str, int, int, bool, int | None, int | None]
) -> None:
    async with fake_server({"/v1/models": MODELS, **routes}) as url, ServerProbe(url) as probe:
        pool = await probe.pool()
    got = (pool.engine, pool.num_blocks, pool.block_size, pool.exact, pool.max_num_seqs, pool.max_model_len)
    assert got == expected
    assert "sk-secret" not in pool.model_dump_json()


@pytest.mark.parametrize(
    ("routes", "needles"),
    [
        pytest.param({}, ["no /metrics", "no SGLang /get_server_info", "no llama.cpp /props"], id="nothing"),
        pytest.param(
            {"/metrics": text_route("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0\n")},
            ["vllm:cache_config_info", "num_gpu_blocks"],
            id="vllm-without-cache-config",
        ),
        pytest.param(
            {"/get_server_info": json_route({"api_key": "sk-secret-2", "version": "0.5"})},
            ["/get_server_info has no max_total_num_tokens"],
            id="sglang-without-pool",
        ),
        pytest.param(
            {"/props": json_route({"total_slots": 2})}, ["/props has no total_slots and n_ctx"], id="llamacpp-no-ctx"
        ),
        pytest.param(
            {
                "/metrics": text_route(
                    '# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{block_size="16",'
                    'num_gpu_blocks="None"} 1.0\n'
                )
            },
            ["num_gpu_blocks", "'None'", "still starting"],
            id="vllm-blocks-not-known-yet",
        ),
    ],
)
async def test_a_server_without_pool_figures_gets_one_error_naming_what_it_lacks(
    routes: dict[str, Route], needles: list[str]
) -> None:
    async with fake_server({"/v1/models": MODELS, **routes}) as url, ServerProbe(url) as probe:
        with pytest.raises(ServerCapabilityError) as info:
            await probe.pool()
    message = str(info.value)
    for needle in needles:
        assert needle in message
    assert "sk-secret" not in message


async def test_garbage_metrics_is_a_response_error() -> None:
    async with fake_server({"/metrics": text_route("<html>login</html>")}) as url, ServerProbe(url) as probe:
        with pytest.raises(EndpointResponseError, match="not Prometheus text"):
            await probe.metrics()


def test_normalised_metrics_mean_the_same_across_engines() -> None:
    vllm = parse_metrics(
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0"} 3\nvllm:num_requests_running{engine="1"} 2\n'
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        'vllm:kv_cache_usage_perc{engine="0"} 0.5\nvllm:kv_cache_usage_perc{engine="1"} 0.25\n'
        "# TYPE vllm:prompt_tokens counter\nvllm:prompt_tokens_total 1200\n"
    )
    assert vllm.engine == "vllm"
    # Data-parallel engines: counts add up, the usage share is averaged.
    assert vllm.normalised() == {"running": 5.0, "kv_usage": 0.375, "prompt_tokens": 1200.0}
    llama = parse_metrics(
        "# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 2\n"
        "# TYPE llamacpp:tokens_predicted_total counter\nllamacpp:tokens_predicted_total 77\n"
    )
    assert llama.engine == "llamacpp"
    assert llama.normalised() == {"running": 2.0, "generation_tokens": 77.0}
    assert parse_metrics("process_cpu_seconds_total 1\n").engine is None


async def test_unreachable_server_is_one_clear_error(closed_port: int) -> None:
    async with ServerProbe(f"http://127.0.0.1:{closed_port}") as probe:
        with pytest.raises(EndpointUnreachableError, match=f"cannot reach http://127.0.0.1:{closed_port}: connection"):
            await probe.models()


async def test_api_key_is_sent_and_a_refusal_says_so() -> None:
    async def guarded(request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != "Bearer k-123":
            return web.json_response({"error": {"message": "invalid api key"}}, status=401)
        return web.json_response({"data": [{"id": "m"}]})

    async with fake_server({"/v1/models": guarded}) as url:
        async with ServerProbe(url, api_key="k-123") as probe:
            assert [m.id for m in await probe.models()] == ["m"]
            assert "k-123" not in repr(probe)
        async with ServerProbe(url) as probe:
            with pytest.raises(EndpointResponseError) as info:
                await probe.models()
    assert info.value.status == 401
    assert "HTTP 401 (the server wants an API key): invalid api key" in str(info.value)


async def test_a_silent_server_times_out() -> None:
    async def stall(_request: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.json_response({})

    async with fake_server({"/v1/models": stall}) as url, ServerProbe(url, read_timeout_s=0.2) as probe:
        with pytest.raises(EndpointTimeoutError, match="stopped answering"):
            await probe.models()


@pytest.mark.parametrize(
    ("events", "needle"),
    [
        (['{"error": {"message": "engine died"}}'], "engine died"),
        (["{not json"], "malformed stream event"),
        (["[1, 2]"], "not a JSON object"),
    ],
)
async def test_a_broken_stream_is_a_response_error(events: list[str], needle: str) -> None:
    async def stream(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        ok = {"choices": [{"index": 0, "text": "hi "}]}
        for event in [json.dumps(ok), *events, "[DONE]"]:
            await resp.write(f"data: {event}\n\n".encode())
        await resp.write_eof()
        return resp

    async with fake_server({"POST /v1/completions": stream}) as url, ServerProbe(url) as probe:
        with pytest.raises(EndpointResponseError, match=needle):
            await probe.stream_completion({"prompt": "x", "max_tokens": 3})


async def test_a_refused_completion_quotes_the_servers_message() -> None:
    refuse = json_route({"error": {"message": "maximum context length is 4096"}}, status=400)
    async with fake_server({"POST /v1/completions": refuse}) as url, ServerProbe(url) as probe:
        with pytest.raises(EndpointResponseError, match="HTTP 400: maximum context length is 4096"):
            await probe.stream_completion({"prompt": "x", "max_tokens": 3})


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("http://h:1", "http://h:1"),
        ("http://h:1/v1/", "http://h:1"),
        ("https://user:pw@h:1/base/v1?x=1", "https://h:1/base"),
    ],
)
def test_base_url_is_the_server_root_without_credentials(given: str, expected: str) -> None:
    assert str(base_url(given)) == expected


@pytest.mark.parametrize("bad", ["h:1", "ftp://h/", "http://"])
def test_base_url_rejects_what_is_not_an_http_server(bad: str) -> None:
    with pytest.raises(ConfigError, match="--url"):
        base_url(bad)


async def test_connection_pool_is_raised_above_aiohttps_default() -> None:
    """Concurrent streams beyond aiohttp's default 100 connections must not queue inside the client."""
    started = 0
    release = asyncio.Event()

    async def hold(_request: web.Request) -> web.Response:
        nonlocal started
        started += 1
        if started == 150:
            release.set()
        await release.wait()
        return web.json_response({"data": [{"id": "m"}]})

    async with fake_server({"/v1/models": hold}) as url, ServerProbe(url) as probe:
        results = await asyncio.wait_for(asyncio.gather(*(probe.models() for _ in range(150))), timeout=10)
    assert len(results) == 150


async def test_a_stop_rule_ends_the_stream_and_the_server_aborts_the_request() -> None:
    async with running_sim("laptop") as (server, url), ServerProbe(url) as probe:
        timing = await probe.stream_completion({"prompt": "a b c", "max_tokens": 200}, stop=lambda n, _t: n == 3)
        assert len(timing.token_times) == 3
        assert timing.prompt_tokens is None  # the usage chunk never came
        for _ in range(100):  # the server notices the closed connection at its next write
            if server.engine.stats.finished.get("abort"):
                break
            await asyncio.sleep(0.02)
        assert server.engine.stats.finished == {"abort": 1}
        assert server.engine.num_running == 0


async def test_count_tokens_asks_vllm_and_llamacpp_in_their_own_forms() -> None:
    async def llamacpp_tokenize(request: web.Request) -> web.Response:
        body = await request.json()  # llama.cpp tokenizes "content" and answers no tokens without it
        return web.json_response({"tokens": list(range(len(body.get("content", "").split())))})

    async with running_sim("laptop") as (_, url), ServerProbe(url) as probe:
        assert await probe.count_tokens("m", "one two three") == 3
    async with fake_server({"POST /tokenize": llamacpp_tokenize}) as url, ServerProbe(url) as probe:
        assert await probe.count_tokens("m", "one two three four") == 4
    async with fake_server({}) as url, ServerProbe(url) as probe:
        assert await probe.count_tokens("m", "one") is None  # no /tokenize at all
    async with fake_server({"POST /tokenize": json_route({"what": 1})}) as url, ServerProbe(url) as probe:
        with pytest.raises(EndpointResponseError, match="neither a token count nor tokens"):
            await probe.count_tokens("m", "one")
    async with fake_server({"POST /tokenize": json_route({"error": "boom"}, 500)}) as url, ServerProbe(url) as probe:
        with pytest.raises(EndpointResponseError, match="HTTP 500"):
            await probe.count_tokens("m", "one")


async def test_count_chat_tokens_asks_vllms_chat_form_and_says_none_where_it_is_not_taken() -> None:
    async def llamacpp_tokenize(request: web.Request) -> web.Response:
        body = await request.json()  # llama.cpp tokenizes "content" and answers no tokens without it
        return web.json_response({"tokens": list(range(len(body.get("content", "").split())))})

    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "one two three"}]
    async with running_sim("laptop") as (_, url), ServerProbe(url) as probe:
        # The simulator's ChatML on its one-token-a-word tokenizer: a header a message, the end marker folded into
        # the last word, and the generation prompt.
        assert await probe.count_chat_tokens("m", messages) == (1 + 2) + (1 + 3) + 1
    async with fake_server({"POST /tokenize": llamacpp_tokenize}) as url, ServerProbe(url) as probe:
        assert await probe.count_chat_tokens("m", messages) is None
    async with fake_server({"POST /tokenize": json_route({"error": "no messages"}, 400)}) as url, ServerProbe(url) as p:
        assert await p.count_chat_tokens("m", messages) is None
    async with fake_server({"POST /tokenize": json_route({"error": "boom"}, 500)}) as url, ServerProbe(url) as probe:
        with pytest.raises(EndpointResponseError, match="HTTP 500"):
            await probe.count_chat_tokens("m", messages)

    async def not_json(_: web.Request) -> web.Response:
        return web.Response(body=b"{not json")

    async with fake_server({"POST /tokenize": not_json}) as url, ServerProbe(url) as p:
        with pytest.raises(EndpointResponseError, match="the body is"):
            await p.count_chat_tokens("m", messages)
