"""The fleet dashboard in a real browser: Debian's headless Chromium (Playwright), a 24-agent fleet on the
embedded simulator, driven from the page's own buttons.

The run goes on in a thread of its own (its own event loop, real time) while Playwright's sync API drives the
page from the test's thread. What the page shows is asserted on its DOM; what the run did is read from its
checkpoint log (each turn's attempts with their send times), the way the other fleet tests read it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from playwright.sync_api import ConsoleMessage, Page, Route, expect, sync_playwright
from typer.testing import CliRunner

from agentload.cli.main import app
from agentload.clock import run_virtual
from agentload.dashboard import open_board
from agentload.dashboard.server import serve_replay
from agentload.fleet.app import FleetApp, FleetSettings
from agentload.fleet.checkpoint import LOG, load_log
from agentload.fleet.limiter import Mode
from agentload.fleet.results import FleetResult
from agentload.store.manifest import read_info, write_info
from agentload.store.rundir import RunDir
from tests.test_report_browser import CHROMIUM, CHROMIUM_ARGS

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not CHROMIUM.is_file(),
        reason=f"Debian's chromium is not installed at {CHROMIUM} (scripts/install-chromium installs it)",
    ),
]

FLEET = """
name = "dash24"
[defaults]
tools = ["search"]
tool_choice = "required"
max_rounds = 6
max_tokens = 16
think_time_s = 1.0
context_tokens = 300
tool_result_tokens = 40

[[tasks]]
id = "plan"
prompt = "Plan the work."
max_rounds = 2
think_time_s = 0.2

[[tasks]]
id = "w"
prompt = "Work item {replica}."
count = 23
depends_on = ["plan"]
"""


class _Run(threading.Thread):
    def __init__(self, opts: FleetApp) -> None:
        super().__init__(daemon=True)
        self.opts = opts
        self.result: FleetResult | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = asyncio.run(self.opts.run())
        except BaseException as exc:  # handed to the test's thread
            self.error = exc


def _committed(run_dir: Path) -> int:
    return sum(len(t) for t in load_log(run_dir / LOG, repair=False).turns.values())


def test_24_agents_render_and_pause_resume_from_the_page(tmp_path: Path) -> None:
    (tmp_path / "f.toml").write_text(FLEET)
    opts = FleetApp(
        FleetSettings(
            fleet=tmp_path / "f.toml", out=tmp_path / "runs", progress="none", profile="llama-8b-h100", dashboard=True
        ),
        open_board=open_board,
    )
    run = _Run(opts)
    run.start()
    deadline = time.monotonic() + 30
    while opts.dashboard_url is None and run.error is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert run.error is None, run.error
    assert opts.dashboard_url is not None
    origin = opts.dashboard_url.split("/?")[0]
    console_errors: list[str] = []
    foreign: list[str] = []

    def only_the_dashboard(route: Route) -> None:
        if route.request.url.startswith(origin):
            route.continue_()
        else:
            foreign.append(route.request.url)
            route.abort()

    def on_console(msg: ConsoleMessage) -> None:
        if msg.type == "error":
            console_errors.append(msg.text)

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.on("console", on_console)
            page.route("**/*", only_the_dashboard)
            page.goto(opts.dashboard_url)
            cards = page.locator("#waves .card[data-id]")
            expect(cards).to_have_count(24, timeout=15_000)
            expect(page.locator(".wave")).to_have_count(2)  # the planner's wave and its 23 dependents
            expect(page.locator('.wave[data-wave="1"] .card')).to_have_count(23)
            # Some worker is live: its card shows a phase of a turn.
            expect(page.locator('.card[data-state="running"]').first).to_be_visible(timeout=15_000)

            # The width, from the page's own controls, reaches the limiter (the panel shows what it answered).
            page.select_option("#width-mode", "parallel")
            page.fill("#width-n", "6")
            page.click("#width-apply")
            expect(page.locator("#limit")).to_have_text("6", timeout=5_000)
            expect(page.locator("#decisions li").first).to_contain_text("set from the dashboard: parallel 6")

            page.click("#pause")
            expect(page.locator("#paused-flag")).to_be_visible(timeout=5_000)
            paused_at = time.monotonic()  # the page shows the pause only once the run is paused
            assert opts.run_dir is not None
            time.sleep(2.0)  # turns in flight finish and are committed
            during = _committed(opts.run_dir)
            time.sleep(1.5)
            assert _committed(opts.run_dir) == during  # no new turn started
            resumed_at = time.monotonic()
            page.click("#resume")
            expect(page.locator("#paused-flag")).to_be_hidden(timeout=5_000)

            run.join(90)
            assert not run.is_alive()
            assert run.error is None, run.error
            # The last delta and the end of the stream reach the page.
            expect(page.locator("#conn")).to_have_text("run ended", timeout=10_000)
            expect(page.locator('.card[data-state="done"]')).to_have_count(24)
            for chart in ("c-share", "c-req", "c-width", "c-ttft", "c-tok", "c-misc"):
                polyline = page.locator(f"#{chart} polyline").first
                assert (polyline.get_attribute("points") or "").count(",") >= 2, chart  # a line, not a dot
            assert page.locator(".card .nums").first.inner_text().startswith("turn ")
        finally:
            browser.close()
    assert console_errors == []
    assert foreign == []
    result = run.result
    assert result is not None
    assert result.totals.done == 24
    state = load_log(opts.run_dir / LOG, repair=False)  # raises on a turn lost or repeated
    assert {a: len(t) for a, t in state.turns.items()} == {"plan": 2, **{f"w.{i:02d}": 6 for i in range(23)}}
    sent = [r.t_sent for lines in state.turns.values() for line in lines for r in line.turn.records]
    assert [t for t in sent if paused_at < t < resumed_at] == []
    assert any(t > resumed_at for t in sent)


LONG_ROUNDS = 30  # the two agents whose buttons are pressed: a late click still finds them running
LONG_TASKS = f"""
[[tasks]]
id = "stopme"
prompt = "Long work."
max_rounds = {LONG_ROUNDS}
depends_on = ["plan"]

