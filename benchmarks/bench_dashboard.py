"""The dashboard at 1,000 agents: its update rate, the client CPU it adds, and the browser tab's frame time.

The same fleet (``--agents`` one-task agents, ``--rounds`` tool-calling turns, ``--think`` s between turns,
``--width`` of them at once, all by default: ``--mode parallel --width N``) runs against the simulator in a
separate process (``simproc``: only the client is in this process), three times:

1. without ``--dashboard`` — the baseline client CPU (user + system seconds of this process);
2. with ``--dashboard`` and one event-stream reader in this process (so its parsing counts against the
   dashboard) — the client CPU again, the share it adds, and the deltas a second the reader got
   (1 and 2 run twice, in the order 1 2 2 1, and are averaged);
3. with ``--dashboard`` and the page open in headless Chromium (Debian's, via Playwright; skipped when absent) —
   the deltas a second the page received and its frame times (``requestAnimationFrame`` intervals: p50, p95, max).

    .venv/bin/python benchmarks/bench_dashboard.py                   # 1,000 agents × 4 rounds, 2 s think
    .venv/bin/python benchmarks/bench_dashboard.py --agents 1000 --width 300   # a 2-core machine's simulator
    .venv/bin/python benchmarks/bench_dashboard.py --agents 200 --no-browser
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from agentload.cli.run import RunOptions, run_fleet
from agentload.fleet.limiter import Mode
from agentload.fleet.results import FleetResult

sys.path.insert(0, str(Path(__file__).resolve().parent))
from simproc import fast_profile, sim_process

FLEET = """
name = "dash-bench"
[defaults]
tools = ["search"]
tool_choice = "required"
max_rounds = {rounds}
max_tokens = 32
think_time_s = {think}
context_tokens = 500
tool_result_tokens = 60

