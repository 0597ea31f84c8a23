"""``bench_dashboard.py``'s browser pass: one more run with the dashboard's page open in headless Chromium (Debian's,
via Playwright), for the deltas a second the page received and its frame times."""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from agentload.fleet.app import FleetApp

# Counts the page's delta events and its frame intervals, injected before the page's own script runs.
PROBE = """
window.__deltas = 0; window.__changed = 0; window.__frames = [];
const Native = window.EventSource;
window.EventSource = class extends Native {
  constructor(url) {
    super(url);
    // A delta without agents' changes has '"agents":[]' (orjson writes no spaces; a string's quotes are escaped).
    this.addEventListener("delta", (e) => {
      window.__deltas++;
      if (!e.data.includes('"agents":[]')) window.__changed++;
    });
  }
};
let last = 0;
function tick(t) { if (last) window.__frames.push(t - last); last = t; requestAnimationFrame(tick); }
requestAnimationFrame(tick);
// The page's own script (and its layout) holding the main thread over 50 ms; a long frame without one was the
// browser waiting for a core, not the page's work.
window.__longtasks = [];
new PerformanceObserver((l) => { for (const e of l.getEntries()) window.__longtasks.push(e.duration); })
  .observe({ entryTypes: ["longtask"] });
"""


def _browser_pass(opts: FleetApp) -> dict[str, Any] | None:
    """One run with the page open in headless Chromium: what it received and its frame times; ``None`` without
    Chromium or Playwright."""
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
    run = threading.Thread(target=lambda: result.update(run=asyncio.run(opts.run())), daemon=True)
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
        d0, c0 = page.evaluate("[window.__deltas, window.__changed]")
        page.evaluate("window.__frames = []; window.__longtasks = []")
        run.join()
        span = time.monotonic() - t0
        deltas, changed = page.evaluate("[window.__deltas, window.__changed]")
        deltas, changed = deltas - d0, changed - c0
        frames: list[float] = page.evaluate("window.__frames")
        longtasks: list[float] = page.evaluate("window.__longtasks")
        cards = page.locator(".card").count()
        browser.close()
    frames.sort()
    result.update(
        deltas_per_s=deltas / span if span > 0 else 0.0,
        changed_per_s=changed / span if span > 0 else 0.0,
        cards=cards,
        frame_p50=statistics.median(frames) if frames else None,
        frame_p95=frames[int(0.95 * (len(frames) - 1))] if frames else None,
        frame_max=frames[-1] if frames else None,
        long_frames=sum(1 for f in frames if f > 50),
        long_tasks=len(longtasks),
        long_task_max=max(longtasks, default=0.0),
        frames=len(frames),
    )
    return result


def browser(opts: FleetApp) -> None:
    """The browser pass of the run ``opts`` (with the dashboard), printed."""
    browsed = _browser_pass(opts)
    if browsed is None:
        print("  browser: skipped (no /usr/bin/chromium or no playwright)")
        return
    frames = (
        f"frame time p50 {browsed['frame_p50']:.1f} ms, p95 {browsed['frame_p95']:.1f} ms, max "
        f"{browsed['frame_max']:.1f} ms, {browsed['long_frames']} of {browsed['frames']} frames over 50 ms; "
        f"{browsed['long_tasks']} long tasks of the page's (over 50 ms; longest {browsed['long_task_max']:.0f} ms)"
        if browsed["frames"]
        else "no frame drawn while the run went on (a starved browser draws none)"
    )
    print(f"  browser: {browsed['cards']} cards, {browsed['changed_per_s']:.2f} deltas a second with agents' "
          f"changes received ({browsed['deltas_per_s']:.2f} with any); {frames}")  # fmt: skip
