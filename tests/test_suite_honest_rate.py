"""A suite run the server cut short: its pass rate is passes ÷ tests scored, beside the counts of scored,
unscored and not run, everywhere it is printed — never a rate that counts unjudged tests as the model's failures.

The runs are built from verdicts (no server): one agent reached T3 before the server died, T1 and T2 passed, T3's
request failed (unscored), T4 failed; the other thirteen of T1–T17 never ran. A second agent's session was stopped
before it finished any test.
"""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import ValidationError
from rich.console import Console
from typer.testing import CliRunner

from agentload.agent.loop import AgentSpec, Transcript
from agentload.cli.main import app
from agentload.report.runpages import suite_section
from agentload.report.suiteview import render_suite_level
from agentload.store.runstore import save_suite_run
from agentload.store.suiterun import suite_info
from agentload.suite.app import summary
from agentload.suite.cases import all_tests
from agentload.suite.model import Category, SuiteTest
from agentload.suite.results import (
    AgentResult,
    AgentStatus,
    SuiteRun,
    TestInfo,
    TestResult,
    compile_level,
    cut_short,
    load_run,
)
from agentload.suite.scoring import Status

POOLED = [t for t in all_tests() if t.category is not Category.MULTIHOP]
LOST = "the server has not answered for 20 s"
WHY = "request failed (connect_error: Connection refused)"


def _result(test: SuiteTest, status: Status, reason: str) -> TestResult:
    spec = AgentSpec(agent_id=f"agent-0/{test.id}", model="m", messages=test.messages())
    return TestResult(test_id=test.id, category=test.category, status=status, reason=reason, suite_version="1.1",
                      played_version="1.1", started_s=0.0, duration_s=1.0,
                      transcript=Transcript(agent_id=spec.agent_id, spec=spec))  # fmt: skip


def _cut_run() -> SuiteRun:
    first = [
        _result(POOLED[0], Status.PASS, "right tool"),
        _result(POOLED[1], Status.PASS, "right tool"),
        _result(POOLED[2], Status.UNSCORED, WHY),
        _result(POOLED[3], Status.FAIL, "wrong argument"),
    ]
    stopped = "stopped: the server was lost"
    agents = [
        AgentResult(agent_id="agent-0", status=AgentStatus.FAILED, error=stopped, session_s=4.0, tests=first),
        AgentResult(agent_id="agent-1", status=AgentStatus.FAILED, error=stopped, session_s=4.0, tests=[]),
    ]
    level = compile_level(2, 4.0, [TestInfo.of(t) for t in POOLED], agents)
    return SuiteRun(suite_version="1.1", model="m", endpoint="http://127.0.0.1:9/v1", started_at=datetime.now(UTC),
                    payload_tokens=1000, levels=[level], incomplete=LOST)  # fmt: skip


def test_the_pooled_rate_counts_only_the_tests_scored() -> None:
    level = _cut_run().levels[0]
    assert level.pooled_pass_rate == pytest.approx(2 / 3)  # two passes of three verdicts
    assert (level.pooled_scored, level.pooled_unscored, level.pooled_not_run) == (3, 1, 2 * 17 - 4)
    assert level.seed_pooled_pass_rate == pytest.approx(2 / 34)  # the seed's figure, kept under its own name
    t3 = level.per_test[2]
    assert (t3.passed, t3.failed, t3.scored, t3.unscored, t3.not_run) == (0, 0, 0, 1, 1)
    assert t3.pass_rate is None  # nothing judged: no rate, rather than 0 %
    assert t3.unscored_reasons == [WHY]
    t1, t5 = level.per_test[0], level.per_test[4]
    assert (t1.pass_rate, t1.scored, t1.not_run, t1.seed_pass_rate) == (1.0, 1, 1, 0.5)
    assert (t5.scored, t5.not_run, t5.pass_rate) == (0, 2, None)


def test_a_level_with_nothing_scored_has_no_rate() -> None:
    unscored = [_result(t, Status.UNSCORED, WHY) for t in POOLED[:2]]
    agent = AgentResult(agent_id="agent-0", status=AgentStatus.UNSCORED, session_s=1.0, tests=unscored)
    level = compile_level(1, 1.0, [TestInfo.of(t) for t in POOLED[:2]], [agent])
    assert level.pooled_pass_rate is None
    assert (level.pooled_scored, level.pooled_unscored, level.pooled_not_run) == (0, 2, 0)
    assert level.seed_pooled_pass_rate == 0.0


