"""The fleet dashboard without a browser: its token, its bad-request answers, its snapshot and deltas, and its
controls on real runs against the embedded simulator (real time: a pause must be seen by real requests).

Every claim about the run is read from what the run wrote (the checkpoint log: each turn's attempts with their
send times), not from the dashboard's own state.
"""

from __future__ import annotations

import asyncio
import random
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer

from agentload.agent.loop import TurnLog
from agentload.clock import Clock, LoopClock, RealClock
from agentload.dashboard import open_board
from agentload.dashboard.control import FleetControl
from agentload.dashboard.replay import FleetReplay
from agentload.dashboard.server import Flusher, dashboard_interval, make_app
from agentload.dashboard.state import PREVIEW_CHARS, Cursor, LiveState, Tee
from agentload.endpoint.records import RequestIds, RequestRecord, ToolCallRecord
from agentload.endpoint.scrape import parse_metrics
from agentload.endpoint.signals import ServerSignals
from agentload.errors import ConfigError
from agentload.fleet.app import FleetApp, FleetSettings
from agentload.fleet.checkpoint import LOG, CheckpointLog, load_log
from agentload.fleet.config import AgentPlan, expand, load_fleet
from agentload.fleet.limiter import AdaptiveWidth, FixedWidth, Limiter, Mode, make_policy
from agentload.fleet.results import FleetResult
from agentload.fleet.turns import AgentState, AgentStopped, FleetBackend, FleetProgress, Pause

FAST = "llama-8b-h100"
TOKEN = "t0ken"

FLEET = """
name = "dash"
[defaults]
tools = ["search"]
tool_choice = "required"
max_rounds = ROUNDS
max_tokens = 16
think_time_s = THINK
context_tokens = 300
tool_result_tokens = 40

[[tasks]]
id = "plan"
prompt = "Plan {replica}."
max_rounds = 2

[[tasks]]
id = "w"
prompt = "Work item {replica}."
count = COUNT
depends_on = ["plan"]
"""


def _fleet(tmp_path: Path, count: int = 5, rounds: int = 4, think: float = 0.2) -> Path:
    path = tmp_path / "dash.toml"
    path.write_text(FLEET.replace("COUNT", str(count)).replace("ROUNDS", str(rounds)).replace("THINK", str(think)))
    return path


@dataclass
class _Run:
    """What the controls reach of a run, without one running."""

    limiter: Limiter
    log: CheckpointLog
    progress: FleetProgress
    segment: int = 0
    t0: float = 0.0
    stopping: set[str] = field(default_factory=set)
    restarted: list[str] = field(default_factory=list)
    clock: Clock = field(default_factory=LoopClock)
    pause: Pause | None = None  # the fleet's backend asks it before each request (set by the fixture)
    plans: list[AgentPlan] = field(default_factory=list)

    def stop_agent(self, agent: str) -> None:
        self.stopping.add(agent)

    def restart_agent(self, agent: str) -> None:
        self.restarted.append(agent)


@pytest.fixture
async def board(tmp_path: Path) -> AsyncIterator[tuple[TestClient[Any, Any], LiveState, FleetControl, _Run]]:
    plans = expand(load_fleet(_fleet(tmp_path)))
    clock = LoopClock()
    state = LiveState(plans, clock, fleet="dash")
    control = FleetControl(state, clock, max_width=len(plans))
    run = _Run(Limiter(make_policy(Mode.AUTO, 3, max_width=len(plans))), CheckpointLog(tmp_path / LOG), Tee(state))
    control.attach(run)
    run.pause, run.plans = control, plans
    state.limiter_changed(run.limiter.statistics())
    client = TestClient(TestServer(make_app(state, control, TOKEN, interval_s=0.05)))
    await client.start_server()
    try:
        yield client, state, control, run
    finally:
        await client.close()
        run.log.close()


Board = tuple[TestClient[Any, Any], LiveState, FleetControl, _Run]


@pytest.mark.parametrize(("method", "path"), [("GET", "/"), ("GET", "/events"), ("GET", "/api/state"),
                                              ("POST", "/api/control")])  # fmt: skip
@pytest.mark.parametrize("token", [None, "", "wrong", TOKEN + "x"])
async def test_every_route_needs_the_token(board: Board, method: str, path: str, token: str | None) -> None:
    client, _, control, run = board
    params = {} if token is None else {"token": token}
    resp = await client.request(method, path, params=params, json={"action": "pause"})
    assert resp.status == 403
    assert "token" in (await resp.json())["error"]
    assert not control.paused
    assert run.limiter.limit == 3


async def test_the_token_opens_every_route(board: Board) -> None:
    client, *_ = board
    page = await client.get("/", params={"token": TOKEN})
    assert page.status == 200
    assert 'id="waves"' in await page.text()
    header = await client.get("/api/state", headers={"X-Agentload-Token": TOKEN})
    assert header.status == 200


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b"not json", "JSON object"),
        (b"[1, 2]", "JSON object"),
        (b'"pause"', "JSON object"),
        (b"{}", "action must be"),
        (b'{"action": "explode"}', "action must be"),
        (b'{"action": "width", "mode": "fast"}', "mode must be"),
        (b'{"action": "width", "mode": "parallel"}', "needs a width"),
        (b'{"action": "width", "mode": "parallel", "width": "4"}', "whole number"),
        (b'{"action": "width", "mode": "parallel", "width": true}', "whole number"),
        (b'{"action": "width", "mode": "parallel", "width": 0}', "between 1 and 6"),
        (b'{"action": "width", "mode": "parallel", "width": 7}', "between 1 and 6"),
        (b'{"action": "width", "mode": "sequential", "width": 3}', "one agent at a time"),
        (b"\xff\xfe", "JSON object"),
    ],
)
async def test_malformed_control_is_a_400_with_a_json_error(board: Board, body: bytes, words: str) -> None:
    client, state, control, run = board
    before = state.version
    resp = await client.post("/api/control", params={"token": TOKEN}, data=body)
    assert resp.status == 400
    answer = await resp.json()
    assert words in answer["error"]
    assert "Traceback" not in answer["error"]
    assert not control.paused
    assert not control.stop.is_set()
    assert run.limiter.limit == 3
    assert run.limiter.history == []
    assert state.version == before


