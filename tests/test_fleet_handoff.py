"""A dependency's files reach its dependents through their own workspaces (fleet/handoff.py)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from agentload.agent import workspace
from agentload.agent.workspace import MAX_DEPTH
from agentload.fleet import handoff
from agentload.fleet.handoff import hand_over
from tests.test_workspace_bounds import build_deep_tree, no_deep_tree_left  # noqa: F401 (an autouse fixture)

DEEP = 1500  # levels: past where a recursive walk (os.fwalk, shutil.rmtree) dies of RecursionError


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def test_the_dependencies_own_files_are_copied_under_from(tmp_path: Path) -> None:
    _write(tmp_path / "plan" / "plan.md", "# plan")
    _write(tmp_path / "plan" / "notes" / "a.txt", "a")
    _write(tmp_path / "plan" / "from" / "older" / "x.md", "handed to plan earlier: not passed on")
    copied = hand_over(tmp_path, "review", ["plan", "never-wrote-anything"])
    assert copied == ["from/plan/notes/a.txt", "from/plan/plan.md"]
    assert (tmp_path / "review" / "from" / "plan" / "plan.md").read_text(encoding="utf-8") == "# plan"
    assert not (tmp_path / "review" / "from" / "plan" / "from").exists()
    # Idempotent: a resumed agent is handed the same files and sees the same prompt.
    assert hand_over(tmp_path, "review", ["plan"]) == copied


def test_links_and_non_text_files_are_not_handed_over(tmp_path: Path) -> None:
    secret = tmp_path / "outside.txt"
    secret.write_text("not the agent's", encoding="utf-8")
    _write(tmp_path / "dep" / "ok.md", "ok")
    os.symlink(secret, tmp_path / "dep" / "link.md")
    (tmp_path / "dep" / "blob.bin").write_bytes(b"\xff\xfe\x00")
    assert hand_over(tmp_path, "me", ["dep"]) == ["from/dep/ok.md"]


def test_what_one_dependency_hands_over_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(handoff, "MAX_FILES_PER_DEPENDENCY", 3)
    for i in range(5):
        _write(tmp_path / "dep" / f"f{i}.md", "x")
    assert len(hand_over(tmp_path, "me", ["dep"])) == 3
    monkeypatch.setattr(handoff, "MAX_HANDOFF_BYTES", 2)
    assert len(hand_over(tmp_path, "other", ["dep"])) == 2


async def test_a_resume_keeps_the_simulated_model_the_run_started_with(tmp_path: Path) -> None:
    """run.json records the embedded simulator's behaviour; a resume without --behaviour uses it, not the default."""
    from contextlib import AsyncExitStack

    from agentload.fleet.app import FleetApp, FleetSettings
    from agentload.fleet.checkpoint import read_manifest
    from agentload.sim.behaviour import FillerBehaviour
    from agentload.sim.inprocess import InProcessTransport

    fleet = tmp_path / "f.toml"
    fleet.write_text('name = "f"\n[[tasks]]\nid = "t"\nprompt = "hi"\nmax_rounds = 1\n', encoding="utf-8")
    started = FleetApp(
        FleetSettings(fleet=fleet, out=tmp_path / "runs", virtual=True, progress="none", behaviour="filler")
    )
    manifest, _ = started.open_manifest()
    manifest, run_dir = started.create_run(manifest)
    assert read_manifest(run_dir).behaviour == "filler"
    resumed = FleetApp(FleetSettings(fleet=None, resume=run_dir, progress="none"))  # behaviour left at "agent"
    manifest, _ = resumed.open_manifest()
    async with AsyncExitStack() as stack:
        server = await resumed.open_server(manifest, stack)
        assert isinstance(server.transport, InProcessTransport)
        behaviour = server.transport.server.config.behaviour
    assert isinstance(getattr(behaviour, "inner", behaviour), FillerBehaviour)


