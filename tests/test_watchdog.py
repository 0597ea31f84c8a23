"""endpoint.watchdog: predicted deadlines, extensions from the server's signals, and the dead-server rule.

Two kinds of test. In virtual time, the watchdog is walked through a phase exactly as the client's timers walk it
(budget, then extend at every expiry) against a real ``SignalPoller`` reading a scripted server, with the
production defaults: a 15-minute cold start and a server that dies mid-request, at full length, in milliseconds.
In real time against the simulator, shortened (a 0.5 s first-token floor against a 5 s cold start, a 1 s
dead-server threshold), the whole client path: timers, poller, HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from agentload.clock import LoopClock, run_virtual
from agentload.endpoint.backend import RetryingBackend
from agentload.endpoint.client import ChatClient, FixedDeadlines, Phase
from agentload.endpoint.records import ErrorKind, Outcome, RequestIds, RequestRecord
from agentload.endpoint.signals import SignalPoller
from agentload.endpoint.transport import MockRequest, MockResponse, MockTransport
from agentload.endpoint.watchdog import Watchdog, estimate_prompt_tokens
from tests.fakeclock import ManualClock
from tests.hostile import sse
from tests.mockserver import Routes, scripted
from tests.simserver import running_sim

FakeClock = ManualClock


def vllm_metrics(running: int = 0, waiting: int = 0, tokens: float = 0, preemptions: float = 0) -> bytes:
    return (
        f"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running {running}\n"
        f"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting {waiting}\n"
        f"# TYPE vllm:generation_tokens counter\nvllm:generation_tokens_total {tokens}\n"
        f"# TYPE vllm:num_preemptions counter\nvllm:num_preemptions_total {preemptions}\n"
    ).encode()


READY_IDLE: Routes = {"/health": (200, b""), "/metrics": (200, vllm_metrics())}
WARMING: Routes = {"/health": (503, b"loading"), "/metrics": (200, vllm_metrics())}
SILENT: Routes = {}


class VirtualServer:
    """A scripted server whose answers depend on virtual time, polled by a real SignalPoller on a fake clock."""

    def __init__(self, script: Callable[[float], Routes], interval_s: float = 1.0) -> None:
        self.clock = FakeClock()
        self.script = script
        self.interval_s = interval_s
        self.poller = SignalPoller(
            "http://127.0.0.1:9",
            engine="vllm",
            transport=scripted(lambda: self.script(self.clock.t)),
            clock=self.clock,
            interval_s=interval_s,
        )
        self._next_poll = 0.0

    async def advance_to(self, t: float) -> None:
        while self._next_poll <= t:
            self.clock.t = self._next_poll
            await self.poller.poll_once()
            self._next_poll += self.interval_s
        self.clock.t = t

    async def walk(self, dog: Watchdog, phase: Phase, prompt_tokens: int, until_s: float) -> float | None:
        """Run one phase as the client's timers do; the time it was given up, or None if still waiting at until_s."""
        dog.budget(Phase.CONNECT, prompt_tokens)
        wait = dog.budget(phase, prompt_tokens)
        start = self.clock.t
        while True:
            await self.advance_to(self.clock.t + wait)
            waited = self.clock.t - start
            if waited >= until_s:
                return None
            more = dog.extend(phase, waited)
            if more is None:
                return waited
            wait = more


def record(prompt: int, ttft: float, cached: int | None = None) -> RequestRecord:
    return RequestRecord(t_sent=0.0, t_first_token=ttft, t_done=ttft + 1, prompt_tokens=prompt, cached_tokens=cached)


# -- virtual time, production defaults --------------------------------------------------------------------------
async def test_a_15_minute_cold_start_kills_nothing_with_the_default_watchdog() -> None:
    # The simulator's cold start: the connection is accepted and nothing comes back, not even the status line,
    # while /health says 503 — for 15 minutes, then ready.
    server = VirtualServer(lambda t: WARMING if t < 900 else READY_IDLE)
    dog = Watchdog(signals=server.poller, clock=server.clock)
    assert await server.walk(dog, Phase.CONNECT, 2000, until_s=900) is None
    stats = dog.statistics()
    assert stats.refused == {}
    assert stats.granted["warming"] >= (900 - dog.connect_s) / dog.check_s - 1
    # The same wait with plain deadlines ends at the connect deadline.
    fixed = VirtualServer(lambda t: WARMING)
    assert await fixed.walk(Watchdog(clock=fixed.clock), Phase.CONNECT, 2000, until_s=900) == pytest.approx(10.0)
    await server.poller.stop()
    await fixed.poller.stop()


