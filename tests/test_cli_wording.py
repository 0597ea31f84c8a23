"""What the commands say: help text shown as written, and the messages that tell a user where a figure came from,
what the command is waiting for and what to do next."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from rich.text import Text
from typer.testing import CliRunner

from agentload.cli.main import app


def _helps(command: Any, path: str) -> Iterator[tuple[str, str]]:
    yield path, command.help or ""
    for param in command.params:
        yield f"{path} {param.name}", getattr(param, "help", None) or ""
    for name, sub in getattr(command, "commands", {}).items():
        yield from _helps(sub, f"{path} {name}")


def test_no_help_text_loses_words_to_rich_markup() -> None:
    # Help is rendered as rich markup: an unescaped "[ray]" or "[default: …]" is read as a tag and vanishes.
    lost = []
    for where, text in _helps(typer.main.get_command(app), "agentload"):
        if Text.from_markup(text).plain != text.replace("\\[", "["):
            lost.append(where)
    assert lost == []


@pytest.mark.parametrize("command", ["run", "bench", "suite"])
def test_the_ray_extra_is_named_whole_in_the_help(command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "300")
    shown = CliRunner().invoke(app, [command, "--help"])
    assert shown.exit_code == 0
    assert "pip install 'agentload[ray]'" in shown.output


QWEN_POOL = [
    *("plan", "--model", "qwen3-235b-a22b", "--gpu", "dgx-station-gb300", "--kv-cache-dtype", "fp8"),
    *("--max-model-len", "40960", "--pool-tokens", "997753"),
]


def test_plan_names_the_flag_a_pool_came_from_and_why_the_logged_one_differs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    shown = CliRunner().invoke(app, [*QWEN_POOL, "--no-curve"])
    assert shown.exit_code == 0, shown.output
    assert "by the profile" not in shown.output
    assert "from --pool-tokens 997,753" in shown.output
    # 997,753 = 62,359 × 16 + 9: vLLM's pool is whole 16-token blocks, so it logs 997,744.
    assert "9 under --pool-tokens 997,753: vLLM counts whole 16-token blocks (62,359 × 16)" in shown.output
    assert "GPU KV cache size: 997,744 tokens" in shown.output


def test_plan_without_the_curve_lists_no_simulated_figure() -> None:
    shown = CliRunner().invoke(app, [*QWEN_POOL, "--no-curve", "--json"])
    assert shown.exit_code == 0, shown.output
    doc = json.loads(shown.output)
    assert doc["curve"] is None
    assert [d["figure"] for d in doc["derivations"] if d["kind"] == "simulated"] == []
    assert doc["pool"]["logged_differs"].startswith("9 under")
    text = CliRunner().invoke(app, [*QWEN_POOL, "--no-curve"])
    assert "throughput curve" not in text.output


def test_plan_of_a_whole_pool_says_nothing_differs() -> None:
    shown = CliRunner().invoke(app, [*QWEN_POOL[:-1], "997744", "--no-curve", "--json"])
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.output)["pool"]["logged_differs"] == ""


def _piped(args: list[str], columns: int) -> str:
    """The command's stdout through a pipe, as a shell gives it with COLUMNS set."""
    env = {**os.environ, "COLUMNS": str(columns)}
    done = subprocess.run(
        [sys.executable, "-m", "agentload", *args], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_profiles_show_every_name_whole_in_80_columns() -> None:
    from agentload.capacity.profile import builtin_profiles, load_profile

    shown = _piped(["profiles"], 80)
    assert "…" not in shown
    assert max(len(line) for line in shown.splitlines()) <= 80
    words = shown.split()
    for name in builtin_profiles():
        assert name in words, name  # on one line, not folded
        profile = load_profile(name)
        assert f"{profile.pool_tokens:,}" in words
        assert f"{profile.max_concurrency:.2f}x" in words


def test_a_piped_bench_keeps_to_columns(tmp_path: Path) -> None:
    args = ["bench", "--sim", "laptop", "--context", "4096", "--agents", "1", "--warmup", "1s", "--window", "5s"]
    shown = _piped([*args, "--out", str(tmp_path)], 80)
    table = shown.split("╭", 1)[0]
    assert max(len(line) for line in table.splitlines()) <= 80
    assert "…" not in table


def test_the_model_to_request_is_the_given_one_else_the_servers_only_one() -> None:
    from agentload.endpoint.probe import ProbeResult, served_model
    from agentload.errors import ConfigError

    def served(*models: str) -> ProbeResult:
        return ProbeResult(url="http://127.0.0.1:1", engine="vllm", models=list(models))

    assert served_model(served("a", "b"), "b") == "b"
    assert served_model(served("only"), None) == "only"
    with pytest.raises(ConfigError, match=r"serves 2 models \(a, b\): name one with --model"):
        served_model(served("a", "b"), None)
    with pytest.raises(ConfigError, match="lists no model on /v1/models: name the one to request with --model"):
        served_model(served(), None)


async def test_bench_url_without_model_requests_the_one_the_server_serves(tmp_path: Path) -> None:
    import asyncio

    from agentload.bench.results import RunResult
    from tests.simserver import running_sim

    async with running_sim("laptop") as (server, url):
        args = ["bench", "--url", url, "--context", "2000", "--agents", "1", "--warmup", "1s", "--window", "3s",
                "--out", str(tmp_path), "--json"]  # fmt: skip
        done = await asyncio.to_thread(CliRunner().invoke, app, args)
    assert done.exit_code == 0, done.output
    run = RunResult.model_validate_json(done.stdout)
    assert run.model == server.model_name
    assert run.levels[0].requests_ok > 0


def test_bench_says_what_it_waits_for_and_names_wait_ready(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there now
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = ["bench", "--url", f"http://127.0.0.1:{port}", "--agents", "1", "--wait-ready", "1s"]
    done = subprocess.run([sys.executable, "-m", "agentload", *args, "--out", str(tmp_path)], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "COLUMNS": "400"})  # fmt: skip
    assert done.returncode == 2, done.stderr
    first, *_ = done.stderr.splitlines()
    assert first.startswith(f"waiting up to 1 s for http://127.0.0.1:{port} to come up: not answering")
    assert "--wait-ready sets how long to wait" in first
    (error,) = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert "--wait-ready" in error


def test_calibrate_off_a_terminal_says_each_phase_and_then_every_ten_seconds() -> None:
    import io

    from rich.console import Console

    from agentload.report.calibrateview import LineProgress

    now = [0.0]
    err = io.StringIO()
    sink = LineProgress(Console(file=err, width=200), clock=lambda: now[0])
    sink.phase("reading the server", 1)
    assert err.getvalue() == ""  # nothing before the server has answered: a wrong URL stays one error line
    sink.advance()
    sink.phase("TTFT against prompt length", 30)
    for _ in range(30):
        now[0] += 1.5  # 45 s of measuring: a line at 10.5, 21, 31.5 and 42 s
        sink.advance()
    lines = err.getvalue().splitlines()
    assert lines[:2] == [
        "calibrate: reading the server: 1 measurement (0 s)",
        "calibrate: TTFT against prompt length: 30 measurements (0 s)",
    ]
    assert lines[2:] == [
        "calibrate: TTFT against prompt length: 7 of 30 (10 s)",
        "calibrate: TTFT against prompt length: 14 of 30 (21 s)",
        "calibrate: TTFT against prompt length: 21 of 30 (32 s)",
        "calibrate: TTFT against prompt length: 28 of 30 (42 s)",
    ]