async def test_width_reaches_the_limiter_and_the_log(board: Board, tmp_path: Path) -> None:
    client, state, _, run = board
    resp = await client.post("/api/control", params={"token": TOKEN}, json={"action": "width", "mode": "parallel",
                                                                              "width": 2})  # fmt: skip
    assert resp.status == 200
    assert (await resp.json())["limit"] == 2
    assert run.limiter.limit == 2
    assert run.limiter.gate.limit == 2
    assert isinstance(run.limiter.policy, FixedWidth)
    assert run.limiter.mode is Mode.PARALLEL
    resp = await client.post("/api/control", params={"token": TOKEN}, json={"action": "width", "mode": "sequential"})
    assert resp.status == 200
    assert run.limiter.limit == 1
    assert run.limiter.policy.mode is Mode.SEQUENTIAL
    resp = await client.post("/api/control", params={"token": TOKEN}, json={"action": "width", "mode": "auto"})
    assert isinstance(run.limiter.policy, AdaptiveWidth)
    assert run.limiter.limit == 1
    # Each change is a LimitLine in the checkpoint, as the limiter's own are (so results and reports show it).
    logged = load_log(tmp_path / LOG).limits
    assert [(x.change.old, x.change.new) for x in logged] == [(3, 2), (2, 1), (1, 1)]
    assert logged[0].change.reason == "set from the dashboard: parallel 2"
    assert [d["new"] for d in state.decisions] == [2, 1, 1]


async def test_pause_resume_stop_answer_and_show(board: Board) -> None:
    client, state, control, _ = board
    for action, paused in (("pause", True), ("pause", True), ("resume", False), ("resume", False)):
        resp = await client.post("/api/control", params={"token": TOKEN}, json={"action": action})
        assert resp.status == 200
        assert (await resp.json())["paused"] is paused
        assert control.paused is paused
        assert state.snapshot()[0]["summary"]["control"]["paused"] is paused
    assert len(control.pauses) == 1  # a second pause of a paused run is not a new pause
    resp = await client.post("/api/control", params={"token": TOKEN}, json={"action": "stop"})
    assert resp.status == 200
    assert control.stop.is_set()


async def test_snapshot_then_deltas_coalesced_per_agent(board: Board) -> None:
    _, state, *_ = board
    body, cursor = state.snapshot()
    assert [a["id"] for a in body["agents"]] == ["plan", "w.0", "w.1", "w.2", "w.3", "w.4"]
    assert {a["wave"] for a in body["agents"]} == {0, 1}
    assert body["agents"][1]["depends_on"] == ["plan"]
    assert body["summary"]["counts"] == {"waiting": 6}
    assert body["summary"]["limiter"]["limit"] == 3
    assert state.delta(cursor) is None  # nothing changed
    for rounds in range(10):
        state.agent("w.2", AgentState.RUNNING, rounds=rounds)
    state.agent("w.4", AgentState.PARKED)
    delta = state.delta(cursor)
    assert delta is not None
    assert [(a["id"], a["state"], a["turn"], a["phase"]) for a in delta["agents"]] == [
        ("w.2", "running", 9, ""),
        ("w.4", "parked", 0, "queued"),
    ]
    assert delta["summary"]["counts"] == {"waiting": 4, "running": 1, "parked": 1}
    assert state.delta(cursor) is None


async def _event(resp: aiohttp.ClientResponse) -> tuple[str, dict[str, Any]]:
    """The stream's next named event (keep-alive comments skipped)."""
    name, data = "", b""
    while True:
        line = (await resp.content.readline()).rstrip(b"\n")
        if line.startswith(b"event: "):
            name = line[7:].decode()
        elif line.startswith(b"data: "):
            data = line[6:]
        elif line == b"" and name:
            return name, orjson.loads(data)


async def test_the_event_stream_sends_a_snapshot_then_deltas(board: Board) -> None:
    client, state, *_ = board
    resp = await client.get("/events", params={"token": TOKEN})
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    name, snap = await asyncio.wait_for(_event(resp), 5)
    assert name == "snapshot"
    assert len(snap["agents"]) == 6
    state.agent("w.1", AgentState.DONE, rounds=4)
    name, delta = await asyncio.wait_for(_event(resp), 5)
    assert name == "delta"
    assert [(a["id"], a["state"]) for a in delta["agents"]] == [("w.1", "done")]
    resp.close()


async def test_open_streams_share_one_delta_built_once(board: Board, monkeypatch: pytest.MonkeyPatch) -> None:
    client, state, *_ = board
    built: list[int] = []
    delta = state.delta

    def counted(cursor: Cursor, *, refresh: bool = True) -> dict[str, Any] | None:
        built.append(cursor.version)
        return delta(cursor, refresh=refresh)

    monkeypatch.setattr(state, "delta", counted)
    pages = [await client.get("/events", params={"token": TOKEN}) for _ in range(2)]
    for page in pages:
        assert (await asyncio.wait_for(_event(page), 5))[0] == "snapshot"
    built.clear()
    state.agent("w.1", AgentState.DONE, rounds=4)
    first, second = [await asyncio.wait_for(_event(page), 5) for page in pages]
    assert first == second
    assert first[0] == "delta"
    assert [a["id"] for a in first[1]["agents"]] == ["w.1"]
    assert len(built) == 1  # built (and encoded) for one page, sent to both
    for page in pages:
        page.close()


@dataclass
class _Flushes:
    """Counts a flusher's flushes (what wakes the open streams) from before any event is made."""

    flusher: Flusher
    page: Cursor | None = None  # a page that takes each flush's delta, as an open stream does (None: no page reads)
    count: int = 0
    _task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> _Flushes:
        async def count() -> None:
            while not self.flusher.closing.is_set():
                await self.flusher.next_flush()
                self.count += 1
                if self.page is not None:
                    self.flusher.encoded_delta(self.page)

        self._task = asyncio.ensure_future(count())
        await asyncio.sleep(0.01)  # the counter waits, and the flusher's task has started
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        await self.flusher.close()

    async def reach(self, n: int) -> None:
        for _ in range(500):
            if self.count >= n:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"{self.count} flushes, not {n}")


def _flusher(tmp_path: Path, *, lagging: bool, **kw: Any) -> tuple[LiveState, Flusher]:
    """A flusher with one page open: at the state's version, or (``lagging``) one change behind it."""
    state, flusher, _ = _flusher_page(tmp_path, lagging=lagging, **kw)
    return state, flusher


