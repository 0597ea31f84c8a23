"""endpoint.probe and ``agentload probe``: engine detection, capacity figures, cached-token reporting, preflight."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from agentload.cli.probe import probe as probe_command
from agentload.endpoint.probe import DEFAULT_AUTO_START, TEMPLATE_DROPS_TOOLS, ProbeResult, preflight, probe
from agentload.endpoint.transport import MockRequest, MockResponse, MockTransport
from agentload.errors import ConfigError, EndpointTimeoutError, EndpointUnreachableError
from tests.simserver import running_sim

Route = tuple[int, Any] | tuple[int, Any, Mapping[str, str]]


def chat_stream(cached: int | None = None, *, details: bool = True, usage: bool = True) -> bytes:
    """An SSE chat reply; ``cached`` None sends ``prompt_tokens_details: null`` as vLLM does without its flag,
    ``details`` False leaves the field out (Ollama), ``usage`` False sends no usage at all."""
    events: list[dict[str, Any]] = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
        {"choices": [{"index": 0, "delta": {"content": "OK"}, "finish_reason": "stop"}]},
    ]
    if usage:
        body: dict[str, Any] = {"prompt_tokens": 90, "completion_tokens": 1, "total_tokens": 91}
        if details:
            body["prompt_tokens_details"] = None if cached is None else {"cached_tokens": cached}
        events.append({"choices": [], "usage": body})
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"


def engine(routes: Mapping[str, Route], chats: list[bytes] | None = None) -> MockTransport:
    """An in-process server: GET routes by path (404 elsewhere); chat replies in order."""
    replies = list(chats or [])

    async def handler(request: MockRequest) -> MockResponse:
        path = "/" + request.url.split("/", 3)[3]
        if request.method == "POST" and path == "/v1/chat/completions":
            return MockResponse(headers={"Content-Type": "text/event-stream"}, chunks_script=[(0.0, replies.pop(0))])
        route = routes.get(path)
        if route is None:
            return MockResponse(status=404, chunks_script=[(0.0, b'{"detail":"Not Found"}')])
        status, body, *rest = route
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        return MockResponse(status=status, headers=rest[0] if rest else {}, chunks_script=[(0.0, data)])

    return MockTransport(handler)


def models(owned_by: str, **card: Any) -> Route:
    return 200, {"object": "list", "data": [{"id": "served/model", "object": "model", "owned_by": owned_by, **card}]}


VLLM_METRICS = b"""# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 0.0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",num_gpu_blocks="62365"} 1.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="m"} 0.0
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 0.0
vllm:time_to_first_token_seconds_count{model_name="m"} 0.0
vllm:time_to_first_token_seconds_sum{model_name="m"} 0.0
# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{model_name="m"} 0.0
# TYPE python_gc_objects_collected counter
python_gc_objects_collected_total{generation="0"} 1.0
"""


# -- detection, per engine ---------------------------------------------------------------------------------------
async def test_vllm_without_prompt_tokens_details() -> None:
    transport = engine(
        {
            "/v1/models": models("vllm", max_model_len=40960),
            "/version": (200, {"version": "0.9.2"}),
            "/metrics": (200, VLLM_METRICS),
            "/health": (200, b""),
        },
        [chat_stream()] * 2,
    )
    result = await probe("http://127.0.0.1:8000/v1", transport=transport)
    assert (result.engine, result.version, result.model, result.max_context) == ("vllm", "0.9.2", "served/model", 40960)
    assert (result.pool_tokens, result.block_size, result.prefix_caching) == (62365 * 16, 16, True)
    assert (result.reports_cached_tokens, result.cached_tokens_advice) == (
        False,
        "start vLLM with --enable-prompt-tokens-details",
    )
    assert result.metrics_url == "http://127.0.0.1:8000/metrics"
    assert result.metric_names == [
        "vllm:cache_config_info",
        "vllm:num_requests_running",
        "vllm:prompt_tokens_total",
        "vllm:time_to_first_token_seconds",
    ]
    assert result.max_running is None
    assert any("max_num_seqs" in n for n in result.notes)
    assert result.evidence == ["/metrics uses the vllm: prefix"]
    assert result.output_length_control == "ignore_eos + min_tokens=max_tokens"


async def test_sglang_reads_server_info_and_never_repeats_its_secrets() -> None:
    info = {
        "max_total_num_tokens": 123_456,
        "context_length": 32768,
        "max_running_requests": 48,
        "disable_radix_cache": False,
        "api_key": "sk-server-secret",
    }
    metrics = b"# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 0\n"
    transport = engine(
        {"/v1/models": models("sglang"), "/get_server_info": (200, info), "/metrics": (200, metrics)},
        [chat_stream()] * 2,
    )
    result = await probe("http://127.0.0.1:30000", transport=transport)
    assert (result.engine, result.max_context, result.pool_tokens, result.block_size) == ("sglang", 32768, 123_456, 1)
    assert (result.max_running, result.prefix_caching, result.reports_cached_tokens) == (48, True, False)
    assert result.cached_tokens_advice == "start SGLang with --enable-cache-report"
    assert "sk-server-secret" not in result.model_dump_json()


async def test_llamacpp_slots_context_and_cached_tokens() -> None:
    props = {"total_slots": 4, "default_generation_settings": {"n_ctx": 8192}}
    slots = [{"id": i, "n_ctx": 8192, "is_processing": False} for i in range(4)]
    transport = engine(
        {
            "/v1/models": models("llamacpp"),
            "/props": (200, props),
            "/slots": (200, slots),
            "/health": (200, {"status": "ok"}, {"Server": "llama.cpp"}),
        },
        [chat_stream(cached=0), chat_stream(cached=80)],
    )
    result = await probe("http://127.0.0.1:8080", transport=transport)
    assert (result.engine, result.parallel_slots, result.max_running, result.max_context) == ("llamacpp", 4, 4, 8192)
    assert result.pool_tokens == 4 * 8192
    assert result.output_length_control == "ignore_eos + n_predict=max_tokens"
    assert result.block_size is None  # llama.cpp has no paged pool; its "blocks" would be made up
    assert (result.reports_cached_tokens, result.prefix_caching, result.cached_tokens_advice) == (True, True, None)
    assert preflight(result, planned_context=8192, requested_width=None).reason == "llama.cpp has 4 slots"


@pytest.mark.parametrize(("caps", "noted"), [({"supports_tools": False}, True), ({"supports_tools": True}, False),
                                             (None, False)])  # fmt: skip
async def test_a_llamacpp_template_that_drops_tools_is_noted(caps: dict[str, bool] | None, noted: bool) -> None:
    props: dict[str, Any] = {"total_slots": 2, "default_generation_settings": {"n_ctx": 4096}}
    if caps is not None:
        props["chat_template_caps"] = caps  # as llama-server states it; older builds have no such field
    transport = engine(
        {"/v1/models": models("llamacpp"), "/props": (200, props), "/slots": (200, [{"id": 0}, {"id": 1}])},
        [chat_stream(cached=0), chat_stream(cached=80)],
    )
    result = await probe("http://127.0.0.1:8080", transport=transport)
    assert result.engine == "llamacpp"
    assert (TEMPLATE_DROPS_TOOLS in result.notes) is noted


async def test_ollama_by_its_own_api() -> None:
    ps = {"models": [{"name": "qwen3:8b", "model": "qwen3:8b", "context_length": 4096}]}
    transport = engine(
        {
            "/v1/models": (200, {"data": [{"id": "qwen3:8b", "owned_by": "library"}]}),
            "/api/version": (200, {"version": "0.9.0"}),
            "/api/ps": (200, ps),
        },
        [chat_stream(details=False)] * 2,
    )
    result = await probe("http://127.0.0.1:11434", transport=transport)
    assert (result.engine, result.version, result.model, result.max_context) == ("ollama", "0.9.0", "qwen3:8b", 4096)
    assert result.reports_cached_tokens is False
    assert result.cached_tokens_advice is not None
    assert "does not report" in result.cached_tokens_advice
    assert result.metrics_url is None
    assert result.output_length_control is None  # Ollama's OpenAI API has no way to force a length


async def test_a_generic_api_and_a_stream_without_usage() -> None:
    transport = engine({"/v1/models": models("openai")}, [chat_stream(usage=False)] * 2)
    result = await probe("https://127.0.0.1:9/v1", transport=transport)
    assert result.engine == "openai-compatible"
    assert (result.pool_tokens, result.max_context, result.parallel_slots) == (None, None, None)
    assert result.reports_cached_tokens is None  # no usage at all: unknown, not "no"
    assert any("no usage object" in n for n in result.notes)
    start = preflight(result, planned_context=8000, requested_width=None)
    assert start.start_width == DEFAULT_AUTO_START
    assert start.holds is None


async def test_the_api_key_goes_in_headers_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROBE_TEST_KEY", "sk-test-abc123")
    transport = engine({"/v1/models": models("openai")}, [chat_stream(cached=0)] * 2)
    result = await probe("http://127.0.0.1:9", api_key_env="PROBE_TEST_KEY", transport=transport)
    assert {r.headers.get("Authorization") for r in transport.requests} == {"Bearer sk-test-abc123"}
    assert "sk-test-abc123" not in result.model_dump_json()


async def test_a_model_the_server_does_not_serve_is_named() -> None:
    transport = engine({"/v1/models": models("vllm")})
    with pytest.raises(ConfigError, match="served/model"):
        await probe("http://127.0.0.1:9", model="other", transport=transport)


async def test_a_failing_chat_request_leaves_cached_token_reporting_unknown() -> None:
    async def handler(request: MockRequest) -> MockResponse:
        if request.method == "POST":
            return MockResponse(status=401, chunks_script=[(0.0, b'{"error": {"message": "bad key sk-x"}}')])
        return MockResponse(status=200, chunks_script=[(0.0, json.dumps(models("openai")[1]).encode())])

    result = await probe("http://127.0.0.1:9", transport=MockTransport(handler))
    assert result.reports_cached_tokens is None
    assert any("HTTP 401" in n for n in result.notes)
    assert "sk-x" not in result.model_dump_json()


# -- the simulator ------------------------------------------------------------------------------------------------
async def test_the_simulator_reports_its_profile() -> None:
    async with running_sim("laptop") as (server, url):
        result = await probe(url + "/v1")
    profile = server.profile
    assert result.engine == "agentload-sim"
    assert result.model == profile.served_model_name
    assert result.pool_tokens == profile.num_blocks * profile.block_size == 65536
    assert result.block_size == profile.block_size == 16
    assert result.max_context == profile.max_model_len == 16384
    assert (result.prefix_caching, result.reports_cached_tokens, result.cached_tokens_advice) == (True, True, None)
    assert "vllm:num_requests_waiting" in result.metric_names
    plan = preflight(result, planned_context=8192, requested_width=None)
    assert (plan.start_width, plan.reason) == (8, "pool ÷ planned context ≈ 8 agents (65,536 ÷ 8,192 tokens)")


async def test_the_simulator_without_prompt_tokens_details_gets_the_advice() -> None:
    async with running_sim("laptop", prompt_tokens_details=False) as (_, url):
        result = await probe(url)
    assert result.reports_cached_tokens is False
    assert result.cached_tokens_advice is not None
    assert "--enable-prompt-tokens-details" in result.cached_tokens_advice
    assert "--prompt-tokens-details" in result.cached_tokens_advice
    warnings = preflight(result, planned_context=4096, requested_width=4).warnings
    assert any("--prompt-tokens-details" in w for w in warnings)


async def test_a_server_still_starting_says_so() -> None:
    async with running_sim("laptop", cold_start_s=5.0) as (_, url):
        result = await probe(url, timeout_s=0.5)
    assert result.engine == "agentload-sim"
    assert result.pool_tokens == 65536  # /metrics answers during the warm-up
    assert result.reports_cached_tokens is None  # the chat request got no answer in time
    assert any("still starting" in n for n in result.notes)
    assert any("connect_timeout" in n for n in result.notes)


# -- unreachable ------------------------------------------------------------------------------------------------


async def test_nothing_listening_is_unreachable(closed_port: int) -> None:
    with pytest.raises(EndpointUnreachableError, match="connection refused"):
        await probe(f"http://127.0.0.1:{closed_port}")


@asynccontextmanager
async def black_hole() -> AsyncIterator[str]:
    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.read(65536):
            pass
        writer.close()

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        await server.wait_closed()


async def test_a_server_that_never_answers_times_out() -> None:
    async with black_hole() as url:
        with pytest.raises(EndpointTimeoutError, match="answered nothing"):
            await probe(url, timeout_s=0.3)


# -- preflight ----------------------------------------------------------------------------------------------------
def result(**fields: Any) -> ProbeResult:
    return ProbeResult(url="http://127.0.0.1:8000", **{"engine": "vllm", **fields})


def test_preflight_sizes_from_the_pool_in_whole_blocks() -> None:
    big = result(pool_tokens=997_840, block_size=16, max_context=40960, prefix_caching=True)
    plan = preflight(big, planned_context=40960, requested_width=None)
    assert (plan.start_width, plan.holds, plan.warnings) == (24, 24, [])
    assert plan.reason == "pool ÷ planned context ≈ 24 agents (997,840 ÷ 40,960 tokens)"
    # 100 tokens take 7 blocks (112 tokens): 65,536 ÷ 112 = 585 agents, not 655.
    assert preflight(result(pool_tokens=65536, block_size=16), planned_context=100, requested_width=None).holds == 585


def test_preflight_keeps_the_requested_width_and_warns_when_it_exceeds_the_server() -> None:
    big = result(pool_tokens=997_840, block_size=16)
    within = preflight(big, planned_context=40960, requested_width=16)
    assert (within.start_width, within.warnings) == (16, [])
    assert within.reason.startswith("the requested width 16; pool ÷ planned context ≈ 24 agents")
    beyond = preflight(big, planned_context=40960, requested_width=64)
    assert beyond.start_width == 64
    [warning] = beyond.warnings
    assert warning.startswith("the requested width 64 exceeds what the server holds, pool ÷ planned context ≈ 24")


def test_preflight_uses_the_tightest_limit() -> None:
    sglang = result(engine="sglang", pool_tokens=1_000_000, block_size=1, max_running=48)
    plan = preflight(sglang, planned_context=8000, requested_width=None)
    assert (plan.start_width, plan.reason) == (48, "SGLang runs at most 48 requests at once")


def test_preflight_warnings() -> None:
    small = result(pool_tokens=4096, block_size=16, max_context=4096, prefix_caching=False, reports_cached_tokens=False,
                   cached_tokens_advice="start vLLM with --enable-prompt-tokens-details")  # fmt: skip
    plan = preflight(small, planned_context=8192, requested_width=None)
    assert (plan.start_width, plan.holds) == (1, 0)
    text = " | ".join(plan.warnings)
    assert "exceeds the server's max context (4,096)" in text
    assert "does not fit the server's KV pool" in text
    assert "prefix caching is off" in text
    assert "--enable-prompt-tokens-details" in text
    with pytest.raises(ConfigError):
        preflight(small, planned_context=0, requested_width=None)
    with pytest.raises(ConfigError):
        preflight(small, planned_context=100, requested_width=0)


# -- the command ---------------------------------------------------------------------------------------------------
@contextmanager
def simulator_in_a_thread(**kwargs: Any) -> Iterator[str]:
    """The simulator on its own event loop, so the command's asyncio.run can be the test's only loop."""
    started = threading.Event()
    box: dict[str, Any] = {}

    async def serve() -> None:
        box["stop"] = asyncio.Event()
        box["loop"] = asyncio.get_running_loop()
        async with running_sim("laptop", **kwargs) as (_, url):
            box["url"] = url
            started.set()
            await box["stop"].wait()

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    assert started.wait(10), "the simulator did not start"
    try:
        yield box["url"]
    finally:
        box["loop"].call_soon_threadsafe(box["stop"].set)
        thread.join(10)


@pytest.fixture
def cli() -> typer.Typer:
    app = typer.Typer()
    app.command("probe")(probe_command)
    app.command("other")(lambda: None)  # two commands, so typer keeps "probe" as a subcommand as main.py will
    return app


def test_cli_json_and_table(cli: typer.Typer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setenv("PROBE_CLI_KEY", "sk-cli-secret")
    with simulator_in_a_thread() as url:
        as_json = CliRunner().invoke(cli, ["probe", url, "--json", "--api-key-env", "PROBE_CLI_KEY"])
        table = CliRunner().invoke(cli, ["probe", url])
    assert as_json.exit_code == 0, as_json.output
    data = json.loads(as_json.stdout)
    assert (data["engine"], data["pool_tokens"], data["block_size"], data["reports_cached_tokens"]) == (
        "agentload-sim",
        65536,
        16,
        True,
    )
    assert "sk-cli-secret" not in as_json.output
    assert table.exit_code == 0, table.output
    assert "the agentload simulator" in table.stdout
    assert "65,536" in table.stdout
    assert "vllm:num_requests_running" in table.stdout


def test_cli_unreachable_is_one_line_and_exit_2(cli: typer.Typer, closed_port: int) -> None:
    outcome = CliRunner().invoke(cli, ["probe", f"http://127.0.0.1:{closed_port}"])
    assert outcome.exit_code == 2
    lines = outcome.output.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"error: cannot reach http://127.0.0.1:{closed_port}: connection refused")


def test_cli_bad_url_is_one_line_and_exit_2(cli: typer.Typer) -> None:
    outcome = CliRunner().invoke(cli, ["probe", "ftp://example"])
    assert outcome.exit_code == 2
    assert "give the server as http://HOST:PORT" in outcome.output
