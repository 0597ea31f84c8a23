"""One connection to one server: transport, chat client, stall watchdog, retries, one server monitor, liveness.

Every command that puts load on a server — ``bench`` (its levels and its token sizing), ``suite`` and ``run`` —
needs the same stack, and each used to wire it by hand (the suite without a watchdog at first; a level with a
second /metrics scraper beside the watchdog's poller). ``open_connection`` builds it once, for any target:

* a real server: ``connect_url`` signs an HTTP transport with the API key and ``--url``'s credentials
  (``transport.signed_transport``), so the load, the polls and the liveness check all carry them;
* the embedded simulator over HTTP: a plain URL, no transport given (an ``AiohttpTransport`` is made);
* the simulator in process: its ``sim.inprocess.InProcessTransport`` given as the transport.

What it holds, in the order it is built and the reverse order it is closed:

``monitor``
    one ``SignalPoller``: /health and /metrics (plus the engine's extras) every ``poll_interval_s``. It feeds the
    watchdog's signals, the liveness rule and — through ``monitor.subscribe`` — the bench level's timeline
    (``bench.sampler.MetricsSampler``), whose ``sample_once`` is a poll on demand (the window's quiesced edges).
``watchdog``
    the ``Watchdog`` stall policy reading the monitor (``first_token_floor_s`` is the one deadline that differs).
``client`` / ``backend``
    the ``ChatClient`` on the transport, and the agent loop's ``ChatBackend``: ``RetryingBackend`` (resends a
    transient failure, stops when the watchdog says the server is dead) or, for one-shot measurements,
    ``SingleAttemptBackend``.
``liveness``
    ``ServerLiveness`` over the watchdog's dead-server rule, for a command to stop its whole load.

The transport is closed by the connection when it made it or is told to (``close_transport``); one it was lent
(a bench target's, shared by its levels) is left to its owner.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass

from agentload.clock import Clock, LoopClock
from agentload.endpoint.backend import RetryingBackend, SingleAttemptBackend
from agentload.endpoint.client import ChatClient
from agentload.endpoint.liveness import ServerLiveness
from agentload.endpoint.redact import ServerUrl
from agentload.endpoint.signals import SignalPoller
from agentload.endpoint.transport import AiohttpTransport, Endpoint, Transport, signed_transport
from agentload.endpoint.watchdog import Watchdog


@dataclass(frozen=True)
class ConnectionOptions:
    """What differs between the commands that open a connection; the defaults are the load's."""

    engine: str | None = None  # as the probe names it; None: the monitor learns it from the metric prefix
    poll_interval_s: float = 1.0
    first_token_floor_s: float = 30.0  # token sizing sends a long first prompt to a cold server: 300 s there
    single_attempt: bool = False  # one request per turn (a measurement that must not be resent)
    max_attempts: int = 5
    base_backoff_s: float = 0.5
    retry_clock: Clock | None = None  # what retries sleep on (default: the connection's clock)
    retry_rng: random.Random | None = None


class Connection:
    """The stack for one server; see the module docstring. Made by ``connect`` / ``open_connection``."""

    def __init__(
        self,
        base_url: str,
        transport: Transport,
        *,
        options: ConnectionOptions,
        clock: LoopClock,
        closers: list[Callable[[], Awaitable[None]]],
    ) -> None:
        self.base_url = base_url
        self.transport = transport
        self.options = options
        self.clock = clock
        self.monitor = SignalPoller(
            base_url, engine=options.engine, interval_s=options.poll_interval_s, transport=transport, clock=clock
        )
        self.watchdog = Watchdog(signals=self.monitor, clock=clock, first_token_floor_s=options.first_token_floor_s)
        # The key and the URL's credentials belong to the transport (signed once); none is read again here.
        self.client = ChatClient(base_url, transport=transport, policy=self.watchdog, api_key_env=None, clock=clock)
        self.backend: SingleAttemptBackend | RetryingBackend  # either is the agent loop's ChatBackend
        self.retrying: RetryingBackend | None = None
        if options.single_attempt:
            self.backend = SingleAttemptBackend(self.client)
        else:
            self.retrying = RetryingBackend(
                self.client,
                policy=self.watchdog,
                max_attempts=options.max_attempts,
                base_backoff_s=options.base_backoff_s,
                clock=options.retry_clock or clock,
                rng=options.retry_rng,
            )
            self.backend = self.retrying
        self.liveness = ServerLiveness(self.watchdog, self.monitor, clock)
        self._closers = closers
        self._closed = False

    async def start(self) -> None:
        await self.monitor.start()

    async def aclose(self) -> None:
        """Stop the monitor, then close what the connection owns (in reverse order of opening). Idempotent."""
        if self._closed:
            return
        self._closed = True
        async with AsyncExitStack() as stack:
            for close in self._closers:
                stack.push_async_callback(close)
            stack.push_async_callback(self.monitor.stop)


async def connect(
    base_url: str,
    transport: Transport | None = None,
    *,
    options: ConnectionOptions | None = None,
    clock: LoopClock | None = None,
    close_transport: bool = False,
) -> Connection:
    """A started connection to ``base_url`` (``aclose`` it); with no transport, one over HTTP it owns."""
    closers: list[Callable[[], Awaitable[None]]] = []
    if transport is None:
        transport = AiohttpTransport()
        close_transport = True
    if close_transport:
        closers.append(transport.aclose)
    try:
        conn = Connection(base_url, transport, options=options or ConnectionOptions(), clock=clock or LoopClock(),
                          closers=closers)  # fmt: skip
        await conn.start()
    except BaseException:
        for close in reversed(closers):
            await close()
        raise
    return conn


async def connect_endpoint(
    endpoint: Endpoint, *, options: ConnectionOptions | None = None, clock: LoopClock | None = None
) -> Connection:
    """A started connection to an ``Endpoint``, as each Ray actor opens its own (``aclose`` it).

    Over a signed HTTP transport it owns when the endpoint has none; through the endpoint's in-process transport
    (tests on virtual time), which stays the caller's, when it has one.
    """
    if endpoint.transport is not None:
        return await connect(endpoint.url, endpoint.transport, options=options, clock=clock)
    server, transport = signed_transport(endpoint.url, endpoint.key)
    return await connect(server.base, transport, options=options, clock=clock, close_transport=True)


@asynccontextmanager
async def open_connection(
    base_url: str,
    transport: Transport | None = None,
    *,
    options: ConnectionOptions | None = None,
    clock: LoopClock | None = None,
    close_transport: bool = False,
) -> AsyncIterator[Connection]:
    """``connect`` as a context manager: closed on the way out, whatever happened inside."""
    conn = await connect(base_url, transport, options=options, clock=clock, close_transport=close_transport)
    try:
        yield conn
    finally:
        await conn.aclose()


@asynccontextmanager
async def connect_url(
    url: str, key: str | None, *, options: ConnectionOptions | None = None, clock: LoopClock | None = None
) -> AsyncIterator[tuple[ServerUrl, Connection]]:
    """A connection to a real server's ``--url``, signed with ``key`` and the URL's own credentials.

    Yields the URL taken apart (``server.base`` to build requests on, ``server.shown`` to record) with the
    connection, which owns the signed transport.
    """
    server, transport = signed_transport(url, key)
    async with open_connection(server.base, transport, options=options, clock=clock, close_transport=True) as conn:
        yield server, conn
