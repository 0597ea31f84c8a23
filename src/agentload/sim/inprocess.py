"""The simulated server behind the endpoint ``Transport`` seam, in this process and without sockets.

The client, the agents and the fleet run unchanged; their requests go straight into ``SimServer``'s
transport-neutral API, and the SSE bytes it produces come straight back. On a ``VirtualTimeLoop`` the engine's
steps and the agents' think time then run in simulated time, so a GB300-sized scenario takes seconds.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from urllib.parse import urlsplit

from aiohttp import web

from agentload.endpoint.transport import Response, StreamBroken
from agentload.errors import RequestError
from agentload.sim.server import ResetConnection, SimResponse, SimServer, _once


class _InProcessResponse:
    def __init__(self, sim: SimResponse, closers: set[asyncio.Task[None]]) -> None:
        self._sim = sim
        self.status = sim.status
        self.headers: Mapping[str, str] = sim.headers
        self._closers = closers
        self._done = False

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            async for block in self._sim.body:
                yield block
        except ResetConnection as exc:
            raise StreamBroken("connection reset by the simulated server") from exc
        self._done = True

    async def read(self) -> bytes:
        return b"".join([b async for b in self.chunks()])

    def close(self) -> None:
        if not self._done:
            # Closing the body generator aborts the request in the engine, as a dropped connection would.
            task = asyncio.ensure_future(self._sim.body.aclose())
            self._closers.add(task)
            task.add_done_callback(self._closers.discard)


def _from_web(resp: web.StreamResponse) -> SimResponse:
    body = resp.body if isinstance(resp, web.Response) and isinstance(resp.body, bytes) else b""
    return SimResponse(resp.status, dict(resp.headers), _once(body))


class InProcessTransport:
    """A Transport whose server is a SimServer object (started on first use, stopped by ``aclose``)."""

    def __init__(self, server: SimServer) -> None:
        self.server = server
        self._started = False
        self._closers: set[asyncio.Task[None]] = set()

    async def send(self, method: str, url: str, body: bytes | None, headers: Mapping[str, str]) -> Response:
        if not self._started:
            self._started = True
            await self.server.runner.start()
        path = urlsplit(url).path.rstrip("/")
        srv = self.server
        try:
            if method == "POST" and path.endswith("/chat/completions"):
                sim = await srv.open_generation(body or b"", chat=True)
            elif method == "POST" and path.endswith("/completions"):
                sim = await srv.open_generation(body or b"", chat=False)
            elif method == "GET" and path.endswith("/health"):
                sim = _from_web(await srv.health(None))  # type: ignore[arg-type]  # the handler ignores it
            elif method == "GET" and path.endswith("/metrics"):
                sim = _from_web(await srv.metrics_endpoint(None))  # type: ignore[arg-type]
            elif method == "GET" and path.endswith("/models"):
                sim = _from_web(await srv.models(None))  # type: ignore[arg-type]
            elif method == "POST" and path.endswith("/tokenize"):
                sim = _from_web(web.json_response(srv.tokenize_body(body or b"")))
            elif method == "POST" and srv.llamacpp and path.endswith("/completion"):
                sim = await srv.open_native(body or b"")  # llama.cpp's own completion endpoint
            elif method == "GET" and srv.llamacpp and path.endswith("/props"):
                sim = _from_web(await srv.props(None))  # type: ignore[arg-type]
            elif method == "GET" and srv.llamacpp and path.endswith("/slots"):
                sim = _from_web(web.json_response(srv.slot_states()))
            elif method == "GET" and not srv.llamacpp and path.endswith("/version"):
                sim = _from_web(await srv.version(None))  # type: ignore[arg-type]
            else:
                sim = SimResponse.error(404, f"no route {method} {path}", "NotFound")
        except RequestError as exc:
            sim = SimResponse.error(exc.status, str(exc), type(exc).__name__, exc.param)
        return _InProcessResponse(sim, self._closers)

    async def aclose(self) -> None:
        if self._closers:
            await asyncio.gather(*self._closers, return_exceptions=True)
        if self._started:
            await self.server.runner.stop()
