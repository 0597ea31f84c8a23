"""The checkpoint log: durable appends, a torn last line dropped and cut off, damage and repeats refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentload.agent.loop import TurnLog
from agentload.endpoint.records import RequestRecord
from agentload.errors import CheckpointError
from agentload.fleet.checkpoint import (
    AgentLine,
    CheckpointLog,
    LimitLine,
    RunManifest,
    SegmentLine,
    TurnLine,
    load_log,
    read_manifest,
    write_manifest,
)
from agentload.fleet.config import parse_fleet
from agentload.fleet.limiter import LimitChange, Mode


def _turn(agent: str, rnd: int, segment: int = 0) -> TurnLine:
    record = RequestRecord(t_sent=float(rnd), t_done=rnd + 0.5, prompt_tokens=100 + rnd, content=f"r{rnd}")
    turn = TurnLog(round=rnd, records=[record], assistant={"role": "assistant", "content": f"r{rnd}"})
    return TurnLine(agent=agent, round=rnd, segment=segment, elapsed_s=rnd + 0.5, turn=turn)


async def _write(path: Path, lines: list[SegmentLine | TurnLine | AgentLine | LimitLine]) -> None:
    log = CheckpointLog(path)
    try:
        for line in lines:
            await log.append(line)
    finally:
        log.close()


async def test_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "turns.jsonl"
    change = LimitChange(t=3.0, old=2, new=3, reason="widen: clean")
    await _write(
        path,
        [
            SegmentLine(segment=0, mode=Mode.AUTO, start_width=2, reason="probe"),
            _turn("a", 0),
            _turn("b", 0),
            _turn("a", 1),
            LimitLine(segment=0, change=change),
            AgentLine(agent="a", outcome="done", stop_reason="answer", elapsed_s=2.0, final_content="r1"),
        ],
    )
    state = load_log(path)
    assert [t.round for t in state.turns["a"]] == [0, 1]
    assert state.committed("a")[1].final.content == "r1"
    assert state.elapsed("a") == 1.5
    assert state.finished["a"].final_content == "r1"
    assert "b" not in state.finished
    assert state.segments[0].start_width == 2
    assert state.limits[0].change == change
    assert state.torn_bytes == 0


async def test_a_torn_last_line_is_dropped_and_cut_off(tmp_path: Path) -> None:
    path = tmp_path / "turns.jsonl"
    await _write(path, [_turn("a", 0), _turn("a", 1)])
    whole = path.read_bytes()
    half = _turn("a", 2).model_dump_json().encode()[:57]  # a kill in the middle of a write
    path.write_bytes(whole + half)
    state = load_log(path)
    assert [t.round for t in state.turns["a"]] == [0, 1]
    assert state.torn_bytes == len(half)
    assert path.read_bytes() == whole  # repaired: the next append starts on a clean line
    await _write(path, [_turn("a", 2)])
    assert [t.round for t in load_log(path).turns["a"]] == [0, 1, 2]


async def test_without_repair_the_file_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "turns.jsonl"
    await _write(path, [_turn("a", 0)])
    path.write_bytes(path.read_bytes() + b'{"kind": "tu')
    before = path.read_bytes()
    assert load_log(path, repair=False).torn_bytes == len(b'{"kind": "tu')
    assert path.read_bytes() == before


async def test_damage_in_a_complete_line_stops_the_resume(tmp_path: Path) -> None:
    path = tmp_path / "turns.jsonl"
    await _write(path, [_turn("a", 0)])
    path.write_bytes(b"not json at all\n" + path.read_bytes())
    with pytest.raises(CheckpointError, match=r"turns.jsonl:1: not a checkpoint line"):
        load_log(path)


@pytest.mark.parametrize(
    ("rounds", "message"),
    [
        ([0, 0], "round 0 follows 1 committed rounds"),  # a repeated turn
        ([0, 2], "round 2 follows 1 committed rounds"),  # a lost turn
        ([1], "round 1 follows 0 committed rounds"),
    ],
)
async def test_a_repeated_or_missing_round_is_refused(tmp_path: Path, rounds: list[int], message: str) -> None:
    path = tmp_path / "turns.jsonl"
    await _write(path, [_turn("a", r) for r in rounds])
    with pytest.raises(CheckpointError, match=message):
        load_log(path)


async def test_nothing_after_an_agent_finished(tmp_path: Path) -> None:
    path = tmp_path / "turns.jsonl"
    done = AgentLine(agent="a", outcome="done")
    await _write(path, [_turn("a", 0), done, _turn("a", 1)])
    with pytest.raises(CheckpointError, match="after it finished"):
        load_log(path)
    await _write(path.with_name("b.jsonl"), [done, done])
    with pytest.raises(CheckpointError, match="finished twice"):
        load_log(path.with_name("b.jsonl"))


def test_a_missing_log_is_an_empty_run(tmp_path: Path) -> None:
    state = load_log(tmp_path / "absent.jsonl")
    assert state.turns == {}
    assert state.segments == []


def test_manifest_round_trip_and_errors(tmp_path: Path) -> None:
    fleet = parse_fleet('[[tasks]]\nid = "a"\nprompt = "p"\ncount = 3\n')
    manifest = RunManifest(run_id="r1", fleet=fleet, url=None, profile="laptop")
    write_manifest(tmp_path, manifest)
    assert read_manifest(tmp_path) == manifest
    with pytest.raises(CheckpointError, match="not a run directory"):
        read_manifest(tmp_path / "nowhere")
    (tmp_path / "run.json").write_text('{"format": 1}')
    with pytest.raises(CheckpointError, match="not a run manifest"):
        read_manifest(tmp_path)
