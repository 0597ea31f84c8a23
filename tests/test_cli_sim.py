"""``agentload sim`` as a user runs it: a real process on a free loopback port."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentload.cli.main import app

AGENTLOAD = [sys.executable, "-m", "agentload"]


def _start(*args: str) -> tuple[subprocess.Popen[str], list[str], str]:
    proc = subprocess.Popen(
        [*AGENTLOAD, "sim", "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert proc.stdout is not None
    lines: list[str] = []
    # Generous: on a loaded 2-core machine a fresh interpreter importing the package can take tens of seconds.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line.rstrip())
        if line.startswith("Serving "):
            return proc, lines, line.split("http://", 1)[1].split()[0]
    _stop(proc)
    raise AssertionError(f"server did not start: {lines}")


def _stop(proc: subprocess.Popen[str]) -> None:
    """Ctrl-C the server and collect its remaining output (which also closes the pipes)."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()


def test_sim_prints_vllm_capacity_lines_and_serves() -> None:
    proc, lines, address = _start("--profile", "qwen3-235b-gb300")
    try:
        assert "Maximum concurrency for 40,960 tokens per request: 24.36x" in lines
        assert any(line.startswith("GPU KV cache size: ") and line.endswith(" tokens") for line in lines)
        assert address.startswith("127.0.0.1:")
        body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}).encode()
        req = urllib.request.Request(f"http://{address}/v1/chat/completions", data=body, method="POST")
        with urllib.request.urlopen(req, timeout=10) as r:
            assert json.load(r)["usage"]["completion_tokens"] == 3
    finally:
        _stop(proc)
    assert proc.returncode == 0


def test_sim_prints_llama_servers_slot_line_for_a_slot_profile() -> None:
    # A slot profile is served with llama-server's face, so its banner is llama-server's, not vLLM's pool lines.
    proc, lines, _ = _start("--profile", "llamacpp-8b-l40s")
    try:
        assert "load_model: initializing, n_slots = 4, n_ctx_slot = 32768, kv_unified = 'false'" in lines
        assert not any("KV cache size" in line or "Maximum concurrency" in line for line in lines)
    finally:
        _stop(proc)


def test_sim_max_model_len_override_changes_the_concurrency_line() -> None:
    proc, lines, _ = _start("--profile", "qwen3-235b-gb300", "--max-model-len", "8192")
    _stop(proc)
    assert "Maximum concurrency for 8,192 tokens per request: 121.79x" in lines


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--profile", "no-such-profile"], "unknown profile"),
        (["--profile", "/nonexistent/p.toml"], "cannot read profile"),
        (["--fault", "explode:1"], "--fault"),
        (["--known-bad", "shout"], "--behaviour oracle"),
        (["--behaviour", "oracle", "--known-bad", "nope"], "unknown known-bad"),
        (["--max-model-len", "99999999"], "lower it"),
        (["--port", "-1"], "port"),
    ],
)
def test_sim_bad_flags_exit_2_with_one_line(args: list[str], needle: str) -> None:
    result = CliRunner().invoke(app, ["sim", *args])
    assert result.exit_code == 2
    assert needle in result.output
    assert "Traceback" not in result.output


def test_sim_bad_profile_file_names_the_problem(tmp_path: Path) -> None:
    bad = tmp_path / "p.toml"
    bad.write_text('name = "x"\nmodel = "qwen2.5-0.5b"\ngpu = "laptop"\n')
    result = CliRunner().invoke(app, ["sim", "--profile", str(bad)])
    assert result.exit_code == 2
    assert "max_model_len" in result.output
    bad.write_text("name = [unclosed")
    result = CliRunner().invoke(app, ["sim", "--profile", str(bad)])
    assert result.exit_code == 2
    assert "not valid TOML" in result.output


@pytest.mark.parametrize(
    ("host", "warned"),
    [
        ("127.0.0.1", False),
        ("127.0.0.2", False),  # all of 127.0.0.0/8 is this machine's loopback
        ("127.255.255.254", False),
        ("localhost", False),
        ("::1", False),
        ("::ffff:127.0.0.3", False),
        ("0.0.0.0", True),
        ("::", True),
        ("192.168.1.10", True),
        ("10.0.0.1", True),
        ("example.com", True),  # a name may resolve to any interface
    ],
)
def test_sim_warns_only_when_bound_beyond_loopback(monkeypatch: pytest.MonkeyPatch, host: str, warned: bool) -> None:
    from agentload.cli import sim as sim_cli

    served: list[str] = []

    async def no_serve(server: object, host: str, port: int, ready_line: bool = True) -> None:
        served.append(host)  # decided and printed the warning already; nothing is bound

    monkeypatch.setattr(sim_cli, "serve", no_serve)
    result = CliRunner().invoke(app, ["sim", "--host", host, "--port", "0"])
    assert result.exit_code == 0, result.output
    assert served == [host]
    words = " ".join(result.output.split())  # the console wraps a long line at the terminal's width
    assert ("reachable beyond this machine" in words) is warned
