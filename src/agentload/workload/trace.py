"""Trace replay: Mooncake request traces and agentload session traces, read from JSONL.

**Mooncake rows**: ``{"timestamp": ms, "input_length": n, "output_length": m, "hash_ids": [...]}``,
optionally ``session_id`` and ``delay`` (ms). ``hash_ids`` name 512-token prefix blocks, so requests whose leading
ids are equal share exactly that prefix: every id becomes one fixed 512-word text (seeded by the id), a prompt
is its blocks' texts in order cut to ``input_length``, and words past the named blocks are the request's own.
Rows are replayed open loop: each fires at its timestamp (relative to the trace's first, divided by ``speed``)
whatever the server is doing — the load is the trace's, not the agent count's; the count only splits the rows
among drivers; a level ends early once every row was answered. Rows sharing a ``session_id`` are sent in order
(the multi-turn variant AIPerf reads): a later row waits for the previous reply, then ``delay`` ms, and never
fires before its own timestamp; each row's prompt is built whole from its own hash_ids, which already say what
it shares with the turns before it. ``context`` does not apply to traces: they fix every size.
The format: docs/background.md §7.

**Session traces** (our format, written by ``workload.record`` from a run's records): one session per line,
``{"session_id", "agent", "start_s", "shared_prefix_tokens", "turns": [{"prompt_tokens", "completion_tokens",
"cached_tokens", "think_s", "tool_s"}, …]}``. A session is replayed as one growing conversation, closed loop:
each replay agent takes whole recorded agents (sessions grouped by ``agent``) and replays their sessions in
order, sleeping ``tool_s + think_s`` before each turn and, by default, starting each session no earlier than its
recorded ``start_s`` — so a trace recorded from N agents and replayed with N agents reproduces the run's load
on another server. In a session where every prompt holds the previous prompt and its reply, each turn appends
its new input to the conversation; in any other, a turn keeps the session's opening and the last reply and adds
its new input (a held context, as ``agentic-hold`` makes), or starts a fresh conversation when even that is too
long. The format keeps sizes, not what was reused, so a session that compacts and then grows again replays as
held turns (same sizes, less reuse).

Sizes are simulator tokens (one per word; ~1–1.3 tokens per word on real servers, corrected by the tokens per
word measured on a session's first turn). Texts are salted with the run and the level, so a level never finds a
previous level's prompts cached. A malformed file raises ``ConfigError`` naming the file and line.

**Limits**: a trace is read line by line and refused past ``MAX_TRACE_ROWS`` rows (or sessions) or a
line of ``MAX_LINE_BYTES``; every number must be finite and within the bounds below; and at most
``MAX_IN_FLIGHT`` Mooncake rows are in flight at once — a row due while that many wait on the server fires when
one of them ends. Without these a 317k-row trace stamped all at 0 built every prompt at once (4.3 GB), a
timestamp of ``Infinity`` spun the replay loop forever and an ``input_length`` of 1e10 asked for a 74.5 GiB
prompt.
"""

from __future__ import annotations

import asyncio
import functools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from agentload.agent.loop import STOPPED, ConversationDriver, End, Ending, Next, Request, Spawn, Steps, Wait
from agentload.endpoint.records import RequestIds, RequestRecord
from agentload.errors import ConfigError
from agentload.inputs import parse_json
from agentload.workload.agentic import (
    DONE,
    FAILED,
    FAILURE_PAUSE_S,
    OPENING_OVERHEAD_TOKENS,
    SINGLE_MESSAGE_OVERHEAD_TOKENS,
    TURN_OVERHEAD_TOKENS,
    VOCAB,
    agent_ids,
    stable_int,
    tokens_per_word,
    words,
)
from agentload.workload.base import AgentDriver, LoadContext

