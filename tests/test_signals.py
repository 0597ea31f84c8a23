"""endpoint.signals: the per-engine adapters, readiness vs warming, the dead-server clock, and the simulator."""

from __future__ import annotations

import asyncio
import json

import pytest

from agentload.endpoint.signals import ServerSignals, SignalPoller
from agentload.endpoint.transport import MockRequest, MockResponse, MockTransport
from agentload.errors import EndpointTimeoutError
from tests.fakeclock import ManualClock
from tests.mockserver import Routes, scripted
from tests.simserver import running_sim


def FakeClock() -> ManualClock:
    return ManualClock(1000.0)


def paths(transport: MockTransport) -> list[str]:
    return ["/" + r.url.split("/", 3)[3] for r in transport.requests]


LLAMACPP_METRICS = (
    b"# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 2\n"
    b"# TYPE llamacpp:requests_deferred gauge\nllamacpp:requests_deferred 3\n"
    b"# TYPE llamacpp:prompt_tokens_total counter\nllamacpp:prompt_tokens_total 1200\n"
)
SLOTS = json.dumps([{"id": 0, "is_processing": True}, {"id": 1, "is_processing": False}, {"id": 2, "state": 1}])


async def test_llamacpp_loading_then_ready_with_slots_and_metrics() -> None:
    state = {"loaded": False}

    def routes() -> Routes:
        if not state["loaded"]:
            return {"/health": (503, b'{"error":{"code":503,"message":"Loading model"}}')}
        return {
            "/health": (200, b'{"status":"ok"}'),
            "/metrics": (200, LLAMACPP_METRICS),
            "/slots": (200, SLOTS.encode()),
        }

    clock = FakeClock()
    poller = SignalPoller("http://127.0.0.1:9/v1", engine="llamacpp", transport=scripted(routes), clock=clock)
    loading = await poller.poll_once()
    assert (loading.responding, loading.ready, loading.warming, loading.running) == (True, False, True, None)
    state["loaded"] = True
    clock.t += 1
    ready = await poller.poll_once()
    assert (ready.ready, ready.warming) == (True, False)
    assert (ready.running, ready.waiting, ready.prompt_tokens) == (2, 3, 1200.0)
    assert (ready.slots_busy, ready.slots_total) == (2, 3)  # is_processing on one, the older state field on another
    assert ready.busy
    assert poller.history == [loading, ready]
    await poller.stop()


async def test_not_ready_after_being_ready_is_unhealthy_not_warming_until_the_server_comes_back() -> None:
    # vLLM answers /health with a 5xx once its engine died: that is no reason to wait for a warm-up.
    script = [(200, b""), (503, b""), None, (503, b""), (200, b"")]
    step = {"i": 0}

    def routes() -> Routes:
        answer = script[step["i"]]
        return {} if answer is None else {"/health": answer, "/metrics": (404, b"")}

    poller = SignalPoller("http://127.0.0.1:9", engine="vllm", transport=scripted(routes), clock=FakeClock())
    seen = []
    for i in range(len(script)):
        step["i"] = i
        seen.append(await poller.poll_once())
    assert [(s.responding, s.ready, s.warming) for s in seen] == [
        (True, True, False),
        (True, False, False),  # was ready since it came up: unhealthy
        (False, None, False),  # silent: restarted, perhaps
        (True, False, True),  # back and not ready: loading again
        (True, True, False),
    ]
    await poller.stop()


async def test_ollama_reads_loaded_models_and_treats_none_loaded_as_loading() -> None:
    loaded: list[dict[str, str]] = []

    def routes() -> Routes:
        return {"/api/ps": (200, json.dumps({"models": loaded}).encode())}

    transport = scripted(routes)
    poller = SignalPoller("http://127.0.0.1:11434", engine="ollama", transport=transport, clock=FakeClock())
    first = await poller.poll_once()
    loaded.append({"name": "qwen3:8b"})
    second = await poller.poll_once()
    loaded.clear()  # unloaded after keep_alive; the next request loads it again, any time
    third = await poller.poll_once()
    assert [(s.ready, s.warming) for s in (first, second, third)] == [(False, True), (True, False), (False, True)]
    assert set(paths(transport)) == {"/api/ps"}
    await poller.stop()


async def test_a_generic_api_without_health_still_counts_as_responding() -> None:
    transport = scripted(lambda: {"/v1/models": (401, b"")})
    poller = SignalPoller("https://127.0.0.1:9/v1", engine="openai-compatible", transport=transport)
    sig = await poller.poll_once()
    assert (sig.responding, sig.ready, sig.warming, sig.running) == (True, None, False, None)
    assert paths(transport) == ["/health"]
    await poller.stop()


