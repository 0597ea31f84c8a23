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