async def test_a_warm_up_that_never_ends_is_given_up_at_the_cap() -> None:
    server = VirtualServer(lambda t: WARMING, interval_s=5.0)
    dog = Watchdog(signals=server.poller, clock=server.clock, warmup_cap_s=1800)
    given_up = await server.walk(dog, Phase.CONNECT, 0, until_s=4000)
    assert given_up == pytest.approx(1800, abs=dog.check_s)
    assert dog.statistics().refused == {"warmup_cap": 1}
    await server.poller.stop()


@pytest.mark.parametrize("dies_at", [0.0, 100.0, 333.3])
async def test_a_dead_server_is_given_up_within_30_s_even_during_a_600_s_prediction(dies_at: float) -> None:
    # A 100k-token prompt is predicted a 600 s first-token wait (3 × 100,000 ÷ 500 tok/s); the server is busy,
    # then stops answering anything at dies_at.
    busy = {"/health": (200, b""), "/metrics": (200, vllm_metrics(running=3))}
    server = VirtualServer(lambda t: busy if t < dies_at else SILENT)
    dog = Watchdog(signals=server.poller, clock=server.clock)
    assert dog.predict(Phase.FIRST_TOKEN, 100_000) == pytest.approx(600.0)
    given_up = await server.walk(dog, Phase.FIRST_TOKEN, 100_000, until_s=2000)
    assert given_up is not None
    # dead_after_s (20) + check_s (2) after the last answer, which came at most one poll interval before dies_at.
    assert given_up - dies_at <= dog.dead_after_s + dog.check_s
    assert given_up - dies_at <= 30.0
    assert dog.statistics().refused == {"dead_server": 1}
    await server.poller.stop()


async def test_a_stream_that_stops_on_a_live_server_waits_idle_s_but_on_a_dead_one_dead_after_s() -> None:
    alive = VirtualServer(lambda t: READY_IDLE)
    dog = Watchdog(signals=alive.poller, clock=alive.clock, idle_s=60)
    assert await alive.walk(dog, Phase.IDLE, 1000, until_s=600) == pytest.approx(60.0)
    assert dog.statistics().refused == {"idle": 1}
    dead = VirtualServer(lambda t: READY_IDLE if t < 10 else SILENT)
    dog = Watchdog(signals=dead.poller, clock=dead.clock, idle_s=60)
    given_up = await dead.walk(dog, Phase.IDLE, 1000, until_s=600)
    assert given_up is not None
    assert given_up <= 10 + dog.dead_after_s + dog.check_s
    await alive.poller.stop()
    await dead.poller.stop()


# -- virtual time: the rules past the prediction -----------------------------------------------------------------
async def test_a_queued_request_waits_while_the_engine_makes_progress_and_not_once_it_is_stuck() -> None:
    def progressing(t: float) -> Routes:
        return {"/health": (200, b""), "/metrics": (200, vllm_metrics(running=8, waiting=4, tokens=100 * t))}

    server = VirtualServer(progressing)
    dog = Watchdog(signals=server.poller, clock=server.clock, first_token_floor_s=5, stuck_s=60, queue_cap_s=300)
    assert await server.walk(dog, Phase.FIRST_TOKEN, 0, until_s=300) is None  # 300 s of queueing: fine
    assert dog.statistics().granted["queued"] > 100

    def wedged(t: float) -> Routes:  # "running" forever, counters frozen from t = 50
        return {"/health": (200, b""), "/metrics": (200, vllm_metrics(running=8, tokens=100 * min(t, 50)))}

    stuck = VirtualServer(wedged)
    dog = Watchdog(signals=stuck.poller, clock=stuck.clock, first_token_floor_s=5, stuck_s=60)
    given_up = await stuck.walk(dog, Phase.FIRST_TOKEN, 0, until_s=1000)
    assert given_up is not None
    assert 110 <= given_up <= 110 + 2 * dog.check_s  # flat for stuck_s after t = 50
    assert dog.statistics().refused == {"stuck": 1}
    await server.poller.stop()
    await stuck.poller.stop()


