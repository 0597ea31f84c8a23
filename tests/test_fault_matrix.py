"""Every injected fault × {1, 32} agents × {bench, suite, run}: nothing lost, nothing repeated, no one wrongly
killed, and every hostile stream cut within its deadline.

Each command runs through the function its CLI calls (a bench level's ``run_level``, ``suite_over``, ``run_fleet``)
against the simulator in process on virtual time, with the production watchdog and retry defaults; an hour of
hostile streaming costs seconds. The client hands every request it sends to ``endpoint.client.stream_watch`` in
the request's own task, where the simulator (called in that same task, in process) draws the request's fault: so
each request is paired with its fault and, once over, with its record. Counted per cell:

* lost: requests sent whose record is not in what the command kept (a bench level's records, the suite's
  transcripts, the fleet's committed turns and interrupts);
* repeated: a turn that succeeded twice, or an attempt kept twice;
* wrongly killed: a request with no fault that a deadline ended (the server was making progress on it);
* over deadline: how far past its deadline + ``MARGIN_S`` a hostile stream ended. A stream that sent nothing yet
  (a stall before the first token, ``comments``) is due to end ``FIRST_TOKEN_S`` after it was sent; one that went
  silent after tokens (a stall mid-stream, ``comments_mid``) ``IDLE_S`` after its last token; an ``endless`` one
  once it is past its ``max_tokens`` (the time of that token), or, on a bench level, at the level's end.

The last kinds strike the whole server rather than drawn requests. ``cold``: the server loads for ``COLD_S``
(/health 503, chat requests get no byte), longer than the first-token floor; a request sent meanwhile met the cold
start but is not faulted (the watchdog must wait for it: ending it is a wrong kill). ``restart`` (``DOWN_S``) and
``restart_short`` (``SHORT_DOWN_S``): mid-run every connection breaks, connections are refused for that long and
the server comes back with an empty engine; a request refused or broken by it is faulted. For these, every turn
must also end in a success (one the load itself cut at its end aside): ``unfinished``. ``restart_long`` stays down
past the dead-server rule, where the command must stop instead (``stopped``: a bench level's, the suite's or the
fleet's "server lost"), keeping its records. Every other kind must not stop the command.

``benchmarks/fault_matrix.py`` runs the same matrix at more agents and prints the table.
"""

from __future__ import annotations

import asyncio
import functools
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from unittest import mock
from urllib.parse import urlsplit

import pytest

from agentload.bench import runner as bench_runner
from agentload.bench.runner import run_level
from agentload.bench.target import Target
from agentload.capacity.profile import load_profile
from agentload.clock import LoopClock, run_virtual
from agentload.endpoint.client import stream_watch
from agentload.endpoint.connection import ConnectionOptions, connect, open_connection
from agentload.endpoint.records import ErrorKind, Outcome, RequestIds, RequestRecord
from agentload.endpoint.transport import ConnectFailed, Response, StreamBroken, TransportError
from agentload.fleet import app as fleet_app
from agentload.fleet.app import FleetApp, FleetSettings
from agentload.fleet.checkpoint import LOG, load_log
from agentload.fleet.limiter import Mode
from agentload.sim.behaviour import OracleBehaviour
from agentload.sim.faults import FaultInjector, FaultSpec, parse_fault
from agentload.sim.inprocess import InProcessTransport
from agentload.sim.server import SimConfig, SimServer
from agentload.suite.app import oracle_book, suite_over
from agentload.suite.cases import select
from agentload.suite.runner import SuiteConfig
from agentload.workload.registry import get_workload