BLOCK_TOKENS = 512  # a Mooncake hash id names this many tokens
# Open-loop drivers wait for a row's time in slices this long, so the end of a level is noticed within one.
WAIT_SLICE_S = 1.0
MAX_TRACE_ROWS = 100_000  # rows of a Mooncake trace, or sessions of a session trace
MAX_LINE_BYTES = 16 * 2**20
MAX_TRACE_TOKENS = 2_000_000  # one request's input or output (the longest context windows are ~1-10M)
MAX_TURNS = 10_000  # turns of one recorded session
MAX_TIMESTAMP_MS = 1e13  # a Unix time in ms until the year 2286; relative traces start at 0
MAX_DELAY_MS = 86_400_000.0  # a day
MAX_WAIT_S = 30 * 86_400.0  # a recorded start, think or tool time: 30 days
# Past this many requests in flight every server is saturated many times over (vLLM admits 256 by default), and
# each waiting row holds its prompt in memory, so a row due beyond it waits for a slot instead.
MAX_IN_FLIGHT = 4096


# -- file formats ------------------------------------------------------------------------------------------------


class MooncakeRow(BaseModel):
    """One request of a Mooncake trace (``line`` is where it was read, for messages)."""

    # Strict: a length written as "12" or 12.5 is a malformed trace, not something to coerce. Finite: NaN passes no
    # bound and inf passes a lower one.
    model_config = ConfigDict(frozen=True, extra="ignore", strict=True, allow_inf_nan=False)

    line: int = 0
    timestamp: float | None = Field(default=None, ge=0, le=MAX_TIMESTAMP_MS, description="arrival, ms")
    input_length: int = Field(ge=1, le=MAX_TRACE_TOKENS, strict=True)
    output_length: int = Field(ge=1, le=MAX_TRACE_TOKENS, strict=True)
    hash_ids: list[int | str] = Field(default_factory=list)
    session_id: str | None = None
    delay: float | None = Field(
        default=None, ge=0, le=MAX_DELAY_MS, description="ms after the session's previous reply"
    )

    @field_validator("session_id", mode="before")
    @classmethod
    def _id_as_text(cls, v: object) -> object:
        # Some traces number their sessions; an id is a name either way.
        return str(v) if isinstance(v, int) and not isinstance(v, bool) else v


class TraceTurn(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)

    prompt_tokens: int = Field(ge=1, le=MAX_TRACE_TOKENS, strict=True)
    completion_tokens: int = Field(ge=1, le=MAX_TRACE_TOKENS, strict=True)
    cached_tokens: int | None = Field(default=None, ge=0, strict=True)  # what the recording server reused
    think_s: float = Field(default=0.0, ge=0, le=MAX_WAIT_S)  # waited before this turn (after the previous reply)
    tool_s: float = Field(default=0.0, ge=0, le=MAX_WAIT_S)

    @model_validator(mode="after")
    def _cached_within_prompt(self) -> TraceTurn:
        if self.cached_tokens is not None and self.cached_tokens > self.prompt_tokens:
            raise ValueError(f"cached_tokens {self.cached_tokens} exceeds prompt_tokens {self.prompt_tokens}")
        return self


