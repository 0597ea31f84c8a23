"""A trace replay's pace from bench's flags, and ``start="mid"``: sessions replayed from a seeded turn inside them.

The mid start's promise: the first request of a replayed session is turn k of it whole (the same text the full
replay sends at turn k, so the server sees the context the session had there, cold), then the replay goes on from
k + 1; k is drawn from the seed and the draw alone.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from agentload.bench.settings import BenchSettings
from agentload.cli.main import app
from agentload.endpoint.records import RequestRecord
from agentload.errors import ConfigError
from agentload.workload.conversation_trace import (
    ConversationTraceWorkload,
    ConversationTreeDriver,
    _Draws,
    load_conversation_trace,
    mid_turn,
    prefix_ceiling,
)
from agentload.workload.registry import get_workload
from agentload.workload.trace import MooncakeWorkload, SessionReplayWorkload
from agentload.workload.words import stable_int
from tests.test_workload_harness import LevelRun, run_level, sim_server

DATA = Path(__file__).parent / "data"
SESSIONS = DATA / "sessions_small.jsonl"
MOONCAKE = DATA / "mooncake_sessions.jsonl"
BLOCK = 16
TURNS = 8


def conversation(index: int, subagent_at: float | None = None) -> dict[str, Any]:
    """A growing conversation: request j holds 4 (j + 1) blocks chained on the previous request's, 3 s after the
    previous reply; optionally a two-request subagent ``subagent_at`` s after the start."""
    requests: list[dict[str, Any]] = []
    for j in range(TURNS):
        ids = [index * 1000 + b for b in range(4 * (j + 1))]
        requests.append({"t": 10.0 * j, "in": len(ids) * BLOCK + 24, "out": 6, "hash_ids": ids,
                         "think_time": 0.0 if j == 0 else 3.0})  # fmt: skip
    if subagent_at is not None:
        sub = [{"t": subagent_at + i, "in": 80, "out": 4, "hash_ids": [9000 + index, 9100 + i]} for i in range(2)]
        requests.insert(1, {"type": "subagent", "t": subagent_at, "requests": sub})
    return {"id": f"conv{index}", "block_size": BLOCK, "requests": requests}


@pytest.fixture
def trace_file(tmp_path: Path) -> Path:
    path = tmp_path / "conversations.json"
    path.write_text(json.dumps([conversation(i) for i in range(3)]))
    return path


def by_turn(run: LevelRun) -> dict[tuple[str, int], tuple[RequestRecord, str]]:
    """Each request's record and prompt text by (draw/context, turn)."""
    out = {}
    for record, body in zip(run.records, run.bodies, strict=True):
        out[(record.ids.agent.split("/", 1)[1], record.ids.turn)] = (record, body["messages"][-1]["content"])
    return out


# -- drawing the turn --------------------------------------------------------------------------------------------


def test_the_mid_turn_is_drawn_from_the_seed_and_draw_alone_and_leaves_a_turn_after_it() -> None:
    draws = [mid_turn(TURNS, 7, d) for d in range(200)]
    assert draws == [mid_turn(TURNS, 7, d) for d in range(200)]  # deterministic per draw
    assert set(draws) == set(range(TURNS - 1))  # every turn with a next one, and never the last
    assert draws != [mid_turn(TURNS, 8, d) for d in range(200)]  # another seed, other turns
    assert mid_turn(1, 7, 0) == 0
    assert mid_turn(2, 7, 5) == 0


def test_a_mid_start_plans_the_conversation_at_its_drawn_turn_and_only_the_subagents_after_it(tmp_path: Path) -> None:
    path = tmp_path / "sub.json"
    path.write_text(json.dumps([conversation(0, subagent_at=35.0)]))
    trace = load_conversation_trace(path)
    contexts = trace.trees[0].contexts
    driver = ConversationTreeDriver("a", trace, _Draws(), 1.0, 3, start="mid")
    seen = set()
    for draw in range(40):
        plan = driver.plan(contexts, draw)
        k = mid_turn(TURNS, 3, draw)
        assert plan[0] == (contexts[0], k, 0.0)
        # The tree's clock starts at request k's recorded time (10 k s): the subagent (at 35 s) keeps its offset
        # from there, or is the sampled point's past and not replayed.
        assert plan[1:] == ([(contexts[1], 0, 35.0 - 10.0 * k)] if 10.0 * k <= 35.0 else [])
        seen.add(len(plan))
    assert seen == {1, 2}
    begin = ConversationTreeDriver("a", trace, _Draws(), 1.0, 3)
    assert begin.plan(contexts, 0) == [(contexts[0], 0, 0.0), (contexts[1], 0, 35.0)]


# -- the warm-up turn is turn k whole ----------------------------------------------------------------------------


