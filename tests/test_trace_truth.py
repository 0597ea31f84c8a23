"""A trace replay's truth per level: the think times it was asked to keep (recorded × time scale) against the ones
it kept, and how late its turns started, from bench's results through ``--json``, the level table and the
invariant checker; stored runs from before these figures still load."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from agentload.bench.analysis import LevelData, summarise
from agentload.bench.invariants import check
from agentload.bench.results import LevelSummary, Percentiles, RunResult
from agentload.cli.main import app
from agentload.endpoint.records import Outcome, RequestIds, RequestRecord
from agentload.report.levels import level_table
from agentload.workload.base import ReplayPace
from agentload.workload.registry import get_workload

SAMPLE = Path(__file__).parent / "data" / "claude_code_subagent_sample.json"
THINK = "think (s)\nreal / rec"
PACE_FIELDS = ("think_recorded_s", "think_realised_s", "turn_late_p50_s", "turn_late_p99_s")


def bench_json(tmp_path: Path, *args: str) -> tuple[dict[str, Any], RunResult]:
    """``agentload bench --json`` in virtual time: what it printed, and the result it stored."""
    result = CliRunner().invoke(app, ["bench", "--out", str(tmp_path / "runs"), "--json", *args])
    assert result.exit_code == 0, result.output
    (stored,) = (tmp_path / "runs").glob("*/result.json")
    return json.loads(result.stdout), RunResult.model_validate_json(stored.read_text())


@pytest.fixture(scope="module")
def sample_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], RunResult, Path]:
    tmp = tmp_path_factory.mktemp("sample")
    printed, result = bench_json(
        tmp, "--sim", "llama-8b-h100", "--agents", "4", "--workload", f"trace:{SAMPLE}", "--time-scale", "0.1",
        "--warmup", "20s", "--window", "120s",
    )  # fmt: skip
    (stored,) = (tmp / "runs").glob("*/result.json")
    return printed, result, stored


def test_a_virtual_bench_of_the_claude_code_sample_keeps_its_recorded_pace(
    sample_run: tuple[dict[str, Any], RunResult, Path],
) -> None:
    printed, result, _ = sample_run
    (level,) = result.levels
    assert level.think_recorded_s is not None
    assert level.think_realised_s is not None
    # The sample's recorded waits, times 0.1, run from 0.1 s (the subagent's) to 31.8 s (the parent's last); the
    # unscaled ones from 1 s to 318 s.
    assert 0.1 <= level.think_recorded_s <= 31.8
    # Simulated time has no loop lag: each turn goes out exactly when it is due, its recorded wait × 0.1 after
    # the previous reply, so the realised mean is the recorded one and no turn is late.
    assert level.think_realised_s == pytest.approx(level.think_recorded_s, rel=1e-6)
    assert level.turn_late_p50_s == pytest.approx(0.0, abs=1e-6)
    assert level.turn_late_p99_s == pytest.approx(0.0, abs=1e-6)
    assert check(result) == []
    # ``--json`` prints the same figures.
    (shown,) = printed["levels"]
    for name in PACE_FIELDS:
        assert shown[name] == pytest.approx(getattr(level, name))
    # The level table shows them in one column, realised then recorded.
    table = level_table(result)
    cell = table.rows[0][table.headers.index(THINK)]
    assert cell == f"{level.think_realised_s:.3f} / {level.think_recorded_s:.3f}"


def test_a_stored_run_from_before_the_pace_figures_loads_without_them_or_their_column(
    sample_run: tuple[dict[str, Any], RunResult, Path],
) -> None:
    _, _, stored = sample_run
    doc = json.loads(stored.read_text())
    for level in doc["levels"]:
        for name in PACE_FIELDS:
            del level[name]
    old = RunResult.model_validate_json(json.dumps(doc))
    assert all(getattr(old.levels[0], name) is None for name in PACE_FIELDS)
    assert THINK not in level_table(old).headers
    assert check(old) == []


def test_a_workload_that_is_not_a_trace_has_no_pace() -> None:
    # The synthetic workload has a ``pace`` flag: the protocol's method is named apart so that it is not taken
    # for one.
    assert not isinstance(get_workload("synthetic"), ReplayPace)
    assert not isinstance(get_workload("agentic"), ReplayPace)
    assert isinstance(get_workload(f"trace:{SAMPLE}", time_scale=0.1), ReplayPace)
    summary = summarise(LevelData(0, 1, 0, "agentic", 0.0, 0.0, 10.0, records=[]))
    assert all(getattr(summary, name) is None for name in PACE_FIELDS)


def record(agent: str, turn: int, sent: float, done: float, *, attempt: int = 0, ok: bool = True) -> RequestRecord:
    outcome = Outcome.OK if ok else Outcome.HTTP_ERROR
    ids = RequestIds(run="r", level=0, agent=agent, turn=turn, attempt=attempt)
    return RequestRecord(ids=ids, t_sent=sent, t_done=done, outcome=outcome)


def test_the_window_judges_the_turns_due_in_it_finding_their_replies_in_the_warm_up() -> None:
    """The sample's conversation ``c0`` waits 12, 15, 12 and 318 s before its turns 1 to 4; at time scale 0.1, 1.2,
    1.5, 1.2 and 31.8 s. The window opens at 15 s."""
    workload = get_workload(f"trace:{SAMPLE}", time_scale=0.1)
    assert isinstance(workload, ReplayPace)
    a, b = "agent-0/d0/c0", "agent-1/d1/c0"
    records = [
        record(a, 0, 0.0, 10.0),
        record(a, 1, 11.2, 14.0),  # due 11.2, in the warm-up: not judged
        record(a, 2, 16.0, 20.0),  # due 15.5 (its reply in the warm-up, at 14 s), sent 0.5 s late
        record(a, 3, 21.2, 21.3, ok=False),  # due 21.2, on time; it failed and was retried
        record(a, 3, 22.3, 25.0, attempt=1),  # the retry's delay is the retry's, not the pace's
        record(a, 4, 56.8, 60.0),  # due 56.8, on time
        record(b, 0, 0.0, 13.6),
        record(b, 1, 15.0, 18.0),  # due 14.8, held by the window's closed start edge: not judged
    ]
    summary = summarise(LevelData(0, 2, 0, workload.name, 0.0, 15.0, 100.0, records=records, pace=workload.turn_pace))
    assert summary.think_recorded_s == pytest.approx((1.5 + 1.2 + 31.8) / 3)
    assert summary.think_realised_s == pytest.approx((2.0 + 1.2 + 31.8) / 3)
    assert summary.turn_late_p50_s == pytest.approx(0.0)
    assert 0.0 < (summary.turn_late_p99_s or 0.0) <= 0.5
    # A turn done after the window's end is not the window's.
    late_end = summarise(LevelData(0, 2, 0, workload.name, 0.0, 15.0, 50.0, records=records,
                                   pace=workload.turn_pace))  # fmt: skip
    assert late_end.think_recorded_s == pytest.approx((1.5 + 1.2) / 2)


def pace_level(**update: object) -> LevelSummary:
    base = LevelSummary(
        level=0, agents=2, context=0, workload="trace:t.json", window_s=60.0, warmup_s=10.0, sessions_completed=0,
        sessions_failed=0, requests_ok=60, requests_failed=0, turns=60, turns_per_s=1.0, output_tps=100.0,
        prefill_tps=900.0, prefill_share=0.9, throughput_source="usage", ttft_s=Percentiles(p50=0.1, p95=0.2, p99=0.3),
        think_recorded_s=1.5, think_realised_s=1.6, turn_late_p50_s=0.01, turn_late_p99_s=0.4,
    )  # fmt: skip
    return base.model_copy(update=update)


def pace_run(level: LevelSummary) -> RunResult:
    return RunResult(run_id="r", created="2026-12-07", agentload_version="0", target="t", model="m",
                     workload="trace:t.json", mode="single", levels=[level])  # fmt: skip


@pytest.mark.parametrize(
    ("planted", "caught"),
    [
        ({"think_realised_s": 1.4}, "a turn started early"),
        ({"turn_late_p50_s": -0.1}, "turn lateness p50 -0.100000 s is negative"),
        ({"turn_late_p50_s": 0.5}, "exceeds its p99"),
        ({"think_recorded_s": -1.0, "think_realised_s": 0.0}, "recorded think time -1.000000 s is negative"),
    ],
)
def test_a_planted_pace_contradiction_is_caught(planted: dict[str, object], caught: str) -> None:
    assert check(pace_run(pace_level())) == []
    found = check(pace_run(pace_level(**planted)))
    assert any(caught in line for line in found), found


def test_the_capacity_estimate_divides_the_pool_by_the_context_the_trace_realised(
    sample_run: tuple[dict[str, Any], RunResult, Path],
) -> None:
    """A trace's sessions are the sizes it recorded: pool ÷ the --context default (40,960) once predicted a
    capacity for sessions the trace never had (the sample's realise ~22k)."""
    _, result, _ = sample_run
    (level,) = result.levels
    (estimate,) = result.capacity
    assert level.context_mean is not None
    assert estimate.target_context == level.context == 40_960  # what the run was given, kept beside it
    assert estimate.context == round(level.context_mean) < 40_960
