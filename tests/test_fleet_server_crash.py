"""A server that dies mid-run leaves the fleet resumable, and a resume on a healthy server finishes it.

The simulator is a real process on 127.0.0.1 (``agentload sim``), killed with SIGKILL once some turns are
committed — the way the issue's campaign killed a server. The fleet runs in this process through ``run_fleet``,
so the test reads what it returned and what it wrote. Nothing waits on a duration: the kill is triggered by a
count of committed turns, and every wait has a generous deadline only to fail instead of hanging.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import typer
from typer.testing import CliRunner

from agentload.cli.run import run
from agentload.clock import LoopClock
from agentload.endpoint.records import ErrorKind, Outcome, RequestIds, RequestRecord
from agentload.fleet.app import FleetApp, FleetSettings
from agentload.fleet.checkpoint import LOG, RESULTS, CheckpointLog, LogState, load_log
from agentload.fleet.config import expand, parse_fleet
from agentload.fleet.limiter import Limiter, Mode, make_policy
from agentload.fleet.results import FleetResult
from agentload.fleet.runner import FleetRunner, SegmentOutcome

AGENTS = 12
ROUNDS = 4
WIDTH = 4
KILL_AFTER_TURNS = 18  # and one agent finished: past the first WIDTH agents' 16 turns, the next ones have begun
# think_time_s keeps each agent alive for seconds, so the kill lands while most of the fleet is still to run.
FLEET = f"""
name = "crash"

[defaults]
tools = ["search"]
tool_choice = "required"
max_rounds = {ROUNDS}
max_tokens = 8
think_time_s = 0.5
context_tokens = 200
tool_result_tokens = 20

