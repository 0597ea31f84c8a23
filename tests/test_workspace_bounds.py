"""A workspace is bounded in depth, entries and bytes, and every walk or removal of it copes with any tree.

A model picks the paths it writes, so without bounds it can build a tree far deeper than a recursive walk
(``os.fwalk``, ``shutil.rmtree``) survives. The deep trees here are built by hand with directory handles, as an
older version or another process could have left them: a path 1,500 levels deep is far beyond PATH_MAX, so
nothing can make or remove it by path.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentload.agent import workspace
from agentload.agent.tools import ToolRegistry, ToolResult, workspace_tools
from agentload.agent.workspace import MAX_DEPTH, Workspace, remove_tree


def _call(reg: ToolRegistry, name: str, **args: str) -> ToolResult:
    return asyncio.run(reg.call(name, json.dumps(args)))


def build_deep_tree(top: Path, levels: int, files_at: tuple[int, ...] = ()) -> list[str]:
    """``levels`` nested directories ``d`` under ``top``, with a file ``f<level>.md`` at each of ``files_at``
    (level 0 is ``top`` itself); the files' paths relative to ``top``."""
    top.mkdir(parents=True, exist_ok=True)
    flags = os.O_RDONLY | os.O_DIRECTORY
    fd = os.open(top, flags)
    made = []
    try:
        for level in range(levels + 1):
            if level in files_at:
                file_fd = os.open(f"f{level}.md", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
                os.write(file_fd, f"level {level}".encode())
                os.close(file_fd)
                made.append("/".join(["d"] * level + [f"f{level}.md"]))
            if level < levels:
                os.mkdir("d", dir_fd=fd)
                child = os.open("d", flags, dir_fd=fd)
                os.close(fd)
                fd = child
    finally:
        os.close(fd)
    return made


@pytest.fixture(autouse=True)
def no_deep_tree_left(tmp_path: Path) -> Iterator[None]:
    """Remove what the test made, passed or failed, without recursion: ``shutil.rmtree``, which pytest cleans its
    old temporary folders with, dies of RecursionError on a deep tree and would break a later session."""
    yield
    for child in tmp_path.iterdir():
        if child.is_dir() and not child.is_symlink():
            remove_tree(child)


def test_a_1500_level_tree_is_listed_down_to_the_depth_bound_and_says_where_it_was_cut(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    files = build_deep_tree(root, 1500, files_at=(0, 5, MAX_DEPTH - 1, MAX_DEPTH, 1500))
    ws = Workspace(root)
    # The files at most MAX_DEPTH components deep are listed; the one below the bound and the bottom one are not.
    assert ws.list_files(".") == sorted(files[:3])
    scan = ws.scan(".")
    assert scan.too_deep == ["/".join(["d"] * MAX_DEPTH)]
    assert scan.cut
    assert not scan.too_many
    assert not scan.unreadable
    assert scan.entries == MAX_DEPTH + 3  # the directories and files down to the bound
    # A listing that starts below the root counts its depth from the root.
    assert ws.list_files("d/d/d") == sorted(files[1:3])
    # The re-created workspace (as on resume) still takes writes: the first one counts the tree without crashing.
    assert Workspace(root).write_text("notes.md", "n") == "notes.md"
    result = _call(ToolRegistry.of(workspace_tools(root)), "list_files", path=".")
    assert not result.error
    assert result.text.splitlines() == sorted([*files[:3], "notes.md"])


def test_remove_tree_removes_a_2000_level_tree_and_follows_no_link(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("secret")
    top = tmp_path / "ws"
    build_deep_tree(top, 2000, files_at=(0, 7, 1999, 2000))
    (top / "to-outside").symlink_to(outside)
    (top / "d" / "d" / "wide").mkdir()
    for i in range(50):
        (top / "d" / "d" / "wide" / f"w{i}").mkdir()
        (top / "d" / "d" / "wide" / f"w{i}" / "f.txt").write_text("x")
    remove_tree(top)
    assert not top.exists()
    assert sorted(os.listdir(tmp_path)) == ["outside"]
    assert (outside / "secret.txt").read_text() == "secret"
    remove_tree(top)  # already gone: nothing to do


def test_write_file_refuses_a_path_past_the_depth_bound(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    reg = ToolRegistry.of(workspace_tools(root))
    deepest = "/".join(["a"] * (MAX_DEPTH - 1) + ["ok.md"])
    assert not _call(reg, "write_file", path=deepest, content="ok").error
    for levels in (MAX_DEPTH + 1, 1500, 2000):
        path = "/".join(["b"] * (levels - 1) + ["x.md"])
        result = _call(reg, "write_file", path=path, content="x")
        assert result.error
        assert f"a workspace path may be at most {MAX_DEPTH} levels deep, not {levels}: 'b/b/" in result.text
        assert len(result.text) < 200  # the path is cut short in what goes back to the model
    assert not (root / "b").exists()  # refused before anything was made
    # ``..`` is resolved first: a long path that climbs back up is as deep as where it lands.
    climbing = "/".join(["c", ".."] * 1000 + ["fine.md"])
    assert not _call(reg, "write_file", path=climbing, content="f").error
    assert (root / "fine.md").read_text() == "f"


def test_write_file_refuses_past_the_entry_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workspace, "MAX_ENTRIES", 5)
    root = tmp_path / "ws"
    reg = ToolRegistry.of(workspace_tools(root))
    for path in ("a.md", "b.md", "sub/c.md", "sub/d.md"):  # sub counts too: five entries
        assert not _call(reg, "write_file", path=path, content="x").error, path
    refused = _call(reg, "write_file", path="e.md", content="x")
    assert refused.error
    assert "holds 5 files and directories and may hold at most 5" in refused.text
    # A write that would make directories is refused before it makes any.
    assert _call(reg, "write_file", path="new/dir/e.md", content="x").error
    assert sorted(os.listdir(root)) == ["a.md", "b.md", "sub"]
    # Rewriting a file that exists adds no entry.
    assert not _call(reg, "write_file", path="sub/c.md", content="again").error
    assert (root / "sub" / "c.md").read_text() == "again"


def test_write_file_refuses_past_the_byte_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workspace, "MAX_WORKSPACE_BYTES", 10)
    root = tmp_path / "ws"
    reg = ToolRegistry.of(workspace_tools(root))
    assert not _call(reg, "write_file", path="a.md", content="123456").error
    refused = _call(reg, "write_file", path="b/b.md", content="12345")
    assert refused.error
    assert "5 more bytes would take the workspace's files over their 10-byte limit (6 bytes used)" in refused.text
    assert sorted(os.listdir(root)) == ["a.md"]  # neither the file nor its directory was made
    # Only growth counts: a rewrite to a size that fits is taken, one past the bound is not and leaves the file.
    assert not _call(reg, "write_file", path="a.md", content="1234567890").error
    assert _call(reg, "write_file", path="a.md", content="12345678901").error
    assert (root / "a.md").read_text() == "1234567890"
    assert not _call(reg, "write_file", path="a.md", content="1").error
    assert not _call(reg, "write_file", path="c.md", content="123456789").error  # what the rewrite freed


def test_the_counts_come_from_disk_once_then_from_the_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A workspace re-created on resume counts what is already on disk; later writes do not walk it again."""
    monkeypatch.setattr(workspace, "MAX_ENTRIES", 6)
    root = tmp_path / "ws"
    (root / "sub").mkdir(parents=True)
    for name in ("a.md", "b.md", "sub/c.md"):
        (root / name).write_text("x")  # four entries written by someone else (an earlier run)
    walks = 0
    real_scan = workspace._scan

    def counting_scan(*args: object, **kwargs: object) -> workspace.Scan:
        nonlocal walks
        walks += 1
        return real_scan(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(workspace, "_scan", counting_scan)
    ws = Workspace(root)
    for _ in range(20):
        ws.write_text("a.md", "rewritten")
    ws.write_text("d.md", "x")
    ws.write_text("e.md", "x")
    with pytest.raises(workspace.WorkspaceError, match="holds 6 files and directories"):
        ws.write_text("f.md", "x")
    assert walks == 1


def test_a_tree_over_the_entry_bound_counts_as_full(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workspace, "MAX_ENTRIES", 10)
    root = tmp_path / "ws"
    root.mkdir()
    for i in range(25):
        (root / f"f{i:02}.md").write_text("abc")
    ws = Workspace(root)
    scan = ws.scan(".")
    assert scan.too_many
    assert (scan.entries, len(scan.files)) == (10, 10)
    assert len(ws.list_files(".")) == 10
    with pytest.raises(workspace.WorkspaceError, match="may hold at most 10"):
        ws.write_text("new.md", "x")
    ws.write_text("f00.md", "xyz")  # no growth: taken
    with pytest.raises(workspace.WorkspaceError, match="byte limit"):
        ws.write_text("f00.md", "longer")  # the bytes beyond the walk are unknown: no growth at all
