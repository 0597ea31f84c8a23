"""``suite --executor ray``'s level (``suite.distributed``) over in-process fake actors on virtual time: the same
verdicts as one process, agent by agent; a killed actor's sessions end failed keeping the tests already received."""

from __future__ import annotations

import asyncio

from agentload.capacity.profile import load_profile
from agentload.clock import run_virtual
from agentload.endpoint.connection import open_connection
from agentload.endpoint.transport import Endpoint
from agentload.sim.behaviour import OracleBehaviour
from agentload.sim.inprocess import InProcessTransport
from agentload.sim.server import SimConfig, SimServer
from agentload.suite.app import oracle_book, suite_over
from agentload.suite.cases import all_tests
from agentload.suite.distributed import RaySuite, SuiteWorker
from agentload.suite.results import AgentStatus, SuiteRun
from agentload.suite.runner import SuiteConfig
from agentload.suite.scoring import Status
from tests.fakeray import FakeCluster

AGENTS = 4


def _run(actors: int | None, kill_at: float | None = None) -> SuiteRun:
    async def go() -> SuiteRun:
        server = SimServer(SimConfig(profile=load_profile("qwen3-235b-gb300"),
                                     behaviour=OracleBehaviour(oracle_book()), seed=7))  # fmt: skip
        transport = InProcessTransport(server)
        async with open_connection("http://sim.invalid", transport) as conn:
            remote = None
            if actors:
                cluster = FakeCluster(SuiteWorker, actors, Endpoint("http://sim.invalid", None, transport))
                remote = RaySuite(cluster)  # type: ignore[arg-type]  # the fake stands in for a RayCluster
                if kill_at is not None:
                    asyncio.get_running_loop().call_later(kill_at, cluster.actors[1].kill)
            run = await suite_over(conn, all_tests(), SuiteConfig(model=server.model_name), [AGENTS],
                                   endpoint="in-process oracle", remote=remote)  # fmt: skip
        await transport.aclose()
        return run

    result: SuiteRun = run_virtual(go())
    return result


def _verdicts(run: SuiteRun) -> dict[tuple[str, str], Status]:
    return {(a.agent_id, t.test_id): t.status for lv in run.levels for a in lv.agent_results for t in a.tests}


def test_a_suite_level_over_actors_gives_every_agent_the_verdicts_it_gets_in_one_process() -> None:
    one, two = _run(None), _run(2)
    assert len(_verdicts(one)) == AGENTS * len(all_tests())
    assert _verdicts(two) == _verdicts(one)
    (l1,), (l2,) = one.levels, two.levels
    assert [a.agent_id for a in l2.agent_results] == [a.agent_id for a in l1.agent_results]
    assert [a.status for a in l2.agent_results] == [a.status for a in l1.agent_results]


def test_a_killed_actors_sessions_end_failed_with_the_tests_already_received() -> None:
    run = _run(2, kill_at=2.0)  # sessions take ~5.6 s of simulated time
    (level,) = run.levels
    by_agent = {a.agent_id: a for a in level.agent_results}
    assert sorted(by_agent) == [f"agent-{i}" for i in range(AGENTS)]
    for i in (1, 3):  # actor 1's sessions
        a = by_agent[f"agent-{i}"]
        assert a.status is AgentStatus.FAILED
        assert "its Ray actor (1) died" in a.error
        assert 0 < len(a.tests) < len(all_tests())  # what it had handed over, nothing run twice
        assert len({t.test_id for t in a.tests}) == len(a.tests)
    for i in (0, 2):
        assert len(by_agent[f"agent-{i}"].tests) == len(all_tests())
