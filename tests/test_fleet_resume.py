"""SIGKILL a running ``agentload run`` and resume it: no turn lost, none repeated.

The run is a real subprocess talking HTTP to a simulator in this process, killed with ``kill -9`` mid-run. The
proof is taken three ways: the log itself (every agent's rounds 0..n-1, each exactly once, read line by line
without the loader's own checks), the server (after the resume it was asked for exactly the turns that were not
committed, and never for one that was), and the transcripts (each turn answers every tool call of the one before,
and each request carried the whole conversation so far).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from agentload.fleet.checkpoint import LOG, load_log
from agentload.sim.server import SimResponse, SimServer
from tests.simserver import running_sim

AGENTS = 8
ROUNDS = 6
FLEET = f"""
[defaults]
system = "You are a test agent."
tools = ["search"]
tool_choice = "required"
max_rounds = {ROUNDS}
max_tokens = 16
think_time_s = 0.3
context_tokens = 400
tool_result_tokens = 30

[[tasks]]
id = "k"
prompt = "I am agent {{agent}}."
count = {AGENTS}
"""
CLI = "import typer; from agentload.cli.run import run; app = typer.Typer(); app.command()(run); app()"
AGENT_RE = re.compile(r"I am agent (k\.\d+)\.")


def _record_requests(server: SimServer, phase: list[str], seen: list[tuple[str, str, int, int]]) -> None:
    """Wrap the server's generation entry point: (phase, agent, round, messages) of every agent turn asked."""
    inner: Callable[..., Awaitable[SimResponse]] = server.open_generation

    async def open_generation(raw: bytes, *, chat: bool) -> SimResponse:
        body: dict[str, Any] = json.loads(raw)
        messages = body.get("messages", [])
        found = next((AGENT_RE.search(str(m.get("content"))) for m in messages if m.get("role") == "user"), None)
        if found:  # the probe's own two tiny requests carry no agent
            rounds = sum(1 for m in messages if m.get("role") == "assistant")
            seen.append((phase[0], found.group(1), rounds, len(messages)))
        return await inner(raw, chat=chat)

    server.open_generation = open_generation  # type: ignore[method-assign]  # an instance-level spy, this test only


async def _spawn(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        CLI,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def _turn_lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b'"kind":"turn"')
    except FileNotFoundError:
        return 0


@pytest.mark.slow
async def test_sigkill_mid_run_then_resume_loses_and_repeats_nothing(tmp_path: Path) -> None:
    fleet = tmp_path / "kill.toml"
    fleet.write_text(FLEET)
    out = tmp_path / "runs"
    phase = ["first"]
    seen: list[tuple[str, str, int, int]] = []
    async with running_sim("llama-8b-h100") as (server, url):
        _record_requests(server, phase, seen)
        args = ["--url", url, "--mode", "parallel", "--width", "4", "--progress", "lines"]
        proc = await _spawn(str(fleet), "--out", str(out), *args)
        # Wait for a third of the turns to be committed, then kill -9 (no cleanup, no flush, no goodbye).
        log: Path | None = None
        for _ in range(600):
            await asyncio.sleep(0.02)
            dirs = list(out.glob("kill-*")) if out.exists() else []
            log = dirs[0] / LOG if dirs else None
            if log is not None and _turn_lines(log) >= AGENTS * ROUNDS // 3:
                break
        assert log is not None
        assert proc.returncode is None, "the run ended before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)
        assert await proc.wait() == -signal.SIGKILL
        run_dir = log.parent
        at_kill = load_log(log, repair=False)
        committed = {(a, t.round) for a, lines in at_kill.turns.items() for t in lines}
        log_at_kill = log.read_bytes()[: len(log.read_bytes()) - at_kill.torn_bytes]
        assert 0 < len(committed) < AGENTS * ROUNDS
        assert any(0 < len(lines) < ROUNDS for lines in at_kill.turns.values()), "an agent was cut mid-way"
        await asyncio.sleep(0.3)  # the server notices the dropped connections and aborts those requests

        phase[0] = "resume"
        proc = await _spawn("--resume", str(run_dir), *args)
        output, _ = await asyncio.wait_for(proc.communicate(), timeout=120)
        assert proc.returncode == 0, output.decode()

    # 1. The log, read line by line: every agent's rounds 0..n-1, each exactly once, and every agent done.
    lines = [json.loads(raw) for raw in log.read_bytes().splitlines()]
    turns = Counter((x["agent"], x["round"]) for x in lines if x["kind"] == "turn")
    assert set(turns) == {(f"k.{i}", r) for i in range(AGENTS) for r in range(ROUNDS)}
    assert set(turns.values()) == {1}
    finished = {x["agent"]: x["outcome"] for x in lines if x["kind"] == "agent"}
    assert finished == {f"k.{i}": "done" for i in range(AGENTS)}
    # What was committed before the kill is still there, byte for byte, ahead of everything written since.
    assert log.read_bytes().startswith(log_at_kill)
    assert [x["segment"] for x in lines if x["kind"] == "segment"] == [0, 1]

    # 2. The server: after the resume it was asked for exactly the turns not committed, never a committed one.
    resumed = [(a, r) for p, a, r, _ in seen if p == "resume"]
    assert not set(resumed) & committed
    assert Counter(resumed) == Counter(set(turns) - committed)

    # 3. The transcripts are whole: each turn answers every tool call of the one before, and each request
    #    carried the system prompt, the task and two messages per earlier round.
    state = load_log(log)
    for agent, agent_lines in state.turns.items():
        prompts = [t.turn.final.prompt_tokens for t in agent_lines]
        assert prompts == sorted(set(prompts)), f"{agent}: the context must grow every turn"
        for t in agent_lines:
            calls = [c["id"] for c in (t.turn.assistant or {}).get("tool_calls", [])]
            assert calls
            assert [m["tool_call_id"] for m in t.turn.tool_results] == calls
    for _, agent, rnd, n_messages in seen:
        assert n_messages == 2 + 2 * rnd, f"{agent} round {rnd} was sent {n_messages} messages"
    results = json.loads((run_dir / "results.json").read_text())
    assert results["totals"]["done"] == AGENTS
    assert all(a["turns"] == ROUNDS and a["stop_reason"] == "round_cap" for a in results["agents"])
