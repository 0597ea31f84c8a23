"""The report in a real browser: Debian's headless Chromium, driven by Playwright's Python package.

Playwright never downloads a browser here (its own download cannot run on these machines): it launches
/usr/bin/chromium, which ``scripts/install-chromium`` installs. The test is skipped only when that browser is
absent. Chromium runs with the flags this machine needs (no sandbox as root, no GPU, no background networking:
the closed network refuses its calls home), and every request the page makes other than the report file itself
is aborted and counted — a report that needs the network fails here.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import ConsoleMessage, Page, Route, sync_playwright

from agentload.report.figures import RunData
from agentload.report.html import load_runs, write_report
from agentload.report.text import knee_sentence
from agentload.store import RunStore
from tests.test_report import dense, sliding
from tests.test_store import save

CHROMIUM = Path(os.environ.get("AGENTLOAD_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--no-sandbox",  # CI runs as root, where Chromium's sandbox refuses to start
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not CHROMIUM.is_file(),
        reason=f"Debian's chromium is not installed at {CHROMIUM} (scripts/install-chromium installs it)",
    ),
]


class Browsed:
    def __init__(self, page: Page, report: Path, runs: list[RunData]) -> None:
        self.page = page
        self.report = report
        self.runs = runs
        self.console_errors: list[str] = []
        self.blocked: list[str] = []


@pytest.fixture(scope="module")
def browsed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browsed]:
    tmp = tmp_path_factory.mktemp("browser")
    store = RunStore(tmp / "runs")
    report = tmp / "report.html"
    dirs = [save(store, dense()), save(store, sliding())]
    write_report(dirs, report)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            seen = Browsed(page, report, load_runs(dirs))

            def on_console(msg: ConsoleMessage) -> None:
                if msg.type == "error":
                    seen.console_errors.append(msg.text)

            def on_request(route: Route) -> None:
                if route.request.url == report.as_uri():
                    route.continue_()
                else:
                    seen.blocked.append(route.request.url)
                    route.abort()

            page.on("console", on_console)
            page.on("pageerror", lambda exc: seen.console_errors.append(f"uncaught: {exc}"))
            page.route("**/*", on_request)
            page.goto(report.as_uri())
            # The report's own script sets one of these once every plot is drawn, or one failed.
            page.wait_for_selector("body[data-plots-drawn], body[data-plots-failed]", timeout=60_000)
            yield seen
        finally:
            browser.close()


def test_every_plot_is_drawn_without_console_errors(browsed: Browsed) -> None:
    page = browsed.page
    assert browsed.console_errors == []
    assert page.get_attribute("body", "data-plots-failed") is None
    assert page.get_attribute("body", "data-plots-drawn") == "6"
    ids = page.eval_on_selector_all("div.plot", "els => els.map(e => e.id)")
    assert ids == ["throughput", "ttft", "run0-split", "run0-timeline", "run1-split", "run1-timeline"]
    for plot_id in ids:
        # Plotly marks a container it has drawn and puts its SVG inside; an empty or failed plot has neither.
        assert page.locator(f"#{plot_id}.js-plotly-plot .main-svg").count() >= 1, plot_id
    # The data reached the SVG: one line per run in the throughput plot, bars in the split plots.
    assert page.locator("#throughput .scatterlayer .trace").count() >= 2
    assert page.locator("#run0-split .barlayer .trace").count() == 2
    assert page.locator("#run1-timeline .scatterlayer .trace").count() == 4
    # The timeline's series travel as base64 typed arrays: decoded, the KV line spans the whole time axis (the
    # plot area of its row), with a vertex for each step between levels.
    line = page.locator("#run0-timeline .subplot.xy .scatterlayer .trace .js-line").first
    area = page.locator("#run0-timeline .draglayer .xy .nsewdrag").first.bounding_box()
    drawn = line.bounding_box()
    assert area is not None
    assert drawn is not None
    assert drawn["width"] == pytest.approx(area["width"], rel=0.02)
    levels = len(browsed.runs[0].result.levels)
    assert (line.get_attribute("d") or "").count("L") >= 2 * levels


def test_the_report_makes_no_network_request(browsed: Browsed) -> None:
    assert browsed.blocked == []


def test_the_knee_is_explained_on_the_page(browsed: Browsed) -> None:
    shown = browsed.page.locator(".run-summary .knee").all_inner_texts()
    expected = [knee_sentence(run.result.knee[0]) for run in browsed.runs]
    assert shown == expected
    assert "preemptions rise to" in shown[0]


def test_hovering_a_point_shows_its_numbers(browsed: Browsed) -> None:
    page = browsed.page
    point = page.locator("#throughput .scatterlayer .trace").first.locator(".points path").nth(3)
    point.scroll_into_view_if_needed(timeout=5_000)
    box = point.bounding_box()
    assert box is not None
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    hover = page.locator("#throughput .hoverlayer .hovertext")
    hover.wait_for(timeout=5_000)
    assert "24 agents" in (hover.text_content() or "")  # an SVG group: text_content, not inner_text