async def test_queueing_is_bounded_by_the_queue_cap() -> None:
    def busy(t: float) -> Routes:
        return {"/health": (200, b""), "/metrics": (200, vllm_metrics(waiting=2, tokens=10 * t))}

    server = VirtualServer(busy)
    dog = Watchdog(signals=server.poller, clock=server.clock, first_token_floor_s=5, queue_cap_s=120)
    given_up = await server.walk(dog, Phase.FIRST_TOKEN, 0, until_s=1000)
    assert given_up == pytest.approx(120, abs=dog.check_s)
    assert dog.statistics().refused == {"queue_cap": 1}
    await server.poller.stop()


async def test_a_ready_idle_server_means_the_request_is_lost_at_the_prediction() -> None:
    server = VirtualServer(lambda t: READY_IDLE)
    dog = Watchdog(signals=server.poller, clock=server.clock, first_token_floor_s=5)
    assert await server.walk(dog, Phase.FIRST_TOKEN, 0, until_s=100) == pytest.approx(5.0, abs=1e-6)
    assert dog.statistics().refused == {"not_in_server": 1}
    await server.poller.stop()


async def test_a_reading_older_than_the_phase_cannot_say_the_request_is_lost() -> None:
    # Polls every 10 s, prediction 1 s: the reading at the expiry predates the request, so one more check.
    server = VirtualServer(lambda t: READY_IDLE, interval_s=10.0)
    await server.advance_to(0.5)
    dog = Watchdog(signals=server.poller, clock=server.clock, first_token_floor_s=1, check_s=2)
    given_up = await server.walk(dog, Phase.FIRST_TOKEN, 0, until_s=100)
    assert given_up is not None
    assert given_up > 9.5  # not before the poll at t = 10 showed the server idle
    assert dog.statistics().granted["awaiting_signal"] >= 1
    await server.poller.stop()


async def test_silence_between_tokens_is_waited_out_only_after_a_preemption() -> None:
    def preempting(t: float) -> Routes:
        return {"/health": (200, b""), "/metrics": (200, vllm_metrics(running=9, preemptions=0 if t < 5 else 1))}

    server = VirtualServer(preempting)
    dog = Watchdog(signals=server.poller, clock=server.clock, idle_s=10, idle_cap_s=40)
    given_up = await server.walk(dog, Phase.IDLE, 0, until_s=100)
    assert given_up == pytest.approx(40, abs=dog.check_s)
    assert dog.statistics().granted["preempted"] >= 10
    assert dog.statistics().refused == {"idle_cap": 1}
    await server.poller.stop()


async def test_silence_on_an_overloaded_server_that_makes_progress_is_waited_out_to_the_cap() -> None:
    def overloaded(t: float) -> Routes:
        return {"/health": (200, b""), "/metrics": (200, vllm_metrics(running=6, waiting=5, tokens=100 * t))}

    server = VirtualServer(overloaded)
    dog = Watchdog(signals=server.poller, clock=server.clock, idle_s=10, idle_cap_s=40)
    given_up = await server.walk(dog, Phase.IDLE, 0, until_s=100)
    assert given_up == pytest.approx(40, abs=dog.check_s)
    assert dog.statistics().granted["overloaded"] >= 10
    await server.poller.stop()


async def test_silence_on_a_queueing_server_whose_counters_stand_still_is_given_up_at_idle_s() -> None:
    def frozen(t: float) -> Routes:
        return {"/health": (200, b""), "/metrics": (200, vllm_metrics(running=6, waiting=5, tokens=1000))}

    server = VirtualServer(frozen)
    dog = Watchdog(signals=server.poller, clock=server.clock, idle_s=10, idle_cap_s=40)
    given_up = await server.walk(dog, Phase.IDLE, 0, until_s=100)
    assert given_up == pytest.approx(10, abs=dog.check_s)
    assert dog.statistics().refused == {"idle": 1}
    await server.poller.stop()


