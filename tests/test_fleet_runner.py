"""The fleet runner against the in-process simulator in simulated time: modes, isolation, waves, stop and resume.

Every assertion is made from what the run wrote (the checkpoint log and results.json), the way reports are.
"""

from __future__ import annotations

from pathlib import Path

from agentload.clock import run_virtual
from agentload.fleet.app import FleetApp, FleetSettings
from agentload.fleet.checkpoint import LOG, RESULTS, LogState, load_log
from agentload.fleet.limiter import Mode
from agentload.fleet.results import FleetResult

FAST = "llama-8b-h100"  # prefills in tens of milliseconds: many turns per simulated second


def _fleet(tmp_path: Path, text: str, name: str = "fleet") -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return path


def _run(tmp_path: Path, fleet: Path | None, **kwargs: object) -> tuple[FleetResult, Path]:
    settings = FleetSettings(fleet=fleet, out=tmp_path / "runs", progress="none", virtual=True, profile=FAST)
    opts = FleetApp(settings.model_copy(update=kwargs))
    result = run_virtual(opts.run())
    assert isinstance(result, FleetResult)
    assert opts.run_dir is not None
    return result, opts.run_dir


def _sessions(state: LogState) -> dict[str, tuple[float, float]]:
    """Each agent's span on the server: first request sent → last reply done."""
    out = {}
    for agent, lines in state.turns.items():
        records = [r for line in lines for r in line.turn.records]
        out[agent] = (min(r.t_sent for r in records), max(r.t_done for r in records))
    return out


def _max_overlap(spans: dict[str, tuple[float, float]]) -> int:
    events = sorted([(s, 1) for s, _ in spans.values()] + [(e, -1) for _, e in spans.values()])
    live = best = 0
    for _, delta in events:  # ends sort before starts at the same instant
        live += delta
        best = max(best, live)
    return best


LOAD = """
[defaults]
tools = ["search"]
tool_choice = "required"
max_rounds = 3
max_tokens = 16
think_time_s = 0.5
context_tokens = 300
tool_result_tokens = 40

[[tasks]]
id = "w"
prompt = "Work item {replica}."
count = COUNT
"""


def test_sequential_runs_one_agent_at_a_time(tmp_path: Path) -> None:
    result, run_dir = _run(tmp_path, _fleet(tmp_path, LOAD.replace("COUNT", "4")), mode=Mode.SEQUENTIAL)
    state = load_log(run_dir / LOG)
    assert result.totals.done == 4
    assert result.totals.turns == 12
    assert all(a.turns == 3 and a.stop_reason == "round_cap" for a in result.agents)
    assert _max_overlap(_sessions(state)) == 1
    assert result.start_width == 1
    assert result.limiter.history == []
    # The results file is the returned result, whole.
    assert FleetResult.model_validate_json((run_dir / RESULTS).read_text()) == result


def test_parallel_width_caps_the_live_agents(tmp_path: Path) -> None:
    result, run_dir = _run(tmp_path, _fleet(tmp_path, LOAD.replace("COUNT", "10")), mode=Mode.PARALLEL, width=3)
    spans = _sessions(load_log(run_dir / LOG))
    assert result.totals.done == 10
    assert _max_overlap(spans) == 3  # reached, never exceeded
    assert "the requested width 3" in result.start_reason


def test_each_agent_has_its_own_conversation_and_workspace(tmp_path: Path) -> None:
    text = """
[[tasks]]
id = "writer"
prompt = "I am {agent}."
tools = ["write_file", "list_files"]
tool_choice = "write_file"
max_rounds = 2
count = 3
"""
    result, run_dir = _run(tmp_path, _fleet(tmp_path, text), mode=Mode.PARALLEL, width=3)
    assert result.totals.done == 3
    state = load_log(run_dir / LOG)
    for agent in ("writer.0", "writer.1", "writer.2"):
        # The simulator's agent model names a file for the task and writes what it knows into it: its own prompt.
        written = (run_dir / "workspaces" / agent / "notes.md").read_text()
        assert f"I am {agent}" in written
        others = {f"writer.{i}" for i in range(3)} - {agent}
        assert not any(f"I am {other}" in written for other in others)
        results = [line.turn.tool_results[0]["content"] for line in state.turns[agent]]
        assert results[-1] == f"wrote {len(written)} characters to notes.md"
    assert sorted(p.name for p in (run_dir / "workspaces").iterdir()) == ["writer.0", "writer.1", "writer.2"]


def test_dependencies_run_in_waves_and_a_failed_dependency_skips(tmp_path: Path) -> None:
    text = """
[defaults]
max_rounds = 1
max_tokens = 8

[[tasks]]
id = "setup"
prompt = "Prepare."
count = 2

[[tasks]]
id = "review"
prompt = "Review."
count = 3
depends_on = ["setup"]

[[tasks]]
id = "report"
prompt = "Report."
depends_on = ["review"]

[[tasks]]
id = "broken"
prompt = "This one names a model the server does not serve."
model = "no-such-model"

[[tasks]]
id = "after-broken"
prompt = "Never runs."
depends_on = ["broken"]
"""
    result, run_dir = _run(tmp_path, _fleet(tmp_path, text), mode=Mode.PARALLEL, width=8)
    by_id = {a.agent_id: a for a in result.agents}
    spans = _sessions(load_log(run_dir / LOG))
    setup_end = max(spans[f"setup.{i}"][1] for i in range(2))
    review = [f"review.{i}" for i in range(3)]
    assert all(spans[r][0] >= setup_end for r in review)
    assert spans["report"][0] >= max(spans[r][1] for r in review)
    assert [by_id[a].wave for a in ("setup.0", "review.2", "report", "broken", "after-broken")] == [0, 1, 2, 0, 1]
    assert by_id["broken"].outcome == "failed"
    assert "does not exist" in by_id["broken"].detail
    assert by_id["after-broken"].outcome == "skipped"
    assert by_id["after-broken"].detail == "dependency broken failed"
    assert (result.totals.done, result.totals.failed, result.totals.skipped) == (6, 1, 1)
    # The report's prompt carries what the three reviewers answered (eight tokens each, plus their labels).
    assert by_id["report"].prompt_tokens > by_id["setup.0"].prompt_tokens + 3 * 8


def test_a_stopped_run_resumes_without_repeating_a_turn(tmp_path: Path) -> None:
    fleet = _fleet(tmp_path, LOAD.replace("COUNT", "6").replace("max_rounds = 3", "max_rounds = 5"))
    first, run_dir = _run(tmp_path, fleet, mode=Mode.PARALLEL, width=3, stop_after_s=4.0)
    assert first.stopped_early
    assert 0 < first.totals.turns < 30
    assert first.totals.unfinished > 0
    committed = {(a, t.round) for a, lines in load_log(run_dir / LOG).turns.items() for t in lines}
    second, _ = _run(tmp_path, None, resume=run_dir, mode=Mode.PARALLEL, width=3)
    state = load_log(run_dir / LOG)
    assert second.totals.done == 6
    assert second.totals.turns == 30
    for agent, lines in state.turns.items():
        assert [t.round for t in lines] == list(range(5))
        for t in lines:
            # Turns committed before the stop kept their segment: nothing was sent twice.
            assert (t.segment == 0) == ((agent, t.round) in committed)
    assert [s.segment for s in second.segments] == [0, 1]
    assert sum(s.turns for s in second.segments) == 30
    resumed = [a for a in second.agents if a.segments == [0, 1]]
    assert resumed, "some agent was cut mid-way and finished in the second segment"