[[tasks]]
id = "c"
prompt = "Crash test agent {{replica}}."
count = {AGENTS}
"""


def _start_sim(tmp_path: Path, name: str) -> tuple[subprocess.Popen[bytes], str]:
    log = tmp_path / f"{name}.log"
    with log.open("wb") as out:  # a file, not a pipe: a full pipe would block the server mid-test
        proc = subprocess.Popen(
            [sys.executable, "-m", "agentload", "sim", "--port", "0", "--profile", "llama-8b-h100"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "COLUMNS": "200"},
        )
    for _ in range(600):
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("Serving "):
                return proc, "http://" + line.split("http://", 1)[1].split()[0]
        if proc.poll() is not None:
            break
        subprocess.run(["sleep", "0.1"], check=True)  # a pause between reads of the log, not a measurement
    proc.kill()
    raise AssertionError(f"the simulator did not start: {log.read_text(errors='replace')}")


def _progress(run_dir: Path | None) -> tuple[int, int]:
    """(turns committed, agents finished) so far."""
    if run_dir is None or not (run_dir / LOG).exists():
        return 0, 0
    state = load_log(run_dir / LOG, repair=False)
    return sum(len(lines) for lines in state.turns.values()), len(state.finished)


async def _crash_run(tmp_path: Path) -> tuple[FleetResult, Path, bytes]:
    fleet = tmp_path / "crash.toml"
    fleet.write_text(FLEET)
    proc, url = _start_sim(tmp_path, "first")
    opts = FleetApp(
        FleetSettings(fleet=fleet, out=tmp_path / "runs", progress="none", url=url, mode=Mode.PARALLEL, width=WIDTH)
    )
    try:
        task = asyncio.create_task(opts.run())
        for _ in range(6000):
            turns, finished = _progress(opts.run_dir)
            if (turns >= KILL_AFTER_TURNS and finished >= 1) or task.done():
                break
            await asyncio.sleep(0.02)
        assert not task.done(), "the run ended before the server could be killed"
        os.kill(proc.pid, signal.SIGKILL)
        killed = time.monotonic()
        result = await asyncio.wait_for(task, timeout=300)
        print(f"from the kill to the end of the run: {time.monotonic() - killed:.1f} s")  # a figure, not asserted
    finally:
        proc.kill()
        proc.wait()
    assert opts.run_dir is not None
    return result, opts.run_dir, (opts.run_dir / LOG).read_bytes()


async def test_a_killed_server_leaves_agents_resumable_and_a_resume_completes_them(tmp_path: Path) -> None:
    crashed, run_dir, log_at_crash = await _crash_run(tmp_path)
    state = load_log(run_dir / LOG, repair=False)
    t = crashed.totals
    print(
        f"after the crash: {t.done} done, {t.interrupted} interrupted, {t.unstarted} unstarted, {t.failed} failed; "
        f"{t.turns} turns committed; {crashed.server_failure}"
    )
    assert crashed.server_failure is not None
    assert t.failed == 0  # the server's failure is nobody's fault: no agent ends failed
    assert not state.finished.keys() - {a.agent_id for a in crashed.agents if a.outcome == "done"}
    assert 0 < t.done < AGENTS
    assert t.interrupted + t.unstarted == AGENTS - t.done
    assert t.unstarted > 0  # agents that never got a slot are still to run
    assert state.interrupts, "the turn the server failed is logged with its attempts"
    for agent, interrupts in state.interrupts.items():
        assert agent not in state.finished
        assert all(not r.ok for x in interrupts for r in x.records)
        assert all(x.round == len(state.turns.get(agent, [])) for x in interrupts)  # the round still to send
    assert crashed.model_dump() == FleetResult.model_validate_json((run_dir / RESULTS).read_text()).model_dump()

    proc, url = _start_sim(tmp_path, "second")
    try:
        resumed = await asyncio.wait_for(
            FleetApp(FleetSettings(resume=run_dir, url=url, progress="none", mode=Mode.PARALLEL, width=WIDTH)).run(),
            timeout=300,
        )
    finally:
        proc.kill()
        proc.wait()
    r = resumed.totals
    print(f"after the resume: {r.done} done, {r.interrupted} interrupted, {r.unstarted} unstarted, {r.failed} failed")
    assert resumed.server_failure is None
    assert (r.done, r.failed, r.unfinished) == (AGENTS, 0, 0)
    assert r.turns == AGENTS * ROUNDS
    # Every turn committed before the crash is still there, byte for byte, ahead of what the resume wrote.
    assert (run_dir / LOG).read_bytes().startswith(log_at_crash)
    after = load_log(run_dir / LOG, repair=False)
    before = {a: [x.turn for x in lines] for a, lines in state.turns.items()}
    for agent, lines in after.turns.items():
        assert [x.round for x in lines] == list(range(ROUNDS))
        assert [x.turn for x in lines[: len(before.get(agent, []))]] == before.get(agent, [])
        # Each turn's conversation is the previous one's plus its reply and tool result: nothing lost or doubled.
        sizes = [x.turn.final.prompt_tokens for x in lines]
        assert all(a < b for a, b in itertools.pairwise(sizes))
        assert all(len(x.turn.tool_results) == 1 for x in lines)
    assert all(a.stop_reason == "round_cap" for a in resumed.agents)
    done_before = {a.agent_id for a in crashed.agents if a.outcome == "done"}
    assert all(a.segments == [0] for a in resumed.agents if a.agent_id in done_before)


app = typer.Typer()
app.command()(run)


def test_the_cli_says_how_to_resume_and_exits_2(tmp_path: Path) -> None:
    fleet = tmp_path / "crash.toml"
    fleet.write_text(FLEET)
    proc, url = _start_sim(tmp_path, "cli")
    runner_args = [str(fleet), "--url", url, "--out", str(tmp_path / "runs"), "--mode", "parallel", "--width", "2"]
    runner_args += ["--progress", "none"]
    killer = subprocess.Popen(  # kills the server once the first turn is committed
        [
            sys.executable,
            "-c",
            "import os, pathlib, signal, sys, time\n"
            "out = pathlib.Path(sys.argv[1])\n"
            "while not any('\"kind\":\"turn\"' in p.read_text() for p in out.glob('*/turns.jsonl')):\n"
            "    time.sleep(0.02)\n"
            "os.kill(int(sys.argv[2]), signal.SIGKILL)\n",
            str(tmp_path / "runs"),
            str(proc.pid),
        ]
    )
    try:
        result = CliRunner().invoke(app, runner_args)
    finally:
        killer.kill()
        proc.kill()
        proc.wait()
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1
    assert "the server failed mid-run" in errors[0]
    assert "continue with: agentload run --resume " in errors[0]
    assert "Traceback" not in result.output


class _ScriptedBackend:
    """Answers every turn at once; the requests whose numbers are in ``fail`` get that record instead."""

    def __init__(self, fail: dict[int, RequestRecord]) -> None:
        self.fail = fail
        self.sent = 0

    async def complete(self, body: Mapping[str, Any], ids: RequestIds) -> list[RequestRecord]:
        self.sent += 1
        number = self.sent
        await asyncio.sleep(0)  # let the other agents' turns interleave, as a real server's would
        failed = self.fail.get(number)
        if failed is not None:
            return [failed.model_copy(update={"ids": ids})]
        return [RequestRecord(ids=ids, t_sent=0.0, t_done=0.0, content=f"answer {number}")]


def _run_scripted(tmp_path: Path, fail: dict[int, RequestRecord]) -> tuple[SegmentOutcome, LogState]:
    fleet = parse_fleet('[defaults]\nmax_rounds = 1\n[[tasks]]\nid = "s"\nprompt = "p {replica}"\ncount = 6\n')
    plans = expand(fleet)
    tmp_path.mkdir()
    log = CheckpointLog(tmp_path / LOG, sync=False)

    async def go() -> SegmentOutcome:
        runner = FleetRunner(
            plans,
            backend=_ScriptedBackend(fail),
            limiter=Limiter(make_policy(Mode.PARALLEL, 2, max_width=6)),
            log=log,
            state=LogState(),
            clock=LoopClock(),
            workspaces=tmp_path / "ws",
            model="m",
        )
        return await runner.run()

    try:
        outcome = asyncio.run(go())
    finally:
        log.close()
    return outcome, load_log(tmp_path / LOG)


def test_a_transient_failure_interrupts_and_a_request_refusal_fails(tmp_path: Path) -> None:
    refused = RequestRecord(
        t_sent=0.0, t_done=0.0, outcome=Outcome.CONNECT_ERROR, error=ErrorKind.CONNECT, error_message="refused"
    )
    outcome, state = _run_scripted(tmp_path / "server", {3: refused})
    assert outcome.server_failure is not None
    assert "connect_error: refused" in outcome.server_failure
    assert all(line.outcome == "done" for line in state.finished.values())  # none failed
    (interrupted,) = state.interrupts
    assert interrupted not in state.finished
    assert interrupted not in state.turns  # its failed turn is not committed: round 0 is sent again on resume
    assert len(state.finished) < 6

    # The server answered, and said no (a 400): that is this agent's failure, and the others go on.
    bad = RequestRecord(
        t_sent=0.0, t_done=0.0, outcome=Outcome.HTTP_ERROR, error=ErrorKind.HTTP_STATUS, http_status=400
    )
    outcome, state = _run_scripted(tmp_path / "agent", {3: bad})
    assert outcome.server_failure is None
    assert sorted(line.outcome for line in state.finished.values()) == ["done"] * 5 + ["failed"]
    assert not state.interrupts