def _flusher_page(tmp_path: Path, *, lagging: bool, **kw: Any) -> tuple[LiveState, Flusher, Cursor]:
    """``_flusher``, and the open page's cursor."""
    state = LiveState(expand(load_fleet(_fleet(tmp_path))), LoopClock())
    _, cursor = state.snapshot()
    if lagging:
        state.agent("w.0", AgentState.RUNNING, rounds=0)
    flusher = Flusher(state, **kw)
    flusher.join(cursor)
    return state, flusher, cursor


async def test_a_flush_rides_the_runs_first_event_in_its_window_not_its_own_timer(tmp_path: Path) -> None:
    """From ``early_s`` before it is due, a flush runs at the first event the state hears (the loop is awake for it
    anyway) instead of waking the loop on its own; before its window, an event does not bring it forward."""
    state, flusher = _flusher(tmp_path, lagging=True, interval_s=3600.0, early_s=3600.0)  # its window: from now on
    async with _Flushes(flusher) as flushes:
        assert flushes.count == 0  # an hour from its timer, with no event yet
        state.agent("w.1", AgentState.RUNNING, rounds=0)
        await flushes.reach(1)
    state, flusher = _flusher(tmp_path, lagging=True, interval_s=3600.0, early_s=0.0)  # its window: in an hour
    async with _Flushes(flusher) as flushes:
        for i in range(1, 5):
            state.agent(f"w.{i}", AgentState.RUNNING, rounds=0)
            await asyncio.sleep(0.02)
        assert flushes.count == 0
    assert state.ride_at is None  # closed: no flush waits on the state
    assert state.ride is None


async def test_an_idle_dashboard_flushes_only_at_an_event_and_its_keep_alive(tmp_path: Path) -> None:
    """Every page at the state's version and no request in flight: nothing can change without an event, so the
    flusher does not wake at its rate (every 20 ms here) — the next event flushes at once; a keep-alive meanwhile."""
    state, flusher = _flusher(tmp_path, lagging=False, interval_s=0.02, keepalive_s=3600.0)
    async with _Flushes(flusher) as flushes:
        await asyncio.sleep(0.3)
        assert flushes.count == 0  # ~15 flushes at its rate
        state.agent("w.1", AgentState.RUNNING, rounds=0)
        await flushes.reach(1)
    state, flusher = _flusher(tmp_path, lagging=False, interval_s=3600.0, keepalive_s=0.05)
    async with _Flushes(flusher) as flushes:
        await flushes.reach(3)  # keep-alives only: no event, and the rate is an hour


async def test_a_burst_of_events_in_an_idle_spell_flushes_at_the_rate_not_at_each_event(tmp_path: Path) -> None:
    """A lockstep fleet commits its turns one by one while no request is in flight: the page, which takes each
    delta, is back at the state's version after every flush. The first event after the quiet spell goes at once;
    the rest wait for the rate (before: a flush at each of them, 20 a second at 1,000 agents)."""
    state, flusher, page = _flusher_page(tmp_path, lagging=False, interval_s=0.2, keepalive_s=3600.0)
    async with _Flushes(flusher, page) as flushes:
        await asyncio.sleep(0.3)  # a quiet spell longer than a period
        t0 = time.monotonic()
        for i in range(40):  # each in a wake-up of its own, as turns committed one after another are
            state.agent("w.1", AgentState.RUNNING, rounds=i)
            await asyncio.sleep(0.005)
        for _ in range(500):  # the last change is sent too, a flush later
            if page.version == state.version:
                break
            await asyncio.sleep(0.01)
        took = time.monotonic() - t0
        count = flushes.count
    assert page.version == state.version
    # One flush at once, then one a period after the one before (0.7 periods at the earliest, riding on an event).
    assert 1 <= count <= 2 + took / (0.7 * 0.2), (count, took)


async def test_a_request_in_flight_or_a_page_behind_keeps_the_rate_without_events(tmp_path: Path) -> None:
    """A reply streams with no event of the state's (``refresh`` reads it at each flush), and a page that missed
    a flush has changes to get: either way the flusher wakes at its rate on its own."""
    state, flusher = _flusher(tmp_path, lagging=False, interval_s=0.02, early_s=0.0, keepalive_s=3600.0)
    _sent(state, "w.1")
    async with _Flushes(flusher) as flushes:
        await flushes.reach(5)
    state, flusher = _flusher(tmp_path, lagging=True, interval_s=0.02, early_s=0.0, keepalive_s=3600.0)
    async with _Flushes(flusher) as flushes:
        await flushes.reach(5)  # nobody reads the deltas here: the page stays behind


# -- on real runs ---------------------------------------------------------------------------------------------------
async def _start(opts: FleetApp) -> tuple[asyncio.Task[FleetResult], str, str]:
    task = asyncio.ensure_future(opts.run())
    for _ in range(400):
        if opts.dashboard_url is not None or task.done():
            break
        await asyncio.sleep(0.025)
    assert opts.dashboard_url is not None, task.result()
    base, token = opts.dashboard_url.split("/?token=")
    return task, base, token


async def _committed(run_dir: Path) -> int:
    return sum(len(t) for t in load_log(run_dir / LOG, repair=False).turns.values())


async def _wait_turns(opts: FleetApp, at_least: int) -> None:
    for _ in range(800):
        if opts.run_dir is not None and (opts.run_dir / LOG).exists() and await _committed(opts.run_dir) >= at_least:
            return
        await asyncio.sleep(0.025)
    raise AssertionError(f"fewer than {at_least} turns committed")


async def _post(session: aiohttp.ClientSession, base: str, token: str, body: dict[str, Any]) -> dict[str, Any]:
    async with session.post(f"{base}/api/control", params={"token": token}, json=body) as resp:
        assert resp.status == 200, await resp.text()
        answer: dict[str, Any] = await resp.json()
        return answer


def _opts(tmp_path: Path, fleet: Path | None, **kw: Any) -> FleetApp:
    settings = FleetSettings(fleet=fleet, out=tmp_path / "runs", progress="none", profile=FAST, dashboard=True)
    return FleetApp(settings.model_copy(update=kw), open_board=open_board)