def slow_stream(tokens: int, pause_at: int, pause_s: float) -> MockTransport:
    """A ready, idle vLLM whose chat stream sends a token a second and pauses ``pause_s`` after token ``pause_at``."""

    async def handler(request: MockRequest) -> MockResponse:
        path = "/" + request.url.split("/", 3)[3]
        if path == "/health":
            return MockResponse(200, chunks_script=[(0.0, b"")])
        if path == "/metrics":
            return MockResponse(200, chunks_script=[(0.0, vllm_metrics())])
        token = b'{"choices":[{"index":0,"delta":{"content":"w "}}]}'
        script = [(1.0 + (pause_s if i == pause_at else 0.0), sse([token])) for i in range(tokens)]
        return MockResponse(200, chunks_script=[*script, (0.0, sse([b"[DONE]"]))])

    return MockTransport(handler)


async def streamed(tokens: int, pause_at: int, pause_s: float) -> RequestRecord:
    transport = slow_stream(tokens, pause_at, pause_s)
    poller = SignalPoller("http://127.0.0.1:9", engine="vllm", transport=transport, clock=LoopClock())
    await poller.start()
    client = ChatClient("http://127.0.0.1:9", transport=transport, api_key_env=None,
                        policy=Watchdog(signals=poller, clock=LoopClock()))  # fmt: skip
    try:
        return await client.chat({**BODY, "max_tokens": tokens})
    finally:
        await poller.stop()


@pytest.mark.parametrize(("pause_s", "cut"), [(5.0, False), (90.0, True)])
def test_a_pause_in_a_stream_older_than_idle_s_is_judged_by_its_own_length(pause_s: float, cut: bool) -> None:
    # Production defaults (idle_s 60, checks every 2 s), in virtual time: a token a second for 100 s with one pause
    # after 70 s. A 5 s pause is a slow decoder's, not a stall; judged by the stream's age (70 s > idle_s) it was
    # once cut at the first check. A 90 s pause on a server with nothing queued is a stall: cut at idle_s of it.
    record = run_virtual(streamed(100, pause_at=70, pause_s=pause_s))
    if not cut:
        assert record.outcome is Outcome.OK, record.error_message
        assert record.completion_tokens == 100
        return
    assert record.error is ErrorKind.IDLE_TIMEOUT
    assert record.t_done is not None
    assert record.chunk_times[-1] + 60.0 <= record.t_done <= record.chunk_times[-1] + 60.0 + 2 * 2.0


async def test_without_signals_the_watchdog_is_a_predicted_deadline() -> None:
    dog = Watchdog(first_token_floor_s=7, check_s=1)
    assert dog.budget(Phase.CONNECT, 0) == dog.connect_s
    assert dog.budget(Phase.FIRST_TOKEN, 0) == 7  # the whole prediction: nothing to re-check against
    assert dog.extend(Phase.FIRST_TOKEN, 7.0) is None
    assert not dog.server_dead()


# -- prediction --------------------------------------------------------------------------------------------------
def test_the_first_token_prediction_learns_the_prefill_rate_queue_and_cached_share() -> None:
    dog = Watchdog(first_token_floor_s=1, prefill_tok_s=500, slack=3)
    assert dog.predict(Phase.FIRST_TOKEN, 10) == 1  # the floor
    assert dog.predict(Phase.FIRST_TOKEN, 5000) == pytest.approx(30)  # 3 × 5000 ÷ 500
    for _ in range(40):
        dog.observe(record(prompt=8000, ttft=2.0))  # 4,000 tok/s
        dog.observe(record(prompt=100, ttft=0.5))  # short prompts: queue wait + overhead
    stats = dog.statistics()
    assert stats.prefill_tok_s == pytest.approx(4000, rel=0.01)
    assert stats.queue_s == pytest.approx(0.5, rel=0.01)
    assert dog.predict(Phase.FIRST_TOKEN, 20_000) == pytest.approx(16.5, rel=0.01)  # 3 × (0.5 + 5 s of prefill)
    for _ in range(40):
        dog.observe(record(prompt=10_000, ttft=0.5, cached=9000))  # agents: 1,000 new tokens in 0.5 s
    stats = dog.statistics()
    assert stats.cached_share == pytest.approx(0.9, rel=0.01)
    assert stats.prefill_tok_s == pytest.approx(2000, rel=0.01)
    # 20,000 prompt tokens of which ~2,000 uncached at 2,000 tok/s: 3 × (0.5 + 1) s.
    assert dog.predict(Phase.FIRST_TOKEN, 20_000) == pytest.approx(4.5, rel=0.01)
    assert dog.statistics().observed == 120