[[tasks]]
id = "restartme"
prompt = "Long work too."
max_rounds = {LONG_ROUNDS}
depends_on = ["plan"]
"""


def test_stop_and_restart_one_agent_from_its_card(tmp_path: Path) -> None:
    (tmp_path / "f.toml").write_text(FLEET.replace("count = 23", "count = 21") + LONG_TASKS)
    opts = FleetApp(
        FleetSettings(
            fleet=tmp_path / "f.toml", out=tmp_path / "runs", progress="none", profile="llama-8b-h100", dashboard=True
        ),
        open_board=open_board,
    )
    run = _Run(opts)
    run.start()
    deadline = time.monotonic() + 30
    while opts.dashboard_url is None and run.error is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert run.error is None, run.error
    assert opts.dashboard_url is not None
    console_errors: list[str] = []

    def on_console(msg: ConsoleMessage) -> None:
        if msg.type == "error":
            console_errors.append(msg.text)

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.on("console", on_console)
            page.goto(opts.dashboard_url)
            expect(page.locator("#waves .card[data-id]")).to_have_count(24, timeout=15_000)
            stopped = page.locator('.card[data-id="stopme"]')
            restarted = page.locator('.card[data-id="restartme"]')
            # Both are live (the planner is done, its dependents under way) before their buttons are pressed.
            expect(stopped).to_have_attribute("data-state", "running", timeout=30_000)
            stopped.locator('button[data-act="stop_agent"]').click()
            expect(restarted).to_have_attribute("data-state", "running", timeout=30_000)
            restarted.locator('button[data-act="restart_agent"]').click()
            expect(restarted.locator(".nums")).to_contain_text("restarted 1×", timeout=30_000)
            # The width, from the page, while it runs.
            page.select_option("#width-mode", "parallel")
            page.fill("#width-n", "8")
            page.click("#width-apply")
            expect(page.locator("#limit")).to_have_text("8", timeout=30_000)

            run.join(180)
            assert not run.is_alive()
            assert run.error is None, run.error
            expect(page.locator("#conn")).to_have_text("run ended", timeout=30_000)
            expect(stopped).to_have_attribute("data-state", "stopped")
            expect(stopped.locator(".acts")).to_be_hidden()  # an ended card has no buttons
            expect(page.locator('.card[data-state="done"]')).to_have_count(23)
            assert page.locator("#error").inner_text() == ""
        finally:
            browser.close()
    assert console_errors == []
    result = run.result
    assert result is not None
    assert opts.run_dir is not None
    assert result.totals.done == 23
    state = load_log(opts.run_dir / LOG, repair=False)  # raises on a turn lost or repeated
    assert "stopme" not in state.finished  # resumable
    assert 1 <= len(state.turns["stopme"]) < LONG_ROUNDS
    assert {a: len(t) for a, t in state.turns.items() if a != "stopme"} == {
        "plan": 2, "restartme": LONG_ROUNDS, **{f"w.{i:02d}": 6 for i in range(21)}}  # fmt: skip
    from_page = [c.reason for c in result.limiter.history if "dashboard" in c.reason]
    assert from_page == ["set from the dashboard: parallel 8"]


class _Replay(threading.Thread):
    """``serve_replay`` on a loop of its own until ``stop()``."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__(daemon=True)
        self.run_dir = run_dir
        self.url: str | None = None
        self.error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._until: asyncio.Event | None = None

    def run(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._until = asyncio.Event()
            await serve_replay(self.run_dir, on_url=self._found, until=self._until)

        try:
            asyncio.run(main())
        except BaseException as exc:  # handed to the test's thread
            self.error = exc

    def _found(self, url: str) -> None:
        self.url = url

    def stop(self) -> None:
        if self._loop is not None and self._until is not None:
            self._loop.call_soon_threadsafe(self._until.set)
        self.join(30)


@contextmanager
def _replay_page(run_dir: Path) -> Iterator[Page]:
    """``agentload dashboard RUN_DIR``'s page in headless Chromium; after the test's checks, the server stopped
    with no error and the page logged no console error."""
    server = _Replay(run_dir)
    server.start()
    deadline = time.monotonic() + 30
    while server.url is None and server.error is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.error is None, server.error
    assert server.url is not None
    console_errors: list[str] = []
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 900})
                page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
                page.goto(server.url)
                yield page
            finally:
                browser.close()
    finally:
        server.stop()
    assert server.error is None, server.error
    assert console_errors == []