async def test_the_dashboard_rate_sets_the_pages_update_period(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--dashboard-rate`` reaches the flusher of the run's page (the CLI's flag: ``test_cli_bad_inputs`` for its
    range and its need of ``--dashboard``); without it, the default 4 a second."""
    periods: list[float] = []
    init = Flusher.__init__

    def recorded(flusher: Flusher, state: LiveState, interval_s: float, **kw: Any) -> None:
        periods.append(interval_s)
        init(flusher, state, interval_s, **kw)

    monkeypatch.setattr(Flusher, "__init__", recorded)
    fleet = _fleet(tmp_path, count=2, rounds=1, think=0.0)
    for rate in (None, 2.0):
        opts = _opts(tmp_path, fleet, dashboard_interval_s=dashboard_interval(True, rate))
        result = await opts.run()
        assert result.totals.done == result.totals.agents
    assert periods == [0.25, 0.5]


async def test_pause_starts_no_turn_and_resume_finishes_every_turn_once(tmp_path: Path) -> None:
    opts = _opts(tmp_path, _fleet(tmp_path, count=5, rounds=6, think=0.2))
    task, base, token = await _start(opts)
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession() as session:
        await _wait_turns(opts, 4)  # the planner done, its dependents under way
        await _post(session, base, token, {"action": "pause"})
        paused_at = loop.time()  # the pause is in force from here (the answer came after it was set)
        await asyncio.sleep(1.5)
        assert opts.run_dir is not None
        during = await _committed(opts.run_dir)
        await asyncio.sleep(1.0)
        assert await _committed(opts.run_dir) == during  # in-flight turns finished; none started since
        # The width panel counts the agents the limiter holds now, not when the width last changed.
        async with session.get(f"{base}/api/state", params={"token": token}) as resp:
            summary = (await resp.json())["summary"]
        assert summary["limiter"]["live"] == summary["counts"]["running"] > 0
        resumed_at = loop.time()  # the resume is sent after this reading
        await _post(session, base, token, {"action": "resume"})
        result = await asyncio.wait_for(task, 60)
    assert result.totals.done == 6
    assert not result.stopped_early
    state = load_log(opts.run_dir / LOG, repair=False)  # raises on a turn lost or repeated
    assert {a: len(t) for a, t in state.turns.items()} == {"plan": 2, **{f"w.{i}": 6 for i in range(5)}}
    records = [r for lines in state.turns.values() for line in lines for r in line.turn.records]
    sent = [r.t_sent for r in records if r.ids.attempt == 0]
    assert len(sent) == 32
    assert [t for t in sent if paused_at <= t <= resumed_at] == []
    assert any(t < paused_at for t in sent)
    assert any(t > resumed_at for t in sent)
    # The log keeps the pause and the resume, at the moments they were made, and the replay shows the run paused
    # between them: at no moment a turn was sent, at every moment between.
    (pause, resume) = state.controls
    assert (pause.action, resume.action, pause.segment) == ("pause", "resume", 0)
    assert paused_at - 0.5 < pause.t <= paused_at < resumed_at <= resume.t < resumed_at + 0.5
    replay = FleetReplay(opts.run_dir)
    first = min(r.t_sent for r in records)
    assert not any(replay.at(t - first)["summary"]["control"]["paused"] for t in sent)
    between = [pause.t + (resume.t - pause.t) * k / 10 - first for k in range(1, 10)]
    assert all(replay.at(t)["summary"]["control"]["paused"] for t in between)


async def test_stop_leaves_the_run_resumable_with_every_turn_once(tmp_path: Path) -> None:
    fleet = _fleet(tmp_path, count=5, rounds=8, think=0.3)
    opts = _opts(tmp_path, fleet)
    task, base, token = await _start(opts)
    async with aiohttp.ClientSession() as session:
        await _wait_turns(opts, 6)
        await _post(session, base, token, {"action": "width", "mode": "parallel", "width": 2})
        await _post(session, base, token, {"action": "stop"})
        first = await asyncio.wait_for(task, 30)
    assert first.stopped_early
    assert first.totals.done < 6
    assert [c.reason for c in first.limiter.history] == ["set from the dashboard: parallel 2"]
    assert opts.run_dir is not None
    resumed = await FleetApp(FleetSettings(resume=opts.run_dir, progress="none", out=tmp_path / "runs")).run()
    assert resumed.totals.done == 6
    assert not resumed.stopped_early
    state = load_log(opts.run_dir / LOG, repair=False)
    assert {a: len(t) for a, t in state.turns.items()} == {"plan": 2, **{f"w.{i}": 8 for i in range(5)}}
    assert len(state.segments) == 2
    # The replay shows the policy in force at each moment: auto over 1-6 agents, parallel 2 from the switch on,
    # and auto again in the resumed segment (a resume starts from the command's mode).
    replay = FleetReplay(opts.run_dir)
    switched = next(t for t, _, change in replay.widths if change.get("reason") == "set from the dashboard: parallel 2")
    policy = [
        (lim["mode"], lim["min"], lim["max"])
        for lim in (
            replay.at(t)["summary"]["limiter"] for t in (switched - 0.01, switched, replay.segments[1]["start"])
        )
    ]
    assert policy == [("auto", 1, 6), ("parallel", 2, 2), ("auto", 1, 6)]
    # The stop shows as stopping until its segment ended; the resumed segment is not stopping.
    assert [(c.action, c.segment) for c in state.controls] == [("stop", 0)]
    stopping = [
        replay.at(t)["summary"]["control"]["stopping"]
        for t in (switched - 0.01, replay.segments[0]["end"], replay.segments[1]["start"], replay.end)
    ]
    assert stopping == [False, True, False, False]


async def test_without_the_flag_nothing_is_served(tmp_path: Path) -> None:
    opts = _opts(tmp_path, _fleet(tmp_path, count=2, rounds=2, think=0.0), dashboard=False)
    result = await opts.run()
    assert result.totals.done == 3
    assert opts.dashboard_url is None


async def test_a_port_in_use_is_one_error_before_the_run_is_recorded(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        opts = _opts(tmp_path, _fleet(tmp_path, count=2, rounds=2, think=0.0), dashboard_port=port)
        with pytest.raises(ConfigError, match=f"cannot listen on 127.0.0.1:{port}"):
            await opts.run()
    assert opts.run_dir is None
    assert not (tmp_path / "runs").exists() or list((tmp_path / "runs").iterdir()) == []


async def test_a_virtual_run_refuses_the_dashboard(tmp_path: Path) -> None:
    opts = _opts(tmp_path, _fleet(tmp_path), virtual=True)
    with pytest.raises(ConfigError, match="no real time to watch"):
        await opts.run()


def _turn(round_: int, ttft: float, out: int, content: str = "", *, sent: float = 10.0) -> TurnLog:
    record = RequestRecord(t_sent=sent, t_first_token=sent + ttft, t_done=sent + 1, prompt_tokens=500 + round_,
                           completion_tokens=out, content=content)  # fmt: skip
    return TurnLog(round=round_, records=[record], assistant={"role": "assistant", "content": content})


async def test_the_timelines_are_rates_between_scrapes(board: Board) -> None:
    _, state, *_ = board
    metrics = "vllm:prefix_cache_queries_total {q}\nvllm:prefix_cache_hits_total {h}\n"
    state.on_scrape(ServerSignals(t=state.t0 + 1, responding=True, kv_usage=0.25, running=3, waiting=0,
                                  preemptions=7.0), parse_metrics(metrics.format(q=100, h=50)))  # fmt: skip
    for i, ttft in enumerate((0.4, 0.1, 0.3, 0.2)):
        state.turn(f"w.{i}", _turn(0, ttft, 10 + i))
    state.on_scrape(ServerSignals(t=state.t0 + 2, responding=True, kv_usage=0.5, running=4, waiting=2,
                                  preemptions=10.0), parse_metrics(metrics.format(q=300, h=200)))  # fmt: skip
    state.on_scrape(ServerSignals(t=state.t0 + 3, responding=True), None)
    first, second, third = state.points
    assert (first["hit"], first["preempt"], first["ttft_p50"], first["turns"]) == (None, 0.0, None, 0)
    # (200 − 50) hits of (300 − 100) queries; 10 − 7 preemptions since the first scrape; nearest-rank p50 and p95
    # of 0.1 0.2 0.3 0.4 are 0.2 and 0.4; 10 + 11 + 12 + 13 completion tokens.
    assert second["hit"] == pytest.approx(0.75)
    assert second["preempt"] == 3.0
    assert second["ttft_p50"] == pytest.approx(0.2)
    assert second["ttft_p95"] == pytest.approx(0.4)
    assert (second["turns"], second["out"], second["kv"], second["waiting"]) == (4, 46, 0.5, 2)
    assert (third["hit"], third["kv"], third["ttft_p50"]) == (None, None, None)  # no scrape, no TTFT: not drawn
    # A restarted server counts again from 0: more queries than at the last scrape but fewer hits is no rate (it
    # was a negative one), and the scrape after it is a rate again.
    state.on_scrape(ServerSignals(t=state.t0 + 4, responding=True), parse_metrics(metrics.format(q=400, h=20)))
    state.on_scrape(ServerSignals(t=state.t0 + 5, responding=True), parse_metrics(metrics.format(q=500, h=100)))
    assert [p["hit"] for p in state.points[3:]] == [None, pytest.approx(0.8)]


@dataclass
class _Stream:
    """A reply in flight as the state reads it (the client's stream: first-token time, text, tool calls so far)."""

    t_first_token: float | None = None
    content: list[str] = field(default_factory=list)
    calls: dict[int, dict[str, str]] = field(default_factory=dict)
    record: RequestRecord | None = None  # the request is over


def _sent(state: LiveState, agent: str, stream: _Stream | None = None) -> _Stream:
    """A request of ``agent`` sent, as the chat client hands it to the dashboard (``stream_watch``)."""
    stream = stream or _Stream()
    state.stream_started(RequestIds(agent=agent), stream)
    return stream


async def test_a_card_follows_its_turns(board: Board) -> None:
    _, state, *_ = board
    state.agent("w.0", AgentState.RUNNING, rounds=0)
    stream = _sent(state, "w.0")
    state.refresh()
    assert state.cards["w.0"].phase == "prefilling"  # no token yet
    stream.t_first_token = 1.0
    stream.content.extend(["x" * 150, "y" * 100])
    state.refresh()
    assert state.cards["w.0"].phase == "streaming"
    assert state.cards["w.0"].preview == "x" * 100 + "y" * 100  # the last 200 characters
    stream.record = _turn(0, 0.05, 7, "the answer").final
    state.refresh()
    assert (state.cards["w.0"].phase, state.cards["w.0"].public()["preview"]) == ("think", "the answer")
    state.turn("w.0", _turn(0, 0.05, 7, "the answer"))
    card = state.cards["w.0"]
    shown = card.public()  # what the page is sent: a finished reply's preview is made then
    assert (shown["phase"], shown["turn"], shown["out"], shown["context"], shown["preview"]) == (
        "think",
        1,
        7,
        500,
        "the answer",
    )
    assert card.ttft == pytest.approx(0.05)
    state.agent("w.0", AgentState.DONE, rounds=1)
    assert (state.cards["w.0"].state, state.cards["w.0"].phase) == ("done", "")


async def test_a_request_cut_short_by_a_restart_or_the_runs_end_is_no_longer_shown_in_flight(board: Board) -> None:
    _, state, *_ = board
    restarted, cut, answered = _sent(state, "w.0"), _sent(state, "w.1"), _sent(state, "w.2")
    restarted.t_first_token = cut.t_first_token = 1.0
    restarted.content.append("half a reply")
    state.refresh()
    assert [state.cards[a].phase for a in ("w.0", "w.1", "w.2")] == ["streaming", "streaming", "prefilling"]
    state.agent_control("w.0", restarted=True)  # its turn is cancelled, uncommitted
    restarted.content.append(" and more")  # the cancelled request's accumulator is no longer read
    state.refresh()
    assert state.cards["w.0"].phase == ""
    answered.record = _turn(0, 0.05, 7, "in time").final
    _, cursor = state.snapshot()
    state.finish()  # the run ended (stopped): w.1 was never answered
    delta = state.delta(cursor)
    assert delta is not None
    assert {a["id"]: a["phase"] for a in delta["agents"]} == {"w.1": ""}
    assert (state.cards["w.2"].phase, state.cards["w.2"].public()["preview"]) == ("think", "in time")
    assert delta["summary"]["finished"] is True


async def test_a_reply_of_tool_calls_streams_its_calls_as_they_grow(board: Board) -> None:
    _, state, *_ = board
    state.turn("w.0", _turn(0, 0.05, 7, "the last answer"))
    stream = _sent(state, "w.0")
    stream.t_first_token = 1.0  # a reasoning token: no text, no call yet
    state.refresh()
    card = state.cards["w.0"]
    assert (card.phase, card.preview) == ("streaming", "the last answer")
    version = state.version
    state.refresh()
    assert state.version == version  # nothing new: the card is not sent again
    stream.calls[0] = {"id": "c0", "name": "search", "arguments": ""}
    state.refresh()
    assert card.preview == "→ search()"
    stream.calls[0]["arguments"] += '{"query": "lo'
    state.refresh()
    assert card.preview == '→ search({"query": "lo)'
    stream.calls[0]["arguments"] += "n" * 80  # past the 60 characters shown: the preview no longer changes
    state.refresh()
    version = state.version
    stream.calls[0]["arguments"] += "g"
    state.refresh()
    assert state.version == version
    call = ToolCallRecord(id="c0", name="search", arguments=stream.calls[0]["arguments"])
    stream.record = RequestRecord(t_sent=1.0, t_first_token=1.5, t_done=2.0, completion_tokens=9, tool_calls=[call])
    state.refresh()
    assert (card.public()["phase"], card.public()["preview"]) == ("tool", '→ search({"query": "lo' + "n" * 47 + ")")


async def test_a_delta_carries_the_agents_changed_since_its_own_cursor(board: Board) -> None:
    _, state, *_ = board
    _, early = state.snapshot()
    state.agent("w.3", AgentState.RUNNING, rounds=0)
    state.agent("w.1", AgentState.RUNNING, rounds=0)
    _, late = state.snapshot()  # a second page, opened now
    state.agent("w.0", AgentState.RUNNING, rounds=0)
    _sent(state, "w.3")
    state.refresh()  # a flush: the request is seen (prefilling)
    state.agent("ghost", AgentState.RUNNING, rounds=0)  # an agent the plans did not name: shown, and counted
    late_delta, early_delta = state.delta(late), state.delta(early)
    assert late_delta is not None
    assert early_delta is not None
    # Each agent once, in the order they last changed; the later page gets only what changed after it opened.
    assert [a["id"] for a in early_delta["agents"]] == ["w.1", "w.0", "w.3", "ghost"]
    assert [a["id"] for a in late_delta["agents"]] == ["w.0", "w.3", "ghost"]
    assert early_delta["agents"][2]["phase"] == "prefilling"
    assert early_delta["summary"]["counts"] == {"waiting": 3, "running": 4}
    state.agent("w.3", AgentState.DONE, rounds=4)
    state.agent("w.1", AgentState.DONE, rounds=4)
    delta = state.delta(late)
    assert delta is not None
    assert [a["id"] for a in delta["agents"]] == ["w.3", "w.1"]
    assert delta["summary"]["counts"] == {"waiting": 3, "running": 2, "done": 2}
    assert [a["id"] for a in state.snapshot()[0]["agents"]] == ["plan", "w.0", "w.1", "w.2", "w.3", "w.4", "ghost"]


async def test_an_unknown_charset_is_a_400(board: Board) -> None:
    client, _, control, _ = board
    resp = await client.post("/api/control", params={"token": TOKEN}, data=b'{"action": "pause"}',
                             headers={"Content-Type": "application/json; charset=bogus"})  # fmt: skip
    assert resp.status == 400
    assert "JSON object" in (await resp.json())["error"]
    assert not control.paused


def _fleet_backend(run: _Run, sent: list[str]) -> FleetBackend:
    """The fleet's own backend over a run without one running: its agents' turns reach ``sent`` when sent."""

    class _Inner:
        async def complete(self, body: Any, ids: RequestIds) -> list[RequestRecord]:
            sent.append(ids.agent)
            return [RequestRecord(ids=ids, t_sent=1.0, t_done=2.0)]

    backend = FleetBackend(_Inner(), run)
    for plan in run.plans:
        backend.begin(plan, None)
    return backend


async def test_a_resume_and_a_new_pause_before_the_turn_wakes_keep_it_waiting(board: Board) -> None:
    _, _, control, run = board
    sent: list[str] = []
    backend = _fleet_backend(run, sent)
    control.pause()
    turn = asyncio.create_task(backend.complete({}, RequestIds(agent="w.0")))
    await asyncio.sleep(0.01)
    # Two requests handled in one pass of the loop: the waiting turn's wake-up is scheduled but has not run.
    control.resume()
    control.pause()
    await asyncio.sleep(0.05)
    assert sent == []  # paused again: the turn has not been sent
    assert not turn.done()
    control.resume()
    await asyncio.wait_for(turn, 5)
    assert sent == ["w.0"]


async def test_an_agent_stopped_while_its_turn_waits_at_the_pause_is_not_sent(board: Board) -> None:
    _, _, control, run = board
    sent: list[str] = []
    backend = _fleet_backend(run, sent)
    control.pause()
    waiting = asyncio.create_task(backend.complete({}, RequestIds(agent="w.1")))
    await asyncio.sleep(0.01)
    run.stopping.add("w.1")
    control.resume()
    with pytest.raises(AgentStopped):
        await asyncio.wait_for(waiting, 5)
    assert sent == []


async def test_a_pause_asked_for_before_the_run_started_is_logged_when_it_starts(tmp_path: Path) -> None:
    plans = expand(load_fleet(_fleet(tmp_path)))
    clock = LoopClock()
    state = LiveState(plans, clock, fleet="dash")
    control = FleetControl(state, clock, max_width=len(plans))
    control.pause()  # no runner yet: nothing to log it in
    run = _Run(Limiter(make_policy(Mode.AUTO, 3, max_width=len(plans))), CheckpointLog(tmp_path / LOG), Tee(state))
    control.attach(run)
    control.resume()
    control.request_stop()
    control.request_stop()  # once in the log
    run.log.close()
    assert [c.action for c in load_log(tmp_path / LOG).controls] == ["pause", "resume", "stop"]


async def test_a_failed_write_of_a_pause_still_pauses(board: Board) -> None:
    client, state, control, run = board
    run.log.close()  # every write now fails, as on a full disk
    resp = await client.post("/api/control", params={"token": TOKEN}, json={"action": "pause"})
    assert resp.status == 200
    assert control.paused
    assert state.control["paused"] is True


async def test_a_failed_checkpoint_write_leaves_the_width_unchanged(board: Board) -> None:
    client, _, _, run = board
    run.log.close()  # every append now fails, as on a full disk
    resp = await client.post("/api/control", params={"token": TOKEN},
                             json={"action": "width", "mode": "parallel", "width": 2})  # fmt: skip
    assert resp.status == 500
    assert run.limiter.limit == 3  # the width the log could not record never runs
    assert run.limiter.history == []


# -- one agent --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({"action": "stop_agent"}, 400, "agent must be"),
        ({"action": "stop_agent", "agent": 3}, 400, "agent must be"),
        ({"action": "restart_agent", "agent": ""}, 400, "agent must be"),
        ({"action": "stop_agent", "agent": "nobody"}, 400, "no agent 'nobody'"),
        ({"action": "restart_agent", "agent": "nobody"}, 400, "no agent 'nobody'"),
    ],
)
async def test_malformed_agent_control_is_a_400(board: Board, body: dict[str, Any], status: int, words: str) -> None:
    client, state, _, run = board
    resp = await client.post("/api/control", params={"token": TOKEN}, json=body)
    assert resp.status == status
    assert words in (await resp.json())["error"]
    assert run.stopping == set()
    assert run.restarted == []
    assert not any(c.stopping or c.restarts for c in state.cards.values())