def test_failed_records_teach_nothing() -> None:
    dog = Watchdog()
    dog.observe(RequestRecord(t_sent=0, t_done=5, prompt_tokens=9000, outcome=Outcome.TIMEOUT))
    assert dog.statistics().observed == 0


def test_prompt_size_estimate_counts_messages_and_tools() -> None:
    body: dict[str, Any] = {"messages": [{"role": "user", "content": "x" * 4000}]}
    bare = estimate_prompt_tokens(body)
    assert 1000 <= bare <= 1020
    body["tools"] = [{"type": "function", "function": {"name": "f", "description": "y" * 400}}]
    assert estimate_prompt_tokens(body) >= bare + 100


async def test_each_request_gets_its_own_prediction_in_its_own_task() -> None:
    # extend() is asked from timer callbacks without naming the request; the context carries it.
    server = VirtualServer(lambda t: READY_IDLE)
    await server.advance_to(0.5)
    dog = Watchdog(signals=server.poller, clock=server.clock, first_token_floor_s=1, prefill_tok_s=1000, check_s=5)
    loop = asyncio.get_running_loop()

    async def one(prompt: int) -> float | None:
        dog.budget(Phase.CONNECT, prompt)
        dog.budget(Phase.FIRST_TOKEN, prompt)
        answer: asyncio.Future[float | None] = loop.create_future()
        loop.call_soon(lambda: answer.set_result(dog.extend(Phase.FIRST_TOKEN, 1.5)))
        await asyncio.sleep(0)
        return await answer

    short, long = await asyncio.gather(one(0), one(10_000))
    assert short is None  # past its 1 s prediction on an idle server
    assert long == 5.0  # 30 s predicted: keep checking
    await server.poller.stop()


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="positive"):
        Watchdog(check_s=0)


# -- real time against the simulator (shortened) ----------------------------------------------------------------
BODY: dict[str, Any] = {"messages": [{"role": "user", "content": "Say something."}], "max_tokens": 6}


@contextlib.asynccontextmanager
async def watching(url: str) -> AsyncIterator[tuple[ChatClient, Watchdog]]:
    """A client whose watchdog has the shortened deadlines (0.5 s) and a poller asking every 0.1 s."""
    poller = SignalPoller(url, engine="agentload-sim", interval_s=0.1, timeout_s=0.3)
    await poller.start()
    dog = Watchdog(signals=poller, connect_s=0.5, first_token_floor_s=0.5, idle_s=0.5, total_s=60, check_s=0.1)
    client = ChatClient(url, policy=dog)
    try:
        yield client, dog
    finally:
        await client.aclose()
        await poller.stop()


@pytest.mark.slow
async def test_agents_sent_during_a_cold_start_all_complete_while_fixed_deadlines_kill_them() -> None:
    # Scaled: a 5 s cold start against a 0.5 s first-token floor and 0.5 s connect deadline (10×; the production
    # case is 900 s against 10 s / 30 s, walked in virtual time above).
    agents = 8

    async def fleet(policy: str) -> list[RequestRecord]:
        async with running_sim("laptop", cold_start_s=5.0) as (server, url):
            body = {**BODY, "model": server.model_name}
            if policy == "watchdog":
                async with watching(url) as (client, dog):
                    records = await asyncio.gather(*(client.chat(body) for _ in range(agents)))
                    assert dog.statistics().granted["warming"] > 0
                    return records
            client = ChatClient(url, policy=FixedDeadlines(connect_s=0.5, first_token_s=0.5, idle_s=0.5))
            try:
                return await asyncio.gather(*(client.chat(body) for _ in range(agents)))
            finally:
                await client.aclose()

    watched, fixed = await asyncio.gather(fleet("watchdog"), fleet("fixed"))
    assert [r.outcome for r in watched] == [Outcome.OK] * agents
    assert all(r.ttft is not None and r.ttft >= 4.5 for r in watched)  # they really waited out the cold start
    assert [r.error for r in fixed] == [ErrorKind.CONNECT_TIMEOUT] * agents


@pytest.mark.slow
def letters(n: int) -> str:
    """``n`` written in the letters a-z (0 → "a", 26 → "ba"): a word a BPE tokenizer counts as one token."""
    out = ""
    while True:
        n, d = divmod(n, 26)
        out = chr(97 + d) + out
        if n == 0:
            return out


