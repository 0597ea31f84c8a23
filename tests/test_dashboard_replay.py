"""``agentload dashboard RUN``: a finished or interrupted fleet run replayed from its run directory, read-only.

Runs are made in simulated time (the in-process simulator: fast, and the same log a real run writes); every
claim about the replay is checked against the checkpoint log the run wrote.
"""

from __future__ import annotations

import asyncio
import math
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer
from typer.testing import CliRunner

from agentload.cli.main import app
from agentload.clock import run_virtual
from agentload.dashboard.benchreplay import BenchReplay
from agentload.dashboard.replay import SEGMENT_GAP_S, FleetReplay, open_replay
from agentload.dashboard.server import make_replay_app, serve_replay
from agentload.errors import CheckpointError
from agentload.fleet.app import FleetApp, FleetSettings
from agentload.fleet.checkpoint import LOG, load_log
from agentload.fleet.samples import read_samples
from agentload.store.rundir import RunDir

FAST = "llama-8b-h100"
TOKEN = "t0ken"
FLEET = """
name = "replayed"
[defaults]
tools = ["search"]
tool_choice = "required"
max_rounds = 5
max_tokens = 16
think_time_s = 0.5
context_tokens = 300
tool_result_tokens = 40

[[tasks]]
id = "plan"
prompt = "Plan."
max_rounds = 2

[[tasks]]
id = "w"
prompt = "Work item {replica}."
count = 6
depends_on = ["plan"]
"""


def _run(tmp_path: Path, **kw: Any) -> Path:
    (tmp_path / "f.toml").write_text(FLEET)
    settings = FleetSettings(fleet=tmp_path / "f.toml", out=tmp_path / "runs", progress="none", virtual=True,
                             profile=FAST)  # fmt: skip
    opts = FleetApp(settings.model_copy(update=kw))
    run_virtual(opts.run())
    assert opts.run_dir is not None
    return opts.run_dir


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _run(tmp_path_factory.mktemp("finished"))