async def test_agent_control_reaches_the_run_and_the_card(board: Board) -> None:
    client, state, _, run = board
    resp = await client.post("/api/control", params={"token": TOKEN}, json={"action": "stop_agent", "agent": "w.1"})
    assert resp.status == 200
    assert (await resp.json())["agent"] == "w.1"
    resp = await client.post("/api/control", params={"token": TOKEN},
                             json={"action": "restart_agent", "agent": "w.2"})  # fmt: skip
    assert resp.status == 200
    assert run.stopping == {"w.1"}
    assert run.restarted == ["w.2"]
    cards = {a["id"]: a for a in state.snapshot()[0]["agents"]}
    assert (cards["w.1"]["stopping"], cards["w.2"]["restarts"]) == (True, 1)
    state.agent("w.1", AgentState.STOPPED, rounds=2)
    assert (state.cards["w.1"].state, state.cards["w.1"].stopping) == ("stopped", False)


async def test_stop_one_agent_on_a_real_run_then_resume_finishes_it_once(tmp_path: Path) -> None:
    rounds = 40  # many more than a stop landing late on a loaded machine can miss
    opts = _opts(tmp_path, _fleet(tmp_path, count=5, rounds=rounds, think=0.1))
    task, base, token = await _start(opts)
    async with aiohttp.ClientSession() as session:
        await _wait_turns(opts, 4)
        answer = await _post(session, base, token, {"action": "stop_agent", "agent": "w.3"})
        assert answer["ok"]
        async with session.post(f"{base}/api/control", params={"token": token},
                                json={"action": "stop_agent", "agent": "plan"}) as resp:  # fmt: skip
            assert resp.status == 400  # the planner has ended
            assert "already ended" in (await resp.json())["error"]
        first = await asyncio.wait_for(task, 120)
    assert opts.run_dir is not None
    by_id = {a.agent_id: a for a in first.agents}
    assert by_id["w.3"].outcome == "interrupted"  # no outcome: resumable
    assert by_id["w.3"].turns < rounds
    assert all(by_id[a].outcome == "done" for a in ("plan", "w.0", "w.1", "w.2", "w.4"))
    assert first.totals.done == 5
    resumed = await FleetApp(FleetSettings(resume=opts.run_dir, progress="none", out=tmp_path / "runs")).run()
    assert resumed.totals.done == 6
    state = load_log(opts.run_dir / LOG, repair=False)  # raises on a turn lost or repeated
    assert {a: len(t) for a, t in state.turns.items()} == {"plan": 2, **{f"w.{i}": rounds for i in range(5)}}
    assert {line.segment for line in state.turns["w.3"]} == {0, 1}
    # The log has the one stop that was taken (not the refused one); the replay shows w.3 stopping while its turn
    # in flight finished, stopped from then to its segment's end, and running again when the resume ran it.
    assert [(c.action, c.agent, c.segment) for c in state.controls] == [("stop_agent", "w.3", 0)]
    replay = FleetReplay(opts.run_dir)
    seg0, seg1 = replay.segments
    (at, _, _, _) = replay.controls[0]
    in_first = [line for line in state.turns["w.3"] if line.segment == 0]
    last = replay._t(0, in_first[-1].turn.final.t_done) if in_first else at  # its last turn in segment 0
    before = next(c for c in replay.at(at - 1e-3)["agents"] if c["id"] == "w.3")
    assert before["state"] in ("running", "waiting")
    assert before["stopping"] is False
    ended = next(c for c in replay.at(seg0["end"])["agents"] if c["id"] == "w.3")
    assert (ended["state"], ended["phase"], ended["stopping"]) == ("stopped", "", True)
    if last > at:  # the stop landed during a turn (else in a think spell): stopping until that turn ended
        during = next(c for c in replay.at((at + last) / 2)["agents"] if c["id"] == "w.3")
        assert (during["state"], during["stopping"]) == ("running", True)
    again = replay._t(1, state.turns["w.3"][-1].turn.final.t_done)
    resumed_card = next(c for c in replay.at(again)["agents"] if c["id"] == "w.3")
    assert resumed_card["state"] == "done"
    assert resumed_card["stopping"] is False
    assert seg1["start"] < again


