"""``agentload runs --root``: a path that cannot be a root of runs is bad input (one ``error:`` line, exit 2), not
an empty root; a directory that does not exist yet is an empty root, and listing it creates nothing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentload.cli.main import app
from agentload.store.runstore import ROOT_ENV

ON_PROC = os.path.isdir("/proc") and os.statvfs("/proc").f_blocks == 0


@pytest.fixture(autouse=True)
def _no_ambient_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ROOT_ENV, raising=False)


def _one_error(args: list[str], needle: str) -> None:
    result = CliRunner().invoke(app, ["runs", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.output
    assert needle in " ".join(result.output.split())
    assert "no runs in" not in result.output


@pytest.mark.parametrize("as_json", [False, True])
def test_a_file_as_the_root_is_an_error(tmp_path: Path, as_json: bool) -> None:
    somefile = tmp_path / "somefile"
    somefile.write_text("not a directory\n")
    _one_error(["--root", str(somefile), *(["--json"] if as_json else [])], "not a directory")
    assert somefile.read_text() == "not a directory\n"


def test_a_root_under_a_file_is_an_error(tmp_path: Path) -> None:
    somefile = tmp_path / "somefile"
    somefile.write_text("")
    _one_error(["--root", str(somefile / "runs")], "cannot be created")


@pytest.mark.skipif(not ON_PROC, reason="needs Linux's /proc")
@pytest.mark.parametrize("root", ["/proc/x", "/proc", "/proc/self/no/such/runs"])
def test_a_root_on_a_kernel_file_system_is_an_error(root: str) -> None:
    _one_error(["--root", root], "kernel file system")


@pytest.mark.skipif(not ON_PROC, reason="needs Linux's /proc")
def test_the_environment_root_is_checked_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ROOT_ENV, "/proc/x")
    _one_error([], "kernel file system")


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root may write anywhere")
def test_a_root_that_could_not_be_created_is_an_error(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        _one_error(["--root", str(locked / "runs")], "cannot be created")
    finally:
        locked.chmod(0o700)


def test_a_root_not_yet_created_lists_no_runs_and_creates_nothing(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    result = CliRunner().invoke(app, ["runs", "--root", str(root)])
    assert result.exit_code == 0, result.output
    assert "no runs in" in result.output
    listed = CliRunner().invoke(app, ["runs", "--root", str(root), "--json"])
    assert listed.exit_code == 0, listed.output
    assert listed.output.strip() == "[]"
    assert not root.exists()
