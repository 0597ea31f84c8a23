"""/metrics → signals, the engine pool readers and the probe against a hostile server: a bad
reading is None for that field or one clear EndpointError sentence, never a crash."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentload.endpoint.probe import ProbeResult, probe
from agentload.endpoint.scrape import ServerPool, _llamacpp_pool, _sglang_pool, _vllm_pool, parse_metrics
from agentload.endpoint.signals import ServerSignals, SignalPoller
from agentload.endpoint.transport import MockRequest, MockResponse, MockTransport
from agentload.errors import AgentloadError, EndpointResponseError, ServerCapabilityError
from tests.fakeclock import ManualClock
from tests.fuzzing import fuzz_examples
from tests.hostile import dumps, json_values, payloads
from tests.mockserver import scripted


def FakeClock() -> ManualClock:
    return ManualClock(1000.0)


def poll(metrics: bytes, *, engine: str | None = "vllm") -> ServerSignals:
    routes = {"/health": (200, b"ok"), "/metrics": (200, metrics)}
    poller = SignalPoller("http://127.0.0.1:9", engine=engine, transport=scripted(lambda: routes), clock=FakeClock())
    return asyncio.run(poller.poll_once())


GOOD = "vllm:num_requests_running 3\nvllm:num_requests_waiting 2\nvllm:kv_cache_usage_perc 0.5\n"


@pytest.mark.parametrize("value", ["NaN", "+Inf", "-Inf", "-1", "1e999"])
@pytest.mark.parametrize(
    ("name", "field"),
    [
        ("vllm:num_requests_running", "running"),
        ("vllm:kv_cache_usage_perc", "kv_usage"),
        ("vllm:prompt_tokens_total", "prompt_tokens"),
    ],
)
def test_an_impossible_gauge_is_none_for_that_field_only(name: str, field: str, value: str) -> None:
    text = "vllm:num_requests_waiting 2\n" + f"{name} {value}\n"
    sig = poll(text.encode())
    assert getattr(sig, field) is None
    assert sig.waiting == 2  # the rest of the scrape still counts
    assert sig.responding


def test_a_usage_share_above_one_is_none() -> None:
    assert poll(b"vllm:kv_cache_usage_perc 1.5\n").kv_usage is None


def test_a_garbage_line_costs_that_line_only() -> None:
    sig = poll(("<html>\n" + GOOD + 'vllm:num_requests_running{x="1} 1\n\x00\n').encode())
    assert (sig.running, sig.waiting, sig.kv_usage) == (3, 2, 0.5)


def test_metrics_with_no_line_of_prometheus_text_is_a_response_error() -> None:
    with pytest.raises(EndpointResponseError, match="not Prometheus text"):
        parse_metrics("<html>\n<body>login</body>\n")
    assert poll(b"<html>login</html>").running is None


def test_deeply_nested_slots_json_is_no_reading() -> None:
    routes = {"/health": (200, b"ok"), "/slots": (200, b"[" * 100_000 + b"]" * 100_000)}
    poller = SignalPoller("http://127.0.0.1:9", engine="llamacpp", transport=scripted(lambda: routes))
    sig = asyncio.run(poller.poll_once())
    assert (sig.slots_total, sig.slots_busy) == (None, None)


# -- engine pool readers ------------------------------------------------------------------------------------------
def test_an_sglang_page_larger_than_the_pool_is_one_sentence() -> None:
    with pytest.raises(ServerCapabilityError, match=r"page_size = 4096, larger than the whole pool .* = 1000\)"):
        _sglang_pool({"max_total_num_tokens": 1000, "page_size": 4096}, "/get_server_info")


@pytest.mark.parametrize(
    ("props", "says"),
    [
        ({"total_slots": -4, "n_ctx": 4096}, "total_slots = -4"),
        ({"total_slots": 10**6, "n_ctx": 4096}, "total_slots = 1000000"),
        ({"total_slots": 4, "n_ctx": -1}, "n_ctx = -1"),
        ({"total_slots": 65536, "n_ctx": 10**6}, "total_slots × n_ctx"),
        ({"total_slots": 1, "n_ctx": 8}, "less than one block"),  # found by the fuzzer: a pool of 0 blocks
    ],
)
def test_impossible_llamacpp_props_are_one_sentence(props: dict[str, Any], says: str) -> None:
    with pytest.raises(ServerCapabilityError, match=says):
        _llamacpp_pool(props)


@pytest.mark.parametrize(
    "props",
    [{"total_slots": "four", "n_ctx": 4096}, {"total_slots": None}, {"default_generation_settings": [1]}, {}],
)
def test_missing_or_wrong_typed_llamacpp_props_give_no_pool(props: dict[str, Any]) -> None:
    assert _llamacpp_pool(props) is None


def test_a_huge_sglang_pool_is_refused() -> None:
    with pytest.raises(ServerCapabilityError, match="max_total_num_tokens = 100000000000000000"):
        _sglang_pool({"max_total_num_tokens": 10**17}, "/server_info")


def test_a_huge_vllm_pool_is_refused() -> None:
    text = 'vllm:cache_config_info{block_size="16",num_gpu_blocks="100000000000000000"} 1\n'
    with pytest.raises(ServerCapabilityError, match="num_gpu_blocks × block_size"):
        _vllm_pool(parse_metrics(text))


def engine(routes: dict[str, tuple[int, bytes]]) -> MockTransport:
    chat = (
        b'data: {"choices":[{"delta":{"content":"OK"}}]}\n\n'
        b'data: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":1}}\n\ndata: [DONE]\n\n'
    )

    async def handler(request: MockRequest) -> MockResponse:
        path = "/" + request.url.split("/", 3)[3]
        if request.method == "POST":
            return MockResponse(chunks_script=[(0.0, routes.get("chat", (200, chat))[1])])
        status, body = routes.get(path, (404, b"{}"))
        return MockResponse(status=status, chunks_script=[(0.0, body)])

    return MockTransport(handler)


def models_body(owned_by: str, **card: Any) -> tuple[int, bytes]:
    return 200, json.dumps({"data": [{"id": "m", "owned_by": owned_by, **card}]}).encode()


async def test_the_probe_notes_an_impossible_pool_instead_of_crashing() -> None:
    info = json.dumps({"max_total_num_tokens": 1000, "page_size": 4096}).encode()
    result = await probe(
        "http://127.0.0.1:9", transport=engine({"/v1/models": models_body("sglang"), "/get_server_info": (200, info)})
    )
    assert result.pool_tokens is None
    assert any("page_size = 4096" in n for n in result.notes)


async def test_the_probe_ignores_an_impossible_context_and_slot_count() -> None:
    props = json.dumps({"total_slots": -4, "n_ctx": 4096}).encode()
    routes = {"/v1/models": models_body("llamacpp", max_model_len=-1), "/props": (200, props)}
    result = await probe("http://127.0.0.1:9", transport=engine(routes))
    assert (result.engine, result.max_context, result.parallel_slots) == ("llamacpp", None, None)
    assert any("total_slots = -4" in n for n in result.notes)


# -- fuzzers ------------------------------------------------------------------------------------------------------
METRIC_NAMES = [
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "vllm:prompt_tokens_total",
    "vllm:num_preemptions_total", "sglang:num_running_reqs", "sglang:token_usage", "llamacpp:requests_processing",
    "llamacpp:tokens_predicted_total", "vllm:cache_config_info", "process_cpu_seconds_total",
]  # fmt: skip
values = st.sampled_from(["NaN", "+Inf", "-Inf", "-1", "1e999", "0", "3", "0.5", "1.5", "x", "0x10", ""]) | st.floats(
    allow_nan=True
).map(repr)
labels = st.sampled_from(
    ["", '{engine="0"}', '{engine="1"}', '{block_size="16",num_gpu_blocks="-4"}', "{x=}", '{a="\\"}', '{le="+Inf"}']
)
metric_lines = st.one_of(
    st.tuples(st.sampled_from(METRIC_NAMES), labels, values).map(lambda t: f"{t[0]}{t[1]} {t[2]}"),
    st.sampled_from(METRIC_NAMES).map(lambda n: f"# TYPE {n} {'counter' if n.endswith('_total') else 'gauge'}"),
    st.text(max_size=30),
)


@settings(max_examples=fuzz_examples(300))
@given(st.lists(metric_lines, max_size=10), st.sampled_from([None, "vllm", "sglang", "llamacpp"]))
def test_fuzz_metrics_text_to_signals(lines: list[str], engine_name: str | None) -> None:
    """Any /metrics text gives a reading whose figures are finite, non-negative, and shares within 0-1."""
    sig = poll("\n".join(lines).encode("utf-8", "surrogatepass"), engine=engine_name)
    assert sig.responding
    for name in ("running", "waiting", "prompt_tokens", "generation_tokens", "preemptions", "kv_usage"):
        value = getattr(sig, name)
        assert value is None or (math.isfinite(value) and value >= 0), (name, value)
    assert sig.kv_usage is None or sig.kv_usage <= 1


pool_fields = st.sampled_from(
    ["max_total_num_tokens", "page_size", "max_running_requests", "context_length", "total_slots", "n_ctx"]
)
pool_values = (
    st.integers(-(2**40), 2**70)
    | st.sampled_from(["-4", "4096", "x", "1" * 30])
    | st.floats(allow_nan=False, allow_infinity=False)
    | json_values
)
pool_bodies = st.dictionaries(pool_fields, pool_values, max_size=6).flatmap(
    lambda top: st.fixed_dictionaries(
        {},
        optional={
            "internal_states": st.lists(st.dictionaries(pool_fields, pool_values, max_size=4), max_size=2)
            | json_values,
            "server_args": st.dictionaries(pool_fields, pool_values, max_size=4) | json_values,
            "default_generation_settings": st.dictionaries(pool_fields, pool_values, max_size=2) | json_values,
        },
    ).map(lambda nested: {**top, **nested})
)


@settings(max_examples=fuzz_examples(300))
@given(pool_bodies, st.lists(st.tuples(labels, values), max_size=3))
def test_fuzz_engine_pool_readers(body: dict[str, Any], infos: list[tuple[str, str]]) -> None:
    """Each reader returns a validated pool or raises the error tree; nothing else escapes."""
    metrics_text = "".join(f"vllm:cache_config_info{lab} {val}\n" for lab, val in infos)
    readers: list[Callable[[], ServerPool | None]] = [
        lambda: _sglang_pool(body, "/get_server_info"),
        lambda: _llamacpp_pool(body),
        lambda: _vllm_pool(parse_metrics(metrics_text)),
    ]
    for read in readers:
        try:
            pool = read()
        except AgentloadError as exc:
            refused: str | None = str(exc)
        else:
            refused = None
        if refused is not None:
            assert refused  # one sentence, not an empty message
        elif pool is not None:
            assert 0 < pool.tokens <= 10**9
            assert pool.num_blocks > 0
            assert pool.block_size > 0


PROBE_PATHS = ["/v1/models", "/version", "/metrics", "/props", "/slots", "/get_server_info", "/api/ps", "chat"]
answers = st.tuples(
    st.sampled_from([200, 200, 200, 404, 500, 503]),
    st.one_of(pool_bodies.map(dumps), json_values.map(dumps), payloads, st.lists(metric_lines, max_size=4).map(
        lambda ls: "\n".join(ls).encode("utf-8", "surrogatepass"))),
)  # fmt: skip


@settings(max_examples=fuzz_examples(150))
@given(st.dictionaries(st.sampled_from(PROBE_PATHS), answers, max_size=8))
def test_fuzz_probe(routes: dict[str, tuple[int, bytes]]) -> None:
    """The whole probe against any mix of answers: a result or an error from the tree."""
    try:
        result = asyncio.run(probe("http://127.0.0.1:9", transport=engine(routes)))
    except AgentloadError as exc:
        refused: str | None = str(exc)
    else:
        refused = None
    if refused is not None:
        assert refused
        return
    assert ProbeResult.model_validate_json(result.model_dump_json()) == result
    for figure in (result.max_context, result.pool_tokens, result.block_size, result.parallel_slots):
        assert figure is None or figure > 0


def test_hostile_queue_buckets_are_dropped_not_raised() -> None:
    """bench's sampler keeps the good buckets of a histogram whose other buckets are not numbers."""
    from agentload.endpoint.samples import QUEUE_HISTOGRAM, to_sample
    from agentload.endpoint.scrape import parse_metrics

    name = QUEUE_HISTOGRAM
    text = "\n".join(
        [
            f'{name}{{le="0.5"}} 3',
            f'{name}{{le="x"}} 4',
            f'{name}{{le="NaN"}} 5',
            f'{name}{{le="1.0"}} NaN',
            f'{name}{{le="2.0"}} -1',
            f'{name}{{le="+Inf"}} 7',
        ]
    )
    raw = to_sample(parse_metrics(text), t=1.0)
    assert raw.queue_buckets == {0.5: 3.0, float("inf"): 7.0}