def _cards(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {a["id"]: a for a in body["agents"]}


def test_the_end_of_a_finished_run_is_what_its_log_says(finished: Path) -> None:
    replay = FleetReplay(finished)
    log = load_log(finished / LOG, repair=False)
    body = replay.at(replay.end)
    cards = _cards(body)
    assert body["summary"]["counts"] == {"done": 7}
    assert body["summary"]["finished"] is True
    assert {a: c["turn"] for a, c in cards.items()} == {a: len(t) for a, t in log.turns.items()}
    assert body["summary"]["turns"] == sum(len(t) for t in log.turns.values())
    assert cards["w.3"]["out"] == sum(r.completion_tokens for line in log.turns["w.3"] for r in line.turn.records)
    assert cards["plan"]["wave"] == 0
    assert cards["w.0"]["depends_on"] == ["plan"]
    last = body["points"][-1]
    assert (last["turns"], last["t"]) == (body["summary"]["turns"], replay.end)
    assert last["running"] == 0  # the server's last sample: nothing left running


@pytest.fixture(scope="module")
def busy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run on a slow server (the laptop profile, long contexts, short think): requests queue and hold KV."""
    tmp = tmp_path_factory.mktemp("busy")
    opts = FleetApp(
        FleetSettings(fleet=tmp / "f.toml", out=tmp / "runs", progress="none", virtual=True, profile="laptop")
    )
    (tmp / "f.toml").write_text(
        FLEET.replace("think_time_s = 0.5", "think_time_s = 0.1").replace(
            "context_tokens = 300", "context_tokens = 4000"
        )
    )
    run_virtual(opts.run())
    assert opts.run_dir is not None
    return opts.run_dir


def test_the_servers_samples_are_drawn_on_the_turns_axis(busy: Path) -> None:
    samples = read_samples(busy)
    assert len(samples) >= 5
    assert {x.segment for x in samples} == {0}
    replay = FleetReplay(busy)
    points = replay.at(replay.end)["points"]
    # Every gauge drawn is one the server reported, at or after the moment it reported it.
    drawn = [p for p in points if p["kv"] is not None]
    assert len(drawn) >= len(points) - 1  # a sample a second: every point has one, bar perhaps the first
    assert {p["kv"] for p in drawn} <= {x.kv_usage for x in samples}
    assert len({p["kv"] for p in drawn}) >= 3  # the pool filled and drained
    assert max(p["running"] for p in drawn) >= 2  # several requests at once
    assert max(p["waiting"] for p in drawn) >= 1  # and a queue behind them
    assert all(p["running"] <= 7 for p in drawn)
    log = load_log(busy / LOG, repair=False)
    first = min(r.t_sent for lines in log.turns.values() for line in lines for r in line.turn.records)
    busiest = max(samples, key=lambda x: x.kv_usage or 0.0)
    at = math.ceil(busiest.t - first)  # the first point at or after it (a point a second)
    assert next(p["kv"] for p in points if p["t"] == at) == busiest.kv_usage
    hits = [p["hit"] for p in drawn if p["hit"] is not None]
    assert hits
    assert all(0.0 <= h <= 1.0 for h in hits)


def test_scrubbing_shows_each_agent_as_it_was(finished: Path) -> None:
    replay = FleetReplay(finished)
    log = load_log(finished / LOG, repair=False)
    start = _cards(replay.at(0.0))
    assert (start["plan"]["state"], start["plan"]["phase"]) == ("running", "prefilling")
    assert {start[f"w.{i}"]["state"] for i in range(6)} == {"waiting"}
    assert replay.at(0.0)["points"][0]["t"] == 0.0
    # w.2's third turn, halfway through its request: running, two turns committed before it.
    first = min(r.t_sent for lines in log.turns.values() for line in lines for r in line.turn.records)
    turn = log.turns["w.2"][2].turn
    mid = ((turn.records[0].t_sent + turn.final.t_done) / 2) - first
    card = _cards(replay.at(mid))["w.2"]
    assert (card["state"], card["turn"]) == ("running", 2)
    assert card["phase"] in ("prefilling", "streaming")
    after = turn.final.t_done - first
    assert _cards(replay.at(after + 1e-6))["w.2"]["turn"] == 3
    # Over time nothing is undone: committed turns only grow.
    totals = [replay.at(replay.end * k / 20)["summary"]["turns"] for k in range(21)]
    assert totals == sorted(totals)
    assert totals[0] == 0
    assert totals[-1] == sum(len(t) for t in log.turns.values())


def test_a_stopped_then_resumed_run_is_two_segments_with_the_gap_between(tmp_path: Path) -> None:
    run_dir = _run(tmp_path, stop_after_s=2.0)
    stopped = FleetReplay(run_dir)
    assert len(stopped.segments) == 1
    end = _cards(stopped.at(stopped.end))
    unfinished = [a for a, c in end.items() if c["state"] not in ("done",)]
    assert unfinished  # cut short at 2 s of a run that needs more
    assert {end[a]["state"] for a in unfinished} <= {"interrupted", "waiting"}
    run_virtual(FleetApp(FleetSettings(resume=run_dir, progress="none", out=tmp_path / "runs")).run())
    replay = FleetReplay(run_dir)
    first, second = replay.segments
    assert second["start"] == pytest.approx(first["end"] + SEGMENT_GAP_S)
    gap = _cards(replay.at(first["end"] + SEGMENT_GAP_S / 2))
    assert [a for a, c in gap.items() if c["state"] == "interrupted"] == [
        a for a in unfinished if end[a]["state"] == "interrupted"
    ]
    assert replay.at(replay.end)["summary"]["counts"] == {"done": 7}
    # Both segments' server samples are drawn, each in its own segment (a sample a second: every point a second
    # or more into a segment has one); none in the gap between them.
    points = replay.at(replay.end)["points"]
    assert {x.segment for x in read_samples(run_dir)} == {0, 1}
    for seg in (first, second):
        within = [p for p in points if seg["start"] + 1.0 <= p["t"] <= seg["end"]]
        assert within
        assert all(p["kv"] is not None for p in within)
    assert all(p["kv"] is None for p in points if first["end"] < p["t"] < second["start"])
    # Each sample carries the watchdog's decisions so far in its segment; the replay sums the segments.
    samples = read_samples(run_dir)
    assert all(x.granted is not None and x.refused is not None for x in samples)
    assert replay.at(replay.end)["summary"]["watchdog"] is not None
    # Counts the run did not happen to need (its server never stalled), written into a copy: segment 0's counter
    # grows a decision a sample, the last one scraped after its last request; segment 1 starts again from 0 (a new
    # process) and gives up once.
    copy = tmp_path / "counted"
    shutil.copytree(run_dir, copy)
    lines, k = [], {0: 0, 1: 0}
    for x in samples:
        k[x.segment] += 1
        refused = {"stream": 1} if x.segment == 1 and x is samples[-1] else {}
        lines.append(x.model_copy(update={"granted": {"prefill": k[x.segment]}, "refused": refused}))
    last0 = max(x.t for x in samples if x.segment == 0)
    lines.insert(k[0], samples[k[0] - 1].model_copy(update={"t": last0 + 5.0, "granted": {"prefill": k[0] + 1},
                                                            "refused": {}}))  # fmt: skip
    (copy / "server.jsonl").write_text("".join(x.model_dump_json() + "\n" for x in lines))
    counted = FleetReplay(copy)
    assert counted.at(first["end"])["summary"]["watchdog"] == {"granted": {"prefill": k[0] + 1}, "refused": {}}
    assert counted.at(replay.end)["summary"]["watchdog"] == {
        "granted": {"prefill": k[0] + 1 + k[1]},
        "refused": {"stream": 1},
    }
    growing = [counted.at(t)["summary"]["watchdog"]["granted"].get("prefill", 0) for t in range(int(replay.end) + 1)]
    assert growing == sorted(growing)


def test_a_log_from_before_the_bounds_were_recorded_shows_the_runs_last(finished: Path, tmp_path: Path) -> None:
    end = FleetReplay(finished).at(0.0)["summary"]["limiter"]
    assert (end["mode"], end["min"], end["max"]) == ("auto", 1, 7)  # the segment's line: auto over 1-7 agents
    old = tmp_path / "old"
    shutil.copytree(finished, old)
    lines = []
    for raw in (old / LOG).read_bytes().splitlines():
        line = orjson.loads(raw)
        if line["kind"] == "segment":
            del line["min_limit"], line["max_limit"]
        lines.append(orjson.dumps(line))
    (old / LOG).write_bytes(b"\n".join(lines) + b"\n")
    got = FleetReplay(old).at(0.0)["summary"]["limiter"]
    assert (got["mode"], got["min"], got["max"]) == ("auto", 1, 7)  # results.json's, as before


@pytest.fixture
async def client(finished: Path) -> AsyncIterator[TestClient[Any, Any]]:
    c = TestClient(TestServer(make_replay_app(FleetReplay(finished), TOKEN)))
    await c.start_server()
    try:
        yield c
    finally:
        await c.close()


@pytest.mark.parametrize(("method", "path"), [("GET", "/"), ("GET", "/api/state"), ("POST", "/api/control")])
async def test_the_replay_needs_the_token(client: TestClient[Any, Any], method: str, path: str) -> None:
    resp = await client.request(method, path, params={"token": "wrong"})
    assert resp.status == 403


async def test_the_replay_serves_the_page_and_the_state_read_only(client: TestClient[Any, Any]) -> None:
    page = await client.get("/", params={"token": TOKEN})
    assert 'data-mode="replay"' in await page.text()
    state = await client.get("/api/state", params={"token": TOKEN, "t": "1.5"})
    assert state.status == 200
    assert (await state.json())["summary"]["replay"]["t"] == 1.5
    end = await (await client.get("/api/state", params={"token": TOKEN})).json()
    assert end["summary"]["replay"]["t"] == end["summary"]["replay"]["end"]
    beyond = await (await client.get("/api/state", params={"token": TOKEN, "t": "1e9"})).json()
    assert beyond["summary"]["t"] == end["summary"]["t"]  # clamped to the end
    for bad in ("abc", "-1", "nan", "inf"):
        resp = await client.get("/api/state", params={"token": TOKEN, "t": bad})
        assert resp.status == 400, bad
        assert "t must be" in (await resp.json())["error"]
    resp = await client.post("/api/control", params={"token": TOKEN}, json={"action": "stop"})
    assert resp.status == 405
    assert "read-only" in (await resp.json())["error"]
    resp = await client.get("/events", params={"token": TOKEN})
    assert resp.status == 404
    assert "error" in await resp.json()


async def test_serve_replay_listens_on_loopback_until_told_to_stop(finished: Path) -> None:
    urls: list[str] = []
    until = asyncio.Event()
    task = asyncio.create_task(serve_replay(finished, on_url=urls.append, until=until))
    for _ in range(400):
        if urls:
            break
        await asyncio.sleep(0.025)
    assert urls
    assert urls[0].startswith("http://127.0.0.1:")
    assert "?token=" in urls[0]
    until.set()
    await asyncio.wait_for(task, 10)


def test_the_command_refuses_a_directory_that_is_not_a_run(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["dashboard", str(tmp_path)])
    assert result.exit_code == 2
    assert "not a fleet or bench run directory" in result.output
    assert "Traceback" not in result.output


# -- bench runs -------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def bench_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bench") / "runs"
    result = CliRunner().invoke(app, ["bench", "--sim", FAST, "--workload", "agentic-hold", "--context", "2000",
                                      "--find-knee", "--max-agents", "4", "--warmup", "2s", "--window", "10s",
                                      "--out", str(root), "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    (run_dir,) = [p.parent for p in root.glob("*/result.json")]
    return run_dir


def test_a_bench_run_replays_its_levels_steps_and_server_timelines(bench_run: Path) -> None:
    replay = open_replay(bench_run)
    assert isinstance(replay, BenchReplay)
    saved = RunDir(bench_run).result()
    end = replay.at(replay.end)
    assert end["summary"]["bench"]["mode"] == "find-knee"
    assert [(x["level"], x["agents"], x["output_tps"]) for x in end["levels"]] == [
        (x.level, x.agents, x.output_tps) for x in saved.levels
    ]
    # The steps, judged again from the summaries in order: doubling 1, 2, 4 (none past the knee below --max-agents).
    assert [(s["phase"], s["agents"]) for s in end["steps"]] == [("doubling", x.agents) for x in saved.levels]
    assert end["steps"][-1]["lo"] == saved.knee[0].agents
    kv = [p["kv"] for p in end["points"]]
    assert len(kv) == len(RunDir(bench_run).samples())
    assert all(v is not None for v in kv)
    # Scrubbed to the start: no level has ended, the first is running.
    start = replay.at(0.0)
    assert (start["levels"], start["steps"]) == ([], [])
    assert start["summary"]["bench"]["current"]["agents"] == 1
    # Between the first level's end and the last's: some rows, not all, and never one before its level ended.
    first_end = replay.ended[0]
    middle = replay.at(first_end)
    assert 1 <= len(middle["levels"]) < len(saved.levels)


async def test_a_bench_replay_is_served_read_only(bench_run: Path) -> None:
    c = TestClient(TestServer(make_replay_app(open_replay(bench_run), TOKEN)))
    await c.start_server()
    try:
        body = await (await c.get("/api/state", params={"token": TOKEN, "t": "0"})).json()
        assert body["summary"]["replay"]["kind"] == "bench"
        assert (await c.post("/api/control", params={"token": TOKEN}, json={"action": "stop"})).status == 405
        assert (await c.get("/api/state", params={"token": TOKEN + "x"})).status == 403
    finally:
        await c.close()


def test_a_suite_or_empty_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="replays fleet and bench runs"):
        open_replay(tmp_path)
