"""endpoint.connection: one stack per server, one /metrics poller feeding the watchdog and the level's timeline,
one lifecycle; and ServerProbe through the transport seam."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Mapping
from urllib.parse import urlsplit

import pytest

from agentload.bench.runner import run_level
from agentload.bench.sampler import MetricsSampler
from agentload.bench.target import Target
from agentload.capacity.profile import load_profile
from agentload.clock import run_virtual
from agentload.endpoint.backend import RetryingBackend, SingleAttemptBackend
from agentload.endpoint.connection import ConnectionOptions, connect, open_connection
from agentload.endpoint.scrape import ServerProbe
from agentload.endpoint.transport import MockRequest, MockResponse, MockTransport, Response, Transport
from agentload.sim.behaviour import FillerBehaviour
from agentload.sim.inprocess import InProcessTransport
from agentload.sim.server import SimConfig, SimServer
from agentload.workload.agentic import AgenticWorkload


class Counting:
    """A transport that counts requests by (method, path) and whether it was closed."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self.sent: Counter[tuple[str, str]] = Counter()
        self.closed = 0

    async def send(self, method: str, url: str, body: bytes | None, headers: Mapping[str, str]) -> Response:
        self.sent[method, urlsplit(url).path] += 1
        return await self.inner.send(method, url, body, headers)

    async def aclose(self) -> None:
        self.closed += 1
        await self.inner.aclose()


def _sim() -> SimServer:
    return SimServer(SimConfig(profile=load_profile("laptop"), behaviour=FillerBehaviour()))


def test_a_bench_level_scrapes_metrics_once_per_poll_for_both_the_watchdog_and_the_timeline() -> None:
    """A level once ran two pollers (the watchdog's and the sampler's), so /metrics was asked twice as
    often as /health. Now every /metrics request is one poll of the one monitor and becomes one timeline sample."""

    async def go() -> tuple[Counting, int, bool]:
        server = _sim()
        transport = Counting(InProcessTransport(server))
        target = Target(transport, "http://sim.invalid", server.model_name, "sim", virtual=True, engine="agentload-sim")
        data = await run_level(target, AgenticWorkload(), agents=2, context=2000, level=0, run_id="r", run_t0=0.0,
                               warmup_s=5.0, window_s=30.0, min_turns=4)  # fmt: skip
        await transport.aclose()
        return transport, len(data.samples), data.samples[-1].sample.t > data.samples[0].sample.t

    transport, samples, spans = run_virtual(go())
    metrics, health = transport.sent["GET", "/metrics"], transport.sent["GET", "/health"]
    assert samples >= 30  # ~1 Hz over a 35 s level, plus the window's two quiet edges
    assert spans
    assert metrics == samples  # every scrape is one sample: no second scraper
    assert health == metrics  # and one poll asks both, so the watchdog's signals come from the same scrapes
    assert transport.closed == 1  # the level left the target's transport open for the next level


async def test_sample_once_returns_its_own_scrape_even_when_a_background_poll_lands_first() -> None:
    count = 0

    async def handler(req: MockRequest) -> MockResponse:
        nonlocal count
        if urlsplit(req.url).path != "/metrics":
            return MockResponse(200)
        count += 1
        mine = count
        await asyncio.sleep(0.05 if mine == 2 else 0.0)  # the on-demand scrape answers after a background one
        body = f"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running {mine}\n".encode()
        return MockResponse(200, chunks_script=[(0.0, body)])

    slow_polls = ConnectionOptions(poll_interval_s=60)
    async with open_connection("http://h:1", MockTransport(handler), options=slow_polls) as c:
        sampler = MetricsSampler(c.monitor)
        sampler.start()
        await asyncio.sleep(0.01)  # the monitor's first periodic poll (scrape 1) is done
        on_demand = asyncio.ensure_future(sampler.sample_once())  # scrape 2, slow
        await asyncio.sleep(0.01)
        await c.monitor.poll_once()  # scrape 3 lands while scrape 2 is still out
        raw = await on_demand
    assert raw is not None
    assert raw.sample.running == 2
    assert [s.sample.running for s in sampler.samples] == [1, 3, 2]


async def test_the_connection_closes_what_it_owns_and_leaves_what_it_was_lent() -> None:
    lent = Counting(MockTransport(lambda _req: _ok()))
    owned = Counting(MockTransport(lambda _req: _ok()))
    async with open_connection("http://h:1", lent) as a:
        task = a.monitor._task
        assert task is not None
    assert task.done()  # the monitor is stopped on the way out
    assert lent.closed == 0
    with pytest.raises(RuntimeError, match="boom"):
        async with open_connection("http://h:1", owned, close_transport=True) as b:
            raise RuntimeError("boom")
    assert owned.closed == 1  # closed on an error too
    assert b.monitor._task is None
    await b.aclose()  # a second close does nothing
    assert owned.closed == 1


async def _ok() -> MockResponse:
    return MockResponse(200)


async def test_options_choose_the_backend_and_the_deadlines() -> None:
    transport = MockTransport(lambda _req: _ok())
    conn = await connect("http://h:1", transport)
    assert isinstance(conn.backend, RetryingBackend)
    assert conn.backend.policy is conn.watchdog  # retries stop when the watchdog says the server is dead
    assert conn.liveness.rule is conn.watchdog
    assert conn.liveness.poller is conn.monitor
    assert conn.watchdog.signals is conn.monitor
    assert conn.client.transport is transport
    assert conn.monitor.transport is transport
    await conn.aclose()
    options = ConnectionOptions(engine="vllm", first_token_floor_s=300.0, single_attempt=True, poll_interval_s=2.0)
    async with open_connection("http://h:1", transport, options=options) as conn:
        assert isinstance(conn.backend, SingleAttemptBackend)
        assert conn.retrying is None
        assert conn.watchdog.first_token_floor_s == 300.0
        assert (conn.monitor.engine, conn.monitor.interval_s) == ("vllm", 2.0)


def test_the_calibration_probe_reads_the_in_process_simulator_through_the_transport_seam() -> None:
    """No HTTP session of its own: the probe's every request goes through the transport it is given."""

    async def go() -> tuple[Counting, int, int, int | None]:
        server = _sim()
        transport = Counting(InProcessTransport(server))
        async with ServerProbe("http://sim.invalid", transport=transport) as probe:
            pool = await probe.pool()
            [model] = await probe.models()
            timing = await probe.stream_completion({"model": model.id, "prompt": "one two three", "max_tokens": 4})
        assert transport.closed == 0  # a lent transport stays open
        await transport.aclose()
        return transport, pool.num_blocks, len(timing.token_times), timing.completion_tokens

    transport, blocks, tokens, completion = run_virtual(go())
    assert blocks == 4096  # the laptop profile's pool, read from vllm:cache_config_info
    assert (tokens, completion) == (4, 4)
    assert transport.sent["GET", "/metrics"] == 1
    assert transport.sent["GET", "/v1/models"] == 1
    assert transport.sent["POST", "/v1/completions"] == 1