def _scrub(page: Page, t: float) -> None:
    page.evaluate("(t) => { const s = document.getElementById('t'); s.value = String(t); "
                  "s.dispatchEvent(new Event('input')); }", t)  # fmt: skip


def test_a_finished_run_replays_with_a_time_slider(tmp_path: Path) -> None:
    (tmp_path / "f.toml").write_text(FLEET)
    opts = FleetApp(
        FleetSettings(
            fleet=tmp_path / "f.toml", out=tmp_path / "runs", progress="none", profile="llama-8b-h100", virtual=True
        )
    )
    result = run_virtual(opts.run())
    assert result.totals.done == 24
    assert opts.run_dir is not None
    log = load_log(opts.run_dir / LOG, repair=False)
    with _replay_page(opts.run_dir) as page:
        # It opens at the end of the run: every card done, with its committed turns.
        expect(page.locator("#conn")).to_have_text("replay", timeout=15_000)
        expect(page.locator('.card[data-state="done"]')).to_have_count(24, timeout=15_000)
        expect(page.locator('.card[data-id="w.07"] .nums')).to_contain_text(f"turn {len(log.turns['w.07'])} ")
        for chart in ("c-width", "c-ttft", "c-tok"):
            assert (page.locator(f"#{chart} polyline").first.get_attribute("points") or "").count(",") >= 2
        # Read-only: no run controls, no card buttons, no width form.
        expect(page.locator("#controls")).to_be_hidden()
        expect(page.locator("#width-controls")).to_be_hidden()
        expect(page.locator(".card .acts").first).to_be_hidden()
        # Back to the start: the planner's first request is in flight, its dependents wait.
        _scrub(page, 0)
        expect(page.locator("body")).to_have_attribute("data-replay-t", "0", timeout=10_000)
        expect(page.locator('.card[data-state="waiting"]')).to_have_count(23)
        expect(page.locator('.card[data-id="plan"]')).to_have_attribute("data-state", "running")
        expect(page.locator("#counts")).to_contain_text("0 turns")
        # Halfway: some turns committed, not all; the page says the time it shows.
        end = float(page.locator("#t").get_attribute("max") or "0")
        _scrub(page, round(end / 2, 1))
        expect(page.locator("body")).to_have_attribute("data-replay-t", str(round(end / 2, 1)), timeout=10_000)
        # The counts are applied on the page's next animation frame, after the time attribute: read them
        # until they show the scrubbed time's (a read in between saw the start's "0 turns" on a busy CI).
        total = sum(len(t) for t in log.turns.values())
        turns = -1
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            turns = int(page.locator("#counts").inner_text().rsplit(" · ", 1)[1].split(" ")[0])
            if 0 < turns < total:
                break
            page.wait_for_timeout(100)
        assert 0 < turns < total
        expect(page.locator("#t-label")).to_contain_text(f"{round(end / 2, 1):.1f} / ")


