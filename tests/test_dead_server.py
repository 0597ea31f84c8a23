"""bench and suite notice a killed or frozen server, stop, save what they collected and exit 2.

The end-to-end tests run the commands as a user does: the simulator in its own process on 127.0.0.1, killed
(SIGKILL) or frozen (SIGSTOP: the kernel still accepts connections, nothing answers) once the command has
collected something. They assert what was saved and that the process ended; the seconds from the fault to the exit
are printed (run with ``-s``) — the 30 s goal is a measured figure, not a timed assertion, so the outer timeout is
generous.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractContextManager, asynccontextmanager, contextmanager
from pathlib import Path

import pytest

from agentload.bench.analysis import LevelData, summarise
from agentload.bench.orchestrate import measure_token_sizing
from agentload.bench.runner import run_level
from agentload.bench.sampler import MetricsSampler
from agentload.bench.target import Target
from agentload.clock import LoopClock, run_virtual
from agentload.endpoint.liveness import ServerLiveness, wait_until_up
from agentload.endpoint.signals import SignalPoller
from agentload.endpoint.transport import AiohttpTransport, ConnectTimedOut, MockRequest, MockResponse, MockTransport
from agentload.errors import EndpointTimeoutError, ServerLostError
from agentload.workload.registry import get_workload
from tests.simserver import sim_process

AGENTLOAD = [sys.executable, "-m", "agentload"]
MODEL = "Qwen/Qwen2.5-0.5B-Instruct"  # the laptop profile's model
ENDED_WITHIN_S = 90.0  # the test fails if the command is still running this long after the fault


# -- a frozen server: accepts connections, reads what is sent, never answers ------------------------------------
@asynccontextmanager
async def frozen_server() -> AsyncIterator[str]:
    held: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        with_data = await reader.read(65536)
        del with_data  # read and ignored: the point is that no byte goes back

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        for w in held:
            w.close()
        server.close()
        await server.wait_closed()


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Dead:
    """A dead-server rule that says "dead" from the start."""

    def server_dead(self) -> bool:
        return True


async def test_a_scrape_of_a_frozen_server_gives_up_instead_of_hanging() -> None:
    async with frozen_server() as url:
        transport = AiohttpTransport()
        # The level's timeline scrapes through the connection's one monitor, whose deadline is the poll's.
        sampler = MetricsSampler(SignalPoller(url, transport=transport, timeout_s=0.5))
        try:
            got = await asyncio.wait_for(sampler.sample_once(), timeout=30.0)
        finally:
            await transport.aclose()
    assert got is None
    assert (sampler.failures, len(sampler.samples)) == (1, 0)


async def test_liveness_tells_a_frozen_server_from_a_killed_one() -> None:
    clock = LoopClock()
    async with frozen_server() as url:
        poller = SignalPoller(url, clock=clock)
        try:
            frozen = await ServerLiveness(_Dead(), poller, clock).wait_lost()
        finally:
            await poller.stop()
    poller = SignalPoller(f"http://127.0.0.1:{_closed_port()}", clock=clock)
    try:
        killed = await ServerLiveness(_Dead(), poller, clock).wait_lost()
    finally:
        await poller.stop()
    assert "answers nothing" in frozen
    assert "refuses connections" in killed


async def test_liveness_does_not_call_a_connect_that_timed_out_a_refusal() -> None:
    """A frozen server whose backlog is full drops new connections: they time out, which is not a refusal."""

    async def handler(req: MockRequest) -> MockResponse:
        raise ConnectTimedOut("connect timed out")

    poller = SignalPoller("http://mock.invalid", transport=MockTransport(handler), clock=LoopClock())
    said = await ServerLiveness(_Dead(), poller, LoopClock()).describe()
    assert "answers nothing" in said
    assert "refuses" not in said


async def test_liveness_waits_while_the_rule_says_alive() -> None:
    class _DeadAfter:
        def __init__(self, n: int) -> None:
            self.asked = 0
            self.n = n

        def server_dead(self) -> bool:
            self.asked += 1
            return self.asked > self.n

    rule = _DeadAfter(3)
    clock = LoopClock()
    poller = SignalPoller(f"http://127.0.0.1:{_closed_port()}", clock=clock)
    try:
        await ServerLiveness(rule, poller, clock, check_s=0.01).wait_lost()
    finally:
        await poller.stop()
    assert rule.asked == 4  # three "alive" answers waited through, the fourth ends it


def _warming_transport(ready_after: int) -> tuple[MockTransport, list[int]]:
    """/health answers 503 (loading) for the first ``ready_after`` polls, then 200."""
    polls = [0]

    async def handler(req: MockRequest) -> MockResponse:
        if req.url.endswith("/health"):
            polls[0] += 1
            return MockResponse(status=200 if polls[0] > ready_after else 503)
        return MockResponse(status=404)

    return MockTransport(handler), polls


async def test_a_warming_server_is_waited_for_and_the_wait_is_reported() -> None:
    transport, polls = _warming_transport(ready_after=4)
    poller = SignalPoller("http://127.0.0.1:9", transport=transport, interval_s=0.02, engine="vllm")
    lines: list[str] = []
    await wait_until_up(poller, 60.0, report=lines.append, every_s=0.03)
    assert polls[0] == 5  # returned at the first ready answer
    assert lines[0] == "waiting up to 60 s for http://127.0.0.1:9 to come up: not ready"
    assert all("not ready" in line for line in lines)


async def test_a_server_that_is_up_is_not_waited_for() -> None:
    transport, polls = _warming_transport(ready_after=0)
    poller = SignalPoller("http://127.0.0.1:9", transport=transport, interval_s=0.02, engine="vllm")
    lines: list[str] = []
    await wait_until_up(poller, 60.0, report=lines.append)
    assert (polls[0], lines) == (1, [])


async def test_a_server_that_never_comes_up_is_a_timeout_naming_its_state() -> None:
    transport, _ = _warming_transport(ready_after=10**9)
    poller = SignalPoller("http://127.0.0.1:9", transport=transport, interval_s=0.02, engine="vllm")
    with pytest.raises(EndpointTimeoutError, match=r"still not ready after 0\.1 s"):
        await wait_until_up(poller, 0.1, report=lambda _: None, every_s=0.05)


# -- end to end: the commands against a simulator process that dies or freezes ----------------------------------
def simulator(*extra: str) -> AbstractContextManager[tuple[subprocess.Popen[str], str]]:
    return sim_process("laptop", *extra)


def _fault(sim: subprocess.Popen[str], how: str) -> None:
    os.kill(sim.pid, signal.SIGKILL if how == "kill" else signal.SIGSTOP)


def _wait_for(check: object, what: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]  # a zero-argument predicate
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def _successes(url: str) -> float:
    """The simulator's count of completed requests (``vllm:request_success_total``, all reasons)."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("vllm:request_success"))


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.is_file() else 0


