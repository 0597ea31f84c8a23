"""The suite as one call: settings in, ``SuiteRun`` out — what ``agentload suite`` does, less parsing and printing.

``run_suite_app`` opens the target (the given server through a signed transport, or the embedded simulator with
the oracle on 127.0.0.1), one connection for the load, the polls and the liveness check, optionally Ray actors, and
runs the levels (``suite_over``). Progress and notes go to the callbacks the caller hands in, so the command decides
how they are shown (a bar on a terminal, lines elsewhere) and ``--json`` output stays clean.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict

from agentload.capacity.profile import load_profile
from agentload.endpoint.apikey import DEFAULT_API_KEY_ENV
from agentload.endpoint.connection import Connection, open_connection
from agentload.endpoint.probe import probe, served_model
from agentload.endpoint.records import Outcome
from agentload.endpoint.transport import Endpoint, Transport, signed_transport
from agentload.errors import ConfigError, EndpointResponseError, EndpointUnreachableError
from agentload.load.cluster import ExecutorSpec, RayCluster
from agentload.sim.agentmodel import AgentBehaviour
from agentload.sim.behaviour import Behaviour, FillerBehaviour, OracleBehaviour, ScenarioBook
from agentload.sim.scenarios import builtin_scenarios
from agentload.sim.server import SimConfig, SimServer
from agentload.suite.cases import select
from agentload.suite.cases.stress import PAYLOAD_TOKENS
from agentload.suite.distributed import RaySuite, SuiteWorker
from agentload.suite.model import SuiteTest
from agentload.suite.oracle import scenarios as suite_scenarios
from agentload.suite.results import SuiteRun, cut_short
from agentload.suite.runner import (
    DEFAULT_MAX_TOKENS,
    LevelStart,
    RemoteLevels,
    SuiteConfig,
    TestDone,
    run_suite,
)

EMBEDDED_PROFILE = "qwen3-235b-gb300"  # the source benchmark's deployment, and short simulated steps

Note = Callable[[str], None]


class SuiteSettings(BaseModel):
    """One ``agentload suite`` invocation, checked by the command: what to run, against what, how hard."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str | None = None  # None: the embedded simulator with the oracle
    model: str | None = None  # None: the one the server serves (the oracle's on the simulator)
    key_env: str = DEFAULT_API_KEY_ENV  # the variable the API key is read from (the key itself is never held here)
    profile: str = EMBEDDED_PROFILE  # the embedded simulator's
    tests: tuple[str, ...] | None = None  # test ids; None: all
    skip_hop: bool = False
    counts: tuple[int, ...] = (1,)  # agents at once, one level per count
    payload_tokens: int = PAYLOAD_TOKENS
    max_tokens: int | None = DEFAULT_MAX_TOKENS  # per turn
    executor: ExecutorSpec = ExecutorSpec()

    def selected(self) -> list[SuiteTest]:
        """The tests to run, in suite order (an unknown id is a ``ConfigError``)."""
        return select(list(self.tests) if self.tests else None, skip_hop=self.skip_hop,
                      payload_tokens=self.payload_tokens)  # fmt: skip


def oracle_book() -> ScenarioBook:
    """The simulator's built-in scenarios plus one per behaviour-suite test, for ``OracleBehaviour``: the suite
    knows both packages, so the book is put together here, never by the simulator (which the suite imports)."""
    return ScenarioBook([*builtin_scenarios(), *suite_scenarios()])


# The simulator's models by name (``agentload sim --behaviour``, ``agentload run --behaviour``): chosen here because
# the oracle's book is the suite's.
BEHAVIOURS = ("agent", "filler", "oracle")


def make_behaviour(kind: str, error_rate: float = 0.0, known_bad: str | None = None) -> Behaviour:
    """The behaviour named on the command line; ``error_rate`` is the oracle's or the agent's share of mistakes."""
    if known_bad is not None and kind != "oracle":
        raise ConfigError("--known-bad needs --behaviour oracle")
    if kind == "filler":
        if error_rate:
            raise ConfigError("--error-rate needs --behaviour agent or oracle")
        return FillerBehaviour()
    if kind == "agent":
        return AgentBehaviour(error_rate=error_rate)
    if kind == "oracle":
        # Conversations without a suite marker (a foreign client's) get the agent model, not filler.
        return OracleBehaviour(oracle_book(), error_rate=error_rate, known_bad=known_bad, fallback=AgentBehaviour())
    raise ConfigError(f"--behaviour {kind!r}: use {', '.join(BEHAVIOURS)}")