PROFILE = "qwen3-235b-gb300"  # room for 256 agents' contexts without preemption muddling the picture
FIRST_TOKEN_S = 30.0  # the watchdog's first-token floor (ConnectionOptions.first_token_floor_s)
IDLE_S = 60.0  # the watchdog's idle deadline
MARGIN_S = 5.0
SEED = 7
# bench: a short level; its end is where an endless stream is due to be cut when the client has no other bound.
WARMUP_S, WINDOW_S, GRACE_S = 5.0, 30.0, 10.0
# The whole-server kinds. A cold start longer than the first-token floor, so only the watchdog's "warming" grant
# saves its requests; a restart shorter than the dead-server rule (``Watchdog.dead_after_s``, 20 s), which the
# commands must ride out with retries; and one longer than it, after which they must stop.
COLD_S = 90.0
DOWN_S = 8.0
LONG_DOWN_S = 30.0
# And one shorter than the retries' shortest backoff total (0.25 + 0.5 + 1 + 2 s, ``RetryingBackend.delay``), so a
# turn's fifth attempt always meets the server back: the restart's mechanics, whatever the retry budget.
SHORT_DOWN_S = 3.0
SUITE_TESTS = ["T1", "T3"]
SUITE_MAX_TOKENS = 256
FLEET_ROUNDS = 3
FLEET = """
name = "faults"

[defaults]
tools = ["search"]
tool_choice = "required"
max_rounds = {rounds}
max_tokens = 16
think_time_s = 0.5
context_tokens = 200
tool_result_tokens = 20

[[tasks]]
id = "f"
prompt = "Fault matrix agent {{replica}}."
count = {agents}
"""


@dataclass(frozen=True)
class Kind:
    """One row of the matrix: the fault as ``--fault`` takes it and where a mid-stream one strikes, or what
    happens to the whole server (a cold start, a restart)."""

    name: str
    fault: str = ""  # "": no request draws a fault
    strike: str = "drawn"  # "first": before the first token; "mid": halfway; "drawn": the simulator's own draw
    hostile: str = ""  # how its deadline is read (see the module docstring): first | idle | endless | ""
    cold_s: float = 0.0  # the server loads this long before serving (SimConfig.cold_start_s)
    down_s: float = 0.0  # the server restarts once, mid-run, refusing connections this long (``_Restarting``)
    stops: bool = False  # the command must stop with the server lost

    @property
    def outage(self) -> bool:
        """A whole-server kind: every turn sent must end in a success, unless the command stops."""
        return self.cold_s > 0 or self.down_s > 0


KINDS = [
    Kind("reset", "reset:0.25"),
    Kind("http500", "http500:0.25"),
    Kind("http503", "http503:0.25"),
    Kind("http429", "http429:0.25:2"),
    Kind("malformed", "malformed:0.25"),
    Kind("stall_first", "stall:0.25:600", strike="first", hostile="first"),
    Kind("stall_mid", "stall:0.25:600", strike="mid", hostile="idle"),
    Kind("comments", "comments:0.25:1", hostile="first"),
    Kind("comments_mid", "comments_mid:0.25:1", strike="mid", hostile="idle"),
    # A token every 0.1 s: a client that cuts a stream a few tokens past max_tokens does so within the margin.
    Kind("endless", "endless:0.1:0.1", hostile="endless"),
    Kind("cold", cold_s=COLD_S),
    Kind("restart", down_s=DOWN_S),
    Kind("restart_short", down_s=SHORT_DOWN_S),
    Kind("restart_long", down_s=LONG_DOWN_S, stops=True),
]
KIND = {k.name: k for k in KINDS}


# -- pairing each request with its fault ----------------------------------------------------------------------------
@dataclass
class Sent:
    """One request the client sent: its ids, the client's accumulator (its record once over), the fault drawn, and
    the whole-server event it met: "cold" (sent before the server was ready: not a fault, it must be waited for) or
    "restart" (refused, or its connection broken, by the restart: a fault)."""

    ids: RequestIds
    acc: Any
    fault: FaultSpec | None = None
    outage: str = ""

    @property
    def faulted(self) -> bool:
        """Something other than the server's own pace may end it: a deadline doing so is no wrong kill."""
        return self.fault is not None or self.outage == "restart"

    @property
    def record(self) -> RequestRecord | None:
        rec = self.acc.record
        return rec if isinstance(rec, RequestRecord) else None


_sending: ContextVar[Sent | None] = ContextVar("fault_matrix_sending", default=None)


