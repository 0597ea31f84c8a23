"""Recording a run as a session trace, on hand-made records whose answer is known: conversations split by run,
level and agent; a retried turn counts once with its final attempt's usage and its first attempt's wait; failed
turns are left out; the shared system prompt is the most common first-turn hit; the file round-trips."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentload.endpoint.records import Outcome, RequestIds, RequestRecord
from agentload.errors import ConfigError
from agentload.workload.record import read_records, record_session_trace, session_traces
from agentload.workload.trace import SessionTrace


def rec(
    agent: str,
    turn: int,
    sent: float,
    done: float,
    *,
    prompt: int = 1000,
    completion: int = 50,
    cached: int | None = None,
    attempt: int = 0,
    level: int = 0,
    run: str = "r1",
    ok: bool = True,
) -> RequestRecord:
    return RequestRecord(
        ids=RequestIds(run=run, level=level, agent=agent, turn=turn, attempt=attempt),
        t_sent=sent,
        t_done=done,
        prompt_tokens=prompt,
        completion_tokens=completion,
        cached_tokens=cached,
        outcome=Outcome.OK if ok else Outcome.HTTP_ERROR,
        http_status=None if ok else 503,
    )


def test_one_conversation_keeps_its_turns_and_the_waits_between_them() -> None:
    records = [
        rec("agent-0/s0", 0, sent=10.0, done=12.0, prompt=1000, cached=496),
        rec("agent-0/s0", 1, sent=14.5, done=15.0, prompt=1100, cached=1040),  # sent 2.5 s after turn 0 ended
        rec("agent-0/s0", 2, sent=15.0, done=16.0, prompt=1200, cached=1136),  # at once
    ]
    (session,) = session_traces(records)
    assert session.session_id == "L0/agent-0/s0"
    assert session.agent == "L0/agent-0"
    assert session.start_s == 0.0
    assert [t.prompt_tokens for t in session.turns] == [1000, 1100, 1200]
    assert [t.cached_tokens for t in session.turns] == [496, 1040, 1136]
    assert [t.think_s for t in session.turns] == [0.0, 2.5, 0.0]


def test_a_retried_turn_counts_once_with_the_final_usage_and_the_first_send() -> None:
    records = [
        rec("a/s", 0, sent=0.0, done=1.0),
        rec("a/s", 1, sent=3.0, done=3.1, attempt=0, ok=False, completion=0),  # 503, then resent
        rec("a/s", 1, sent=4.0, done=5.0, attempt=1, prompt=1300, completion=70),
    ]
    (session,) = session_traces(records)
    assert len(session.turns) == 2
    assert (session.turns[1].prompt_tokens, session.turns[1].completion_tokens) == (1300, 70)
    # The agent waited 2 s after turn 0 before its first send; the retry's delay is the server's, not the agent's.
    assert session.turns[1].think_s == 2.0


def test_turns_that_failed_or_carry_no_usage_are_left_out() -> None:
    records = [
        rec("a/s", 0, sent=0.0, done=1.0),
        rec("a/s", 1, sent=2.0, done=3.0, ok=False),
        rec("a/s", 2, sent=4.0, done=5.0, completion=0),  # ok, but no token came back
        rec("a/s", 3, sent=6.0, done=7.0, prompt=0),
        rec("a/s", 4, sent=8.0, done=9.0, prompt=1500),
        rec("b/s", 0, sent=0.5, done=1.0, ok=False),  # a session with no good turn is no session
    ]
    (session,) = session_traces(records)
    assert [t.prompt_tokens for t in session.turns] == [1000, 1500]
    assert session.turns[1].think_s == 7.0  # since the last kept turn ended (at 1.0), skipped ones included


def test_sessions_are_ordered_by_start_and_split_by_level_and_run() -> None:
    records = [
        rec("b/s", 0, sent=5.0, done=6.0),
        rec("a/s", 0, sent=2.0, done=3.0),
        rec("a/s", 0, sent=9.0, done=10.0, level=1),  # the same agent name at the next level: another session
    ]
    sessions = session_traces(records)
    assert [(s.session_id, s.start_s) for s in sessions] == [("L0/a/s", 0.0), ("L0/b/s", 3.0), ("L1/a/s", 7.0)]
    two_runs = session_traces([rec("a/s", 0, 0.0, 1.0, run="x"), rec("a/s", 0, 0.5, 1.0, run="y")])
    assert [s.session_id for s in two_runs] == ["x:L0/a/s", "y:L0/a/s"]


def test_the_shared_prefix_is_the_most_common_first_turn_hit() -> None:
    records = [
        rec("a0/s", 0, 0.0, 1.0, cached=0),  # the first agent finds nothing cached
        rec("a1/s", 0, 0.1, 1.0, cached=496),
        rec("a2/s", 0, 0.2, 1.0, cached=496),
        rec("a3/s", 0, 0.3, 1.0, cached=512),  # one lucky hit past the system prompt
        rec("a1/s", 1, 2.0, 3.0, prompt=1100, cached=1040),  # later turns do not vote
        rec("a2/s", 1, 2.0, 3.0, prompt=1100, cached=1040),
        rec("a3/s", 1, 2.0, 3.0, prompt=1100, cached=1040),
    ]
    assert {s.shared_prefix_tokens for s in session_traces(records)} == {496}
    assert {s.shared_prefix_tokens for s in session_traces(records, shared_prefix_tokens=128)} == {128}
    assert {s.shared_prefix_tokens for s in session_traces([rec("a/s", 0, 0.0, 1.0)])} == {0}  # nothing reported


def test_a_short_session_shares_no_more_than_its_first_prompt_holds() -> None:
    records = [rec("a/s", 0, 0.0, 1.0, prompt=300)]
    (session,) = session_traces(records, shared_prefix_tokens=496)
    assert session.shared_prefix_tokens == 299  # at least one token of its own to prefill


def test_no_records_no_sessions() -> None:
    assert session_traces([]) == []


def test_the_trace_file_round_trips(tmp_path: Path) -> None:
    records = [
        rec("a/s", 0, 0.0, 1.0, cached=496),
        rec("a/s", 1, 1.25, 2.0, prompt=1100, cached=1040),
        rec("b/s", 0, 0.5, 1.5, cached=496),
    ]
    records_file = tmp_path / "records.jsonl"
    records_file.write_text("".join(r.model_dump_json() + "\n" for r in records) + "\n", encoding="utf-8")
    back = read_records(records_file)
    assert back == records  # blank lines are skipped
    trace = tmp_path / "trace.jsonl"
    assert record_session_trace(back, trace) == 2
    written = [SessionTrace.model_validate_json(line) for line in trace.read_text("utf-8").splitlines()]
    assert written == session_traces(records)
    assert '"agent":"L0/a"' in trace.read_text("utf-8")


def test_a_damaged_records_file_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    path.write_text(rec("a/s", 0, 0.0, 1.0).model_dump_json() + "\n" + '{"t_sent": 1}\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"records\.jsonl:2: not a request record \(t_done: Field required\)"):
        read_records(path)
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(ConfigError, match="cannot read records"):
        read_records(path)


def test_an_unwritable_trace_is_one_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot write the session trace"):
        record_session_trace([rec("a/s", 0, 0.0, 1.0)], tmp_path / "no" / "trace.jsonl")
