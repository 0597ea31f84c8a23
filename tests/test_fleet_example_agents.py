"""``examples/fleet.toml`` on the simulator's agent model: every agent uses its tools over several
rounds, the files land in the workspaces, and the dependent waves read the earlier agents' files (handed over
under ``from/<agent id>/``, fleet/handoff.py) and build on their answers."""

from __future__ import annotations

from pathlib import Path

from agentload.clock import run_virtual
from agentload.fleet.app import FleetApp, FleetSettings
from agentload.fleet.checkpoint import LOG, WORKSPACES, load_log
from agentload.fleet.limiter import Mode

FLEET = Path(__file__).resolve().parents[1] / "examples" / "fleet.toml"


def test_the_example_fleet_calls_its_tools_over_several_rounds(tmp_path: Path) -> None:
    opts = FleetApp(
        FleetSettings(fleet=FLEET, mode=Mode.PARALLEL, width=4, out=tmp_path, progress="none", virtual=True)
    )
    result = run_virtual(opts.run())
    agents = {a.agent_id: a for a in result.agents}
    assert result.totals.done == 10
    # plan: write plan.md, answer; each reviewer: read the plan and search, write defects.md, answer; report: read
    # four of the reviewers' files and list their folders (the agent model fans a call out over at most four of
    # the names its instruction gives), write report.md, answer.
    assert (agents["plan"].turns, agents["plan"].tool_calls) == (2, 1)
    assert (agents["report"].turns, agents["report"].tool_calls) == (3, 9)
    assert {(a.turns, a.tool_calls) for a in result.agents if a.task_id == "module"} == {(3, 3)}
    assert opts.run_dir is not None
    workspaces = opts.run_dir / WORKSPACES
    assert (workspaces / "plan" / "plan.md").is_file()
    assert all((workspaces / f"module.{i}" / "defects.md").is_file() for i in range(8))
    report = (workspaces / "report" / "report.md").read_text(encoding="utf-8")
    # The report was written from the reviewers' files it read.
    assert "From read_file:" in report
    assert "plan.md" in agents["plan"].last_output

    # The dependent waves read the files the earlier ones wrote, through their own workspaces.
    assert all((workspaces / f"module.{i}" / "from" / "plan" / "plan.md").is_file() for i in range(8))
    assert sorted(p.name for p in (workspaces / "report" / "from").iterdir()) == [f"module.{i}" for i in range(8)]
    reads = _tool_calls(opts.run_dir, "read_file")
    assert {agent for agent, path in reads if path == "from/plan/plan.md"} == {f"module.{i}" for i in range(8)}
    report_reads = {path for agent, path in reads if agent == "report"}
    assert len(report_reads) >= 4, report_reads
    assert all(path.startswith("from/module.") and path.endswith("/defects.md") for path in report_reads)


def _tool_calls(run_dir: Path, name: str) -> list[tuple[str, str]]:
    """(agent, path) of every committed call of tool ``name`` in the run's log."""
    import json

    calls = []
    for agent, lines in load_log(run_dir / LOG, repair=False).turns.items():
        for line in lines:
            for call in line.turn.final.tool_calls:
                if call.name == name:
                    calls.append((agent, json.loads(call.arguments).get("path", "")))
    return calls