async def test_restart_one_agent_on_a_real_run_completes_every_turn_once(tmp_path: Path) -> None:
    rounds = 40  # many more than the tries below can take on a loaded machine
    opts = _opts(tmp_path, _fleet(tmp_path, count=4, rounds=rounds, think=0.05))
    task, base, token = await _start(opts)
    restarted = 0
    async with aiohttp.ClientSession() as session:
        await _wait_turns(opts, 6)
        for _ in range(600):  # until it lands while w.2 is running; one between attempts is a 400
            async with session.post(f"{base}/api/control", params={"token": token},
                                    json={"action": "restart_agent", "agent": "w.2"}) as resp:  # fmt: skip
                assert resp.status in (200, 400), await resp.text()
                if resp.status == 200:
                    restarted += 1
                    break
                assert "already ended" not in (await resp.json())["error"]
            await asyncio.sleep(0.02)
        result = await asyncio.wait_for(task, 120)
    assert restarted == 1
    assert result.totals.done == 5
    assert opts.run_dir is not None
    state = load_log(opts.run_dir / LOG, repair=False)
    assert {a: len(t) for a, t in state.turns.items()} == {"plan": 2, **{f"w.{i}": rounds for i in range(4)}}
    # Only the restart taken is in the log; the replay counts it on w.2's card from then on.
    assert [(c.action, c.agent) for c in state.controls] == [("restart_agent", "w.2")]
    replay = FleetReplay(opts.run_dir)
    (at, _, _, _) = replay.controls[0]
    restarts = {t: {c["id"]: c["restarts"] for c in replay.at(t)["agents"]} for t in (at - 1e-3, at, replay.end)}
    assert [r["w.2"] for r in restarts.values()] == [0, 1, 1]
    assert all(r[a] == 0 for r in restarts.values() for a in r if a != "w.2")


