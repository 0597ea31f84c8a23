"""``agentload bench --url … --dashboard``: the live page of a bench run — server timelines, the level table filling
in as levels finish, and the knee search's steps — on the same state, server and page as a fleet's.

The end-to-end tests run ``agentload sim`` and ``agentload bench`` as processes of their own (as a person would),
read the page's URL from the bench's stderr, and compare what the page was sent (or shows) with the
``result.json`` the bench wrote.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from playwright.sync_api import expect, sync_playwright

from agentload.bench.results import LevelSummary
from agentload.bench.search import SearchStep
from agentload.clock import LoopClock
from agentload.dashboard.bench import BenchBoard
from agentload.dashboard.control import FleetControl
from agentload.dashboard.server import Dashboard
from agentload.dashboard.state import BenchView, LiveState
from agentload.endpoint.records import RequestRecord
from tests.simserver import sim_process
from tests.test_report_browser import CHROMIUM, CHROMIUM_ARGS

FAST = "llama-8b-h100"
MODEL_ARGS = ["--workload", "agentic-hold", "--context", "2000", "--find-knee", "--max-agents", "2",
              "--warmup", "2s", "--window", "5s", "--min-turns", "4"]  # fmt: skip


def _summary(level: int, agents: int) -> LevelSummary:
    return LevelSummary(level=level, agents=agents, context=2000, workload="agentic-hold", window_s=5, warmup_s=2,
                        sessions_completed=0, sessions_failed=0, requests_ok=10, requests_failed=0, turns=10,
                        output_tps=12.5 * agents, prefill_tps=1, throughput_source="server")  # fmt: skip


async def test_levels_and_steps_reach_the_snapshot_then_only_new_ones_the_deltas() -> None:
    clock = LoopClock()
    state = LiveState([], clock, fleet="agentic-hold")
    state.bench = BenchView({"mode": "find-knee", "workload": "agentic-hold"})
    board = BenchBoard(state, Dashboard(state, FleetControl(state, clock, max_width=1), controls=False))
    board.level_started(0, 1, 2000, "agentic-hold", 2.0, 5.0)
    board.record(RequestRecord(t_sent=1.0, t_first_token=1.25, t_done=2.0, completion_tokens=7))
    board.record(RequestRecord(t_sent=1.0, t_done=2.0, completion_tokens=9, outcome="http_error"))  # not a turn
    body, cursor = state.snapshot()
    assert body["summary"]["bench"]["current"]["agents"] == 1
    assert (body["levels"], body["steps"], state.turns, state.out_tokens) == ([], [], 1, 7)
    board.level_done(_summary(0, 1))
    board.step(SearchStep("doubling", 1, 2000, False, "", 1, None))
    delta = state.delta(cursor)
    assert delta is not None
    assert [(x["level"], x["agents"], x["output_tps"]) for x in delta["levels"]] == [(0, 1, 12.5)]
    assert [(x["phase"], x["agents"], x["past"]) for x in delta["steps"]] == [("doubling", 1, False)]
    assert delta["summary"]["bench"]["current"] is None
    board.level_started(1, 2, 2000, "agentic-hold", 2.0, 5.0)
    delta = state.delta(cursor)
    assert delta is not None
    assert (delta["levels"], delta["steps"]) == ([], [])  # sent once
    assert delta["summary"]["bench"]["current"]["level"] == 1


@contextmanager
def _bench(tmp_path: Path, url: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``agentload bench --url URL … --dashboard`` in a process of its own: (the process, the page's URL)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentload", "bench", "--url", url, "--model", "meta-llama/Llama-3.1-8B-Instruct",
         *MODEL_ARGS, "--out", str(tmp_path / "runs"), "--json", "--dashboard"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        seen = []
        line = proc.stderr.readline()
        while line and not line.startswith("dashboard: "):
            seen.append(line)
            line = proc.stderr.readline()
        assert line.startswith("dashboard: http://127.0.0.1:"), "".join(seen)
        yield proc, line.split(" ", 1)[1].strip()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=60)


def _result(tmp_path: Path) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(next((tmp_path / "runs").glob("*/result.json")).read_text())
    return result


async def test_a_bench_streams_its_levels_steps_and_server_timelines(tmp_path: Path) -> None:
    with sim_process(FAST) as (_, sim_url), _bench(tmp_path, sim_url) as (proc, page_url):
        base, token = page_url.split("/?token=")
        events: list[tuple[str, dict[str, Any]]] = []
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{base}/api/control", params={"token": token}, json={"action": "pause"}) as r:
                assert r.status == 405  # a bench has no controls
                assert "no controls" in (await r.json())["error"]
            async with session.get(f"{base}/events", params={"token": "wrong"}) as r:
                assert r.status == 403
            async with session.get(f"{base}/events", params={"token": token},
                                   timeout=aiohttp.ClientTimeout(total=300)) as resp:  # fmt: skip
                name = ""
                async for raw in resp.content:
                    line = raw.rstrip(b"\n")
                    if line.startswith(b"event: "):
                        name = line[7:].decode()
                    elif line.startswith(b"data: "):
                        events.append((name, orjson.loads(line[6:])))
                        if name == "end":
                            break
        assert await asyncio.to_thread(proc.wait, 120) == 0
    result = _result(tmp_path)
    assert events[0][0] == "snapshot"
    assert events[-1][0] == "end"
    levels = [row for _, body in events for row in body.get("levels", [])]
    steps = [step for _, body in events for step in body.get("steps", [])]
    points = [p for _, body in events for p in body.get("points", [])]
    assert [(x["level"], x["agents"]) for x in levels] == [(x["level"], x["agents"]) for x in result["levels"]]
    assert [x["output_tps"] for x in levels] == [x["output_tps"] for x in result["levels"]]
    assert [(s["phase"], s["agents"]) for s in steps] == [("doubling", x["agents"]) for x in result["levels"]]
    currents = {body["summary"]["bench"]["current"]["agents"] for _, body in events
                if body.get("summary", {}).get("bench", {}) and body["summary"]["bench"]["current"]}  # fmt: skip
    assert currents <= {1, 2}
    assert currents  # a level was seen running
    # The server's own gauges, from each level's one monitor (drawn; their values are the server's business).
    assert sum(1 for p in points if p["kv"] is not None and p["running"] is not None) >= 2
    assert points[-1]["turns"] > 0


def test_the_dashboard_needs_a_real_time_server(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "agentload", "bench", "--sim", "laptop", "--agents", "1", "--dashboard",
         "--out", str(tmp_path / "runs")],
        capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert proc.returncode == 2
    assert "--dashboard shows a run as it happens" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_a_dashboard_port_in_use_leaves_no_run_directory(tmp_path: Path) -> None:
    with socket.socket() as taken, sim_process(FAST) as (_, sim_url):
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "agentload", "bench", "--url", sim_url, "--model",
             "meta-llama/Llama-3.1-8B-Instruct", *MODEL_ARGS, "--out", str(tmp_path / "runs"), "--dashboard",
             "--dashboard-port", str(port)],
            capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"},
        )  # fmt: skip
    assert proc.returncode != 0
    assert f"the dashboard cannot listen on 127.0.0.1:{port}" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "runs").exists() or not any(p.is_dir() for p in (tmp_path / "runs").iterdir())


@pytest.mark.slow
@pytest.mark.skipif(not CHROMIUM.is_file(), reason=f"Debian's chromium is not installed at {CHROMIUM}")
def test_the_page_fills_the_level_table_and_the_search_steps(tmp_path: Path) -> None:
    console_errors: list[str] = []
    # The browser is up before the bench starts: the bench does not wait for a viewer, and on a busy machine
    # Chromium took longer to launch than the whole two-level run (the page then met a closed port).
    with sync_playwright() as pw, sim_process(FAST) as (_, sim_url):
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
        with _bench(tmp_path, sim_url) as (proc, page_url):
            try:
                page.goto(page_url)
                expect(page.locator("#bench")).to_be_visible(timeout=15_000)
                expect(page.locator("#bench-meta")).to_contain_text("find-knee")
                expect(page.locator("#width-section")).to_be_hidden()  # a bench has no width to set
                expect(page.locator("#controls")).to_be_hidden()
                expect(page.locator("#bench-current")).to_contain_text("measuring level", timeout=30_000)
                # Each level's row once its summary is compiled; each step of the search beside it.
                expect(page.locator("#levels tbody tr")).to_have_count(2, timeout=180_000)
                expect(page.locator("#steps li")).to_have_count(2)
                expect(page.locator("#steps li").first).to_contain_text("doubling: 1 agents")
                expect(page.locator("#conn")).to_have_text("run ended", timeout=60_000)
                kv = page.locator('#c-share polyline[data-key="kv"]').get_attribute("points") or ""
                assert kv.count(",") >= 2  # the server's KV usage over time
                rows = [r.inner_text().split("\t") for r in page.locator("#levels tbody tr").all()]
            finally:
                browser.close()
            assert proc.wait(120) == 0
    result = _result(tmp_path)
    assert [int(r[1]) for r in rows] == [x["agents"] for x in result["levels"]]
    assert [r[3] for r in rows] == [f"{x['output_tps']:.1f}" for x in result["levels"]]
    assert console_errors == []
