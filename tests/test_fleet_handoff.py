"""A dependency's files reach its dependents through their own workspaces (fleet/handoff.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agentload.fleet import handoff
from agentload.fleet.handoff import hand_over


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

    from agentload.cli.run import RunOptions, _create_run, _manifest, _open_server
    from agentload.fleet.checkpoint import read_manifest
    from agentload.sim.behaviour import FillerBehaviour
    from agentload.sim.inprocess import InProcessTransport

    fleet = tmp_path / "f.toml"
    fleet.write_text('name = "f"\n[[tasks]]\nid = "t"\nprompt = "hi"\nmax_rounds = 1\n', encoding="utf-8")
    started = RunOptions(fleet=fleet, out=tmp_path / "runs", virtual=True, progress="none")
    started.behaviour = "filler"
    manifest, _ = _manifest(started)
    manifest, run_dir = _create_run(started, manifest)
    assert read_manifest(run_dir).behaviour == "filler"
    resumed = RunOptions(fleet=None, resume=run_dir, progress="none")  # behaviour left at its default, "agent"
    manifest, _ = _manifest(resumed)
    async with AsyncExitStack() as stack:
        server = await _open_server(resumed, manifest, stack)
        assert isinstance(server.transport, InProcessTransport)
        behaviour = server.transport.server.config.behaviour
    assert isinstance(getattr(behaviour, "inner", behaviour), FillerBehaviour)