class SessionTrace(BaseModel):
    """One recorded session: a conversation's turns, with the time spent between them."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)

    session_id: str
    agent: str | None = None  # the recorded agent; its sessions are replayed in order by one replay agent
    start_s: float = Field(default=0.0, ge=0, le=MAX_WAIT_S)  # after the recording's first request
    shared_prefix_tokens: int = Field(default=0, ge=0, strict=True)  # leading tokens every session shares
    turns: list[TraceTurn] = Field(min_length=1, max_length=MAX_TURNS)

    @model_validator(mode="after")
    def _prefix_within_first_prompt(self) -> SessionTrace:
        first = self.turns[0].prompt_tokens
        if self.shared_prefix_tokens >= first:
            raise ValueError(f"shared_prefix_tokens {self.shared_prefix_tokens} is not below the first prompt {first}")
        return self


@dataclass(frozen=True)
class MooncakeTrace:
    path: Path
    rows: list[MooncakeRow]


@dataclass(frozen=True)
class SessionTraceFile:
    path: Path
    sessions: list[SessionTrace]


def _where(path: Path, line: int) -> str:
    return f"{path}:{line}"


def _first_problem(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"])
    msg = str(err["msg"]).removeprefix("Value error, ")
    return f"{loc}: {msg}" if loc else msg


def load_trace(path: str | Path) -> MooncakeTrace | SessionTraceFile:
    """Read a Mooncake or session trace (told apart by their fields); ``ConfigError`` names the file and line."""
    path = Path(path)
    kind: Literal["mooncake", "session"] | None = None
    rows: list[MooncakeRow] = []
    sessions: list[SessionTrace] = []
    for number, raw in _lines(path):
        if not raw.strip():
            continue
        where = _where(path, number)
        if len(rows) + len(sessions) >= MAX_TRACE_ROWS:
            raise ConfigError(f"{where}: a trace holds at most {MAX_TRACE_ROWS:,} rows or sessions; split it")
        obj = parse_json(raw, where)
        if not isinstance(obj, dict):
            raise ConfigError(f"{where}: expected a JSON object, got {type(obj).__name__}")
        this: Literal["mooncake", "session"] = "session" if "turns" in obj else "mooncake"
        if this == "mooncake" and "input_length" not in obj and "timestamp" not in obj and "hash_ids" not in obj:
            raise ConfigError(f"{where}: neither a Mooncake row (input_length, output_length, …) nor a session (turns)")
        if kind is None:
            kind = this
        elif this != kind:
            raise ConfigError(f"{where}: a {this} line in a {kind} trace")
        try:
            if this == "session":
                sessions.append(SessionTrace.model_validate(obj))
            else:
                rows.append(MooncakeRow.model_validate({**obj, "line": number}))
        except ValidationError as exc:
            raise ConfigError(f"{where}: {_first_problem(exc)}") from exc
    if kind is None:
        raise ConfigError(f"{path}: the trace is empty")
    if kind == "session":
        seen: set[str] = set()
        for s in sessions:
            if s.session_id in seen:
                raise ConfigError(f"{path}: session {s.session_id!r} appears twice")
            seen.add(s.session_id)
        return SessionTraceFile(path, sessions)
    _check_session_order(path, rows)
    return MooncakeTrace(path, rows)


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """(number, text) of each line, read one at a time (a trace can be large) and each at most MAX_LINE_BYTES."""
    try:
        with path.open("rb") as f:
            number = 0
            while raw := f.readline(MAX_LINE_BYTES + 1):
                number += 1
                if len(raw) > MAX_LINE_BYTES:
                    raise ConfigError(
                        f"{_where(path, number)}: a line longer than {MAX_LINE_BYTES // 2**20} MiB is not a trace row"
                    )
                try:
                    yield number, raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise ConfigError(f"{_where(path, number)}: not UTF-8 text (byte {exc.start})") from exc
    except OSError as exc:
        raise ConfigError(f"cannot read trace {path}: {exc.strerror or exc}") from exc


def _check_session_order(path: Path, rows: Sequence[MooncakeRow]) -> None:
    """Within a session, time must not run backwards (across independent rows order does not matter: they are
    scheduled by their own timestamps)."""
    last: dict[str, float] = {}
    for row in rows:
        if row.session_id is None or row.timestamp is None:
            continue
        before = last.get(row.session_id)
        if before is not None and row.timestamp < before:
            raise ConfigError(
                f"{_where(path, row.line)}: timestamp {row.timestamp:g} is before the previous turn of session "
                f"{row.session_id!r} ({before:g})"
            )
        last[row.session_id] = row.timestamp


# -- Mooncake replay ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Job:
    """What one open-loop arrival starts: a lone row, or a whole session (its rows in order)."""

    key: str
    start_s: float  # trace time, seconds after the trace's first timestamp (before ``speed``)
    rows: list[MooncakeRow]
    t0_ms: float  # the trace's first timestamp: a later row's own timestamp is measured from it


def _jobs(rows: Sequence[MooncakeRow]) -> list[_Job]:
    t0 = min((r.timestamp for r in rows if r.timestamp is not None), default=0.0)

    def start(row: MooncakeRow) -> float:
        return ((row.timestamp - t0) if row.timestamp is not None else 0.0) / 1000 + (row.delay or 0.0) / 1000

    sessions: dict[str, list[MooncakeRow]] = {}
    jobs: list[_Job] = []
    for row in rows:
        if row.session_id is None:
            jobs.append(_Job(f"row{row.line}", start(row), [row], t0))
        elif row.session_id in sessions:
            sessions[row.session_id].append(row)
        else:
            sessions[row.session_id] = [row]
            jobs.append(_Job(f"session:{row.session_id}", start(row), sessions[row.session_id], t0))
    jobs.sort(key=lambda j: j.start_s)  # stable: equal times keep file order
    return jobs


@functools.lru_cache(maxsize=4096)
def _block_words(salt: tuple[int, ...], block: int | str) -> tuple[str, ...]:
    """The 512 words a hash id stands for (the same for every request of the level that names it)."""
    key = [*salt, 0, block] if isinstance(block, int) and block >= 0 else [*salt, 1, stable_int(str(block))]
    rng = np.random.default_rng(key)
    return tuple(VOCAB[rng.integers(0, len(VOCAB), BLOCK_TOKENS)])


def mooncake_prompt(row: MooncakeRow, salt: tuple[int, ...]) -> str:
    """``row``'s prompt text: its hash blocks in order, then words of its own, ``input_length`` in all (less the
    chat template's tokens, so the server counts ~``input_length``)."""
    n = max(1, row.input_length - SINGLE_MESSAGE_OVERHEAD_TOKENS)
    out: list[str] = []
    for block in row.hash_ids:
        if len(out) >= n:
            break
        out.extend(_block_words(salt, block)[: n - len(out)])
    if len(out) < n:
        out.append(words(np.random.default_rng([*salt, 2, row.line]), n - len(out)))
    return " ".join(out)


