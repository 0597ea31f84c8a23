"""``agentload suite`` as a user runs it: the embedded simulator by default, tables or JSON, one line and exit 2
for a bad flag or a server that answers nothing."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from agentload.cli.suite import redact, suite
from agentload.suite.results import load_run
from agentload.suite.scoring import Status

app = typer.Typer()
app.command()(suite)


def _run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "160"})
    return result.exit_code, result.stdout, result.stderr


def test_json_output_and_saved_results(tmp_path: Path) -> None:
    code, out, err = _run("--tests", "T1,t16,H1", "--agents", "2", "--json", "--out", str(tmp_path))
    assert code == 0, err
    data = json.loads(out)
    (level,) = data["levels"]
    assert level["agents"] == 2
    assert level["tests"] == ["T1", "T16", "H1"]
    assert level["pooled_pass_rate"] == 1.0
    assert level["pooled_tests"] == ["T1", "T16"]
    assert "agent_results" not in level  # transcripts go to the run directory, not to stdout
    assert data["endpoint"].startswith("embedded simulator (qwen3-235b-gb300")
    (saved,) = tmp_path.glob("suite-*/suite.json")
    run = load_run(saved)
    results = [t for a in run.levels[0].agent_results for t in a.tests]
    assert len(results) == 6
    assert all(r.status is Status.PASS and r.transcript.turns for r in results)
    assert str(saved) in err.replace("\n", "")


def test_tables_per_agent_count() -> None:
    code, out, err = _run("--tests", "T2,T12", "--sweep", "1,3")
    assert code == 0, err
    assert "1 agent: per-test pass rate" in out
    assert "3 agents: per-test pass rate" in out
    assert out.count("pooled pass rate") == 2
    assert "3/3" in out
    for needle in (
        "agents completed / unscored / failed",
        "3 / 0 / 0",
        "wall clock",
        "median session",
        "sessions per minute",
        "TTFT p50 / p95",
    ):
        assert needle in out


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--tests", "T1,T99"], "unknown test id T99"),
        (["--tests", ","], "--tests is empty"),
        (["--sweep", "1,x,4"], "--sweep '1,x,4'"),
        (["--sweep", "1,0"], "agent counts must be positive"),
        (["--sweep", " , "], "--sweep is empty"),
        (["--agents", "0"], "--agents must be at least 1"),
        (["--agents", "-3"], "--agents must be at least 1"),
        (["--agents", "2", "--sweep", "1,2"], "not both"),
        (["--url", "http://127.0.0.1:9"], "cannot reach http://127.0.0.1:9"),  # asked for the model it serves
        (["--url", "http://127.0.0.1:9", "--model", "m", "--profile", "laptop"], "--profile"),
        (["--profile", "no-such-profile"], "no-such-profile"),
        (["--api-key-env", "AGENTLOAD_SURELY_UNSET_VARIABLE"], "is not set"),
        (["--tests", "H1", "--skip-hop"], "no tests left"),
        (["--payload-tokens", "10"], "at least 1000"),
        (["--max-tokens", "0"], "--max-tokens must be at least 1"),
    ],
)
def test_bad_flags_fail_with_one_line(args: list[str], needle: str) -> None:
    code, out, err = _run(*args)
    assert code == 2, out + err
    assert "Traceback" not in out + err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error:")
    assert needle in lines[0]


def test_out_must_be_a_directory(tmp_path: Path) -> None:
    file = tmp_path / "taken"
    file.write_text("x")
    code, _, err = _run("--tests", "T1", "--out", str(file))
    assert code == 2
    assert "is a file" in err


def test_a_server_that_answers_nothing_is_one_clear_error() -> None:
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there now
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, out, err = _run("--url", f"http://127.0.0.1:{port}", "--model", "m", "--tests", "T1")
    assert code == 2, out + err
    assert "Traceback" not in out + err
    # Refused connections are resent while the dead-server rule cannot yet tell a restart from a dead server; then
    # the rule stops the suite, saying how the server went.
    (line,) = [line for line in err.splitlines() if line.startswith("error:")]
    assert f"http://127.0.0.1:{port} has not answered for 20 s: it refuses connections" in line
    assert "0 / 0 / 1" in out  # the figures are still printed: one agent, its session stopped
    assert "server was lost" in out  # the test cut short is kept, unscored, with why


def test_a_model_the_server_does_not_serve_is_one_clear_error() -> None:
    code, out, err = _run("--model", "no-such-model", "--tests", "T1,T2")
    assert code == 2, out + err
    assert "every request to embedded simulator" in err
    assert "does not exist" in err


def test_credentials_in_the_url_are_never_shown() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://user:hunter2@127.0.0.1:{port}/v1?api_key=sk-abc"
    code, out, err = _run("--url", url, "--model", "m", "--tests", "T1", "--json")
    assert code == 2
    assert "hunter2" not in out + err
    assert "sk-abc" not in out + err
    assert json.loads(out)["endpoint"] == f"http://user:***@127.0.0.1:{port}/v1?api_key=***"
    assert redact("https://[::1]:8443/v1") == "https://[::1]:8443/v1"
