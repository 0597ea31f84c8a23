"""``agentload run --executor ray`` over in-process stand-ins for Ray actors (``tests/fakeray.py``), in simulated time.

The fleet's agents stay in the driver and each turn's request is sent by an actor (``fleet.distributed``). What
must hold: the agents do what they do in one process (same rounds, same replies), every agent's turns stay on one
actor, a killed actor loses and repeats no committed turn, and with every actor dead the run stops keeping what it
committed, and resumes. Real Ray is in ``tests/test_ray_executor.py``.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from agentload.clock import run_virtual
from agentload.errors import ExecutorError
from agentload.fleet.app import FleetApp, FleetSettings
from agentload.fleet.checkpoint import LOG, load_log
from agentload.fleet.limiter import Mode
from agentload.fleet.results import FleetResult
from agentload.load.cluster import ExecutorSpec
from tests.fakeray import FakeCluster
from tests.test_fleet_runner import FAST, LOAD

FLEET = LOAD.replace("COUNT", "9").replace("max_rounds = 3", "max_rounds = 4")
RAY = ExecutorSpec("ray", workers=3)


class Clusters:
    """The stand-ins a run started (``FleetApp.cluster``), with an optional hook once the actors exist."""

    def __init__(self, count: int = 3, on_start: Any = None) -> None:
        self.count = count
        self.on_start = on_start
        self.made: list[FakeCluster] = []

    def __call__(self, spec: ExecutorSpec) -> FakeCluster:
        cluster = _Started(self.count, self.on_start)
        self.made.append(cluster)
        return cluster


class _Started(FakeCluster):
    def __init__(self, count: int, on_start: Any) -> None:
        super().__init__(None, count)
        self.on_start = on_start

    def start(self, cls: Any, *args: Any) -> Any:
        actors = super().start(cls, *args)
        if self.on_start is not None:
            self.on_start(self)
        return actors


def _run(tmp_path: Path, fleet: Path | None, cluster: Any = None, **kwargs: Any) -> tuple[FleetResult, Path]:
    settings = FleetSettings(fleet=fleet, out=tmp_path / "runs", progress="none", virtual=True, profile=FAST,
                             mode=Mode.PARALLEL, width=6)  # fmt: skip
    opts = FleetApp(settings.model_copy(update=kwargs))
    if cluster is not None:
        opts.cluster = cluster
    result = run_virtual(opts.run())
    assert opts.run_dir is not None
    return result, opts.run_dir


def _fleet(tmp_path: Path) -> Path:
    path = tmp_path / "fleet.toml"
    path.write_text(FLEET)
    return path


def _turns(run_dir: Path) -> dict[str, list[tuple[int, str, int, int]]]:
    """Each agent's committed turns: round, reply, prompt and completion tokens."""
    state = load_log(run_dir / LOG)
    return {
        agent: [
            (t.round, t.turn.final.content, t.turn.final.prompt_tokens, t.turn.final.completion_tokens) for t in lines
        ]
        for agent, lines in sorted(state.turns.items())
    }


def test_the_agents_do_over_actors_what_they_do_in_one_process(tmp_path: Path) -> None:
    clusters = Clusters()
    local, local_dir = _run(tmp_path / "local", _fleet(tmp_path))
    remote, remote_dir = _run(tmp_path / "ray", _fleet(tmp_path), executor=RAY, cluster=clusters)
    assert local.totals.done == remote.totals.done == 9
    assert _turns(remote_dir) == _turns(local_dir)  # same rounds, replies and server-counted tokens, agent by agent
    assert local.executor == "local"
    assert remote.executor == "fake ray: 3 actors in this process"
    (cluster,) = clusters.made
    # Every turn went through an actor, each agent's through one only, and the agents spread over the three.
    sent = Counter({i: a.calls["complete"] for i, a in enumerate(cluster.actors)})
    assert sum(sent.values()) == remote.totals.turns == 36
    assert sorted(sent.values()) == [12, 12, 12]
    assert all(a.calls["close"] == 1 for a in cluster.actors)


def test_a_killed_actor_loses_and_repeats_no_committed_turn(tmp_path: Path) -> None:
    def kill_later(cluster: FakeCluster) -> None:
        actor = cluster.actors[1]
        send = actor.worker.complete

        async def complete(body: Any, ids: Any) -> Any:
            if actor.calls["complete"] == 3:  # its third turn: killed once the request is on its way
                asyncio.get_running_loop().call_soon(actor.kill)
            return await send(body, ids)

        actor.worker.complete = complete

    clusters = Clusters(on_start=kill_later)
    result, run_dir = _run(tmp_path, _fleet(tmp_path), executor=RAY, cluster=clusters)
    (cluster,) = clusters.made
    assert cluster.actors[1].dead
    assert cluster.actors[1].calls["complete"] >= 3
    assert result.totals.done == 9
    state = load_log(run_dir / LOG)
    for lines in state.turns.values():
        assert [t.round for t in lines] == [0, 1, 2, 3]  # each round committed once
    assert not state.interrupts
    (warning,) = [w for w in result.warnings if "actor 1 of 3 died" in w]
    # Width 6 over 3 actors: 2 agents each when it died (the later ones were placed on the live actors).
    assert "its turns in flight were not committed and are sent again by the live actors" in warning
    assert "which serve the 2 agents it had served from now on" in warning
    sent = sum(a.calls["complete"] for a in cluster.actors)
    assert sent > result.totals.turns  # the turns in flight on the dead actor were sent again


def test_every_actor_dead_stops_the_run_and_resume_finishes_it(tmp_path: Path) -> None:
    killers: list[asyncio.Future[None]] = []

    def kill_all_later(cluster: FakeCluster) -> None:
        async def later() -> None:
            await asyncio.sleep(2.0)
            for a in cluster.actors:
                a.kill()

        killers.append(asyncio.ensure_future(later()))

    settings = FleetSettings(fleet=_fleet(tmp_path), out=tmp_path / "runs", progress="none", virtual=True,
                             profile=FAST, mode=Mode.PARALLEL, width=6, executor=RAY)  # fmt: skip
    opts = FleetApp(settings, cluster=Clusters(on_start=kill_all_later))
    with pytest.raises(ExecutorError, match="every Ray actor died"):
        run_virtual(opts.run())
    assert opts.run_dir is not None
    kept = {(a, t.round) for a, lines in load_log(opts.run_dir / LOG).turns.items() for t in lines}
    assert 0 < len(kept) < 36
    resumed, _ = _run(tmp_path, None, resume=opts.run_dir)  # in this process: no actors needed to go on
    assert resumed.totals.done == 9
    state = load_log(opts.run_dir / LOG)
    assert sum(len(lines) for lines in state.turns.values()) == 36  # nothing committed twice
    assert {(a, t.round) for a, lines in state.turns.items() for t in lines if t.segment == 0} == kept