async def test_a_card_that_only_streamed_since_the_cursor_is_sent_as_its_phase_and_preview(board: Board) -> None:
    _, state, *_ = board
    stream = _sent(state, "w.0")
    _, old = state.snapshot()  # a page that saw the request start, not its stream
    stream.t_first_token = 1.0
    stream.content.append("hello")
    state.refresh()
    _, cursor = state.snapshot()
    first = state.delta(old)
    assert first is not None
    assert first["agents"] == [{"id": "w.0", "phase": "streaming", "preview": "hello"}]
    stream.content.append(" world")
    state.refresh()
    delta = state.delta(cursor)
    assert delta is not None
    assert delta["agents"] == [{"id": "w.0", "phase": "streaming", "preview": "hello world"}]
    # A turn's progress since a page's cursor: that page gets the card's state, turn and figures too.
    _, before_done = state.snapshot()
    stream.record = _turn(0, 0.05, 7, "hello world!").final
    done = state.delta(before_done)
    assert done is not None
    (card,) = done["agents"]
    assert (card["phase"], card["preview"], card["state"]) == ("think", "hello world!", "waiting")
    assert card["ttft"] == pytest.approx(0.05)


async def test_a_delta_sends_as_much_of_a_card_as_changed_and_the_whole_card_for_anything_rare(board: Board) -> None:
    _, state, *_ = board
    whole = set(state.cards["w.0"].public())
    progress = {"id", "state", "phase", "turn", "context", "out", "ttft", "preview"}
    _, cursor = state.snapshot()

    def sent() -> dict[str, set[str]]:
        delta = state.delta(cursor)
        assert delta is not None
        return {a["id"]: set(a) for a in delta["agents"]}

    # A turn's life: admitted, sent, answered, committed: its progress, never the static fields again.
    state.agent("w.0", AgentState.RUNNING, rounds=0)
    stream = _sent(state, "w.0")
    assert sent() == {"w.0": progress}
    stream.record = _turn(0, 0.05, 7, "ok").final
    assert sent() == {"w.0": progress}  # answered
    state.turn("w.0", _turn(0, 0.05, 7, "ok"))
    assert sent() == {"w.0": progress}
    _sent(state, "w.0")  # the next turn's request: its phase only
    assert sent() == {"w.0": {"id", "phase", "preview"}}
    # Rare changes send the whole card: an error, a stop asked from the page and then taken, an agent never planned.
    state.agent("w.1", AgentState.FAILED, detail="boom")
    state.agent_control("w.2", stopping=True)
    state.agent("ghost", AgentState.RUNNING, rounds=0)
    assert sent() == {"w.1": whole, "w.2": whole, "ghost": whole}
    state.agent("w.2", AgentState.STOPPED)  # its stopping mark is cleared: a static field
    assert sent() == {"w.2": whole}
    assert state.cards["w.2"].stopping is False
    state.agent("w.3", AgentState.DONE, rounds=2)  # an end with nothing rare: progress
    assert sent() == {"w.3": progress}


