"""A run's state as stored and as shown: what a resume reads back, and the one label every view gives a run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from agentload.cli.run import run
from agentload.fleet.checkpoint import LOG, load_log, read_manifest
from agentload.fleet.limiter import Mode
from agentload.fleet.results import FleetResult

FLEET = """
[defaults]
tools = ["search"]
tool_choice = "required"
max_rounds = 2
max_tokens = 8
context_tokens = 100

[[tasks]]
id = "t"
prompt = "Task {replica}."
count = 6
"""

run_app = typer.Typer()
run_app.command()(run)


def _start(tmp_path: Path, *flags: str) -> Path:
    tmp_path.mkdir(exist_ok=True)
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(FLEET)
    out = tmp_path / "runs"
    stop = [] if "--stop-after" in flags else ["--stop-after", "0"]
    started = CliRunner().invoke(run_app, [str(fleet), "--virtual", "--json", "--out", str(out), *stop, *flags])
    assert started.exit_code == 0, started.output
    return next(out.iterdir())


def _resume(run_dir: Path, *flags: str) -> FleetResult:
    again = CliRunner().invoke(run_app, ["--resume", str(run_dir), "--json", *flags])
    assert again.exit_code == 0, again.output
    return FleetResult.model_validate_json(again.output[again.output.index("{") :])


def test_a_sequential_run_resumes_sequential(tmp_path: Path) -> None:
    run_dir = _start(tmp_path, "--mode", "sequential")
    assert read_manifest(run_dir).mode is Mode.SEQUENTIAL
    resumed = _resume(run_dir)
    assert resumed.mode is Mode.SEQUENTIAL
    assert resumed.start_width == 1
    assert [s.mode for s in load_log(run_dir / LOG).segments] == [Mode.SEQUENTIAL, Mode.SEQUENTIAL]
    assert resumed.totals.done == 6


def test_a_parallel_run_resumes_at_its_width_and_auto_keeps_its_bound(tmp_path: Path) -> None:
    parallel = _start(tmp_path / "p", "--mode", "parallel", "--width", "2")
    resumed = _resume(parallel)
    assert (resumed.mode, resumed.start_width) == (Mode.PARALLEL, 2)
    auto = _start(tmp_path / "a", "--max-width", "3")
    _resume(auto)
    assert [s.max_limit for s in load_log(auto / LOG).segments] == [3, 3]


def test_a_mode_given_at_the_resume_replaces_the_stored_one(tmp_path: Path) -> None:
    run_dir = _start(tmp_path, "--mode", "parallel", "--width", "2")
    resumed = _resume(run_dir, "--mode", "sequential")
    assert (resumed.mode, resumed.start_width) == (Mode.SEQUENTIAL, 1)
    assert read_manifest(run_dir).mode is Mode.PARALLEL  # what was asked at the start stays recorded


def test_a_run_json_from_before_the_settings_were_stored_resumes_from_its_first_segment(tmp_path: Path) -> None:
    run_dir = _start(tmp_path, "--mode", "parallel", "--width", "2")
    path = run_dir / "run.json"
    doc = json.loads(path.read_text())
    for key in ("mode", "width", "max_width", "api_key_env"):
        del doc[key]
    path.write_text(json.dumps(doc))
    resumed = _resume(run_dir)
    assert (resumed.mode, resumed.start_width) == (Mode.PARALLEL, 2)


def test_a_stored_key_variable_that_is_unset_at_the_resume_is_one_error_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = _start(tmp_path)
    path = run_dir / "run.json"
    doc = json.loads(path.read_text())
    doc.update(url="http://127.0.0.1:9", api_key_env="AGENTLOAD_TEST_KEY", virtual=False)
    path.write_text(json.dumps(doc))
    monkeypatch.delenv("AGENTLOAD_TEST_KEY", raising=False)
    again = CliRunner().invoke(run_app, ["--resume", str(run_dir)])
    assert again.exit_code == 2
    assert "started with --api-key-env AGENTLOAD_TEST_KEY, which is not set now" in again.output
    assert again.output.count("\n") == 1


def _listed(root: Path) -> dict[str, str]:
    from agentload.cli.runs import runs

    app = typer.Typer()
    app.command()(runs)
    listed = CliRunner().invoke(app, ["--root", str(root), "--json"])
    assert listed.exit_code == 0, listed.output
    return {e["id"]: e["status"] for e in json.loads(listed.output)}


def _replayed(run_dir: Path) -> tuple[str | None, str]:
    from agentload.dashboard.replay import open_replay

    replay = open_replay(run_dir)
    summary = replay.at(replay.end)["summary"]
    assert summary["finished"]  # the replay is at its end: the header shows the run's status there
    return summary["status"], summary["status_why"]


def test_a_killed_fleet_is_incomplete_in_the_listing_and_in_its_replay(tmp_path: Path) -> None:
    from agentload.store.manifest import read_info, write_info

    run_dir = _start(tmp_path, "--mode", "parallel", "--width", "2", "--stop-after", "0.5")
    # What a SIGKILL in the first segment leaves: the manifest as created ("running"), the log, no results.json.
    (run_dir / "results.json").unlink()
    info = read_info(run_dir)
    assert info is not None
    write_info(run_dir, info.model_copy(update={"status": "running", "detail": ""}))
    assert _listed(run_dir.parent)[run_dir.name] == "incomplete"
    status, why = _replayed(run_dir)
    assert status == "incomplete"
    assert "wrote no result" in why


def test_a_stopped_and_a_finished_fleet_read_the_same_in_the_listing_and_the_replay(tmp_path: Path) -> None:
    stopped = _start(tmp_path / "s", "--stop-after", "0")
    assert _listed(stopped.parent)[stopped.name] == "interrupted"
    assert _replayed(stopped)[0] == "interrupted"
    _resume(stopped)
    assert _listed(stopped.parent)[stopped.name] == "finished"
    assert _replayed(stopped) == ("finished", "")
