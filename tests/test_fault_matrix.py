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

``benchmarks/fault_matrix.py`` runs the same matrix at more agents and prints the table.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from agentload.bench.runner import run_level
from agentload.bench.target import Target
from agentload.capacity.profile import load_profile
from agentload.cli import run as run_cli
from agentload.cli.common import default_book
from agentload.cli.run import RunOptions, run_fleet
from agentload.cli.suite import suite_over
from agentload.clock import LoopClock, run_virtual
from agentload.endpoint.client import stream_watch
from agentload.endpoint.connection import ConnectionOptions, open_connection
from agentload.endpoint.records import Outcome, RequestIds, RequestRecord
from agentload.fleet.checkpoint import LOG, load_log
from agentload.fleet.limiter import Mode
from agentload.sim.behaviour import OracleBehaviour
from agentload.sim.faults import FaultInjector, FaultSpec, parse_fault
from agentload.sim.inprocess import InProcessTransport
from agentload.sim.server import SimConfig, SimServer
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
    """One row of the matrix: the fault as ``--fault`` takes it, and where a mid-stream one strikes."""

    name: str
    fault: str
    strike: str = "drawn"  # "first": before the first token; "mid": halfway; "drawn": the simulator's own draw
    hostile: str = ""  # how its deadline is read (see the module docstring): first | idle | endless | ""


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
]
KIND = {k.name: k for k in KINDS}


# -- pairing each request with its fault ----------------------------------------------------------------------------
@dataclass
class Sent:
    """One request the client sent: its ids, the client's accumulator (its record once over), the fault drawn."""

    ids: RequestIds
    acc: Any
    fault: FaultSpec | None = None

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

    def watch(self, ids: RequestIds | None, acc: Any) -> None:
        if ids is None:
            return  # the fleet's probe: not a turn of any agent
        sent = Sent(ids, acc)
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
        return sum(1 for s in self.sent if s.fault is not None)

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
        return sum(1 for s in self.sent if s.fault is None and s.record is not None
                   and s.record.outcome is Outcome.TIMEOUT)  # fmt: skip

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
                "wrongly_killed": self.wrongly_killed, "over_deadline_s": self.over_deadline()}  # fmt: skip


def _key(ids: RequestIds, t_sent: float) -> tuple[Any, ...]:
    return (ids.run, ids.level, ids.agent, ids.turn, ids.attempt, t_sent)


def _server(kind: Kind, **config: Any) -> SimServer:
    server = SimServer(SimConfig(profile=load_profile(PROFILE), seed=SEED, **config))
    server.faults = _Injector([parse_fault(kind.fault)], SEED, kind.strike)
    return server


# -- the three commands -----------------------------------------------------------------------------------------
async def _bench(cell: Cell, _tmp: Path) -> None:
    server = _server(cell.kind)
    transport = InProcessTransport(server)
    target = Target(transport, "http://sim.invalid", server.model_name, "fault matrix", virtual=True,
                    profile=server.profile, engine="agentload-sim")  # fmt: skip
    t0 = LoopClock().now()
    try:
        data = await run_level(target, get_workload("agentic"), agents=cell.agents, context=2000, level=0,
                               run_id="matrix", run_t0=t0, warmup_s=WARMUP_S, window_s=WINDOW_S,
                               grace_s=GRACE_S)  # fmt: skip
    finally:
        await transport.aclose()
    cell.kept = list(data.records)
    cell.level_end = t0 + WARMUP_S + WINDOW_S + GRACE_S


async def _suite(cell: Cell, _tmp: Path) -> None:
    server = _server(cell.kind, behaviour=OracleBehaviour(default_book()))
    options = ConnectionOptions(retry_rng=random.Random(SEED))
    async with open_connection("http://sim.invalid", InProcessTransport(server), options=options,
                               close_transport=True) as conn:  # fmt: skip
        run = await suite_over(conn, select(SUITE_TESTS), SuiteConfig(model=server.model_name,
                               max_tokens=SUITE_MAX_TOKENS), [cell.agents], endpoint="fault matrix")  # fmt: skip
    cell.kept = [r for lv in run.levels for a in lv.agent_results for t in a.tests for r in t.transcript.records()]


async def _run(cell: Cell, tmp: Path) -> None:
    fleet = tmp / "fleet.toml"
    fleet.write_text(FLEET.format(rounds=FLEET_ROUNDS, agents=cell.agents))
    made: list[SimServer] = []

    def server(config: SimConfig) -> SimServer:
        made.append(_server(cell.kind, behaviour=config.behaviour))
        return made[-1]

    opts = RunOptions(fleet=fleet, out=tmp / "runs", progress="none", virtual=True, mode=Mode.PARALLEL,
                      width=cell.agents)  # fmt: skip
    with mock.patch.object(run_cli, "SimServer", server):
        await run_fleet(opts)
    assert opts.run_dir is not None
    assert len(made) == 1
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
# Cells that fail today, with why; each mark goes once its cause is fixed.
XFAIL: dict[tuple[str, int, str], str] = {}


def _cells(command: str) -> list[Any]:
    out = []
    for kind in KINDS:
        for agents in (1, 32):
            why = XFAIL.get((kind.name, agents, command))
            marks = [pytest.mark.xfail(strict=False, reason=why)] if why else []
            out.append(pytest.param(kind.name, agents, marks=marks, id=f"{kind.name}-{agents}"))
    return out


def _check(cell: Cell) -> None:
    row = cell.row()
    assert cell.injected >= 1, f"the seed injected no {cell.kind.name} fault: the cell means nothing ({row})"
    assert cell.lost == 0, row
    assert cell.repeated == 0, row
    assert cell.wrongly_killed == 0, row
    assert cell.over_deadline() <= 0.0, row


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
