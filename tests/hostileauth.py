"""A hostile server for the secret tests: the simulator behind a gateway that guards every path.

Every path — /v1, /metrics, /health, /version, /props — wants the credentials the test names (a bearer key, a
Basic user:password, query parameters). A request without them gets a 401 whose body quotes what it was sent;
and, to be hostile to a client that does sign its requests, some authorised chat requests are answered with a
401 or a 500 whose body echoes the Authorization header and the full URL back. ``GuardStats`` counts what the
gateway saw per path, so a test can assert the polls were authorised and actually read.
"""

from __future__ import annotations

import base64
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from aiohttp import web
from aiohttp.test_utils import TestServer

from agentload.capacity.profile import load_profile
from agentload.sim.server import SimConfig, SimServer

CHAT = "/v1/chat/completions"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class GuardStats:
    authorised: Counter[str] = field(default_factory=Counter)  # path → requests with the right credentials
    denied: Counter[str] = field(default_factory=Counter)  # path → requests without them
    echoed: int = 0  # authorised chat requests answered with an error body quoting the credentials


@dataclass
class HostileServer:
    url: str  # http://127.0.0.1:PORT
    stats: GuardStats


def _echo(request: web.Request, why: str, status: int) -> web.Response:
    sent = request.headers.get("Authorization", "")
    message = f"{why}: you sent Authorization: {sent!r} to {request.url}"
    return web.json_response({"error": {"message": message, "type": "gateway", "code": status}}, status=status)


@asynccontextmanager
async def hostile_server(
    *,
    bearer: str | None = None,
    basic: tuple[str, str] | None = None,
    query: Mapping[str, str] | None = None,
    echo_every: int = 5,
    profile: str = "laptop",
) -> AsyncIterator[HostileServer]:
    """The simulator (``profile``) behind the gateway; every ``echo_every``-th authorised chat request is answered
    with an echoing error, alternately a 401 and a 500 (0: never)."""
    expected_auth = None
    if bearer is not None:
        expected_auth = f"Bearer {bearer}"
    elif basic is not None:
        expected_auth = "Basic " + base64.b64encode(f"{basic[0]}:{basic[1]}".encode()).decode()
    stats = GuardStats()
    chats = 0

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        nonlocal chats
        path = request.path
        ok = expected_auth is None or request.headers.get("Authorization") == expected_auth
        ok = ok and all(request.query.get(k) == v for k, v in (query or {}).items())
        if not ok:
            stats.denied[path] += 1
            return _echo(request, "invalid credentials", 401)
        stats.authorised[path] += 1
        if path == CHAT and echo_every:
            chats += 1
            if chats % echo_every == 0:
                stats.echoed += 1
                if (chats // echo_every) % 2:
                    return _echo(request, "token revoked", 401)
                return _echo(request, "upstream failed", 500)
        return await handler(request)

    sim = SimServer(SimConfig(profile=load_profile(profile)))
    app = sim.app()
    app.middlewares.insert(0, guard)  # outermost, and before the server freezes the app
    ts = TestServer(app, host="127.0.0.1")
    await ts.start_server()
    try:
        yield HostileServer(f"http://127.0.0.1:{ts.port}", stats)
    finally:
        await ts.close()
