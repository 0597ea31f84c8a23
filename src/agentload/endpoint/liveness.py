"""Is the server still there, and is it up yet? One answer for every command that holds a load on a server.

Why: bench and suite once ran on for minutes against a killed server (every turn a failed connect, exit 0)
and forever against a frozen one. ``agentload run`` already noticed, because its requests go through the stall
watchdog, whose dead-server rule reads a ``SignalPoller``: no answer of any kind for ``dead_after_s`` (20 s by
default). This module does not add a third rule; it watches that one from the outside, so a command can stop its
load instead of only its requests:

* ``ServerLiveness.wait_lost()`` returns once the rule says the server is gone, with a sentence saying how — a
  killed server refuses connections, a frozen one (SIGSTOP, a wedged process) accepts them and answers nothing —
  found by one short request of its own. Detection lands at ``dead_after_s`` + one ``check_s`` after the last
  answer, plus the poller's own timeout for a frozen server's last poll: about 20-27 s with the defaults.
* ``wait_until_up`` is for a command's start (item 5): a server that is still loading refuses connections or
  answers 503, which is no reason to fail — it is waited for, up to a bound, with a line now and then saying so.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Callable
from typing import Protocol
from urllib.parse import urlsplit

from agentload.clock import Clock
from agentload.endpoint.signals import SignalPoller
from agentload.endpoint.transport import ConnectFailed, ConnectTimedOut, TransportError
from agentload.errors import EndpointTimeoutError, EndpointUnreachableError

# How long the start waits for the resolver: a name that does not resolve in this long is not coming.
RESOLVE_TIMEOUT_S = 10.0

# How long ``describe`` waits for its own answer: a live server's /health answers in milliseconds.
DESCRIBE_TIMEOUT_S = 3.0


class DeadServerRule(Protocol):
    """The rule that says when a server is gone (``Watchdog``: no answer to its poller for ``dead_after_s``)."""

    def server_dead(self) -> bool: ...


class ServerLiveness:
    """Watches the dead-server rule of a run's watchdog; see the module docstring."""

    def __init__(self, rule: DeadServerRule, poller: SignalPoller, clock: Clock, *, check_s: float = 1.0) -> None:
        self.rule = rule
        self.poller = poller
        self.clock = clock
        self.check_s = check_s

    def lost(self) -> bool:
        return self.rule.server_dead()

    async def wait_lost(self) -> str:
        """Return, with ``describe``'s sentence, once the rule says the server is gone (never, while it answers)."""
        while not self.rule.server_dead():
            await self.clock.sleep(self.check_s)
        return await self.describe()

    async def describe(self) -> str:
        """One sentence for the error line: how long the server has been silent and what a fresh request meets."""
        silent = self.poller.last_response_age()
        try:
            async with asyncio.timeout(DESCRIBE_TIMEOUT_S):
                resp = await self.poller.transport.send("GET", self.poller.url + "/health", None, {})
                resp.close()
            how = f"answered again just now (HTTP {resp.status}) but too late to go on"
        except ConnectTimedOut:
            how = "answers nothing, not even a connection in time (frozen, hung or unreachable)"
        except ConnectFailed:
            how = "refuses connections (the server is down)"
        except TimeoutError:
            how = "accepts connections but answers nothing (frozen or hung)"
        except TransportError as exc:
            how = f"breaks connections ({exc})"
        return f"{self.poller.url} has not answered for {silent:.0f} s: it {how}"


async def wait_until_up(
    poller: SignalPoller, timeout_s: float, *, report: Callable[[str], None], every_s: float = 10.0
) -> None:
    """Wait until the server answers and says it is ready, up to ``timeout_s``; ``report`` a line every ``every_s``.

    Raises ``EndpointTimeoutError`` (which names the state it was left in) when the bound passes, and
    ``EndpointUnreachableError`` at once when the host name does not resolve: a server that is loading refuses
    connections, but a mistyped name would only be waited for in vain.
    """
    await _check_resolves(poller.url)
    try:
        await poller.wait_until_ready(0.0)  # one poll: a server that is up is not kept waiting for a message
        return
    except EndpointTimeoutError:
        pass
    report(f"waiting up to {timeout_s:g} s for {poller.url} to come up: {_state(poller)}")
    waited = 0.0
    while True:
        step = min(every_s, timeout_s - waited)
        try:
            await poller.wait_until_ready(step)
            return
        except EndpointTimeoutError as exc:
            waited += step
            if waited >= timeout_s:
                raise EndpointTimeoutError(
                    f"{poller.url} is still {_state(poller)} after {timeout_s:g} s of waiting for it to come up"
                ) from exc
        report(f"still waiting for {poller.url}: {_state(poller)} ({waited:.0f} s of at most {timeout_s:g} s)")


async def _check_resolves(url: str) -> None:
    parts = urlsplit(url)
    host = parts.hostname
    if not host:
        return
    try:
        ipaddress.ip_address(host)
        return  # a literal address needs no resolver
    except ValueError:
        pass
    try:
        await asyncio.wait_for(asyncio.get_running_loop().getaddrinfo(host, parts.port), RESOLVE_TIMEOUT_S)
    except socket.gaierror as exc:
        raise EndpointUnreachableError(f"{host} does not resolve ({exc.strerror}): check the URL's host name") from exc
    except TimeoutError:
        return  # a slow resolver is the connection's problem, and waited for as such


def _state(poller: SignalPoller) -> str:
    sig = poller.latest
    return "not ready" if sig is not None and sig.responding else "not answering"