class _Injector(FaultInjector):
    """The simulator's injector, telling the request being sent which fault it drew, and striking where told."""

    def __init__(self, specs: list[FaultSpec], seed: int, strike: str) -> None:
        super().__init__(specs, seed=seed)
        self.strike = strike

    def draw(self) -> FaultSpec | None:
        spec = super().draw()
        sent = _sending.get()
        if sent is not None:
            sent.fault = spec
        return spec

    def mid_stream_point(self, total_tokens: int) -> int:
        drawn = super().mid_stream_point(total_tokens)  # drawn all the same: the same run as without the override
        if self.strike == "first":
            return 0
        if self.strike == "mid":
            return max(1, total_tokens // 2)
        return drawn


@dataclass
class Cell:
    kind: Kind
    agents: int
    command: str
    sent: list[Sent] = field(default_factory=list)
    kept: list[RequestRecord] = field(default_factory=list)
    level_end: float | None = None  # a bench level's end on the client's clock
    servers: list[SimServer] = field(default_factory=list)  # in the order made: a restart adds one
    stopped: str | None = None  # why the command stopped early (the server lost), or None

    def watch(self, ids: RequestIds | None, acc: Any) -> None:
        if ids is None:
            return  # the fleet's probe: not a turn of any agent
        sent = Sent(ids, acc)
        if self.kind.cold_s > 0 and self.servers and not self.servers[-1].runner.is_ready:
            sent.outage = "cold"
        self.sent.append(sent)
        _sending.set(sent)  # the rest of this request's task: the simulator's draw runs in it

    # -- what is counted --------------------------------------------------------------------------------------------
    @property
    def failed(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.kept:
            if not r.ok:
                why = r.error.value if r.error is not None else r.outcome.value
                if r.http_status not in (None, 200):
                    why = f"http_{r.http_status}"
                out[why] = out.get(why, 0) + 1
        return out

    @property
    def injected(self) -> int:
        return sum(1 for s in self.sent if s.fault is not None or s.outage)

    @property
    def lost(self) -> int:
        kept = {_key(r.ids, r.t_sent) for r in self.kept}
        return sum(1 for s in self.sent if _key(s.ids, s.acc.t_sent) not in kept)

    @property
    def repeated(self) -> int:
        attempts: dict[tuple[Any, ...], int] = {}
        successes: dict[tuple[Any, ...], int] = {}
        for r in self.kept:
            i = r.ids
            attempts[(i.run, i.level, i.agent, i.turn, i.attempt)] = attempts.get((i.run, i.level, i.agent, i.turn,
                                                                                   i.attempt), 0) + 1  # fmt: skip
            if r.ok:
                successes[(i.run, i.level, i.agent, i.turn)] = successes.get((i.run, i.level, i.agent, i.turn), 0) + 1
        return sum(n - 1 for n in attempts.values() if n > 1) + sum(n - 1 for n in successes.values() if n > 1)

    @property
    def wrongly_killed(self) -> int:
        return sum(1 for s in self.sent if not s.faulted and s.record is not None
                   and s.record.outcome is Outcome.TIMEOUT)  # fmt: skip

    @property
    def unfinished(self) -> int:
        """Turns kept none of whose attempts succeeded, a turn whose last attempt the load itself cut aside (a
        bench level's end). Only a whole-server kind is held to 0: a drawn fault may fail a turn five times."""
        done: dict[tuple[Any, ...], bool] = {}
        for r in self.kept:
            i = r.ids
            turn = (i.run, i.level, i.agent, i.turn)
            done[turn] = done.get(turn, False) or r.ok or r.error is ErrorKind.CUT
        return sum(1 for ok in done.values() if not ok)

    def over_deadline(self) -> float:
        """The most seconds any hostile stream ran past its deadline + MARGIN_S (0 when none did)."""
        worst = 0.0
        for s in self.sent:
            rec = s.record
            if s.fault is None or rec is None or not self.kind.hostile:
                continue
            due = self._due(rec)
            if due is not None:
                worst = max(worst, rec.t_done - (due + MARGIN_S))
        return worst

    def _due(self, rec: RequestRecord) -> float | None:
        hostile = self.kind.hostile
        if hostile == "first" or (hostile == "idle" and not rec.chunk_times):
            return rec.t_sent + FIRST_TOKEN_S
        if hostile == "idle":
            return rec.chunk_times[-1] + IDLE_S
        # endless: past max_tokens (each chunk one token), else the level's end; a suite or fleet turn has a cap.
        cap = rec.requested_tokens
        if cap is not None and len(rec.chunk_times) > cap:
            return rec.chunk_times[cap - 1]
        if cap is not None:
            return rec.t_done  # it never reached its cap: it ended for some other reason, in time
        return self.level_end

    def row(self) -> dict[str, Any]:
        return {"kind": self.kind.name, "agents": self.agents, "command": self.command, "requests": len(self.sent),
                "injected": self.injected, "failed": self.failed, "lost": self.lost, "repeated": self.repeated,
                "wrongly_killed": self.wrongly_killed, "over_deadline_s": self.over_deadline(),
                "unfinished": self.unfinished, "stopped": self.stopped}  # fmt: skip


def _key(ids: RequestIds, t_sent: float) -> tuple[Any, ...]:
    return (ids.run, ids.level, ids.agent, ids.turn, ids.attempt, t_sent)


def _server(cell: Cell, **config: Any) -> SimServer:
    kind = cell.kind
    server = SimServer(SimConfig(profile=load_profile(PROFILE), seed=SEED, cold_start_s=kind.cold_s, **config))
    server.faults = _Injector([parse_fault(kind.fault)] if kind.fault else [], SEED, kind.strike)
    cell.servers.append(server)
    return server


# -- a server that restarts ---------------------------------------------------------------------------------------
_T = TypeVar("_T")


class _Restarting:
    """The in-process transport to a server that restarts once, mid-run: when a request past the cell's first
    ``agents`` has streamed its first chunk while an eighth of the agents (at least one) have a request open (a
    bench level's short turns between think times seldom overlap more). Every connection open then breaks (before
    the status line: ``ConnectFailed``; after it: ``StreamBroken``), every connection for ``down_s`` after is
    refused, and then a fresh ``SimServer`` answers: an empty engine, no KV or prefix cache.

    A connection breaks where its request's task waits on the server: the task is cancelled there and the
    cancellation turned into the transport's error, as a socket closing under an aiohttp read would surface. A
    response from before the restart that is read again afterwards breaks on that read.
    """

    def __init__(self, cell: Cell, server: SimServer) -> None:
        self.cell = cell
        self.inner = InProcessTransport(server)
        self.down = False
        self.epoch = 0  # restarts so far: a response opened in an earlier epoch is on a dead connection
        self.struck = False
        self.open_chats = 0  # chat responses begun and not yet closed
        self._waiting: set[asyncio.Task[Any]] = set()  # tasks waiting on the server right now
        self._breaking: set[asyncio.Task[Any]] = set()  # those the restart cancelled
        self._back: asyncio.Task[None] | None = None

    async def send(self, method: str, url: str, body: bytes | None, headers: Mapping[str, str]) -> Response:
        chat = method == "POST" and urlsplit(url).path.rstrip("/").endswith("/completions")
        if self.down:
            self.faulted(chat)
            raise ConnectFailed("connection refused (the server is restarting)")
        # Past the first ``agents`` requests: the restart lands mid-run, not on the load's first turns.
        strike = chat and len(self.cell.sent) > self.cell.agents
        epoch = self.epoch
        closed = ConnectFailed("the connection closed before the status line: the server went down")
        resp = await self.wait(self.inner.send(method, url, body, headers), chat, closed)
        if chat:
            self.open_chats += 1
        return _RestartingResponse(self, resp, epoch, chat=chat, strike=strike)

    def strikes(self) -> bool:
        return not self.struck and self.open_chats >= max(1, self.cell.agents // 8)

    async def wait(self, step: Awaitable[_T], chat: bool, broken: TransportError) -> _T:
        """Await ``step`` on the server; raise ``broken`` instead if the restart breaks it."""
        task = asyncio.current_task()
        assert task is not None
        self._waiting.add(task)
        try:
            return await step
        except asyncio.CancelledError:
            if task not in self._breaking or task.uncancel() > 0:
                raise  # not the restart's (or a deadline's at the same instant too): the canceller's to handle
            self.faulted(chat)
            raise broken from None
        finally:
            self._waiting.discard(task)
            self._breaking.discard(task)

    def faulted(self, chat: bool) -> None:
        sent = _sending.get()
        if chat and sent is not None:
            sent.outage = "restart"

    def go_down(self) -> None:
        self.struck, self.down = True, True
        self.epoch += 1
        for task in self._waiting:
            if task.cancelling() == 0:  # one a deadline is ending already ends as that deadline says
                self._breaking.add(task)
                task.cancel()
        self._back = asyncio.create_task(self._come_back(self.inner, asyncio.get_running_loop().time()))

    async def _come_back(self, old: InProcessTransport, down_at: float) -> None:
        await old.aclose()  # the old engine stops with whatever it held
        await asyncio.sleep(max(0.0, down_at + self.cell.kind.down_s - asyncio.get_running_loop().time()))
        self.inner = InProcessTransport(_server(self.cell, behaviour=old.server.config.behaviour))
        self.down = False

    async def aclose(self) -> None:
        if self._back is not None and not self._back.done():
            self._back.cancel()  # a command that stopped while the server was down
            await asyncio.gather(self._back, return_exceptions=True)
        await self.inner.aclose()


class _RestartingResponse:
    def __init__(self, owner: _Restarting, resp: Response, epoch: int, *, chat: bool, strike: bool) -> None:
        self._owner = owner
        self._resp = resp
        self._epoch = epoch
        self._chat = chat
        self._strike = strike
        self._closed = False
        self.status = resp.status
        self.headers = resp.headers

    async def chunks(self) -> AsyncIterator[bytes]:
        owner = self._owner
        it = aiter(self._resp.chunks())
        reads = 0
        while True:
            if self._strike and reads >= 1 and owner.strikes():
                owner.go_down()  # this stream has begun: it breaks with the rest
            if self._epoch != owner.epoch:
                owner.faulted(self._chat)
                await it.aclose()  # type: ignore[attr-defined]  # the inner response's body is an async generator
                raise StreamBroken("connection reset: the server went down")
            try:
                block = await owner.wait(anext(it), self._chat, StreamBroken("connection reset: the server went down"))
            except StopAsyncIteration:
                return
            reads += 1
            yield block

    async def read(self) -> bytes:
        return b"".join([b async for b in self.chunks()])

    def close(self) -> None:
        if self._chat and not self._closed:
            self._owner.open_chats -= 1
        self._closed = True
        self._resp.close()


def _transport(cell: Cell, server: SimServer) -> InProcessTransport | _Restarting:
    return _Restarting(cell, server) if cell.kind.down_s > 0 else InProcessTransport(server)


# -- the three commands -----------------------------------------------------------------------------------------
async def _bench(cell: Cell, _tmp: Path) -> None:
    server = _server(cell)
    transport = _transport(cell, server)
    target = Target(transport, "http://sim.invalid", server.model_name, "fault matrix", virtual=True,
                    profile=server.profile, engine="agentload-sim")  # fmt: skip
    # The level's warm-up covers a cold start: its requests wait through it, and the window measures a warm server
    # (``bench --url`` waits for /health before its first level; here the level's own requests meet the cold start).
    warmup = WARMUP_S + cell.kind.cold_s
    # The retries' jitter seeded, as the suite's is: a cell runs the same every time.
    seeded = functools.partial(connect, options=ConnectionOptions(retry_rng=random.Random(SEED)))
    t0 = LoopClock().now()
    try:
        with mock.patch.object(bench_runner, "connect", seeded):
            data = await run_level(target, get_workload("agentic"), agents=cell.agents, context=2000, level=0,
                                   run_id="matrix", run_t0=t0, warmup_s=warmup, window_s=WINDOW_S,
                                   grace_s=GRACE_S)  # fmt: skip
    finally:
        await transport.aclose()
    cell.kept = list(data.records)
    cell.level_end = t0 + warmup + WINDOW_S + GRACE_S
    cell.stopped = data.lost


async def _suite(cell: Cell, _tmp: Path) -> None:
    server = _server(cell, behaviour=OracleBehaviour(oracle_book()))
    options = ConnectionOptions(retry_rng=random.Random(SEED))
    async with open_connection("http://sim.invalid", _transport(cell, server), options=options,
                               close_transport=True) as conn:  # fmt: skip
        run = await suite_over(conn, select(SUITE_TESTS), SuiteConfig(model=server.model_name,
                               max_tokens=SUITE_MAX_TOKENS), [cell.agents], endpoint="fault matrix")  # fmt: skip
    cell.kept = [r for lv in run.levels for a in lv.agent_results for t in a.tests for r in t.transcript.records()]
    cell.stopped = run.incomplete


async def _run(cell: Cell, tmp: Path) -> None:
    fleet = tmp / "fleet.toml"
    fleet.write_text(FLEET.format(rounds=FLEET_ROUNDS, agents=cell.agents))
    made: list[SimServer] = []

    def server(config: SimConfig) -> SimServer:
        made.append(_server(cell, behaviour=config.behaviour))
        return made[-1]

    opts = FleetApp(FleetSettings(fleet=fleet, out=tmp / "runs", progress="none", virtual=True, mode=Mode.PARALLEL,
                      width=cell.agents))  # fmt: skip
    with (mock.patch.object(fleet_app, "SimServer", server),
          mock.patch.object(fleet_app, "InProcessTransport", lambda s: _transport(cell, s))):  # fmt: skip
        result = await opts.run()
    assert opts.run_dir is not None
    assert len(made) == 1
    cell.stopped = result.server_failure
    state = load_log(opts.run_dir / LOG, repair=False)
    cell.kept = [r for lines in state.turns.values() for x in lines for r in x.turn.records]
    cell.kept += [r for lines in state.interrupts.values() for x in lines for r in x.records]


COMMANDS: dict[str, Callable[[Cell, Path], Awaitable[None]]] = {"bench": _bench, "suite": _suite, "run": _run}


def run_cell(kind: Kind, agents: int, command: str, tmp: Path) -> Cell:
    """Run one cell of the matrix on a fresh virtual-time loop and return what it counted."""
    cell = Cell(kind, agents, command)

    async def go() -> None:
        token = stream_watch.set(cell.watch)  # inherited by every task the command starts from here
        try:
            await COMMANDS[command](cell, tmp)
        finally:
            stream_watch.reset(token)

    run_virtual(go())
    return cell


# -- the tests: one per command over the table of kinds × agents --------------------------------------------------
# Cells that fail, with why; a mark goes once its cause is fixed (strict: a fix shows as XPASS). None today.
XFAIL: dict[tuple[str, int, str], str] = {}
# Cells beyond 1 and 32 agents, where a race shows only when many requests' deadline checks fall at different
# instants (a bench level staggers its agents' starts over a second).
EXTRA: dict[str, list[tuple[str, int]]] = {"bench": [("cold", 256)]}


def _cells(command: str) -> list[Any]:
    out = []
    for kind, agents in [(k.name, n) for k in KINDS for n in (1, 32)] + EXTRA.get(command, []):
        why = XFAIL.get((kind, agents, command))
        marks = [pytest.mark.xfail(strict=True, reason=why)] if why else []
        out.append(pytest.param(kind, agents, marks=marks, id=f"{kind}-{agents}"))
    return out


def _check(cell: Cell) -> None:
    row = cell.row()
    assert cell.injected >= 1, f"the seed injected no {cell.kind.name} fault: the cell means nothing ({row})"
    assert cell.lost == 0, row
    assert cell.repeated == 0, row
    assert cell.wrongly_killed == 0, row
    assert cell.over_deadline() <= 0.0, row
    assert (cell.stopped is not None) is cell.kind.stops, row
    if cell.kind.outage and not cell.kind.stops:
        assert cell.unfinished == 0, row
    if cell.kind.down_s > 0 and not cell.kind.stops:
        assert len(cell.servers) == 2, f"the server never came back after its restart ({row})"


@pytest.mark.parametrize(("kind", "agents"), _cells("bench"))
def test_bench_level_under_faults(kind: str, agents: int, tmp_path: Path) -> None:
    _check(run_cell(KIND[kind], agents, "bench", tmp_path))


@pytest.mark.parametrize(("kind", "agents"), _cells("suite"))
def test_suite_under_faults(kind: str, agents: int, tmp_path: Path) -> None:
    _check(run_cell(KIND[kind], agents, "suite", tmp_path))


@pytest.mark.parametrize(("kind", "agents"), _cells("run"))
def test_fleet_run_under_faults(kind: str, agents: int, tmp_path: Path) -> None:
    _check(run_cell(KIND[kind], agents, "run", tmp_path))


def test_a_clean_cell_counts_every_request_and_injects_nothing(tmp_path: Path) -> None:
    """The counting itself: with no fault every request sent is kept, once, and the pairing saw them all."""
    cell = run_cell(Kind("none", "reset:0"), 2, "run", tmp_path)
    assert cell.sent
    assert cell.injected == 0
    assert (cell.lost, cell.repeated, cell.wrongly_killed, cell.failed) == (0, 0, 0, {})
    assert len(cell.kept) == len(cell.sent) == 2 * FLEET_ROUNDS
