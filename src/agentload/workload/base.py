"""The contract between a workload and the benchmark that runs it (the consumer, bench/, relies only on this).

A workload makes ``AgentDriver``s; the benchmark starts ``count`` of them for one load level and stops them when
the level ends. Every workload's agents (agentic, synthetic, trace replays, the suite) produce their conversations
and the waits between them (``agent.loop.Agent``) and ``agent.loop.ConversationDriver`` runs them: it sends the requests
through ``ctx.backend`` (which records every attempt), waits with ``ctx.clock`` (virtual in simulated runs), and
checks ``ctx.should_stop()`` between turns — so a workload's module is called by the loop and never calls it.
Workloads never time anything themselves: the records carry every timing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from agentload.agent.loop import ChatBackend
from agentload.clock import Clock
from agentload.endpoint.records import RequestIds, RequestRecord
from agentload.workload.sizing import TokenSizing


class LoadContext(Protocol):
    """What a running driver may use."""

    @property
    def backend(self) -> ChatBackend:
        """Every attempt made through it is recorded with the level's ids."""
        ...

    @property
    def clock(self) -> Clock: ...

    @property
    def sizing(self) -> TokenSizing:
        """What the workload's text costs in the server's tokens (measured once per run)."""
        ...

    @property
    def model(self) -> str: ...

    @property
    def run_id(self) -> str: ...

    @property
    def text_salt(self) -> str:
        """What the workload's text is salted with beside its seed: the run id, so the same agent in another run
        (or a rerun against the same server) does not find its session's prefix still cached; a constant under
        ``bench --same-text``, so two runs with the same seed send the same words."""
        ...

    @property
    def level(self) -> int: ...

    def should_stop(self) -> bool:
        """True once the level's time is up (finish the current turn, then return)."""
        ...

    def session_done(self, agent_id: str, *, ok: bool, passed: int | None = None, scored: int | None = None) -> None:
        """Report one finished session (a conversation, a suite pass): ok, and for scored workloads the score."""
        ...

    def reply_clamped(self, ids: RequestIds, drawn: int) -> None:
        """The turn ``ids`` asked for fewer output tokens than the workload drew (``drawn``), to stay at its
        context: the level compares what was asked with what was drawn, since output tok/s measured against the
        shortened asks would not be the workload's."""
        ...


class AgentDriver(Protocol):
    agent_id: str

    async def run(self, ctx: LoadContext) -> None:
        """Drive one agent until the workload is done with it or ``ctx.should_stop()``."""
        ...


class Workload(Protocol):
    name: str

    def agents(self, count: int, *, context: int, seed: int) -> list[AgentDriver]:
        """``count`` independent agents whose conversations aim at ``context`` tokens."""
        ...


@runtime_checkable
class ReplayCeiling(Protocol):
    """A replayed trace that knows its own prefix-hit ceiling: what an unlimited prefix cache would serve of the
    requests it sent (by the trace's block ids). A level reports it beside the server's measured rate."""

    def ceiling(self, records: Sequence[RequestRecord]) -> float | None: ...


@dataclass(frozen=True)
class PaceTruth:
    """How a replay kept a trace's pace over some records: every turn that followed a reply in its context."""

    turns: int
    recorded_wait_s: float  # mean recorded wait before those turns, times the replay's time_scale
    realised_wait_s: float  # mean of each turn's send minus the previous reply's end
    lateness_s: tuple[float, ...]  # each turn's realised minus scheduled wait, in record order


@runtime_checkable
class ReplayPace(Protocol):
    """A replayed trace that knows the waits it was asked to keep: each turn's recorded think time (times its
    time scale) after the previous reply in its context, against the wait the records show. A level reports both,
    and how late its turns started.

    ``records`` are where previous replies are looked up (a level hands all of its records, warm-up included, so
    a window's first turns find theirs); only turns due (previous reply's end + recorded wait) at or after
    ``due_from`` count, on the records' clock. (Not named ``pace``: the synthetic workload has a ``pace`` flag,
    which a runtime protocol check, by name only, would take for this method.)"""

    def turn_pace(self, records: Sequence[RequestRecord], *, due_from: float = -math.inf) -> PaceTruth | None: ...


@dataclass(frozen=True)
class SessionWall:
    """One replayed session (a conversation or a subagent of a trace) that ran to its last request: how long it
    took here against how long the same requests took when the trace was recorded."""

    realised_s: float  # its first request sent → its last reply done, on the records' clock
    recorded_s: float  # the trace's recorded waits before its requests plus their recorded response times


@runtime_checkable
class ReplaySessions(Protocol):
    """A replayed trace that knows its sessions' recorded wall times. ``records`` are where a session's earlier
    requests are looked up (a level hands all of its records, warm-up included); only sessions whose last request
    was sent at or after ``ended_from`` count, and only those the trace timed (each of their requests has a
    recorded response time)."""

    def session_walls(
        self, records: Sequence[RequestRecord], *, ended_from: float = -math.inf
    ) -> tuple[SessionWall, ...]: ...