def test_a_bench_run_replays_its_level_table_and_search(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    done = CliRunner().invoke(app, ["bench", "--sim", "llama-8b-h100", "--workload", "agentic-hold", "--context",
                                    "2000", "--find-knee", "--max-agents", "4", "--warmup", "2s", "--window", "10s",
                                    "--out", str(root), "--json"])  # fmt: skip
    assert done.exit_code == 0, done.output
    (run_dir,) = [p.parent for p in root.glob("*/result.json")]
    levels = RunDir(run_dir).result().levels
    with _replay_page(run_dir) as page:
        expect(page.locator("#conn")).to_have_text("replay", timeout=15_000)
        expect(page.locator("#levels tbody tr")).to_have_count(len(levels))
        expect(page.locator("#steps li")).to_have_count(len(levels))
        expect(page.locator("#width-section")).to_be_hidden()
        kv = page.locator('#c-share polyline[data-key="kv"]').get_attribute("points") or ""
        assert kv.count(",") >= 2
        _scrub(page, 0)
        expect(page.locator("body")).to_have_attribute("data-replay-t", "0", timeout=10_000)
        expect(page.locator("#levels tbody tr")).to_have_count(0)
        expect(page.locator("#steps li")).to_have_count(0)
        expect(page.locator("#bench-current")).to_contain_text("measuring level 0: 1 agents")


SEQUENTIAL = """
name = "seq"
[defaults]
tools = ["search"]
tool_choice = "required"
max_rounds = 3
max_tokens = 16
think_time_s = 0.3
context_tokens = 300

[[tasks]]
id = "w"
prompt = "Work item {replica}."
count = 3
"""


def test_a_sequential_run_shows_its_mode_and_no_preemptions_it_did_not_have(tmp_path: Path) -> None:
    (tmp_path / "f.toml").write_text(SEQUENTIAL)
    opts = FleetApp(
        FleetSettings(
            fleet=tmp_path / "f.toml",
            out=tmp_path / "runs",
            progress="none",
            profile="llama-8b-h100",
            mode=Mode.SEQUENTIAL,
            dashboard=True,
        ),
        open_board=open_board,
    )
    run = _Run(opts)
    run.start()
    deadline = time.monotonic() + 30
    while opts.dashboard_url is None and run.error is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert run.error is None, run.error
    assert opts.dashboard_url is not None
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(opts.dashboard_url)
            expect(page.locator("#mode")).to_contain_text("sequential", timeout=15_000)
            # The width form starts from the run's own mode, not the list's first entry.
            expect(page.locator("#width-mode")).to_have_value("sequential")
            run.join(60)
            assert not run.is_alive()
            assert run.error is None, run.error
            expect(page.locator("#conn")).to_have_text("run ended", timeout=10_000)
            misc = page.locator("#c-misc-max").inner_text()
            assert "1 preemptions" not in misc, misc  # one agent at a time: the simulator preempted nothing
            assert "no preemptions" in misc, misc
        finally:
            browser.close()


def test_a_killed_run_replays_as_incomplete_not_finished(tmp_path: Path) -> None:
    (tmp_path / "f.toml").write_text(SEQUENTIAL)
    opts = FleetApp(
        FleetSettings(
            fleet=tmp_path / "f.toml",
            out=tmp_path / "runs",
            progress="none",
            profile="llama-8b-h100",
            virtual=True,
            stop_after_s=2.0,
        )
    )
    run_virtual(opts.run())
    assert opts.run_dir is not None
    # What a SIGKILL before the segment's end leaves: the manifest as created ("running") and no results.json.
    (opts.run_dir / "results.json").unlink()
    info = read_info(opts.run_dir)
    assert info is not None
    write_info(opts.run_dir, info.model_copy(update={"status": "running", "detail": ""}))
    with _replay_page(opts.run_dir) as page:
        expect(page.locator("#conn")).to_have_text("replay", timeout=15_000)
        expect(page.locator("#clock")).to_contain_text("· incomplete")
        assert "finished" not in page.locator("#clock").inner_text()
        assert "killed" in (page.locator("#clock").get_attribute("title") or "")
