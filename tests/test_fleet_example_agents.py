"""``examples/fleet.toml`` on the simulator's agent model (issue 13): every agent uses its tools over several
rounds, the files land in the workspaces, and the dependent waves build on the earlier agents' answers."""

from __future__ import annotations

from pathlib import Path

from agentload.cli.run import RunOptions, run_fleet
from agentload.fleet.checkpoint import WORKSPACES
from agentload.fleet.limiter import Mode
from agentload.vtime import run_virtual

FLEET = Path(__file__).resolve().parents[1] / "examples" / "fleet.toml"


def test_the_example_fleet_calls_its_tools_over_several_rounds(tmp_path: Path) -> None:
    opts = RunOptions(fleet=FLEET, mode=Mode.PARALLEL, width=4, out=tmp_path, progress="none", virtual=True)
    result = run_virtual(run_fleet(opts))
    agents = {a.agent_id: a for a in result.agents}
    assert result.totals.done == 10
    # plan: write plan.md, answer; each reviewer: search, write defects.md, answer; report: write, answer.
    assert [(agents[i].turns, agents[i].tool_calls) for i in ("plan", "report")] == [(2, 1), (2, 1)]
    assert {(a.turns, a.tool_calls) for a in result.agents if a.task_id == "module"} == {(3, 2)}
    assert opts.run_dir is not None
    workspaces = opts.run_dir / WORKSPACES
    assert (workspaces / "plan" / "plan.md").is_file()
    assert all((workspaces / f"module.{i}" / "defects.md").is_file() for i in range(8))
    report = (workspaces / "report" / "report.md").read_text(encoding="utf-8")
    # The report was written from the eight reviewers' answers, each of which says what its search found.
    assert all(f"[module.{i}]" in report for i in range(8))
    assert report.count("From search: Result 1") == 8
    assert "plan.md" in agents["plan"].last_output