def _end(proc: subprocess.Popen[str], faulted_at: float) -> tuple[str, float]:
    try:
        _, err = proc.communicate(timeout=ENDED_WITHIN_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise AssertionError(f"still running {ENDED_WITHIN_S:g} s after the server was stopped") from None
    return err, time.monotonic() - faulted_at


@pytest.mark.slow
@pytest.mark.parametrize("how", ["kill", "freeze"])
def test_bench_stops_on_a_lost_server_and_saves_an_incomplete_result(tmp_path: Path, how: str) -> None:
    root = tmp_path / "runs"
    with simulator() as (sim, url):
        args = ["bench", "--url", url, "--model", MODEL, "--workload", "agentic", "--context", "2000", "--agents",
                "2", "--warmup", "1s", "--window", "300s", "--out", str(root)]  # fmt: skip
        proc = subprocess.Popen([*AGENTLOAD, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "COLUMNS": "400"})  # fmt: skip
        # Fault the server once the run has something to lose: records on disk, past the first quiet edge.
        _wait_for(lambda: sum(_lines(p) for p in root.glob("*/records.jsonl")) >= 8, "the first records")
        _fault(sim, how)
        faulted = time.monotonic()
        err, took = _end(proc, faulted)
    print(f"\nbench, server {how}: exit {proc.returncode} {took:.1f} s after the fault")
    assert proc.returncode == 2, err
    error_lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1, err
    assert ("refuses connections" if how == "kill" else "answers nothing") in error_lines[0]
    assert "Traceback" not in err
    (run_dir,) = [p for p in root.iterdir() if p.is_dir()]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["incomplete"]
    assert "has not answered" in result["incomplete"]
    assert _lines(run_dir / "records.jsonl") >= 8
    assert _lines(run_dir / "samples.jsonl") >= 1
    assert result["levels"]
    assert "stopped early" in " ".join(result["levels"][-1]["warnings"])
    # An incomplete run is kept on disk but not indexed among the finished ones.
    history = root / "history.sqlite"
    if history.exists():
        with sqlite3.connect(history) as conn:
            assert conn.execute("SELECT count(*) FROM runs").fetchone()[0] == 0


@pytest.mark.slow
@pytest.mark.parametrize("how", ["kill", "freeze"])
def test_suite_stops_on_a_lost_server_and_saves_the_finished_tests(tmp_path: Path, how: str) -> None:
    root = tmp_path / "runs"
    progress = tmp_path / "progress.json"
    with simulator() as (sim, url):
        args = ["suite", "--url", url, "--model", MODEL, "--agents", "2", "--out", str(root), "--json"]
        with progress.open("w") as out:
            proc = subprocess.Popen([*AGENTLOAD, *args], stdout=out, stderr=subprocess.PIPE, text=True)
            # The suite saves only at the end; the fault comes once the server has completed enough requests
            # (its own counter) that each agent has finished a test or more.
            _wait_for(lambda: _successes(url) >= 20, "20 completed requests")
            _fault(sim, how)
            faulted = time.monotonic()
            err, took = _end(proc, faulted)
    print(f"\nsuite, server {how}: exit {proc.returncode} {took:.1f} s after the fault")
    assert proc.returncode == 2, err
    error_lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1, err
    assert ("refuses connections" if how == "kill" else "answers nothing") in error_lines[0]
    (saved,) = root.glob("suite-*/suite.json")
    run = json.loads(saved.read_text())
    assert run["incomplete"]
    assert "has not answered" in run["incomplete"]
    sessions = run["levels"][0]["agent_results"]
    assert len(sessions) == 2
    assert sum(len(s["tests"]) for s in sessions) >= 1  # what was finished before the fault is kept


# -- item 5: a server still warming up ---------------------------------------------------------------------------
def test_a_level_measured_on_a_warming_server_says_so() -> None:
    """/health says "loading" the whole level and every turn gets a 503: a 0 tok/s level, with the reason beside it."""

    async def handler(req: MockRequest) -> MockResponse:
        return MockResponse(status=503)  # /health, /metrics and every chat request alike

    target = Target(MockTransport(handler), "http://mock.invalid", "m", "mock", virtual=True)

    async def level() -> LevelData:
        return await run_level(target, get_workload("synthetic"), agents=1, context=1024, level=0, run_id="r",
                               run_t0=LoopClock().now(), warmup_s=2.0, window_s=10.0, grace_s=5.0)  # fmt: skip

    data: LevelData = run_virtual(level())
    summary = summarise(data)
    assert data.lost is None  # a server that answers, even "not ready", is not lost
    assert summary.output_tps == 0
    assert any("warming up" in w for w in summary.warnings)


def test_bench_on_a_port_nothing_listens_on_waits_its_bound_then_exits_2(tmp_path: Path) -> None:
    port = _closed_port()
    args = ["bench", "--url", f"http://127.0.0.1:{port}", "--model", "m", "--agents", "1", "--wait-ready", "2s",
            "--out", str(tmp_path / "runs")]  # fmt: skip
    done = subprocess.run([*AGENTLOAD, *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert [line for line in done.stderr.splitlines() if line.startswith("error:")] == [
        f"error: http://127.0.0.1:{port} is still not answering after 2 s of waiting for it to come up: check the "
        "URL and port, or wait longer for a server still loading with --wait-ready"
    ]
    assert not (tmp_path / "runs").exists()  # no run, no history row


@pytest.mark.slow
def test_bench_waits_for_a_server_that_comes_up_late_then_measures(tmp_path: Path) -> None:
    """Refused at first (nothing listens yet), then a 3 s cold start, then up: bench waits, says so, measures."""
    root = tmp_path / "runs"
    port = _closed_port()
    args = ["bench", "--url", f"http://127.0.0.1:{port}", "--model", MODEL, "--workload", "agentic", "--context",
            "2000", "--agents", "1", "--warmup", "1s", "--window", "4s", "--out", str(root)]  # fmt: skip
    proc = subprocess.Popen([*AGENTLOAD, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "COLUMNS": "400"})  # fmt: skip
    assert proc.stderr is not None
    first = proc.stderr.readline()  # the server starts only once bench has said it is waiting
    sim = subprocess.Popen([*AGENTLOAD, "sim", "--port", str(port), "--profile", "laptop", "--cold-start", "3"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        _, rest = proc.communicate(timeout=300)
    finally:
        sim.kill()
        sim.communicate(timeout=30)
    assert proc.returncode == 0, first + rest
    assert first.startswith(f"waiting up to 120 s for http://127.0.0.1:{port} to come up: not answering")
    (result,) = root.glob("*/result.json")
    assert json.loads(result.read_text())["levels"][0]["output_tps"] > 0


@contextmanager
def model_less_server() -> Iterator[str]:
    """A server that lists no models (so nothing can be checked up front) and answers every chat with a 404."""
    from aiohttp import web

    async def chat(_: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "The model does not exist.", "code": 404}}, status=404)

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/health", health)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app, access_log=None)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = runner.addresses[0][1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)
        loop.close()


def test_a_bench_in_which_no_request_succeeds_exits_2_and_adds_nothing_to_the_history(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    with model_less_server() as url:
        args = ["bench", "--url", url, "--model", "no-such-model", "--workload", "agentic", "--context", "2000",
                "--agents", "1", "--warmup", "1s", "--window", "3s", "--out", str(root)]  # fmt: skip
        done = subprocess.run([*AGENTLOAD, *args], capture_output=True, text=True, timeout=300,
                              env={**os.environ, "COLUMNS": "400"})  # fmt: skip
    assert done.returncode == 2, done.stderr
    (error,) = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert "succeeded" in error
    assert "The model does not exist" in error
    (run_dir,) = root.iterdir()
    assert _lines(run_dir / "records.jsonl") >= 1  # what failed stays on disk
    assert not (run_dir / "result.json").exists()
    assert not (root / "history.sqlite").exists()


def test_a_server_frozen_before_the_first_level_is_a_lost_server_not_a_sizing_note() -> None:
    """Token sizing is the first load bench sends; on a server that froze after the probe it must not wait 300 s."""

    async def never(_: MockRequest) -> MockResponse:
        await asyncio.sleep(10**6)  # accepts, answers nothing: every request and poll hangs
        raise AssertionError("unreachable")

    target = Target(MockTransport(never), "http://mock.invalid", "m", "mock", virtual=True)

    async def size() -> float:
        started = LoopClock().now()
        with pytest.raises(ServerLostError, match=r"before the first level: .* has not answered for"):
            await measure_token_sizing(target, seed=0)
        return LoopClock().now() - started

    took = run_virtual(size())
    assert took < 60  # simulated seconds: the dead-server rule's 20 s, not the 300 s first-token deadline
