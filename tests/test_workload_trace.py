"""Trace replay on the simulator: Mooncake prefixes and timing, session traces, record → replay, malformed files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer

from agentload.cli.common import clean_errors
from agentload.clock import run_virtual
from agentload.endpoint.records import RequestRecord
from agentload.errors import ConfigError
from agentload.workload import trace
from agentload.workload.agentic import AgenticWorkload
from agentload.workload.record import read_records, record_session_trace, session_traces
from agentload.workload.registry import get_workload
from agentload.workload.sizing import TokenSizing
from agentload.workload.trace import (
    BLOCK_TOKENS,
    MooncakeRow,
    MooncakeTrace,
    SessionTraceFile,
    load_trace,
    trace_workload,
)
from tests.test_workload_harness import hit_rate, run_level, run_level_async, sim_server

DATA = Path(__file__).parent / "data"
BLOCK = 16  # the simulator's KV block


def by_line(records: list[RequestRecord]) -> dict[str, RequestRecord]:
    return {r.ids.agent.split("/", 1)[1]: r for r in records}


def rel_sent(records: list[RequestRecord], t0: float) -> dict[tuple[str, int], float]:
    return {(r.ids.agent.split("/", 1)[1], r.ids.turn): r.t_sent - t0 for r in records}


# -- Mooncake ----------------------------------------------------------------------------------------------------


def test_shared_leading_hash_ids_hit_the_cache_in_proportion() -> None:
    run = run_level(trace_workload(DATA / "mooncake_shared_prefix.jsonl"), 2, context=0)
    assert all(r.ok for r in run.records)
    rows = by_line(run.records)
    # Lines 1..5 share 0, 2, 1, 0 and 3 leading blocks with what was sent before them.
    shared_blocks = {"row1": 0, "row2": 2, "row3": 1, "row4": 0, "row5": 3}
    for key, blocks in shared_blocks.items():
        cached = rows[key].cached_tokens or 0
        # Within one KV block: the last word of an earlier prompt merges with its end-of-message marker.
        assert abs(cached - blocks * BLOCK_TOKENS) <= BLOCK, (key, cached)
    # Sizes are the trace's: input_length as the server counts it, output_length exactly.
    assert [rows[f"row{i}"].prompt_tokens for i in range(1, 6)] == [1536, 1536, 1100, 1536, 2000]
    assert all(r.completion_tokens == 16 for r in run.records)


def test_unrelated_traces_share_nothing_even_with_equal_ids_across_levels() -> None:
    """Block texts are salted with the level: replaying the trace again at the next level starts cold."""
    server = sim_server()
    workload = trace_workload(DATA / "mooncake_shared_prefix.jsonl")

    async def twice() -> list[list[RequestRecord]]:
        out = []
        for level in (0, 1):
            run = await run_level_async(server, workload, 1, context=0, level=level)
            out.append(run.records)
        return out

    first, second = run_virtual(twice())
    assert by_line(second)["row1"].cached_tokens == 0
    assert hit_rate(second) == pytest.approx(hit_rate(first), abs=0.01)


def test_rows_fire_at_their_timestamps_divided_by_speed() -> None:
    run = run_level(trace_workload(DATA / "mooncake_shared_prefix.jsonl", speed=2.0), 3, context=0)
    t0 = min(r.t_sent for r in run.records)
    sent = {k: round(v, 3) for k, v in rel_sent(run.records, t0).items()}
    # Timestamps 1000, 3000, … ms from the first, at twice the speed: 0, 1, 2, 3, 4 s.
    assert sent == {("row1", 0): 0.0, ("row2", 0): 1.0, ("row3", 0): 2.0, ("row4", 0): 3.0, ("row5", 0): 4.0}


def test_session_rows_wait_for_the_previous_reply_then_the_delay() -> None:
    run = run_level(trace_workload(DATA / "mooncake_sessions.jsonl"), 2, context=0)
    assert all(r.ok for r in run.records)
    t0 = min(r.t_sent for r in run.records)
    turns = {(r.ids.agent.split("/", 1)[1], r.ids.turn): r for r in run.records}
    a0, a1, a2 = (turns[("session:a", i)] for i in range(3))
    b0, b1 = (turns[("session:b", i)] for i in range(2))
    assert a0.t_sent - t0 == pytest.approx(0.0, abs=1e-6)
    assert turns[("row2", 0)].t_sent - t0 == pytest.approx(0.5, abs=1e-3)
    assert b0.t_sent - t0 == pytest.approx(1.0, abs=1e-3)
    assert a1.t_sent - a0.t_done == pytest.approx(2.0, abs=1e-3)  # "delay": 2000
    assert b1.t_sent - b0.t_done == pytest.approx(0.5, abs=1e-3)
    assert a2.t_sent - t0 == pytest.approx(10.0, abs=1e-3)  # its own timestamp, later than the reply
    # A session may open with a delay instead of a timestamp; its later timestamps still count from the trace's.
    c0, c1 = (turns[("session:c", i)] for i in range(2))
    assert c0.t_sent - t0 == pytest.approx(3.0, abs=1e-3)
    assert c1.t_sent - t0 == pytest.approx(6.0, abs=1e-3)
    # A session's later turns extend its blocks (the earlier turn's last block was partial): each finds all of
    # the earlier prompt cached, to within the block its end-of-message marker falls in.
    for before, after in ((a0, a1), (a1, a2), (b0, b1), (c0, c1)):
        assert before.prompt_tokens - 2 * BLOCK <= (after.cached_tokens or 0) <= before.prompt_tokens
    assert sorted(s.ok for s in run.sessions) == [True] * 4


def test_open_loop_stops_starting_rows_when_the_level_ends() -> None:
    run = run_level(trace_workload(DATA / "mooncake_shared_prefix.jsonl"), 1, context=0, duration_s=5.0)
    # Rows at 0, 2, 4 s are sent; the ones at 6 and 8 s are after the level's end.
    assert sorted(by_line(run.records)) == ["row1", "row2", "row3"]


def test_rows_due_past_the_in_flight_limit_wait_for_a_slot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Twelve rows stamped at 0 (the campaign's 317k-row trace built every prompt at once): with 3 slots, no more
    # than 3 are ever in flight, and every row is still sent.
    monkeypatch.setattr(trace, "MAX_IN_FLIGHT", 3)
    path = tmp_path / "zeros.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 200, "output_length": 20}\n' * 12, encoding="utf-8")
    run = run_level(trace_workload(path), 2, context=0)
    assert len(run.records) == 12
    events = sorted([(r.t_sent, 1) for r in run.records] + [(r.t_done, -1) for r in run.records])
    live, most = 0, 0
    for _, step in events:  # an end at the same instant as a start frees its slot first (-1 sorts first)
        live += step
        most = max(most, live)
    assert most == 3


def test_trace_numbers_must_be_finite_and_bounded(tmp_path: Path) -> None:
    cases = {
        '{"timestamp": Infinity, "input_length": 10, "output_length": 1}': "Infinity",
        '{"timestamp": 1e400, "input_length": 10, "output_length": 1}': "too large",
        '{"timestamp": 0, "input_length": 2000001, "output_length": 1}': "input_length",
        '{"session_id": "a", "delay": 1e12, "input_length": 10, "output_length": 1}': "delay",
        '{"session_id": "a", "turns": [{"prompt_tokens": 10, "completion_tokens": 1, "think_s": NaN}]}': "NaN",
    }
    for line, needle in cases.items():
        path = tmp_path / "t.jsonl"
        path.write_text(line + "\n", encoding="utf-8")
        with pytest.raises(ConfigError, match=needle):
            load_trace(path)


# -- session traces ----------------------------------------------------------------------------------------------


def test_session_trace_replays_its_sizes_and_timing() -> None:
    trace = load_trace(DATA / "sessions_small.jsonl")
    assert isinstance(trace, SessionTraceFile)
    run = run_level(trace_workload(DATA / "sessions_small.jsonl"), 2, context=0)
    assert all(r.ok for r in run.records)
    replayed = session_traces(run.records, shared_prefix_tokens=496)
    # Both sessions of the recorded agent 0 go to replay agent 0, in order; agent 1's to agent 1.
    assert [s.session_id for s in replayed] == ["L0/agent-0/s0", "L0/agent-1/s0", "L0/agent-0/s1"]
    for want, got in zip(trace.sessions, replayed, strict=True):
        assert [(t.prompt_tokens, t.completion_tokens) for t in got.turns] == [
            (t.prompt_tokens, t.completion_tokens) for t in want.turns
        ]
        for w, g in zip(want.turns[1:], got.turns[1:], strict=True):
            assert g.think_s == pytest.approx(w.think_s + w.tool_s, abs=1e-3)
        assert got.start_s == pytest.approx(want.start_s, abs=1e-3)
    grown, held = replayed[0], replayed[1]
    # A growing session reuses all of its previous turn; a held one (its prompt shrank) only its opening.
    assert (grown.turns[2].cached_tokens or 0) >= grown.turns[1].prompt_tokens - BLOCK
    assert (held.turns[2].cached_tokens or 0) < held.turns[1].prompt_tokens - 20
    assert (held.turns[2].cached_tokens or 0) >= held.turns[0].prompt_tokens - BLOCK


def test_record_then_replay_round_trips_a_session_trace(tmp_path: Path) -> None:
    """An agentic run recorded, replayed on a fresh server with as many agents, and recorded again: the same trace."""
    original = run_level(AgenticWorkload("grow"), 2, context=8192, duration_s=150.0)
    records = tmp_path / "records.jsonl"
    records.write_text("".join(r.model_dump_json() + "\n" for r in original.records))
    trace = tmp_path / "sessions.jsonl"
    written = record_session_trace(read_records(records), trace)
    assert written >= 4
    recorded = load_trace(trace)
    assert isinstance(recorded, SessionTraceFile)
    assert recorded.sessions[0].shared_prefix_tokens > 0

    replay = run_level(get_workload(f"trace:{trace}"), 2, context=0)
    again = session_traces(replay.records)
    assert [(s.session_id, s.agent, s.shared_prefix_tokens) for s in again] == [
        (s.session_id, s.agent, s.shared_prefix_tokens) for s in recorded.sessions
    ]
    for want, got in zip(recorded.sessions, again, strict=True):
        assert got.start_s == pytest.approx(want.start_s, abs=1e-3)
        assert [(t.prompt_tokens, t.completion_tokens, t.cached_tokens) for t in got.turns] == [
            (t.prompt_tokens, t.completion_tokens, t.cached_tokens) for t in want.turns
        ]
        assert [t.think_s for t in got.turns] == pytest.approx([t.think_s for t in want.turns], abs=1e-3)
    assert hit_rate(replay.records) == pytest.approx(hit_rate(original.records), abs=0.005)


def test_repeat_cycles_sessions_with_fresh_text() -> None:
    run = run_level(trace_workload(DATA / "sessions_small.jsonl", repeat=True, timing="closed"), 1, context=0,
                    duration_s=60.0)  # fmt: skip
    sessions = {r.ids.agent for r in run.records}
    assert len(sessions) > 3
    # A repeated session's first turn finds only the shared prefix cached, not its previous pass.
    firsts = [r for r in run.records if r.ids.turn == 0]
    assert all((r.cached_tokens or 0) <= 496 + BLOCK for r in firsts)


# -- malformed files ---------------------------------------------------------------------------------------------


MOONCAKE_OK = '{"timestamp": 0, "input_length": 100, "output_length": 5, "hash_ids": [1]}'
SESSION_OK = '{"session_id": "s", "turns": [{"prompt_tokens": 100, "completion_tokens": 5}]}'


@pytest.mark.parametrize(
    ("second_line", "problem"),
    [
        ('{"timestamp": 5, "input_length": 100', "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"timestamp": 5, "output_length": 5, "hash_ids": [1]}', "input_length: Field required"),
        ('{"timestamp": 5, "input_length": 100}', "output_length: Field required"),
        ('{"timestamp": 5, "input_length": -3, "output_length": 5}', "input_length: Input should be greater than"),
        ('{"timestamp": 5, "input_length": 100, "output_length": 0}', "output_length: Input should be greater"),
        ('{"timestamp": -1, "input_length": 100, "output_length": 5}', "timestamp: Input should be greater"),
        ('{"timestamp": 5, "input_length": "100", "output_length": 5}', "input_length: Input should be a valid int"),
        ('{"timestamp": 5, "input_length": 100, "output_length": 5, "hash_ids": [1.5]}', "hash_ids.0"),
        ('{"timestamp": 5, "input_length": 100, "output_length": 5, "delay": -2}', "delay: Input should be greater"),
        ('{"foo": 1}', "neither a Mooncake row"),
        (SESSION_OK, "a session line in a mooncake trace"),
    ],
)
def test_malformed_mooncake_lines_name_the_file_and_line(tmp_path: Path, second_line: str, problem: str) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_text(f"{MOONCAKE_OK}\n\n{second_line}\n")
    with pytest.raises(ConfigError) as info:
        load_trace(path)
    message = str(info.value)
    assert message.startswith(f"{path}:3: ")
    assert problem in message
    assert "\n" not in message


def test_time_running_backwards_within_a_session_is_malformed(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    rows = [
        {"session_id": "a", "timestamp": 5000, "input_length": 100, "output_length": 5},
        {"timestamp": 1000, "input_length": 100, "output_length": 5},  # independent rows may come in any order
        {"session_id": "a", "timestamp": 4000, "input_length": 100, "output_length": 5},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ConfigError, match=r":3: timestamp 4000 is before the previous turn of session 'a' \(5000\)"):
        load_trace(path)
    rows.pop()
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert isinstance(load_trace(path), MooncakeTrace)


@pytest.mark.parametrize(
    ("second_line", "problem"),
    [
        ('{"session_id": "t", "turns": []}', "turns: List should have at least 1 item"),
        ('{"session_id": "t", "turns": [{"prompt_tokens": 10}]}', "turns.0.completion_tokens: Field required"),
        (
            '{"session_id": "t", "turns": [{"prompt_tokens": 10, "completion_tokens": 2, "cached_tokens": 11}]}',
            "cached_tokens 11 exceeds prompt_tokens 10",
        ),
        (
            '{"session_id": "t", "turns": [{"prompt_tokens": 10, "completion_tokens": 2, "think_s": -1}]}',
            "turns.0.think_s: Input should be greater than or equal to 0",
        ),
        ('{"session_id": "t", "turns": [{"prompt_tokens": 10, "completion_tokens": 2, "x": 1}]}', "turns.0.x"),
        (
            '{"session_id": "t", "shared_prefix_tokens": 10, "turns": [{"prompt_tokens": 10, "completion_tokens": 2}]}',
            "shared_prefix_tokens 10 is not below the first prompt 10",
        ),
        (MOONCAKE_OK, "a mooncake line in a session trace"),
    ],
)
def test_malformed_session_lines_name_the_file_and_line(tmp_path: Path, second_line: str, problem: str) -> None:
    path = tmp_path / "sessions.jsonl"
    path.write_text(f"{SESSION_OK}\n{second_line}\n")
    with pytest.raises(ConfigError) as info:
        load_trace(path)
    assert str(info.value).startswith(f"{path}:2: ")
    assert problem in str(info.value)


def test_whole_file_problems(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read trace"):
        load_trace(tmp_path / "missing.jsonl")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(ConfigError, match="the trace is empty"):
        load_trace(empty)
    twice = tmp_path / "twice.jsonl"
    twice.write_text(f"{SESSION_OK}\n{SESSION_OK}\n")
    with pytest.raises(ConfigError, match="session 's' appears twice"):
        load_trace(twice)
    records = tmp_path / "records.jsonl"
    records.write_text('{"t_sent": 1.0}\n')
    with pytest.raises(ConfigError, match=r"records.jsonl:1: not a request record \(t_done: Field required\)"):
        read_records(records)


def test_a_malformed_trace_is_one_error_line_and_exit_status_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What the CLI does with it: the same handler every command uses (cli/common.py)."""
    path = tmp_path / "trace.jsonl"
    path.write_text(f"{MOONCAKE_OK}\n{{oops\n")
    with pytest.raises(typer.Exit) as info, clean_errors():
        get_workload(f"trace:{path}")
    assert info.value.exit_code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"{path}:2: not valid JSON" in err
    assert "Traceback" not in err