async def test_auto_mode_learns_llamacpp_from_the_metric_prefix_and_adds_slots() -> None:
    routes = {"/health": (200, b""), "/metrics": (200, LLAMACPP_METRICS), "/slots": (200, SLOTS.encode())}
    transport = scripted(lambda: routes)
    poller = SignalPoller("http://127.0.0.1:9", transport=transport)
    first = await poller.poll_once()
    assert first.engine == "llamacpp"
    assert first.slots_total is None  # /slots was not asked yet
    second = await poller.poll_once()
    assert second.slots_total == 3
    assert paths(transport).count("/slots") == 1
    await poller.stop()


async def test_silence_ages_from_the_last_answer_and_at_finds_the_last_answered_reading() -> None:
    clock = FakeClock()
    up = {"on": True}
    poller = SignalPoller(
        "http://127.0.0.1:9",
        engine="vllm",
        transport=scripted(lambda: {"/health": (200, b"")} if up["on"] else {}),
        clock=clock,
    )
    clock.t += 5
    assert poller.last_response_age() == 0.0  # nothing asked yet: no evidence either way
    up["on"] = False
    await poller.poll_once()
    assert poller.last_response_age() == 5.0  # asked and never answered: age since the poller was created
    up["on"] = True
    answered = await poller.poll_once()
    up["on"] = False
    for _ in range(3):
        clock.t += 2
        await poller.poll_once()
    assert poller.last_response_age() == 6.0
    assert poller.latest is not None
    assert not poller.latest.responding
    assert poller.last_answer == answered
    assert poller.at(clock.t) == answered  # silent readings are skipped
    assert poller.at(answered.t - 0.5) is None
    await poller.stop()


async def test_a_hung_endpoint_is_no_answer_after_the_poll_timeout() -> None:
    async def handler(request: MockRequest) -> MockResponse:
        await asyncio.sleep(60)
        raise AssertionError("unreachable")

    poller = SignalPoller("http://127.0.0.1:9", engine="vllm", transport=MockTransport(handler), timeout_s=0.05)
    sig = await poller.poll_once()
    assert not sig.responding
    await poller.stop()


def test_unknown_engine_and_bad_interval_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown engine"):
        SignalPoller("http://127.0.0.1:9", engine="tgi")
    with pytest.raises(ValueError, match="interval"):
        SignalPoller("http://127.0.0.1:9", interval_s=0)


def test_busy_and_progress() -> None:
    idle = ServerSignals(t=0, responding=True, ready=True, running=0, waiting=0)
    assert not idle.busy
    assert idle.progress is None
    assert ServerSignals(t=0, responding=True, waiting=1).busy
    assert ServerSignals(t=0, responding=True, slots_busy=1).busy
    assert ServerSignals(t=0, responding=True, prompt_tokens=5, generation_tokens=7).progress == 12


async def test_simulator_cold_start_then_a_running_request_in_the_background() -> None:
    async with running_sim("laptop", cold_start_s=0.6) as (server, url):
        poller = SignalPoller(url, engine="agentload-sim", interval_s=0.05)
        await poller.start()
        try:
            await asyncio.sleep(0.2)
            cold = poller.latest
            assert cold is not None
            assert (cold.responding, cold.ready, cold.warming) == (True, False, True)
            await asyncio.sleep(0.6)
            warm = poller.latest
            assert warm is not None
            assert (warm.ready, warm.warming, warm.running, warm.waiting) == (True, False, 0, 0)
            assert warm.kv_usage == 0.0
            assert poller.polls >= 10
        finally:
            await poller.stop()
        assert server.runner.is_ready


async def test_waiting_for_readiness_returns_once_ready_and_times_out_on_a_dead_url() -> None:
    async with running_sim("laptop", cold_start_s=0.5) as (_, url):
        poller = SignalPoller(url, engine="agentload-sim", interval_s=0.05)
        began = asyncio.get_running_loop().time()
        sig = await poller.wait_until_ready(timeout_s=10)
        assert sig.ready
        assert asyncio.get_running_loop().time() - began >= 0.4
        assert any(s.warming for s in poller.history)
        await poller.stop()
    refused = SignalPoller("http://127.0.0.1:9", engine="vllm", transport=scripted(dict), interval_s=0.05)
    with pytest.raises(EndpointTimeoutError, match=r"not answering after 0\.2 s"):
        await refused.wait_until_ready(timeout_s=0.2)
    await refused.stop()