def test_the_warm_up_is_the_full_replays_turn_k_and_the_replay_goes_on_from_k_plus_1(trace_file: Path) -> None:
    whole = run_level(get_workload(f"trace:{trace_file}", time_scale=0.01), 1, context=0, server=sim_server(),
                      stop_after_requests=TURNS * 3, seed=5)  # fmt: skip
    mid_workload = get_workload(f"trace:{trace_file}", time_scale=0.01, start="mid")
    mid = run_level(mid_workload, 1, context=0, server=sim_server(), stop_after_requests=TURNS * 3, seed=5)
    full, cut = by_turn(whole), by_turn(mid)
    assert all(r.ok for r in mid.records)
    ks = [mid_turn(TURNS, 5, draw) for draw in range(3)]
    assert min(ks) > 0  # (seed 5 starts every tree past its first request)
    for draw, k in enumerate(ks):
        # The record names the request the context started at (``k<k>``), for its ceiling.
        sent = sorted(turn for key, turn in cut if key == f"d{draw}/k{k}/c{draw}")
        assert sent == list(range(k, TURNS))  # turn k first, then on to the end
        warm, text = cut[(f"d{draw}/k{k}/c{draw}", k)]
        assert text == full[(f"d{draw}/c{draw}", k)][1]  # the same blocks, the same words
        assert (warm.cached_tokens or 0) < BLOCK  # cold, as a resumed session would be
        for turn in range(k + 1, TURNS):
            record, text = cut[(f"d{draw}/k{k}/c{draw}", turn)]
            assert text == full[(f"d{draw}/c{draw}", turn)][1]
            assert (record.cached_tokens or 0) > 0  # its context from turn k on is warm
    # The ceiling counts the warm-up as a miss and what follows against what was sent from turn k on (here, in
    # a conversation whose every request holds the previous one's blocks, what the full replay's same turns had),
    # from the records alone: a level's window without its warm-up's records is enough.
    assert isinstance(mid_workload, ConversationTraceWorkload)
    warmups = [r for r in mid.records if r.ids.turn == int(r.ids.agent.split("/")[2][1:])]
    assert len(warmups) == len({r.ids.agent for r in mid.records})  # one per replayed tree
    assert mid_workload.ceiling(warmups) == 0.0
    rest = [r for r in mid.records if r not in warmups and r.ids.agent.split("/")[1] in ("d0", "d1", "d2")]
    same = [full[(r.ids.agent.split("/", 1)[1].replace(f"/k{k}/", "/"), r.ids.turn)][0]
            for r in rest for k in [int(r.ids.agent.split("/")[2][1:])]]  # fmt: skip
    assert mid_workload.ceiling(rest) == pytest.approx(prefix_ceiling(mid_workload.trace, same))


def test_the_pace_truth_counts_every_turn_after_a_reply_and_on_virtual_time_keeps_the_trace(trace_file: Path) -> None:
    workload = get_workload(f"trace:{trace_file}", time_scale=0.5)
    assert isinstance(workload, ConversationTraceWorkload)
    run = run_level(workload, 2, context=0, server=sim_server(), stop_after_requests=TURNS * 3)
    truth = workload.pace(run.records)
    assert truth is not None
    trees = {r.ids.agent for r in run.records}
    assert truth.turns == len(run.records) - len(trees)  # each context's first turn has no recorded wait
    assert truth.recorded_wait_s == pytest.approx(3.0 * 0.5)
    # Simulated time has no loop lag: each turn goes out exactly its recorded wait after the previous reply.
    assert truth.realised_wait_s == pytest.approx(truth.recorded_wait_s, abs=1e-9)
    assert max(abs(x) for x in truth.lateness_s) < 1e-9
    assert workload.pace([]) is None


def test_a_session_trace_starts_each_session_at_its_drawn_turn_at_its_recorded_size() -> None:
    workload = get_workload(f"trace:{SESSIONS}", speed=100.0, start="mid")
    assert isinstance(workload, SessionReplayWorkload)
    sessions = {s.session_id: s for s in workload.trace.sessions}
    # The replay's names: the recorded agent 0's two sessions go to replay agent 0 in order, agent 1's to agent 1.
    names = {"agent-0/s0": "L0/agent-0/s0", "agent-0/s1": "L0/agent-0/s1", "agent-1/s0": "L0/agent-1/s0"}

    def k_of(session_id: str, seed: int) -> int:
        return mid_turn(len(sessions[session_id].turns), seed, stable_int(session_id), 0)

    seed = next(s for s in range(100) if any(k_of(sid, s) > 0 for sid in sessions))  # a draw that skips a turn
    run = run_level(workload, 2, context=0, seed=seed)
    assert all(r.ok for r in run.records)
    for name, session_id in names.items():
        k, turns = k_of(session_id, seed), sessions[session_id].turns
        sent = [r for r in run.records if r.ids.agent == name]
        assert [r.ids.turn for r in sent] == list(range(k, len(turns)))
        assert abs(sent[0].prompt_tokens - turns[k].prompt_tokens) <= 2  # the context's size at turn k, whole
        for record in sent[1:]:
            assert abs(record.prompt_tokens - turns[record.ids.turn].prompt_tokens) <= 2


# -- options and flags -------------------------------------------------------------------------------------------