def test_a_streaming_preview_is_the_tail_of_everything_said_so_far(tmp_path: Path) -> None:
    """The preview is built from the pieces that arrived since the last read; after any run of arrivals (empty
    pieces, one long piece, many short ones, reads after every piece or after many) it is the last
    ``PREVIEW_CHARS`` characters of the whole text, as joining it all would give."""
    rng = random.Random(7)
    state = LiveState(expand(load_fleet(_fleet(tmp_path))), RealClock())
    acc = _sent(state, "w.1")
    acc.t_first_token = 0.1
    card = state.cards["w.1"]
    checked = 0
    for _ in range(300):
        for _ in range(rng.choice([0, 1, 1, 2, 7, 40])):
            acc.content.append(rng.choice(["", "a", "token ", "ünïcode ", "x" * 250, "\n"]) + str(rng.randrange(99)))
        state.refresh()
        if acc.content:
            assert card.phase == "streaming"
            assert card.preview == "".join(acc.content)[-PREVIEW_CHARS:]
            checked += 1
    assert checked > 250


def test_a_delta_sends_each_card_changed_since_its_cursor_once_in_the_order_of_their_last_changes(
    tmp_path: Path,
) -> None:
    """Whatever the cursor's age — across thousands of changes, past the point where the change log drops the
    entries later changes superseded — a delta carries every card changed since the cursor, once, ordered by its
    latest change, and nothing else."""
    rng = random.Random(11)
    plans = expand(load_fleet(_fleet(tmp_path)))
    state = LiveState(plans, RealClock())
    ids = [p.agent_id for p in plans]
    cursors: list[tuple[Cursor, dict[str, int]]] = []  # a cursor, and each card's last change when it was taken
    last: dict[str, int] = {}
    for step in range(6000):
        agent = rng.choice(ids)
        state.agent(agent, rng.choice([AgentState.RUNNING, AgentState.PARKED, AgentState.RUNNING]), rounds=step % 7)
        last[agent] = state.version
        if step % 1500 == 0:
            cursors.append((Cursor(state.version), dict(last)))
    assert len(state._log_v) < 6000  # the log was compacted on the way
    for cursor, then in cursors:
        since = cursor.version
        expected = sorted((v, a) for a, v in last.items() if v > since)
        delta = state.delta(cursor)
        assert delta is not None
        assert [a["id"] for a in delta["agents"]] == [a for _, a in expected]
        assert all(then.get(a, 0) < v for v, a in expected)
        assert state.delta(cursor) is None  # moved on: nothing since
