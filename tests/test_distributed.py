"""A bench level spread over actors (``bench.distributed``), with the actors run in this process on virtual time.

The fake cluster holds real ``LevelWorker``s and calls them as Ray would (``actor.method.remote(...)`` awaited,
every argument and result pickled on the way), through the in-process simulator; an actor can be killed, after
which every call to it fails as Ray's do. The real Ray executor is tested in ``test_ray_executor.py``.
"""

from __future__ import annotations

import asyncio
import sys

import pytest

from agentload.bench.analysis import LevelData, summarise
from agentload.bench.distributed import LevelWorker, last_sessions, on_driver_clock
from agentload.bench.runner import run_level
from agentload.bench.target import Target
from agentload.capacity.profile import load_profile
from agentload.clock import LoopClock, run_virtual
from agentload.endpoint.records import RequestIds, RequestRecord
from agentload.endpoint.transport import Endpoint
from agentload.errors import ConfigError, ExecutorError
from agentload.load.cluster import ClockOffset, ExecutorSpec, require_ray
from agentload.sim.behaviour import FillerBehaviour
from agentload.sim.inprocess import InProcessTransport
from agentload.sim.server import SimConfig, SimServer
from agentload.workload.agentic import AgenticWorkload
from tests.fakeray import FakeCluster


def _sim() -> SimServer:
    return SimServer(SimConfig(profile=load_profile("laptop"), behaviour=FillerBehaviour()))


def _level(actors: int | None, kill_at: float | None = None, kill: tuple[int, ...] = (1,)) -> LevelData:
    """One 8-agent level on a fresh simulator: in one process (``actors`` None) or over fake actors."""

    async def go() -> LevelData:
        server = _sim()
        transport = InProcessTransport(server)
        target = Target(transport, "http://sim.invalid", server.model_name, "sim", virtual=True, engine="agentload-sim")
        cluster = FakeCluster(LevelWorker, actors, Endpoint(target.base_url, None, transport)) if actors else None
        killer: asyncio.Task[None] | None = None
        if cluster is not None and kill_at is not None:

            async def later() -> None:
                await asyncio.sleep(kill_at)
                for k in kill:
                    cluster.actors[k].kill()

            killer = asyncio.ensure_future(later())
        data = await run_level(target, AgenticWorkload("hold"), agents=8, context=4096, level=0, run_id="r",
                               run_t0=LoopClock().now(), warmup_s=10.0, window_s=60.0, min_turns=400, grace_s=30.0,
                               seed=3, cluster=cluster)  # type: ignore[arg-type]  # fmt: skip
        if killer is not None:
            await killer
        await transport.aclose()
        return data

    result: LevelData = run_virtual(go())
    return result


def _turns(data: LevelData) -> dict[tuple[str, int, int], tuple[int, int, int | None]]:
    return {(r.ids.agent, r.ids.turn, r.ids.attempt): (r.prompt_tokens, r.completion_tokens, r.cached_tokens)
            for r in data.records}  # fmt: skip


@pytest.mark.parametrize("actors", [2, 3])
def test_a_level_over_actors_gives_the_level_table_of_one_process(actors: int) -> None:
    """On virtual time the two schedules are the same load: every agent its conversation, turn for turn, and the
    level's summary identical to the last figure (on a real server timings differ; tokens per turn do not)."""
    one, spread = _level(None), _level(actors)
    a, b = _turns(one), _turns(spread)
    assert len(a) == len(one.records)
    assert len(b) == len(spread.records)
    assert {k[0] for k in b} == {f"agent-{i}/s0" for i in range(8)}  # every agent ran, each on one actor
    assert a == b  # the same turns, with the same prompt, output and cached tokens
    assert summarise(spread).model_dump() == summarise(one).model_dump()
    assert summarise(one).turns > 100
    assert not spread.notes


def test_the_agents_of_a_killed_actor_go_on_elsewhere_from_their_next_session_and_no_saved_turn_is_run_again() -> None:
    data = _level(2, kill_at=40.0)
    keys = [(r.ids.agent, r.ids.turn, r.ids.attempt) for r in data.records]
    assert len(keys) == len(set(keys))  # nothing saved twice
    note = next(n for n in data.notes if "actor 1 of 2 died" in n)
    assert "4 of its 4 agents went on on actor(s) 0" in note
    # Actor 1 ran agents 1, 3, 5, 7: each saved turns of its first session, then went on in its second, later.
    sessions = last_sessions(data.records)
    for i in (1, 3, 5, 7):
        assert sessions[f"agent-{i}"] >= 1
        first = [r for r in data.records if r.ids.agent == f"agent-{i}/s0"]
        second = [r for r in data.records if r.ids.agent == f"agent-{i}/s1"]
        assert first
        assert second
        assert min(r.t_sent for r in second) > max(r.t_sent for r in first)
    for i in (0, 2, 4, 6):  # the survivors' own agents were not disturbed
        assert sessions[f"agent-{i}"] == 0


def test_a_level_whose_every_actor_died_is_an_executor_error() -> None:
    with pytest.raises(ExecutorError, match="every Ray actor died"):
        _level(2, kill_at=40.0, kill=(0, 1))


def test_records_from_another_node_are_moved_onto_the_drivers_clock() -> None:
    r = RequestRecord(ids=RequestIds(agent="a/s0"), t_sent=10.0, t_first_token=10.5, t_done=11.0,
                      chunk_times=[10.5, 10.75])  # fmt: skip
    moved = on_driver_clock(r, ClockOffset(2.0, 0.001, same_node=False))
    assert (moved.t_sent, moved.t_first_token, moved.t_done, moved.chunk_times) == (8.0, 8.5, 9.0, [8.5, 8.75])
    assert moved.ttft == r.ttft
    assert moved.itl() == r.itl()
    assert on_driver_clock(r, ClockOffset(0.0, 0.0, same_node=True)) is r


def test_executor_flags_are_checked_together() -> None:
    assert ExecutorSpec().kind == "local"
    with pytest.raises(ConfigError, match="--workers must be at least 1"):
        ExecutorSpec("ray", workers=0)
    with pytest.raises(ConfigError, match="options of --executor ray"):
        ExecutorSpec("local", workers=2)


def test_the_endpoint_never_shows_its_key() -> None:
    e = Endpoint("http://127.0.0.1:1", "sk-secret-123")
    assert "sk-secret" not in repr(e)
    assert "sk-secret" not in str(e)


def test_without_ray_the_executor_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed: importing it raises ImportError
    with pytest.raises(ConfigError, match=r"pip install 'agentload\[ray\]'"):
        require_ray()


def test_an_actor_dead_before_the_level_starts_leaves_its_agents_to_the_others() -> None:
    data = _level(2, kill_at=0.0)
    assert {r.ids.agent for r in data.records} == {f"agent-{i}/s0" for i in range(8)}  # all ran, from the start
    assert any("actor 1 of 2 died" in n and "4 of its 4 agents went on on actor(s) 0" in n for n in data.notes)
