"""``agentload suite`` as a user runs it: the embedded simulator by default, tables or JSON, one line and exit 2
for a bad flag or a server that answers nothing."""

from __future__ import annotations

import io
import json
import socket
from pathlib import Path

import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

from agentload.agent.loop import AgentSpec, Transcript
from agentload.cli.suite import suite
from agentload.endpoint.redact import redact_url
from agentload.suite.cases import all_tests
from agentload.suite.model import SUITE_VERSION
from agentload.suite.progress import PROGRESS_EVERY_S, LineProgress
from agentload.suite.results import TestResult, load_run
from agentload.suite.runner import DEFAULT_MAX_TOKENS
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
    assert redact_url("https://[::1]:8443/v1") == "https://[::1]:8443/v1"


def test_json_prints_progress_lines_on_stderr_and_the_json_alone_on_stdout(tmp_path: Path) -> None:
    """A long ``--json`` run is seen to move: a line as each level starts and one when its last test is done, on
    stderr; stdout holds the JSON and nothing else."""
    code, out, err = _run("--tests", "T1,T2", "--sweep", "1,2", "--json", "--out", str(tmp_path))
    assert code == 0, err
    data = json.loads(out)  # the whole of stdout is the one JSON document
    assert [level["agents"] for level in data["levels"]] == [1, 2]
    lines = err.splitlines()
    assert "suite: 1 agent × 2 tests started" in lines
    assert "suite: 2 agents × 2 tests started" in lines
    done = [line for line in lines if " tests done, " in line]
    assert done[-1].startswith("suite: 2 agents: 4/4 tests done, 4 passed (")
    assert any(line.startswith("suite: 1 agent: 2/2 tests done, 2 passed (") for line in done)
    # The levels' lines come in the order the levels ran.
    assert lines.index("suite: 1 agent × 2 tests started") < lines.index("suite: 2 agents × 2 tests started")


def _requested(saved: Path) -> set[int | None]:
    run = load_run(saved)
    return {r.requested_tokens for a in run.levels[0].agent_results for t in a.tests for r in t.transcript.records()}


def test_every_turn_asks_for_the_default_output_cap_unless_told_otherwise(tmp_path: Path) -> None:
    """The cap is in every request's body (``max_tokens``, read back from the records the client made of what it
    sent); ``--max-tokens`` replaces it."""
    code, _, err = _run("--tests", "T1,T5", "--json", "--out", str(tmp_path / "default"))
    assert code == 0, err
    (saved,) = (tmp_path / "default").glob("suite-*/suite.json")
    assert _requested(saved) == {DEFAULT_MAX_TOKENS}
    code, _, err = _run("--tests", "T1,T5", "--json", "--max-tokens", "300", "--out", str(tmp_path / "given"))
    assert code == 0, err
    (saved,) = (tmp_path / "given").glob("suite-*/suite.json")
    assert _requested(saved) == {300}


def test_the_help_says_the_default_cap_and_why() -> None:
    result = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200"})
    text = " ".join(result.stdout.split())
    assert f"default {DEFAULT_MAX_TOKENS:,}" in text
    assert "8,106 tokens" in text


def test_line_progress_between_a_levels_ends_is_at_most_one_line_per_period() -> None:
    """Where no bar can redraw, an 800-test level of 100 s prints a line each 10 s, not one a test."""
    assert PROGRESS_EVERY_S == 10.0
    out = Console(file=io.StringIO(), width=200)
    now = [0.0]
    lines = LineProgress(out, now=lambda: now[0])
    lines.level(8, 100)
    test = all_tests()[0]
    spec = AgentSpec(agent_id=f"agent-0/{test.id}", model="m", messages=test.messages())
    passed = TestResult(test_id=test.id, category=test.category, status=Status.PASS, reason="right tool",
                        suite_version=SUITE_VERSION, played_version=SUITE_VERSION, started_s=0.0, duration_s=1.0,
                        transcript=Transcript(agent_id=spec.agent_id, spec=spec))  # fmt: skip
    for _ in range(800):
        now[0] += 0.125  # 100 s in all, in steps a float holds exactly
        lines.test_done(8, passed)
    printed = out.file.getvalue().splitlines()  # type: ignore[attr-defined]
    assert printed[0] == "suite: 8 agents × 100 tests started"
    assert printed[1] == "suite: 8 agents: 80/800 tests done, 80 passed (10 s)"
    assert printed[-1] == "suite: 8 agents: 800/800 tests done, 800 passed (100 s)"
    assert len(printed) == 11  # the start, then one each 10 s; the tenth is the level's end