def test_a_1500_level_tree_is_skipped_with_a_note_and_the_rest_is_handed_over(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    workspaces = tmp_path / "ws"
    _write(workspaces / "plan" / "plan.md", "# plan")
    _write(workspaces / "plan" / "notes" / "a.txt", "a")
    deep = build_deep_tree(workspaces / "plan" / "deep", DEEP, files_at=(3, DEEP))
    with caplog.at_level(logging.WARNING, logger=handoff.__name__):
        copied = hand_over(workspaces, "review", ["plan"])
    assert copied == sorted(["from/plan/plan.md", "from/plan/notes/a.txt", f"from/plan/deep/{deep[0]}"])
    assert (workspaces / "review" / "from" / "plan" / "plan.md").read_text(encoding="utf-8") == "# plan"
    cut = "deep/" + "/".join(["d"] * (MAX_DEPTH - 1))  # the first directory the walk did not go into
    assert copied.skipped == [f"plan: not followed below the depth limit: {cut}"]
    assert f"hand-over to review skipped: plan: not followed below the depth limit: {cut}" in caplog.messages
    # Idempotent with the bad tree too: a resumed agent is handed the same files.
    again = hand_over(workspaces, "review", ["plan"])
    assert (again, again.skipped) == (copied, copied.skipped)


def test_files_the_dependents_own_bounds_refuse_are_noted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    workspaces = tmp_path / "ws"
    monkeypatch.setattr(workspace, "MAX_WORKSPACE_BYTES", 5)
    _write(workspaces / "dep" / "a.md", "123")
    _write(workspaces / "dep" / "b.md", "456")
    copied = hand_over(workspaces, "me", ["dep"])
    assert copied == ["from/dep/a.md"]
    assert len(copied.skipped) == 1
    assert copied.skipped[0].startswith("dep: b.md: ")
    assert "over their 5-byte limit" in copied.skipped[0]


def _deep_fleet(tmp_path: Path, plan_prompt: str) -> Path:
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(
        f"""name = "deep"
[[tasks]]
id = "plan"
prompt = "{plan_prompt}"
tools = ["write_file"]
max_rounds = 3

[[tasks]]
id = "review"
prompt = "Read the plan and review it."
tools = ["read_file"]
depends_on = ["plan"]
max_rounds = 3
""",
        encoding="utf-8",
    )
    return fleet


def test_a_model_that_writes_a_1500_level_path_does_not_stop_the_fleet(tmp_path: Path) -> None:
    """Through the real runner on the simulator: the model's write is refused, the dependent still runs."""
    from agentload.clock import run_virtual
    from agentload.fleet.app import FleetApp, FleetSettings

    deep = "/".join(["d"] * DEEP) + "/plan.md"
    fleet = _deep_fleet(tmp_path, f"Write the review plan to {deep}, then answer.")
    opts = FleetApp(FleetSettings(fleet=fleet, out=tmp_path / "runs", progress="none", virtual=True))
    result = run_virtual(opts.run())
    assert (result.totals.done, result.totals.failed) == (2, 0)
    plan = next(a for a in result.agents if a.agent_id == "plan")
    assert plan.tool_calls == 1
    assert f"at most {MAX_DEPTH} levels deep, not {DEEP + 1}" in plan.last_output  # the refusal reached the model


def test_a_resume_hands_over_past_a_1500_level_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run whose hand-over died on a deep tree resumes: the dependent runs with the plan, the fleet finishes."""
    from agentload.clock import run_virtual
    from agentload.fleet import runner
    from agentload.fleet.app import FleetApp, FleetSettings
    from agentload.fleet.checkpoint import WORKSPACES

    def crash(*_args: object) -> list[str]:
        raise RecursionError("maximum recursion depth exceeded")  # what the recursive walk did to the first run

    fleet = _deep_fleet(tmp_path, "Write the review plan to plan.md, then answer.")
    opts = FleetApp(FleetSettings(fleet=fleet, out=tmp_path / "runs", progress="none", virtual=True))
    with monkeypatch.context() as patched:
        patched.setattr(runner, "hand_over", crash)
        with pytest.raises(RecursionError):
            run_virtual(opts.run())
    assert opts.run_dir is not None
    plan_ws = opts.run_dir / WORKSPACES / "plan"
    assert (plan_ws / "plan.md").is_file()
    build_deep_tree(plan_ws / "deep", DEEP, files_at=(DEEP,))  # as an older version let the model leave it
    resumed = FleetApp(FleetSettings(fleet=None, resume=opts.run_dir, progress="none"))
    result = run_virtual(resumed.run())
    assert (result.totals.done, result.totals.failed) == (2, 0)
    review = next(a for a in result.agents if a.agent_id == "review")
    assert review.turns >= 1
    handed = opts.run_dir / WORKSPACES / "review" / "from" / "plan"
    assert (handed / "plan.md").read_text(encoding="utf-8") == (plan_ws / "plan.md").read_text(encoding="utf-8")
    assert not (handed / "deep").exists()  # nothing of the chain holds a file above the bound