async def test_a_long_prefill_after_the_role_chunk_is_not_killed_while_the_server_shows_it_running() -> None:
    # laptop profile: a 15,000-token prompt prefills for ~4.4 s; the role chunk arrives at once, then silence.
    async with running_sim("laptop") as (server, url):
        words = " ".join(f"p{letters(i)}" for i in range(15_000))  # short letter words: one token each
        body = {"model": server.model_name, "messages": [{"role": "user", "content": words}], "max_tokens": 4}
        async with watching(url) as (client, dog):
            watched = await client.chat(body)
        # Same floor, no signals to extend it: killed mid-prefill, the role chunk notwithstanding.
        fixed_client = ChatClient(url, policy=FixedDeadlines(first_token_s=0.5))
        other = {**body, "messages": [{"role": "user", "content": words.replace("p", "q")}]}
        fixed = await fixed_client.chat(other)
        await fixed_client.aclose()
    assert watched.outcome is Outcome.OK
    assert watched.ttft is not None
    assert watched.ttft > 3.0
    assert watched.t_first_byte is not None
    # The role chunk came first, long before the first token (a ratio: a busy machine delays both).
    assert watched.t_first_byte - watched.t_sent < watched.ttft / 2
    assert dog.statistics().granted["queued"] > 10
    assert fixed.error is ErrorKind.FIRST_TOKEN_TIMEOUT
    assert fixed.t_first_byte is not None  # it had the role chunk: first byte is not progress


@contextlib.asynccontextmanager
async def black_hole() -> AsyncIterator[str]:
    """A server that accepts connections, reads whatever comes, and never answers — on every path."""
    writers: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        while await reader.read(65536):
            pass
        writer.close()

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()
        for w in writers:
            w.close()
        await server.wait_closed()


async def test_a_server_that_accepts_and_never_answers_is_declared_dead_after_dead_after_s() -> None:
    # Shortened: dead after 1 s of silence, checked every 0.1 s, connect budget 30 s that it must not wait out.
    async with black_hole() as url:
        poller = SignalPoller(url, engine="vllm", interval_s=0.1, timeout_s=0.3)
        await poller.start()
        dog = Watchdog(signals=poller, connect_s=30, check_s=0.1, dead_after_s=1.0)
        client = ChatClient(url, policy=dog)
        backend = RetryingBackend(client, max_attempts=5, base_backoff_s=0.05)
        started = time.monotonic()
        records = await backend.complete({**BODY, "model": "m"}, RequestIds())
        elapsed = time.monotonic() - started
        await client.aclose()
        await poller.stop()
    assert len(records) == 1  # no resend into a dead server
    assert records[0].error is ErrorKind.CONNECT_TIMEOUT
    assert dog.statistics().refused == {"dead_server": 1}
    assert 1.0 <= elapsed <= 1.0 + 0.1 + 1.0  # dead_after_s + check_s + slack for a loaded machine (not 30 s)
    assert backend.stats.gave_up == {"server_dead": 1}


async def test_nothing_listening_ends_when_the_poller_has_heard_nothing_for_dead_after_s(closed_port: int) -> None:
    url = f"http://127.0.0.1:{closed_port}"
    poller = SignalPoller(url, engine="vllm", interval_s=0.1, timeout_s=0.3)
    await poller.start()
    dog = Watchdog(signals=poller, check_s=0.1, dead_after_s=1.0)
    client = ChatClient(url, policy=dog)
    # Far more attempts than 1 s allows: the dead-server rule, not the attempt count, must end the turn.
    backend = RetryingBackend(client, max_attempts=1000, base_backoff_s=0.05, max_backoff_s=0.1)
    started = time.monotonic()
    records = await backend.complete({**BODY, "model": "m"}, RequestIds())
    elapsed = time.monotonic() - started
    await client.aclose()
    await poller.stop()
    assert {r.outcome for r in records} == {Outcome.CONNECT_ERROR}
    assert 3 <= len(records) < 100
    assert [r.ids.attempt for r in records] == list(range(len(records)))
    assert 1.0 <= elapsed <= 1.0 + 0.1 + 1.0
    assert backend.stats.gave_up == {"server_dead": 1}