class _Origin:
    """The wall (or virtual) time the trace's zero maps to, and the slots for rows in flight (``MAX_IN_FLIGHT``),
    shared by every driver of a level."""

    def __init__(self) -> None:
        self.t: float | None = None
        self.slots = asyncio.Semaphore(MAX_IN_FLIGHT)

    def at(self, now: float) -> float:
        if self.t is None:
            self.t = now
        return self.t


def _due(when: float) -> Wait:
    """Wait until ``when`` on the level's clock in slices, so the level's end is seen within one."""
    return Wait(until=when, slice_s=WAIT_SLICE_S)


@dataclass
class MooncakeDriver:
    agent_id: str
    jobs: list[_Job]
    origin: _Origin
    speed: float
    seed: int
    extra_body: Mapping[str, Any] = field(default_factory=dict)

    def conversations(self, ctx: LoadContext) -> Steps:
        origin = self.origin.at(ctx.clock.now())
        salt = (self.seed, ctx.level, stable_int(ctx.text_salt))

        def ended(end: Ending) -> None:
            if end.reason != STOPPED:  # the level ended mid-session: not a finished session
                ctx.session_done(self.agent_id, ok=end.reason == DONE)

        for job in self.jobs:
            yield _due(origin + job.start_s / self.speed)
            # Open loop: the job starts at its time whether or not the earlier ones have finished.
            yield Spawn(_JobRows(self, ctx, job, origin, salt), self.origin.slots, ended)


class _JobRows:
    """One job's rows as a conversation of single-message requests, each sent when the trace has it due."""

    def __init__(self, driver: MooncakeDriver, ctx: LoadContext, job: _Job, origin: float, salt: tuple[int, ...]):
        self.driver, self.ctx, self.job, self.origin, self.salt = driver, ctx, job, origin, salt

    def request(self, turn: int) -> Request:
        ctx, row = self.ctx, self.job.rows[turn]
        body = {
            "model": ctx.model,
            "messages": [{"role": "user", "content": mooncake_prompt(row, self.salt)}],
            "max_tokens": row.output_length,
            **self.driver.extra_body,
        }
        return Request(
            body, RequestIds(run=ctx.run_id, level=ctx.level, agent=f"{self.driver.agent_id}/{self.job.key}", turn=turn)
        )

    async def reply(self, turn: int, records: list[RequestRecord]) -> Next | End:
        if not records[-1].ok:
            return End(FAILED)
        if turn + 1 >= len(self.job.rows):
            return End(DONE)
        row, speed = self.job.rows[turn + 1], self.driver.speed
        due = self.ctx.clock.now() + (row.delay or 0.0) / 1000 / speed
        if row.timestamp is not None:
            due = max(due, self.origin + (row.timestamp - self.job.t0_ms) / 1000 / speed)
        return Next(until=due, slice_s=WAIT_SLICE_S)


