"""The dashboard's HTTP side: the page, its event stream and its controls, on 127.0.0.1 behind a random token.

* ``GET /?token=T`` — the page (one vendored file, ``dashboard.html``: no CDN, no framework);
* ``GET /events?token=T`` — server-sent events: ``snapshot`` (everything) on connect, then ``delta`` (only what
  changed, coalesced per agent) about ``1 / interval_s`` times a second (none while idle), and ``end`` when the
  run is over; every
  open stream flushes on one schedule (``Flusher``), so pages that have seen the same share one delta, built and
  encoded once;
* ``GET /api/state?token=T`` — the snapshot as JSON;
* ``POST /api/control?token=T`` — ``{"action": "pause" | "resume" | "stop"}``,
  ``{"action": "width", "mode": "sequential" | "parallel" | "auto", "width": N}``, or
  ``{"action": "stop_agent" | "restart_agent", "agent": ID}`` (an unknown agent, one that has ended, or a restart
  of one that is not running is a 400).

``make_replay_app`` serves a finished run's replay (``dashboard.replay``) read-only on the same rules: the page in
replay mode, ``GET /api/state?token=T&t=S`` the snapshot at ``S`` seconds (default: the end), and no controls
(``POST /api/control`` is a 405); ``serve_replay`` serves one from a run directory (``agentload dashboard RUN``).

The token (``secrets.token_urlsafe``) is in the URL the command prints, as notebook servers do; it is also
accepted as an ``X-Agentload-Token`` header. Without it every route answers 403; a malformed control body 400 with
a JSON error; an error inside a handler 500 with one line, never a traceback — and never anything the run sees.
Every route also answers 421 to a request whose ``Host`` is not the loopback address it was sent to
(``127.0.0.1``, ``localhost`` or ``[::1]``, with the port it listens on): a page of another site whose name was
rebound to 127.0.0.1 (DNS rebinding) sends its own name there, and must not reach the run even holding the token.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
from collections.abc import Awaitable, Callable
from importlib import resources
from pathlib import Path
from typing import Any

import orjson
from aiohttp import hdrs, web

from agentload.dashboard.control import FleetControl
from agentload.dashboard.replay import Replay, open_replay
from agentload.dashboard.state import Cursor, LiveState
from agentload.errors import ConfigError
from agentload.fleet.limiter import Mode

# The page's update rate: 4 Hz keeps 1,000 cards fluid without flooding the browser.
INTERVAL_S = 0.25
# The rates a run may ask for: a page updated less than once in 5 s is no longer live; more than 20 times a second,
# faster than anyone reads.
MIN_DASHBOARD_RATE, MAX_DASHBOARD_RATE = 0.2, 20.0
# How early a flush may ride on an event of the run's (a share of the period): its gaps stay within 0.7-1.3 periods.
RIDE_SHARE = 0.3
# An idle dashboard's keep-alive comment (it flushes nothing while nothing changes), so a closed tab is noticed.
KEEPALIVE_S = 10.0
TOKEN_HEADER = "X-Agentload-Token"
# The names a browser on this machine may send as Host for the loopback address the dashboard listens on.
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
_log = logging.getLogger(__name__)
_STATE: web.AppKey[LiveState] = web.AppKey("state", LiveState)
_CONTROL: web.AppKey[FleetControl] = web.AppKey("control", FleetControl)
_TOKEN: web.AppKey[str] = web.AppKey("token", str)
_FLUSHER: web.AppKey[Flusher] = web.AppKey("flusher")
_REPLAY: web.AppKey[Replay] = web.AppKey("replay")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def dashboard_interval(dashboard: bool, rate: float | None) -> float | None:
    """``--dashboard-rate`` as the page's update period, s (None: the dashboard's default, 4 a second); one clear
    error without ``--dashboard``."""
    if rate is None:
        return None
    if not dashboard:
        raise ConfigError("--dashboard-rate sets the live page's updates a second: use it with --dashboard")
    if not MIN_DASHBOARD_RATE <= rate <= MAX_DASHBOARD_RATE:  # NaN too
        raise ConfigError(
            f"--dashboard-rate must be {MIN_DASHBOARD_RATE:g} to {MAX_DASHBOARD_RATE:g} updates a second, got {rate:g}"
        )
    return 1.0 / rate


def page() -> str:
    return resources.files("agentload.dashboard").joinpath("dashboard.html").read_text(encoding="utf-8")


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def _loopback_host(request: web.Request) -> bool:
    """Whether the request's ``Host`` names this server: a loopback name with the port it came in on (no port
    only on 80, where a browser leaves it out)."""
    sockname = request.transport.get_extra_info("sockname") if request.transport is not None else None
    if not sockname:
        return False
    port = int(sockname[1])
    host = request.headers.get(hdrs.HOST, "").strip().lower()
    allowed = {f"{name}:{port}" for name in LOOPBACK_NAMES}
    if port == 80:
        allowed.update(LOOPBACK_NAMES)
    return host in allowed


@web.middleware
async def _guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    if not _loopback_host(request):
        # Checked before the token: a rebound name is refused whatever the request carries.
        return _error(421, "wrong Host: open the dashboard at the 127.0.0.1 URL agentload printed")
    given = request.query.get("token") or request.headers.get(TOKEN_HEADER) or ""
    if not secrets.compare_digest(given.encode(), request.app[_TOKEN].encode()):
        return _error(403, "a valid token is required (the URL agentload printed carries it)")
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status >= 400:  # a route or method that does not exist: JSON like every other refusal
            return _error(exc.status, exc.reason)
        raise
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception as exc:  # one line in the log, none of it in the answer: the run goes on either way
        _log.warning("dashboard: %s %s failed: %s", request.method, request.path, type(exc).__name__)
        return _error(500, "internal error in the dashboard (the run is unaffected)")


def _json(body: Any) -> bytes:
    return orjson.dumps(body)


async def _index(request: web.Request) -> web.StreamResponse:
    return web.Response(text=page(), content_type="text/html", headers={"Cache-Control": "no-store"})


async def _state(request: web.Request) -> web.StreamResponse:
    body, _ = request.app[_STATE].snapshot()
    return web.Response(body=_json(body), content_type="application/json")


class Flusher:
    """One flush schedule for every open event stream of a live dashboard, and one encoding per delta.

    At a fixed rate — each flush due ``interval_s`` after the one before, not after the previous write — so the time
    a flush takes (and a busy loop's lateness) is not added to every period; a schedule that fell more than a period
    behind starts again from now rather than sending a burst. One task runs while a stream is open. Streams that
    flushed at the same tick are at the same cursor afterwards (a new page joins them at its first flush), so each
    delta is built and encoded for the first of them and the same bytes go to the rest (``encoded_delta``).

    The flush rides on the run's own wake-ups: from ``early_s`` before it is due, the first event the state hears
    (an agent's request sent or turn committed, a scrape) runs it then, while the loop is awake anyway; only if none
    comes does its timer wake the loop at the due time. A busy fleet has events every few milliseconds, so the
    page's stream adds no wake-ups to the client's loop (measured: as many sleeps a run with the page open as
    without; the client CPU the dashboard adds did not move with them — docs/dashboard.md, "Measured"), and the
    first change after a quiet spell goes out at once. The schedule keeps its rate: the next flush is due a period
    after this one was *due*, so a change waits at most ``interval_s + early_s``.
    And an idle dashboard does not flush at all: when every open page has seen the state's version and no request is
    in flight (nothing can change without an event), it waits for the next event, and a keep-alive comment goes out
    every ``keepalive_s`` meanwhile (so a closed tab is still noticed). That event's change goes at once after a
    spell longer than a period, else at the rate: a lockstep fleet commits its turns one by one with no request in
    flight, and flushing at each of them ran 20 flushes a second (1,000 agents at once, 2026-12-06).
    """

    def __init__(
        self, state: LiveState, interval_s: float, *, early_s: float | None = None, keepalive_s: float = KEEPALIVE_S
    ) -> None:
        self.state = state
        self.interval_s = interval_s
        self.early_s = RIDE_SHARE * interval_s if early_s is None else early_s
        self.keepalive_s = keepalive_s
        self.closing = asyncio.Event()
        self._tick = asyncio.Event()
        self._cursors: list[Cursor] = []
        self._task: asyncio.Task[None] | None = None
        # The last delta encoded: (cursor before, state version) → (its event, or None: nothing changed; cursor after)
        self._last: tuple[tuple[int, ...], bytes | None, tuple[int, ...]] | None = None

    def join(self, cursor: Cursor) -> None:
        self._cursors.append(cursor)
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    def leave(self, cursor: Cursor) -> None:
        self._cursors = [c for c in self._cursors if c is not cursor]  # by identity: two pages' cursors can be equal
        if not self._cursors and self._task is not None:
            self._task.cancel()
            self._task = None

    async def close(self) -> None:
        """Open streams send what is left and ``end``, then return (the app's shutdown)."""
        self.closing.set()
        self._pulse()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def next_flush(self) -> None:
        """Wait for the next flush (or the close)."""
        if not self.closing.is_set():
            await self._tick.wait()

    def _pulse(self) -> None:
        self._tick.set()  # wakes every waiting stream; the next wait waits for the next flush
        self._tick.clear()

    def _idle(self) -> bool:
        """Every page has seen everything, and nothing can change without an event."""
        version = self.state.version
        return not self.state.in_flight and all(c.version == version for c in self._cursors)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time()  # when the last flush was due
        while not self.closing.is_set():
            if self._idle() and not await self._wait(loop, -math.inf, loop.time() + self.keepalive_s):
                self._pulse()  # the keep-alive: no event came (the streams send a comment)
                await asyncio.sleep(0)
                continue
            # Something can change (or an event just did, after an idle spell): the next flush, at the rate. After a
            # spell longer than a period the event's change goes at once; after a flush moments ago it waits its
            # turn — a burst of events in an idle spell (a lockstep fleet's turns committed one by one, with no
            # request in flight) would otherwise flush at each of them.
            due += self.interval_s
            if loop.time() - due > self.interval_s:
                due = loop.time()  # a schedule that fell behind (or slept idle) starts again from now: no burst
            await self._wait(loop, due - self.early_s, due)
            self._pulse()
            await asyncio.sleep(0)  # the streams take this flush (their cursors move) before ``_idle`` reads them

    async def _wait(self, loop: asyncio.AbstractEventLoop, ride_from: float, due: float) -> bool:
        """Until the state's first event from ``ride_from`` on, or ``due`` (both on the loop's clock). True: woken
        by an event, not by the timer."""
        woken: asyncio.Future[bool] = loop.create_future()

        def wake(by_event: bool = True) -> None:
            if not woken.done():
                woken.set_result(by_event)

        timer = loop.call_at(due, wake, False)
        state = self.state
        state.ride = wake
        state.ride_clock = loop.time
        state.ride_at = ride_from
        try:
            return await woken
        finally:
            timer.cancel()
            state.ride_at = state.ride = None

    def encoded_delta(self, cursor: Cursor) -> bytes | None:
        """The ``delta`` event for ``cursor`` (moved on), or None when nothing changed since it."""
        self.state.refresh()
        key = (*_position(cursor), self.state.version)
        if self._last is not None and self._last[0] == key:
            _, event, after = self._last
            cursor.version, cursor.points, cursor.decisions, cursor.levels, cursor.steps = after
            return event
        body = self.state.delta(cursor, refresh=False)
        event = None if body is None else b"event: delta\ndata: " + _json(body) + b"\n\n"
        self._last = (key, event, _position(cursor))
        return event


def _position(cursor: Cursor) -> tuple[int, int, int, int, int]:
    """A cursor's fields as a tuple (``dataclasses.astuple`` copies each field deeply: ~10 µs a flush)."""
    return cursor.version, cursor.points, cursor.decisions, cursor.levels, cursor.steps


async def _events(request: web.Request) -> web.StreamResponse:
    state, flusher = request.app[_STATE], request.app[_FLUSHER]
    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    )
    await resp.prepare(request)
    body, cursor = state.snapshot()
    flusher.join(cursor)
    try:
        with contextlib.suppress(ConnectionResetError):
            await resp.write(b"event: snapshot\ndata: " + _json(body) + b"\n\n")
            while not flusher.closing.is_set():
                await flusher.next_flush()
                event = flusher.encoded_delta(cursor)
                if event is not None:
                    await resp.write(event)
                elif not flusher.closing.is_set():
                    await resp.write(b": keep-alive\n\n")  # a comment: lets the server notice a closed tab
            await resp.write(b"event: end\ndata: {}\n\n")
    finally:
        flusher.leave(cursor)
    return resp


async def _control(request: web.Request) -> web.StreamResponse:
    control = request.app[_CONTROL]
    try:
        body = await request.json(loads=orjson.loads)
    except (ValueError, orjson.JSONDecodeError, UnicodeDecodeError, LookupError):  # LookupError: unknown charset
        return _error(400, "the body must be a JSON object")
    if not isinstance(body, dict):
        return _error(400, "the body must be a JSON object")
    action = body.get("action")
    if action == "pause":
        control.pause()
    elif action == "resume":
        control.resume()
    elif action == "stop":
        control.request_stop()
    elif action == "width":
        try:
            mode = Mode(str(body.get("mode")))
        except ValueError:
            return _error(400, "mode must be one of sequential, parallel, auto")
        width = body.get("width")
        if width is not None and (isinstance(width, bool) or not isinstance(width, int)):
            return _error(400, "width must be a whole number")
        try:
            change = await control.set_width(mode, width)
        except ConfigError as exc:  # a width the run cannot take; a failed checkpoint write is not the page's fault
            return _error(400, str(exc))
        return web.json_response({"ok": True, "action": action, "limit": change.new, "reason": change.reason})
    elif action in ("stop_agent", "restart_agent"):
        agent = body.get("agent")
        if not isinstance(agent, str) or not agent:
            return _error(400, "agent must be an agent's id")
        try:
            if action == "stop_agent":
                control.stop_agent(agent)
            else:
                control.restart_agent(agent)
        except ConfigError as exc:
            return _error(400, str(exc))
        return web.json_response({"ok": True, "action": action, "agent": agent})
    else:
        return _error(400, "action must be one of pause, resume, stop, width, stop_agent, restart_agent")
    return web.json_response({"ok": True, "action": action, "paused": control.paused})


async def _replay_index(request: web.Request) -> web.StreamResponse:
    # The same page, told it replays (no event stream, no controls, a time slider).
    text = page().replace("<body>", '<body data-mode="replay" class="readonly">', 1)
    return web.Response(text=text, content_type="text/html", headers={"Cache-Control": "no-store"})


async def _replay_state(request: web.Request) -> web.StreamResponse:
    replay = request.app[_REPLAY]
    raw = request.query.get("t")
    t = replay.end
    if raw is not None:
        try:
            t = float(raw)
        except ValueError:
            return _error(400, "t must be a number of seconds")
        if not math.isfinite(t) or t < 0:
            return _error(400, "t must be a number of seconds from 0")
    return web.Response(body=_json(replay.at(t)), content_type="application/json")


async def _read_only(request: web.Request) -> web.StreamResponse:
    return _error(405, "a replay is read-only: it has no controls")


def make_replay_app(replay: Replay, token: str) -> web.Application:
    app = web.Application(middlewares=[_guard], client_max_size=64 * 1024)
    app[_REPLAY] = replay
    app[_TOKEN] = token
    app.router.add_get("/", _replay_index)
    app.router.add_get("/api/state", _replay_state)
    app.router.add_post("/api/control", _read_only)
    return app


async def _no_controls(request: web.Request) -> web.StreamResponse:
    return _error(405, "a bench run has no controls")


def make_app(
    state: LiveState, control: FleetControl, token: str, *, interval_s: float = INTERVAL_S, controls: bool = True
) -> web.Application:
    app = web.Application(middlewares=[_guard], client_max_size=64 * 1024)
    app[_STATE] = state
    app[_CONTROL] = control
    app[_TOKEN] = token
    app[_FLUSHER] = Flusher(state, interval_s)

    async def closing(app: web.Application) -> None:
        await app[_FLUSHER].close()  # open event streams send what is left and ``end``, then return

    app.on_shutdown.append(closing)
    app.router.add_get("/", _index)
    app.router.add_get("/events", _events)
    app.router.add_get("/api/state", _state)
    app.router.add_post("/api/control", _control if controls else _no_controls)
    return app


class Served:
    """An app served on 127.0.0.1 behind a new random token: ``await start()``, ``await close()``."""

    def __init__(self, make: Callable[[str], web.Application], *, port: int = 0) -> None:
        self.token = secrets.token_urlsafe(24)
        self.app = make(self.token)
        self.port = port
        self._runner: web.AppRunner | None = None

    async def start(self) -> str:
        """Serve; returns the page's URL, token included."""
        self._runner = web.AppRunner(self.app, access_log=None, shutdown_timeout=2.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        try:
            await site.start()
        except OSError as exc:
            await self._runner.cleanup()
            self._runner = None
            raise ConfigError(f"the dashboard cannot listen on 127.0.0.1:{self.port}: {exc.strerror}") from None
        self.port = self._runner.addresses[0][1]
        return self.url

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/?token={self.token}"

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


class Dashboard(Served):
    """The live dashboard, served for the length of a run."""

    def __init__(
        self,
        state: LiveState,
        control: FleetControl,
        *,
        port: int = 0,
        interval_s: float | None = None,
        controls: bool = True,
    ) -> None:
        # None: the default rate (the CLI's ``--dashboard-rate`` not given)
        period = INTERVAL_S if interval_s is None else interval_s
        super().__init__(lambda token: make_app(state, control, token, interval_s=period, controls=controls), port=port)


class ReplayServer(Served):
    """A finished run's replay, served until closed."""

    def __init__(self, replay: Replay, *, port: int = 0) -> None:
        super().__init__(lambda token: make_replay_app(replay, token), port=port)


async def serve_replay(
    run_dir: Path, *, port: int = 0, on_url: Callable[[str], None] | None = None, until: asyncio.Event | None = None
) -> None:
    """Serve ``run_dir``'s replay until ``until`` is set (or forever); ``on_url`` hears the page's URL once."""
    replay = open_replay(run_dir)  # a directory that is not a run fails here, before anything listens
    server = ReplayServer(replay, port=port)
    url = await server.start()
    try:
        if on_url is not None:
            on_url(url)
        await (until or asyncio.Event()).wait()
    finally:
        await server.close()
