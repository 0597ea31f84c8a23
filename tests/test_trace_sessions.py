"""A trace replay's turns and sessions per level: turn latency, each session's wall time against the one the trace
recorded, and the turns that stalled; and a trace's run said at the context it realised, not at ``--context``.

The sample (``data/claude_code_subagent_sample.json``) holds conversation ``c0`` (5 requests: think times 12, 15,
12 and 318 s before requests 1 to 4, recorded response times 4.87, 2.87, 17.45, 11.09 and 3.04 s) and its
subagent ``c0.s0`` (10 requests: think times 1, 2, 1, 2, 3, 2, 3, 3, 1 s before requests 1 to 9, response times
1.33, 1.34, 1.33, 1.13, 1.06, 1.25, 2.75, 3.22, 1.4, 1.6 s)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentload.bench.analysis import LevelData, summarise
from agentload.bench.invariants import check
from agentload.bench.results import TURN_STALL_S, LevelSummary, Percentiles, RunResult
from agentload.cli.main import app
from agentload.endpoint.records import Outcome, RequestIds, RequestRecord
from agentload.report.levels import level_table
from agentload.report.text import capacity_sentence, knee_sentence
from agentload.workload.base import ReplaySessions
from agentload.workload.conversation_trace import ConversationTraceWorkload
from agentload.workload.registry import get_workload

SAMPLE = Path(__file__).parent / "data" / "claude_code_subagent_sample.json"
COLUMN = "turn p50 / p95 · session\nwall ÷ rec (n) · stalls"
FIELDS = ("turn_latency_p50_s", "turn_latency_p95_s", "turn_stalls", "session_wall_ratio_p50", "sessions_timed")
# The recorded walls the sample's numbers give: waits after the first request plus every response time.
PARENT_RECORDED = (12 + 15 + 12 + 318) + (4.87 + 2.87 + 17.45 + 11.09 + 3.04)
SUBAGENT_RECORDED = (1 + 2 + 1 + 2 + 3 + 2 + 3 + 3 + 1) + (
    1.33 + 1.34 + 1.33 + 1.13 + 1.06 + 1.25 + 2.75 + 3.22 + 1.4 + 1.6
)
TIME_SCALE = 0.1


def record(agent: str, turn: int, sent: float, done: float, *, attempt: int = 0, ok: bool = True) -> RequestRecord:
    outcome = Outcome.OK if ok else Outcome.HTTP_ERROR
    ids = RequestIds(run="r", level=0, agent=agent, turn=turn, attempt=attempt)
    return RequestRecord(ids=ids, t_sent=sent, t_done=done, outcome=outcome)


def workload() -> ConversationTraceWorkload:
    w = get_workload(f"trace:{SAMPLE}", time_scale=TIME_SCALE)
    assert isinstance(w, ConversationTraceWorkload)
    return w


def test_a_session_is_timed_from_its_first_send_to_its_last_reply_against_its_recorded_waits_and_responses() -> None:
    w = workload()
    sub, parent, mid, unfinished = "agent-0/d0/c0.s0", "agent-0/d0/c0", "agent-1/d1/k5/c0.s0", "agent-2/d2/c0.s0"
    records = [
        record(sub, 0, 1.0, 2.0, ok=False),  # its first attempt failed: the session still started at its send
        record(sub, 0, 3.0, 4.0, attempt=1),
        *(record(sub, t, 4.0 + t, 4.5 + t) for t in range(1, 10)),  # the last reply done at 13.5 s
        *(record(parent, t, 10.0 * t, 10.0 * t + 2.0) for t in range(5)),  # 0 → 42 s
        *(record(mid, t, 20.0 + t, 20.5 + t) for t in range(5, 10)),  # a mid start: requests 5 to 9, 20 → 24.5 s
        *(record(unfinished, t, t, t + 0.5) for t in range(9)),  # its last request never went out
    ]
    walls = sorted((round(x.realised_s, 6), round(x.recorded_s, 6)) for x in w.session_walls(records))
    mid_recorded = (2 + 3 + 3 + 1) + (1.25 + 2.75 + 3.22 + 1.4 + 1.6)
    assert walls == sorted(
        [(12.5, round(SUBAGENT_RECORDED, 6)), (42.0, round(PARENT_RECORDED, 6)), (4.5, round(mid_recorded, 6))]
    )
    # Only sessions whose last request went out at or after ``ended_from``.
    assert [round(x.realised_s, 6) for x in w.session_walls(records, ended_from=30.0)] == [42.0]


def test_a_trace_without_recorded_response_times_times_no_session(tmp_path: Path) -> None:
    doc = json.loads(SAMPLE.read_text())
    for request in doc["requests"]:
        request.pop("api_time", None)
    path = tmp_path / "no_api.json"
    path.write_text(json.dumps(doc))
    w = get_workload(f"trace:{path}")
    assert isinstance(w, ReplaySessions)
    records = [record("agent-0/d0/c0", t, 10.0 * t, 10.0 * t + 2.0) for t in range(5)]
    assert w.session_walls(records) == ()
    summary = summarise(LevelData(0, 1, 0, w.name, 0.0, 0.0, 100.0, records=records, sessions=w.session_walls))
    assert summary.sessions_timed == 0
    assert summary.session_wall_ratio_p50 is None


def test_the_window_times_turns_from_their_first_send_and_counts_the_stalled_ones() -> None:
    """The window opens at 15 s. The parent's turns are due their reply's end + 1.2, 1.5, 1.2, 31.8 s."""
    w = workload()
    a = "agent-0/d0/c0"
    records = [
        record(a, 0, 0.0, 10.0),  # the warm-up's
        record(a, 1, 16.0, 17.0, ok=False),  # due 11.2, sent 4.8 s late: a stall; failed, then retried
        record(a, 1, 18.0, 19.0, attempt=1),  # the turn took 16 → 19 s
        record(a, 2, 20.5, 22.5),  # due 20.5, on time; 2 s
        record(a, 3, 23.7, 24.2),  # due 23.7, on time; 0.5 s
        record(a, 4, 56.0, 60.0),  # due 56.0, on time; 4 s; the session's last request: 0 → 60 s
    ]
    summary = summarise(LevelData(0, 1, 0, w.name, 0.0, 15.0, 100.0, records=records, pace=w.turn_pace,
                                  sessions=w.session_walls))  # fmt: skip
    # The window's completed turns took 3, 2, 0.5 and 4 s (turn 1 from its first attempt's send).
    assert summary.turn_latency_p50_s == pytest.approx(2.5)
    assert summary.turn_latency_p95_s == pytest.approx(3.85)
    # Turn 1 fell due before the window (in the warm-up) so the pace does not judge it; none judged is late.
    assert summary.turn_stalls == 0
    assert summary.sessions_timed == 1
    assert summary.session_wall_ratio_p50 == pytest.approx(60.0 / PARENT_RECORDED)
    # The same turn, due inside the window (its reply at 14 s), is judged: 16 − 15.2 = 0.8 s late is no stall,
    # 2.8 s is one.
    shifted = [record(a, 0, 0.0, 14.0), *records[1:]]
    assert summarise(LevelData(0, 1, 0, w.name, 0.0, 14.0, 100.0, records=shifted, pace=w.turn_pace)).turn_stalls == 0
    later = [record(a, 0, 0.0, 12.0), *records[1:]]
    assert TURN_STALL_S < 16.0 - 12.0 - 1.2
    assert summarise(LevelData(0, 1, 0, w.name, 0.0, 12.0, 100.0, records=later, pace=w.turn_pace)).turn_stalls == 1


def test_a_workload_that_is_not_a_trace_has_no_session_figures() -> None:
    assert not isinstance(get_workload("agentic"), ReplaySessions)
    assert not isinstance(get_workload("synthetic"), ReplaySessions)
    records = [record("agent-0/s0", 0, 1.0, 2.0)]
    summary = summarise(LevelData(0, 1, 0, "agentic", 0.0, 0.0, 10.0, records=records))
    assert all(getattr(summary, name) is None for name in FIELDS)


@pytest.fixture(scope="module")
def sample_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, RunResult, Path]:
    """``agentload bench`` of the sample in virtual time, a sweep of 2 and 4 agents: what it printed (console and
    log), and the result it stored."""
    tmp = tmp_path_factory.mktemp("sample")
    args = [
        "bench", "--out", str(tmp / "runs"), "--sim", "llama-8b-h100", "--workload", f"trace:{SAMPLE}",
        "--time-scale", str(TIME_SCALE), "--sweep", "2,4", "--warmup", "20s", "--window", "100s",
    ]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    (stored,) = (tmp / "runs").glob("*/result.json")
    # Words the console wrapped at its width are joined again.
    return " ".join(result.output.split()), RunResult.model_validate_json(stored.read_text()), stored


def test_a_virtual_bench_of_the_sample_times_its_turns_and_sessions(sample_run: tuple[str, RunResult, Path]) -> None:
    _, result, _ = sample_run
    assert check(result) == []
    for level in result.levels:
        assert level.turn_latency_p50_s is not None
        assert level.turn_latency_p95_s is not None
        assert 0 < level.turn_latency_p50_s <= level.turn_latency_p95_s
        # A turn's latency holds its time to first token.
        assert level.ttft_s.p50 is not None
        assert level.turn_latency_p50_s >= level.ttft_s.p50
        # Simulated time has no loop lag: every turn goes out when it is due, so none stalls.
        assert level.turn_stalls == 0
        assert level.sessions_timed is not None
        assert 0 < level.sessions_timed <= level.turns
        ratio = level.session_wall_ratio_p50
        assert ratio is not None
        # A session keeps its recorded waits × 0.1 and adds the simulated server's replies: its wall is at least
        # 0.1 × its waits' share of the recorded wall (357 / 396 for the parent, 18 / 34 for the subagent), and
        # under the recorded wall, the simulated H100 answering these prompts faster than the recorded API did.
        assert TIME_SCALE * 18 / SUBAGENT_RECORDED < ratio < 1.0
    table = level_table(result)
    cells = [row[table.headers.index(COLUMN)] for row in table.rows]
    level = result.levels[0]
    assert cells[0].endswith(f" · {level.session_wall_ratio_p50:.2f} ({level.sessions_timed}) · 0")


def test_a_trace_run_is_said_at_its_realised_context_not_the_default_one(
    sample_run: tuple[str, RunResult, Path],
) -> None:
    """The --context default (40,960) sizes nothing in a trace: the header, each level's line, the table's title,
    the knee and the capacity estimate say the context the trace realised (the sample's ~21.7k) instead."""
    output, result, _ = sample_run
    (estimate,) = result.capacity
    (knee,) = result.knee
    assert estimate.replay
    assert knee.realised_context == estimate.context < 40_960
    for default in ("40,960", "40k", "(target"):
        assert default not in output
    for said in ("context the trace's own", "× trace sizes", "trace context"):
        assert said in output
    assert f"the trace's realised {estimate.context:,}-token context" in knee_sentence(knee)
    assert "the trace's realised context" in capacity_sentence(estimate)
    assert all(row[level_table(result).headers.index("context")] == "trace" for row in level_table(result).rows)


def test_a_stored_run_from_before_the_session_figures_loads_without_them_or_their_column(
    sample_run: tuple[str, RunResult, Path],
) -> None:
    _, _, stored = sample_run
    doc = json.loads(stored.read_text())
    for level in doc["levels"]:
        for name in FIELDS:
            del level[name]
    for knee in doc["knee"]:
        del knee["realised_context"]
    for estimate in doc["capacity"]:
        del estimate["replay"]
    old = RunResult.model_validate_json(json.dumps(doc))
    assert all(getattr(lv, name) is None for lv in old.levels for name in FIELDS)
    assert COLUMN not in level_table(old).headers
    assert check(old) == []
    # Said as it was before: at the --context it was given.
    assert "40,960-token context" in knee_sentence(old.knee[0])


def session_level(**update: object) -> LevelSummary:
    base = LevelSummary(
        level=0, agents=2, context=0, workload="trace:t.json", window_s=60.0, warmup_s=10.0, sessions_completed=0,
        sessions_failed=0, requests_ok=60, requests_failed=0, turns=60, turns_per_s=1.0, output_tps=100.0,
        prefill_tps=900.0, prefill_share=0.9, throughput_source="usage", ttft_s=Percentiles(p50=0.1, p95=0.2, p99=0.3),
        think_recorded_s=1.5, think_realised_s=1.6, turn_late_p50_s=0.01, turn_late_p99_s=0.4, turn_stalls=0,
        turn_latency_p50_s=1.0, turn_latency_p95_s=3.0, session_wall_ratio_p50=0.9, sessions_timed=4,
    )  # fmt: skip
    return base.model_copy(update=update)


@pytest.mark.parametrize(
    ("planted", "caught"),
    [
        ({"turn_latency_p50_s": 4.0}, "turn latency p50 4.000000 s exceeds its p95"),
        ({"turn_latency_p50_s": -1.0}, "turn latency p50 -1.000000 s is negative"),
        ({"sessions_timed": 61}, "61 sessions timed, more than the window's 60"),
        ({"sessions_timed": 0}, "over 0 timed sessions"),
        ({"session_wall_ratio_p50": None}, "over 4 timed sessions"),
        ({"turn_late_p50_s": 1.5, "turn_late_p99_s": 2.0}, "no stalled turn counted"),
    ],
)
def test_a_planted_session_contradiction_is_caught(planted: dict[str, object], caught: str) -> None:
    def run(level: LevelSummary) -> RunResult:
        return RunResult(run_id="r", created="2026-12-07", agentload_version="0", target="t", model="m",
                         workload="trace:t.json", mode="single", levels=[level])  # fmt: skip

    assert check(run(session_level())) == []
    found = check(run(session_level(**planted)))
    assert any(caught in line for line in found), found