@dataclass
class MooncakeWorkload:
    """Open-loop replay of a Mooncake trace; ``speed`` > 1 compresses its time (2.0 = twice the rate)."""

    trace: MooncakeTrace
    speed: float = 1.0
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    name: str = field(init=False)

    def __post_init__(self) -> None:
        self.name = f"trace:{self.trace.path}"
        if not self.speed > 0:
            raise ConfigError(f"the replay speed must be positive, got {self.speed}")
        self._jobs = _jobs(self.trace.rows)

    def agents(self, count: int, *, context: int, seed: int) -> list[AgentDriver]:
        # ``context`` does not apply: the trace fixes every size.
        ids = agent_ids(count)
        origin = _Origin()
        return [
            ConversationDriver(
                MooncakeDriver(agent_id, self._jobs[i::count], origin, self.speed, seed, dict(self.extra_body))
            )
            for i, agent_id in enumerate(ids)
        ]


# -- session replay ----------------------------------------------------------------------------------------------


def _deal(sessions: Sequence[SessionTrace], count: int) -> list[list[SessionTrace]]:
    """Whole recorded agents to replay agents, round robin in order of first appearance."""
    groups: dict[str, list[SessionTrace]] = {}
    for s in sessions:
        groups.setdefault(s.agent if s.agent is not None else f"session:{s.session_id}", []).append(s)
    shares: list[list[SessionTrace]] = [[] for _ in range(count)]
    for i, group in enumerate(groups.values()):
        shares[i % count].extend(sorted(group, key=lambda s: s.start_s))
    return shares


Timing = Literal["recorded", "closed"]


@dataclass
class SessionReplayDriver:
    agent_id: str
    sessions: list[SessionTrace]
    origin: _Origin
    speed: float
    seed: int
    timing: Timing = "recorded"
    repeat: bool = False
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    replayed: int = 0

    def conversations(self, ctx: LoadContext) -> Steps:
        origin = self.origin.at(ctx.clock.now())
        if not self.sessions:
            return
        rounds = 0
        while True:
            for session in self.sessions:
                if rounds == 0 and self.timing == "recorded":
                    yield _due(origin + session.start_s / self.speed)
                elif ctx.should_stop():
                    return
                end = yield self._session(ctx, session, rounds)
                if end is None or end.reason == STOPPED:  # the level ended first
                    return
                ok = end.reason == DONE
                ctx.session_done(self.agent_id, ok=ok)
                if not ok:
                    yield Wait(FAILURE_PAUSE_S)
            rounds += 1
            if not self.repeat:
                return

    def _shared(self, ctx: LoadContext, n: int) -> str:
        # One text for the level; a session sharing fewer tokens takes its beginning, so all share a prefix.
        return words(np.random.default_rng([self.seed, ctx.level, stable_int(ctx.text_salt), stable_int("shared")]), n)

    def _session(self, ctx: LoadContext, session: SessionTrace, rounds: int) -> _SessionTurns:
        """One session's replay, as a conversation."""
        name = f"{self.agent_id}/s{self.replayed}"
        self.replayed += 1
        rng = np.random.default_rng(
            [self.seed, ctx.level, stable_int(ctx.text_salt), stable_int(session.session_id), rounds]
        )
        shared = session.shared_prefix_tokens
        system = [{"role": "system", "content": self._shared(ctx, shared)}] if shared > 0 else []
        return _SessionTurns(self, ctx, session, name, rng, system)