def test_blocks_and_prompts_are_sized_in_the_server_s_tokens() -> None:
    """Where the server makes 1.25 tokens of a word (measured before the run), a 512-token block is 410 words and
    a prompt of 2,000 tokens ~1,600 words: two rows share the trace's prefix in server tokens, not 25 % more."""
    real = TokenSizing(tokens_per_word=1.25, opening_overhead=10, turn_overhead=6, source="measured")
    a = MooncakeRow(input_length=2000, output_length=8, hash_ids=[1, 2, 3], line=1)
    b = MooncakeRow(input_length=2000, output_length=8, hash_ids=[1, 2, 9], line=2)
    salt = (0, 0, 1)
    wa, wb = trace.mooncake_prompt(a, salt, 512, real).split(), trace.mooncake_prompt(b, salt, 512, real).split()
    shared = next(i for i, (x, y) in enumerate(zip(wa, wb, strict=False)) if x != y)
    assert 2 * 410 <= shared < 2 * 410 + 5  # two blocks of 410 words (a few more only by chance: random words)
    assert abs(len(wa) * 1.25 - 2000) <= 1.25 * 8  # the template's few tokens aside
    # On the simulator (a token a word, the default) a block is its 512 words, as before.
    plain = trace.mooncake_prompt(a, salt, 512).split()
    assert plain[:512] == list(trace._block_words(salt, 1, 512))