def test_a_start_or_pace_that_does_not_apply_to_the_trace_is_one_clear_error(trace_file: Path) -> None:
    with pytest.raises(ConfigError, match="start=mid applies to closed-loop replays"):
        get_workload(f"trace:{MOONCAKE}", start="mid")
    assert isinstance(get_workload(f"trace:{MOONCAKE}", start="begin"), MooncakeWorkload)
    with pytest.raises(ConfigError, match="start must be 'begin' or 'mid', got 'middle'"):
        get_workload(f"trace:{trace_file}", start="middle")
    with pytest.raises(ConfigError, match="start must be 'begin' or 'mid'"):
        get_workload(f"trace:{SESSIONS}", start="end")
    with pytest.raises(ConfigError, match="unknown trace option speed for a conversation trace"):
        get_workload(f"trace:{trace_file}", speed=2.0)
    with pytest.raises(ConfigError, match=r"unknown trace option time_scale for .* \(a request trace\)"):
        get_workload(f"trace:{MOONCAKE}", time_scale=0.5)
    with pytest.raises(ConfigError, match=r"unknown trace option timing for .* \(a request trace\)"):
        get_workload(f"trace:{MOONCAKE}", timing="closed")


def test_the_pace_flags_reach_the_workload(trace_file: Path) -> None:
    settings = BenchSettings(workload=f"trace:{trace_file}", time_scale=0.1, start="mid", agents=1)
    assert settings.workload_options == {"time_scale": 0.1, "start": "mid"}
    workload = get_workload(settings.workload, **settings.workload_options)
    assert isinstance(workload, ConversationTraceWorkload)
    assert (workload.time_scale, workload.start) == (0.1, "mid")
    jsonl = BenchSettings(workload=f"trace:{SESSIONS}", trace_speed=4.0, trace_timing="closed", trace_repeat=False,
                          agents=1)  # fmt: skip
    assert jsonl.workload_options == {"speed": 4.0, "timing": "closed", "repeat": False}
    replay = get_workload(jsonl.workload, **jsonl.workload_options)
    assert isinstance(replay, SessionReplayWorkload)
    assert (replay.speed, replay.timing, replay.repeat) == (4.0, "closed", False)
    assert BenchSettings(agents=1).workload_options == {}
    with pytest.raises(ConfigError, match="--time-scale, --start set a trace replay's pace: use with --workload trace"):
        BenchSettings(workload="agentic", time_scale=0.1, start="mid", agents=1)


def _bench(args: list[str]) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["bench", *args])
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize(
    ("flags", "problem"),
    [
        (["--workload", "agentic", "--time-scale", "0.5"], "--time-scale set a trace replay's pace"),
        (["--trace-speed", "2"], "unknown trace option speed for a conversation trace"),
        (["--start", "middle"], "start must be 'begin' or 'mid'"),
        (["--time-scale", "-1"], "greater than or equal to 0"),
    ],
)
def test_bad_pace_flags_are_one_error_line(trace_file: Path, flags: list[str], problem: str) -> None:
    code, _, err = _bench(["--sim", "laptop", "--workload", f"trace:{trace_file}", "--agents", "1", *flags])
    assert code == 2
    assert problem in err
    assert "Traceback" not in err


def test_a_resumed_trace_run_keeps_its_pace_flags(trace_file: Path, tmp_path: Path) -> None:
    root = tmp_path / "runs"
    args = ["--sim", "laptop", "--workload", f"trace:{trace_file}", "--time-scale", "0.05", "--start", "mid",
            "--context", "4096", "--sweep", "1,2", "--warmup", "2s", "--window", "10s", "--min-turns", "4",
            "--out", str(root), "--json"]  # fmt: skip
    code, out, err = _bench(args)
    assert code == 0, err
    whole = json.loads(out)
    (done,) = [p for p in root.iterdir() if p.is_dir()]
    stored = json.loads((done / "bench.json").read_text())
    assert (stored["time_scale"], stored["start"], stored["trace_speed"]) == (0.05, "mid", None)
    # The run as a process killed during its second level would have left it, resumed without its flags.
    run = tmp_path / "cut" / done.name
    shutil.copytree(done, run)
    for name in ("result.json", "records.csv", "levels.csv", "samples.csv"):
        (run / name).unlink()
    lines = (run / "levels.jsonl").read_text().splitlines(keepends=True)
    (run / "levels.jsonl").write_text(lines[0])
    samples = [
        ln for ln in (run / "samples.jsonl").read_text().splitlines(keepends=True) if json.loads(ln)["level"] <= 1
    ]
    (run / "samples.jsonl").write_text("".join(samples))
    code, _, err = _bench(["--resume", str(run), "--time-scale", "1"])
    assert code == 2
    assert "drop --time-scale" in err
    code, out, err = _bench(["--resume", str(run), "--json"])
    assert code == 0, err
    resumed = json.loads(out)
    # The same pace and start: the resumed level measures what the uninterrupted one did.
    assert [lv["turns"] for lv in resumed["levels"]] == [lv["turns"] for lv in whole["levels"]]
    assert [lv["agents"] for lv in resumed["levels"]] == [1, 2]
