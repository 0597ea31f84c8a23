"""The dashboard answers only requests addressed to its loopback address: a page of another site whose name was
rebound to 127.0.0.1 (DNS rebinding) sends that name as ``Host`` and is refused on every route, token or not."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from agentload.clock import LoopClock
from agentload.dashboard.control import FleetControl
from agentload.dashboard.server import make_app
from agentload.dashboard.state import LiveState

TOKEN = "host-test-token"
ROUTES = [("GET", "/"), ("GET", "/events"), ("GET", "/api/state"), ("POST", "/api/control")]


@pytest.fixture
async def live() -> AsyncIterator[tuple[TestClient[Any, Any], FleetControl]]:
    clock = LoopClock()
    state = LiveState([], clock, fleet="host")
    control = FleetControl(state, clock, max_width=1)
    client = TestClient(TestServer(make_app(state, control, TOKEN, interval_s=0.05), host="127.0.0.1"))
    await client.start_server()
    try:
        yield client, control
    finally:
        await client.close()


@pytest.mark.parametrize(("method", "path"), ROUTES)
@pytest.mark.parametrize(
    "host",
    [
        "evil.example",
        "evil.example:{port}",
        "127.0.0.1.evil.example:{port}",
        "127.0.0.1:{other}",  # another port of this machine: not this server
        "127.0.0.1",  # no port: only right on 80
        "0.0.0.0:{port}",
        "",
    ],
)
async def test_a_foreign_host_is_refused_with_a_valid_token(
    live: tuple[TestClient[Any, Any], FleetControl], method: str, path: str, host: str
) -> None:
    client, control = live
    port = client.port
    assert port is not None
    header = host.format(port=port, other=port + 1 if port < 65535 else port - 1)
    resp = await client.request(method, path, params={"token": TOKEN}, json={"action": "pause"},
                                headers={"Host": header})  # fmt: skip
    assert resp.status == 421
    assert "Host" in (await resp.json())["error"]
    assert not control.paused  # the control never ran


@pytest.mark.parametrize("name", ["127.0.0.1", "localhost", "LOCALHOST", "[::1]"])
async def test_the_loopback_host_with_the_port_is_served(
    live: tuple[TestClient[Any, Any], FleetControl], name: str
) -> None:
    client, _ = live
    headers = {"Host": f"{name}:{client.port}"}
    page = await client.get("/", params={"token": TOKEN}, headers=headers)
    assert page.status == 200
    assert "<html" in await page.text()
    state = await client.get("/api/state", params={"token": TOKEN}, headers=headers)
    assert state.status == 200
    # The control route is reached (and judges the body) rather than refused at the door.
    control = await client.post("/api/control", params={"token": TOKEN}, json={"action": "?"}, headers=headers)
    assert control.status == 400


async def test_the_right_host_still_needs_the_token(live: tuple[TestClient[Any, Any], FleetControl]) -> None:
    client, _ = live
    resp = await client.get("/api/state", params={"token": "wrong"}, headers={"Host": f"127.0.0.1:{client.port}"})
    assert resp.status == 403