[[tasks]]
id = "a"
prompt = "Work item {{replica}}."
count = {agents}
"""

# Counts the page's delta events and its frame intervals, injected before the page's own script runs.
PROBE = """
window.__deltas = 0; window.__frames = [];
const Native = window.EventSource;
window.EventSource = class extends Native {
  constructor(url) { super(url); this.addEventListener("delta", () => { window.__deltas++; }); }
};
let last = 0;
function tick(t) { if (last) window.__frames.push(t - last); last = t; requestAnimationFrame(tick); }
requestAnimationFrame(tick);
"""


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _opts(fleet: Path, out: Path, url: str, width: int, dashboard: bool) -> RunOptions:
    return RunOptions(fleet=fleet, out=out, url=url, mode=Mode.PARALLEL, width=width, progress="none",
                      dashboard=dashboard, fsync=False)  # fmt: skip


async def _read_stream(opts: RunOptions, counts: dict[str, float], gaps: list[float]) -> None:
    while opts.dashboard_url is None:  # noqa: ASYNC110  (run_fleet sets it; there is no event to wait on)
        await asyncio.sleep(0.01)
    base, token = opts.dashboard_url.split("/?token=")
    async with aiohttp.ClientSession() as session, session.get(f"{base}/events", params={"token": token}) as resp:
        first = last = None
        changed_at: float | None = None  # when the last delta that carried an agent's change arrived
        try:
            async for line in resp.content:
                if line.startswith(b"event: delta"):
                    counts["deltas"] += 1
                    last = time.monotonic()
                    first = first or last
                elif line.startswith(b"data: "):
                    counts["bytes"] += len(line)
                    if last is not None and orjson.loads(line[6:]).get("agents"):
                        if changed_at is not None:
                            gaps.append(last - changed_at)
                        changed_at = last
                elif line.startswith(b"event: end"):
                    return
        finally:
            if first is not None and last is not None:
                counts["span"] += last - first  # summed over the runs, as the deltas are


async def _with_reader(opts: RunOptions, counts: dict[str, float], gaps: list[float]) -> FleetResult:
    reader = asyncio.ensure_future(_read_stream(opts, counts, gaps))
    try:
        return await run_fleet(opts)
    finally:
        await asyncio.wait_for(reader, 10)


def _browser_pass(opts: RunOptions) -> dict[str, Any] | None:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    chromium = Path("/usr/bin/chromium")
    if not chromium.is_file():
        return None
    args = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"]  # fmt: skip
    result: dict[str, Any] = {}
    run = threading.Thread(target=lambda: result.update(run=asyncio.run(run_fleet(opts))), daemon=True)
    run.start()
    while opts.dashboard_url is None:
        time.sleep(0.01)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(chromium), args=args, headless=True)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.add_init_script(PROBE)
        page.goto(opts.dashboard_url)
        page.wait_for_selector(".card", timeout=30_000)
        t0 = time.monotonic()
        d0 = page.evaluate("window.__deltas")
        page.evaluate("window.__frames = []")
        run.join()
        span = time.monotonic() - t0
        deltas = page.evaluate("window.__deltas") - d0
        frames: list[float] = page.evaluate("window.__frames")
        cards = page.locator(".card").count()
        browser.close()
    frames.sort()
    result.update(
        deltas_per_s=deltas / span if span > 0 else 0.0,
        cards=cards,
        frame_p50=statistics.median(frames) if frames else None,
        frame_p95=frames[int(0.95 * (len(frames) - 1))] if frames else None,
        frame_max=frames[-1] if frames else None,
        frames=len(frames),
    )
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--think", type=float, default=2.0)
    ap.add_argument("--width", type=int, default=None, help="agents live at once (default: all)")
    ap.add_argument("--step", type=float, default=0.02, help="the simulator's step time, s")
    ap.add_argument("--no-browser", action="store_true")
    args = ap.parse_args()
    width = args.width or args.agents
    with tempfile.TemporaryDirectory() as tmp, sim_process(fast_profile(args.step)) as (_, host, port):
        fleet = Path(tmp) / "fleet.toml"
        fleet.write_text(FLEET.format(agents=args.agents, rounds=args.rounds, think=args.think))
        url = f"http://{host}:{port}"
        out = Path(tmp) / "runs"

        # In the order A B B A: drift of a shared machine (or of the server's warm cache) falls on both sides.
        cpu = {False: 0.0, True: 0.0}
        wall = {False: 0.0, True: 0.0}
        results: dict[bool, FleetResult] = {}
        counts = {"deltas": 0.0, "bytes": 0.0, "span": 0.0}
        gaps: list[float] = []  # between consecutive deltas that carried agents' changes
        for dashboard in (False, True, True, False):
            opts = _opts(fleet, out, url, width, dashboard=dashboard)
            c0, w0 = _cpu(), time.monotonic()
            results[dashboard] = asyncio.run(_with_reader(opts, counts, gaps) if dashboard else run_fleet(opts))
            cpu[dashboard] += _cpu() - c0
            wall[dashboard] += time.monotonic() - w0
        base, dash = results[False], results[True]
        base_cpu, dash_cpu, base_wall, dash_wall = cpu[False] / 2, cpu[True] / 2, wall[False] / 2, wall[True] / 2

        print(f"{args.agents} agents × {args.rounds} rounds ({width} at once), think {args.think:g} s, "
              f"simulator step {args.step:g} s")  # fmt: skip
        for name, r in (("without", base), ("with", dash)):
            if r.server_failure is not None or r.totals.done != args.agents:
                print(f"  warning: the run {name} the dashboard did not finish cleanly: {r.totals.done} agents done; "
                      f"server failure: {r.server_failure}")  # fmt: skip
        print(f"  without dashboard (mean of 2): {base.totals.turns} turns, {base_wall:.1f} s wall, "
              f"{base_cpu:.2f} s client CPU")  # fmt: skip
        print(f"  with dashboard + 1 stream reader (mean of 2): {dash.totals.turns} turns, {dash_wall:.1f} s wall, "
              f"{dash_cpu:.2f} s client CPU ({(dash_cpu - base_cpu) / base_cpu:+.1%} vs without)")  # fmt: skip
        rate = counts["deltas"] / counts["span"] if counts["span"] > 0 else 0.0
        print(f"  stream: {counts['deltas']:.0f} deltas, {rate:.2f} per second, "
              f"{counts['bytes'] / max(counts['deltas'], 1) / 1024:.1f} KiB each on average")  # fmt: skip
        if gaps:
            gaps.sort()
            print(f"  while agents change: {len(gaps) + 1} deltas carried changes, {1 / statistics.median(gaps):.2f} "
                  f"a second at the median gap ({statistics.median(gaps) * 1000:.0f} ms; p95 "
                  f"{gaps[int(0.95 * (len(gaps) - 1))] * 1000:.0f} ms, max {gaps[-1] * 1000:.0f} ms)")  # fmt: skip
        if args.no_browser:
            return
        browsed = _browser_pass(_opts(fleet, out, url, width, dashboard=True))
        if browsed is None:
            print("  browser: skipped (no /usr/bin/chromium or no playwright)")
            return
        print(f"  browser: {browsed['cards']} cards, {browsed['deltas_per_s']:.2f} deltas a second applied; frame "
              f"time p50 {browsed['frame_p50']:.1f} ms, p95 {browsed['frame_p95']:.1f} ms, "
              f"max {browsed['frame_max']:.1f} ms over {browsed['frames']} frames")  # fmt: skip


if __name__ == "__main__":
    main()
