"""A scripted server behind the in-process MockTransport, shared by the signal-poller and watchdog tests."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from agentload.endpoint.transport import ConnectFailed, MockRequest, MockResponse, MockTransport

Routes = Mapping[str, tuple[int, bytes]]


def scripted(routes: Callable[[], Routes]) -> MockTransport:
    """A server that answers the paths ``routes()`` names now, 404 elsewhere; an empty table refuses connections."""

    async def handler(request: MockRequest) -> MockResponse:
        table = routes()
        if not table:
            raise ConnectFailed("connection refused (mock)")
        path = "/" + request.url.split("/", 3)[3]
        status, body = table.get(path, (404, b"not found"))
        return MockResponse(status=status, chunks_script=[(0.0, body)])

    return MockTransport(handler)
