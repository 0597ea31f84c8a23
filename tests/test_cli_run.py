"""``agentload run``: one clear line and exit 2 for every mistake, JSON out, resume, on a local Typer app."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from agentload.cli.run import run
from agentload.fleet.config import expand, load_fleet
from agentload.fleet.results import FleetResult

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
app = typer.Typer()
app.command()(run)

SMALL = """
[defaults]
tools = ["search"]
tool_choice = "required"
max_rounds = 2
max_tokens = 8
context_tokens = 100

[[tasks]]
id = "t"
prompt = "Task {replica}."
count = 3
"""


def _fleet(tmp_path: Path, text: str = SMALL) -> Path:
    path = tmp_path / "fleet.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[tasks]\n", "not valid TOML"),
        ('[[tasks]]\nid = "a"\nprompt = "p"\ntools = ["rm"]\n', "unknown tool 'rm'"),
        ('[[tasks]]\nid = "a"\nprompt = "p"\ndepends_on = ["a"]\n', "dependency cycle: a → a"),
        ('[[tasks]]\nid = "a"\nprompt = "p"\ndepends_on = ["b"]\n', "depends on 'b', which no task defines"),
    ],
)
def test_a_bad_fleet_file_is_one_line_and_exit_2(tmp_path: Path, text: str, message: str) -> None:
    result = CliRunner().invoke(app, [str(_fleet(tmp_path, text)), "--out", str(tmp_path / "runs"), "--virtual"])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("error: ")
    assert message in lines[0]
    assert not (tmp_path / "runs").exists()  # nothing is created for a fleet that cannot run


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "give a FLEET.toml to run, or --resume RUN_DIR"),
        (["FLEET", "--mode", "parallel"], "--mode parallel needs --width N"),
        (["FLEET", "--mode", "sequential", "--width", "3"], "--width does not apply to --mode sequential"),
        (["FLEET", "--virtual", "--url", "http://127.0.0.1:9"], "--virtual runs the embedded simulator"),
        (["--resume", "NOWHERE"], "is not a run directory"),
        (["FLEET", "--progress", "fancy"], "--progress 'fancy'"),
    ],
)
def test_bad_flags_are_one_line_and_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    fleet = str(_fleet(tmp_path))
    argv = [fleet if a == "FLEET" else str(tmp_path / "nowhere") if a == "NOWHERE" else a for a in args]
    result = CliRunner().invoke(app, [*argv, "--out", str(tmp_path / "runs")])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert result.output.count("\n") == 1


def test_a_simulated_run_prints_json_and_resumes_as_a_no_op(tmp_path: Path) -> None:
    fleet = _fleet(tmp_path)
    out = tmp_path / "runs"
    result = CliRunner().invoke(app, [str(fleet), "--virtual", "--json", "--out", str(out), "--profile", "laptop"])
    assert result.exit_code == 0, result.output
    # stderr notes (the starting width and why) come first; the JSON document is the rest.
    doc = result.output[result.output.index("{") :]
    parsed = FleetResult.model_validate_json(doc)
    assert parsed.totals.done == 3
    assert parsed.totals.turns == 6
    assert parsed.mode.value == "auto"
    assert "pool ÷ planned context" in parsed.start_reason
    run_dir = out / parsed.run_id
    assert json.loads((run_dir / "results.json").read_text())["run_id"] == parsed.run_id
    # Resuming a finished run sends nothing and changes no turn.
    before = (run_dir / "turns.jsonl").read_text().count('"kind":"turn"')
    again = CliRunner().invoke(app, ["--resume", str(run_dir), "--json"])
    assert again.exit_code == 0, again.output
    resumed = FleetResult.model_validate_json(again.output[again.output.index("{") :])
    assert resumed.totals.done == 3
    assert [s.turns for s in resumed.segments] == [6, 0]
    assert (run_dir / "turns.jsonl").read_text().count('"kind":"turn"') == before


def test_json_prints_the_progress_on_stderr_and_the_json_alone_on_stdout(tmp_path: Path) -> None:
    """``--json`` moves the progress lines to stderr rather than silencing them: a long run is seen to move, and
    stdout is one JSON document."""
    fleet = _fleet(tmp_path)
    argv = [str(fleet), "--virtual", "--json", "--out", str(tmp_path / "runs"), "--profile", "laptop"]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    parsed = FleetResult.model_validate_json(result.stdout)  # the whole of stdout
    assert parsed.totals.done == 3
    done = [line.split() for line in result.stderr.splitlines() if line.lstrip().startswith("done ")]
    assert sorted(words[1] for words in done) == sorted(f"{a.agent_id}:" for a in parsed.agents)
    quiet = CliRunner().invoke(app, [*argv, "--progress", "none"])
    assert quiet.exit_code == 0, quiet.output
    assert not [line for line in quiet.stderr.splitlines() if line.lstrip().startswith("done ")]


def test_resume_refuses_a_different_fleet(tmp_path: Path) -> None:
    fleet = _fleet(tmp_path)
    out = tmp_path / "runs"
    first = CliRunner().invoke(app, [str(fleet), "--virtual", "--json", "--out", str(out), "--stop-after", "0"])
    assert first.exit_code == 0, first.output
    run_dir = next(out.iterdir())
    other = tmp_path / "other.toml"
    other.write_text(SMALL.replace("count = 3", "count = 4"))
    result = CliRunner().invoke(app, [str(other), "--resume", str(run_dir)])
    assert result.exit_code == 2
    assert "is not the fleet" in result.output


def test_the_summary_table_names_the_width_and_the_results_file(tmp_path: Path) -> None:
    fleet = _fleet(tmp_path)
    result = CliRunner().invoke(
        app, [str(fleet), "--virtual", "--mode", "parallel", "--width", "2", "--out", str(tmp_path / "r")]
    )
    assert result.exit_code == 0, result.output
    assert "3 done, 0 failed" in result.output
    assert "started at 2: the requested width 2" in result.output
    assert "results.json" in result.output


def test_an_unreachable_server_is_one_line_and_leaves_no_run_directory(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there now
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "runs"
    result = CliRunner().invoke(app, [str(_fleet(tmp_path)), "--url", f"http://127.0.0.1:{port}", "--out", str(out)])
    assert result.exit_code == 2
    assert "cannot reach" in result.output
    assert result.output.count("\n") == 1
    assert not out.exists() or not any(out.iterdir())


def test_the_example_fleets_load_and_plan() -> None:
    for path in sorted(EXAMPLES.glob("*.toml")):
        plans = expand(load_fleet(path))
        assert plans, path
