"""The simulator behind the transport seam, in virtual time: the same client and agent code, no sockets."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from agentload.agent.loop import AgentSpec, run_agent
from agentload.agent.tools import Tool, ToolRegistry
from agentload.capacity.profile import load_profile
from agentload.clock import LoopClock, VirtualTimeLoop, run_virtual
from agentload.endpoint.backend import SingleAttemptBackend
from agentload.endpoint.client import ChatClient, stream_watch
from agentload.endpoint.records import Outcome, RequestIds, RequestRecord
from agentload.sim.faults import parse_fault
from agentload.sim.inprocess import InProcessTransport
from agentload.sim.server import SimConfig, SimServer


def test_virtual_loop_jumps_over_sleeps() -> None:
    async def main() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await asyncio.gather(asyncio.sleep(3600), asyncio.sleep(1800))
        return t0, loop.time()

    wall = time.monotonic()
    t0, t1 = run_virtual(main())
    assert t1 - t0 >= 3600
    assert t1 - t0 < 3600.01
    assert time.monotonic() - wall < 1.0


def test_virtual_loop_orders_timers_like_a_real_one() -> None:
    order: list[str] = []

    async def after(delay: float, name: str) -> None:
        await asyncio.sleep(delay)
        order.append(name)

    async def main() -> None:
        await asyncio.gather(after(3, "c"), after(1, "a"), after(2, "b"), after(1, "a2"))

    run_virtual(main())
    assert order == ["a", "a2", "b", "c"]


def _client(profile: str = "qwen3-235b-gb300", **config: Any) -> tuple[ChatClient, SimServer]:
    server = SimServer(SimConfig(profile=load_profile(profile), **config))
    return ChatClient("http://sim.invalid", transport=InProcessTransport(server), api_key_env=None), server


def test_agent_turns_run_in_virtual_time_with_think_time_for_free() -> None:
    async def main() -> tuple[Any, float]:
        client, _ = _client()
        tools = ToolRegistry.of([Tool("noop", "does nothing", {"type": "object"}, lambda a: "ok", latency_s=60)])
        spec = AgentSpec(
            agent_id="a",
            model="Qwen/Qwen3-235B-A22B",
            messages=[{"role": "user", "content": "go " * 30_000}],
            max_rounds=5,
            max_tokens=50,
            think_time_s=300,
            tool_choice="required",
        )
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        transcript = await run_agent(spec, SingleAttemptBackend(client), tools, LoopClock())
        elapsed = loop.time() - t0
        await client.aclose()
        return transcript, elapsed

    wall = time.monotonic()
    transcript, elapsed = run_virtual(main())
    wall = time.monotonic() - wall
    assert transcript.stop_reason == "round_cap"
    records = transcript.records()
    assert [r.outcome for r in records] == [Outcome.OK] * 5
    # Four think times and five tool latencies passed in simulated time...
    assert elapsed > 4 * 300 + 5 * 60
    # ...but not on the wall clock.
    assert wall < elapsed / 100
    # The first turn prefilled ~30k tokens (seconds of modelled compute); later turns hit the prefix cache.
    first, later = records[0], records[1:]
    assert first.cached_tokens == 0
    assert all((r.cached_tokens or 0) > 0.95 * r.prompt_tokens for r in later)
    assert first.ttft is not None
    assert all(r.ttft is not None and r.ttft < first.ttft / 5 for r in later)


def test_inprocess_errors_and_faults_reach_the_client_as_records() -> None:
    async def main() -> list[Any]:
        client, _ = _client(faults=[parse_fault("http503:1")])
        bad_model = await client.chat({"model": "nope", "messages": [{"role": "user", "content": "x"}]})
        faulty = await client.chat({"messages": [{"role": "user", "content": "x"}], "max_tokens": 3})
        await client.aclose()
        client2, _ = _client(faults=[parse_fault("reset:1")])
        reset = await client2.chat({"messages": [{"role": "user", "content": "x"}], "max_tokens": 30})
        await client2.aclose()
        return [bad_model, faulty, reset]

    bad_model, faulty, reset = run_virtual(main())
    assert (bad_model.outcome, bad_model.http_status) == (Outcome.HTTP_ERROR, 404)
    assert (faulty.outcome, faulty.http_status) == (Outcome.HTTP_ERROR, 503)
    assert reset.outcome is Outcome.STREAM_ERROR


def test_abandoned_stream_is_aborted_in_the_engine() -> None:
    async def main() -> SimServer:
        client, server = _client()
        task = asyncio.ensure_future(
            client.chat({"messages": [{"role": "user", "content": "x"}], "max_tokens": 10_000})
        )
        await asyncio.sleep(1.0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.sleep(1.0)
        assert not server.engine.has_work()
        await client.aclose()
        return server

    server = run_virtual(main())
    assert server.engine.stats.finished.get("abort") == 1


def test_idle_timer_expires_even_when_the_clock_lands_a_hair_short_of_it() -> None:
    """A timer due at t can fire at t − ε on the virtual clock (float sums); the guard must still expire, not re-arm
    itself at the same instant forever (which spun a fleet run at 100% CPU)."""
    from agentload.endpoint.client import FixedDeadlines, Phase, _Guard

    async def main() -> str | None:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, VirtualTimeLoop)
        # At t = 95.38166120961107, t + 0.3 rounds down: (t + 0.3) − t < 0.3. A guard armed then sees, when its
        # timer fires at t + 0.3, that less than its budget has passed.
        loop.advance(95.38166120961107 - loop.time())
        guard = _Guard(FixedDeadlines(idle_s=0.3))
        guard.arm(Phase.IDLE, 0.3)
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            return guard.fired.value if guard.fired else None
        finally:
            guard.disarm()
        return None

    wall = time.monotonic()
    assert run_virtual(main()) == "idle_timeout"
    assert time.monotonic() - wall < 5


def test_a_watcher_is_handed_the_request_and_its_reply_and_the_pieces_are_not_kept_past_the_end() -> None:
    """``stream_watch`` gets each request's accumulator as it is sent; at the end it holds the record (the reply
    joined), and the pieces it was joined from are dropped then, not when the watcher next looks."""
    seen: list[tuple[RequestIds | None, Any]] = []
    lengths: list[int] = []

    async def main() -> RequestRecord:
        client, _ = _client()
        token = stream_watch.set(lambda ids, acc: seen.append((ids, acc)))
        try:
            body = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 40}
            task = asyncio.ensure_future(client.chat(body, ids=RequestIds(agent="w.1")))
            while not task.done():  # the pieces as the reply streams
                await asyncio.sleep(0.01)
                if seen:
                    lengths.append(len(seen[0][1].content))
            return await task
        finally:
            stream_watch.reset(token)
            await client.aclose()

    record = run_virtual(main())
    assert (record.outcome, record.completion_tokens, bool(record.content)) == (Outcome.OK, 40, True)
    [(ids, acc)] = seen
    assert ids is not None
    assert ids.agent == "w.1"
    assert max(lengths) > 10  # the watcher saw the reply's pieces while it streamed...
    assert acc.record is record
    assert (acc.content, acc.reasoning) == ([], [])  # ...and none are kept once they are joined into the record