class _SessionTurns:
    """One recorded session as a conversation: each turn's prompt rebuilt to the recorded size from the last reply.

    A session in which every prompt holds the previous prompt and its reply is one growing conversation; in any
    other, a turn keeps the opening and the last reply (a held context) or starts over. Sizes alone cannot tell a
    held turn with a large new input from a grown one, so the whole session decides.
    """

    def __init__(
        self,
        driver: SessionReplayDriver,
        ctx: LoadContext,
        session: SessionTrace,
        name: str,
        rng: np.random.Generator,
        system: list[dict[str, Any]],
    ) -> None:
        self.driver, self.ctx, self.session, self.name, self.rng, self.system = driver, ctx, session, name, rng, system
        self.shared = session.shared_prefix_tokens
        self.first_overhead = OPENING_OVERHEAD_TOKENS if self.shared > 0 else SINGLE_MESSAGE_OVERHEAD_TOKENS
        self.grows = all(b.prompt_tokens >= a.prompt_tokens + a.completion_tokens for a, b in pairwise(session.turns))
        self.messages = self.opening(session.turns[0].prompt_tokens)
        self.head = len(self.messages)  # the opening's messages, kept when a held context drops the middle
        self.last: RequestRecord | None = None
        self.opening_tokens = 0
        self.per_word = 1.0
        self.restarted = False

    def opening(self, prompt_tokens: int) -> list[dict[str, Any]]:
        n = max(1, prompt_tokens - self.shared - self.first_overhead)
        return [*self.system, {"role": "user", "content": words(self.rng, n)}]

    def request(self, turn_no: int) -> Request:
        turn, last = self.session.turns[turn_no], self.last
        if last is not None:
            reply = {"role": "assistant", "content": last.content}
            grown = last.prompt_tokens + last.completion_tokens + TURN_OVERHEAD_TOKENS
            held = self.opening_tokens + last.completion_tokens + TURN_OVERHEAD_TOKENS
            self.restarted = False
            if self.grows and turn.prompt_tokens - grown >= 1:
                new = math.floor((turn.prompt_tokens - grown) / self.per_word)
                self.messages += [reply, {"role": "user", "content": words(self.rng, max(1, new))}]
            elif turn.prompt_tokens - held >= 1:
                new = math.floor((turn.prompt_tokens - held) / self.per_word)
                user = {"role": "user", "content": words(self.rng, max(1, new))}
                self.messages = [*self.messages[: self.head], reply, user]
            else:
                self.messages = self.opening(turn.prompt_tokens)
                self.restarted = True
        ctx = self.ctx
        body = {"model": ctx.model, "messages": list(self.messages), "max_tokens": turn.completion_tokens}
        ids = RequestIds(run=ctx.run_id, level=ctx.level, agent=self.name, turn=turn_no)
        return Request({**body, **self.driver.extra_body}, ids)

    async def reply(self, turn_no: int, records: list[RequestRecord]) -> Next | End:
        last = records[-1]
        if not last.ok:
            return End(FAILED)
        if self.last is None:
            self.opening_tokens = last.prompt_tokens
            # Our words cost this many of the server's tokens per recorded token (1.0 when both are the simulator).
            self.per_word = tokens_per_word(last, self.session.turns[0].prompt_tokens)
        elif self.restarted:
            self.opening_tokens = last.prompt_tokens
        self.last = last
        turns = self.session.turns
        if turn_no + 1 >= len(turns):
            return End(DONE)
        upcoming = turns[turn_no + 1]
        return Next((upcoming.tool_s + upcoming.think_s) / self.driver.speed)


@dataclass
class SessionReplayWorkload:
    """Closed-loop replay of a session trace: each agent replays whole recorded agents' sessions in order."""

    trace: SessionTraceFile
    speed: float = 1.0
    timing: Timing = "recorded"
    repeat: bool = False  # cycle through the sessions until the level ends (each pass with fresh text)
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    name: str = field(init=False)

    def __post_init__(self) -> None:
        self.name = f"trace:{self.trace.path}"
        if not self.speed > 0:
            raise ConfigError(f"the replay speed must be positive, got {self.speed}")
        if self.timing not in ("recorded", "closed"):
            raise ConfigError(f"session timing must be 'recorded' or 'closed', got {self.timing!r}")

    def agents(self, count: int, *, context: int, seed: int) -> list[AgentDriver]:
        # ``context`` does not apply: the trace fixes every size.
        origin = _Origin()
        shares = _deal(self.trace.sessions, len(agent_ids(count)))
        return [
            ConversationDriver(
                SessionReplayDriver(
                    agent_id, share, origin, self.speed, seed, self.timing, self.repeat, dict(self.extra_body)
                )
            )
            for agent_id, share in zip(agent_ids(count), shares, strict=True)
        ]


def trace_workload(path: str | Path, **options: Any) -> MooncakeWorkload | SessionReplayWorkload:
    """The replay workload for the trace at ``path`` (its format decides which)."""
    trace = load_trace(path)
    known = {"speed", "extra_body"} if isinstance(trace, MooncakeTrace) else {"speed", "timing", "repeat", "extra_body"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ConfigError(f"unknown trace option {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    if isinstance(trace, MooncakeTrace):
        return MooncakeWorkload(trace, **options)
    return SessionReplayWorkload(trace, **options)