@asynccontextmanager
async def embedded_simulator(profile: str) -> AsyncIterator[tuple[str, str]]:
    """The simulator with the oracle on 127.0.0.1 (a free port) in this event loop; yields (URL, model)."""
    server = SimServer(SimConfig(profile=load_profile(profile), behaviour=OracleBehaviour(oracle_book())))
    runner = server.app_runner()  # the idle and half-sent connection limits of `agentload sim`
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        yield f"http://127.0.0.1:{port}", server.model_name
    finally:
        await runner.cleanup()


@asynccontextmanager
async def _endpoint(
    url: str | None, model: str | None, profile: str, key: str | None
) -> AsyncIterator[tuple[str, str, str, Transport | None]]:
    """(base URL, model, how results name the endpoint, transport): the given server, or the embedded simulator.

    A given server's credentials (the key, and any in the URL) go to the transport only; results name the URL
    with them masked (``endpoint.redact``). A server that is not told which model serves its only one.
    """
    if url is not None:
        server, transport = signed_transport(url, key)
        if model is None:
            try:
                model = served_model(await probe(server.base, transport=transport), None)
            except BaseException:
                await transport.aclose()  # the connection that would have closed it is never opened
                raise
        yield server.base, model, server.shown, transport
        return
    async with embedded_simulator(profile) as (base, served):
        yield base, model or served, f"embedded simulator ({profile}, oracle)", None


async def run_suite_app(
    settings: SuiteSettings,
    *,
    on_level: LevelStart | None = None,
    on_test: TestDone | None = None,
    note: Note | None = None,
) -> SuiteRun:
    """Run the suite as ``settings`` say and return the compiled run (the caller saves and prints it)."""
    tests = settings.selected()
    key = os.environ.get(settings.key_env) or None
    async with AsyncExitStack() as stack:
        base, served, label, transport = await stack.enter_async_context(
            _endpoint(settings.url, settings.model, settings.profile, key)
        )
        # One connection for the load, the polls and the liveness check; it closes the transport on the way out.
        conn = await stack.enter_async_context(open_connection(base, transport, close_transport=True))
        remote: RaySuite | None = None
        if settings.executor.kind == "ray":
            # Each actor connects to the server itself (the embedded simulator listens on 127.0.0.1 of this machine).
            cluster = RayCluster(settings.executor)
            stack.callback(cluster.close)
            cluster.start(SuiteWorker, Endpoint(settings.url or base, key))
            await cluster.measure_offsets()
            if note is not None:
                note(cluster.describe())
            remote = RaySuite(cluster)
        config = SuiteConfig(model=served, max_tokens=settings.max_tokens, payload_tokens=settings.payload_tokens)
        return await suite_over(conn, tests, config, list(settings.counts), endpoint=label, on_level=on_level,
                                on_test=on_test, remote=remote)  # fmt: skip


async def suite_over(
    conn: Connection,
    tests: list[SuiteTest],
    config: SuiteConfig,
    counts: list[int],
    *,
    endpoint: str,
    on_level: LevelStart | None = None,
    on_test: TestDone | None = None,
    remote: RemoteLevels | None = None,
) -> SuiteRun:
    """The suite's levels through ``conn``, as ``agentload suite`` runs them on any target.

    The same stack as bench and ``run``: a passing 503 or reset is resent (same turn, same body) rather than
    costing the agent a test, the stall watchdog gives up a request on a frozen server within ~22 s and waits out
    a cold start, and the liveness watch stops the whole run when the server is gone.
    """
    # The connection's clock: wall time on a normal loop, simulated time when the target is in process.
    return await run_suite(conn.backend, tests, config, counts, conn.clock, endpoint=endpoint, on_level=on_level,
                           on_test=on_test, liveness=conn.liveness, remote=remote)  # fmt: skip


def summary(run: SuiteRun) -> dict[str, Any]:
    """The run without transcripts (those go to the run directory), and how far it got if it was cut short:
    what --json prints."""
    out = run.model_dump(mode="json", exclude={"levels": {"__all__": {"agent_results"}}})
    out["cut_short"] = cut_short(run)
    return out


def raise_if_unreachable(run: SuiteRun) -> None:
    """A run in which not one request succeeded says nothing about the model: say why, and exit non-zero."""
    levels = run.levels
    if not levels or not all(lv.requests and lv.requests_failed == lv.requests for lv in levels):
        return
    first = next(rec for lv in levels for a in lv.agent_results for r in a.tests for rec in r.transcript.records())
    why = f": {first.error_message}" if first.error_message else ""
    if first.outcome is Outcome.CONNECT_ERROR:
        raise EndpointUnreachableError(f"every request to {run.endpoint} failed to connect{why}")
    raise EndpointResponseError(f"every request to {run.endpoint} failed{why}", status=first.http_status)
