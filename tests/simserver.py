"""Start a SimServer on a random loopback port inside the test's event loop."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp.test_utils import TestServer

from agentload.capacity.profile import load_profile
from agentload.sim.server import SimConfig, SimServer


@asynccontextmanager
async def running_sim(profile: str = "qwen3-235b-gb300", **kwargs: object) -> AsyncIterator[tuple[SimServer, str]]:
    """Yield the server and its base URL (``http://127.0.0.1:PORT``)."""
    server = SimServer(SimConfig(profile=load_profile(profile), **kwargs))  # type: ignore[arg-type]  # test kwargs
    ts = TestServer(server.app(), host="127.0.0.1")
    await ts.start_server()
    try:
        yield server, f"http://127.0.0.1:{ts.port}"
    finally:
        await ts.close()