def test_an_unscored_test_must_say_why() -> None:
    with pytest.raises(ValidationError, match="without a reason"):
        _result(POOLED[0], Status.UNSCORED, " ")


def test_the_console_prints_the_honest_rate_with_its_counts_and_the_cut() -> None:
    run = _cut_run()
    # A console of its own, wide enough for the reason on one line of its cell (setting the shared console's width
    # would outlive the test: the monkeypatch restores a fixed width, not the console's own measuring).
    out = Console(file=io.StringIO(), width=240)
    render_suite_level(run.levels[0], out)
    words = " ".join(out.file.getvalue().split())  # type: ignore[attr-defined]
    assert "pooled pass rate 66.7% passes ÷ tests scored: 3 scored, 1 unscored, 30 not run" in words
    assert "seed's figure 5.9%" in words
    assert WHY in words  # the reason beside the unscored test
    assert cut_short(run) == "server lost after 0 of 2 sessions at 2 agents"


def test_the_json_summary_carries_the_counts_and_the_cut() -> None:
    out = summary(_cut_run())
    json.dumps(out)  # what --json prints
    level = out["levels"][0]
    assert level["pooled_pass_rate"] == pytest.approx(2 / 3)
    assert (level["pooled_scored"], level["pooled_unscored"], level["pooled_not_run"]) == (3, 1, 30)
    assert level["seed_pooled_pass_rate"] == pytest.approx(2 / 34)
    assert out["cut_short"] == "server lost after 0 of 2 sessions at 2 agents"
    assert out["incomplete"] == LOST


def test_the_runs_listing_headline_is_the_honest_rate(tmp_path: Path) -> None:
    run = _cut_run()
    info = suite_info(run, "suite-x")
    assert info.outcome == (
        "pass 67% at 2 (3 scored, 1 unscored, 30 not run); server lost after 0 of 2 sessions at 2 agents"
    )
    assert LOST in info.detail
    assert "after 0 of 2 sessions" in info.detail
    root = tmp_path / "runs"
    saved = save_suite_run(run, root)
    listed = CliRunner().invoke(app, ["runs", "--root", str(root), "--json"])
    assert listed.exit_code == 0, listed.output
    (entry,) = json.loads(listed.output)
    assert entry["id"] == saved.parent.name
    assert entry["outcome"] == info.outcome
    assert entry["status"] == "interrupted"


def test_the_html_suite_page_prints_the_counts_and_the_cut() -> None:
    section = suite_section("run", "#000", _cut_run(), 0)
    (_, _, rows), _ = section.tables
    cells = {row[0]: row[3:] for row in rows}
    assert cells["pooled"] == ["66.7% (3 scored, 1 unscored, 30 not run)"]
    assert cells["seed's figure"] == ["5.9%"]
    assert cells["T1"] == ["100% (1/1, 1 not run)"]
    assert cells["T3"] == ["— (0/0, 1 unscored, 1 not run)"]
    assert any("server lost after 0 of 2 sessions" in w for w in section.warnings)


def test_a_result_saved_with_the_seed_figure_loads_with_the_honest_one(tmp_path: Path) -> None:
    run = _cut_run()
    data = json.loads(run.model_dump_json())
    for level in data["levels"]:  # as saved before the counts existed: the rate was passes ÷ (agents × tests)
        level["pooled_pass_rate"] = level.pop("seed_pooled_pass_rate")
        for key in ("pooled_scored", "pooled_unscored", "pooled_not_run"):
            del level[key]
        for s in level["per_test"]:
            s["pass_rate"] = s.pop("seed_pass_rate")
            for key in ("scored", "not_run", "unscored_reasons"):
                del s[key]
    path = tmp_path / "suite.json"
    path.write_text(json.dumps(data))
    loaded = load_run(path)
    assert loaded.levels[0].pooled_pass_rate == pytest.approx(2 / 3)
    assert loaded.levels[0].pooled_not_run == 30
    assert loaded.levels[0].suite_version == run.levels[0].suite_version
