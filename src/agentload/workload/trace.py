"""Trace replay: request traces (Mooncake, Qwen-Bailian, BurstGPT, Azure) and agentload session traces.

**Mooncake rows**: ``{"timestamp": ms, "input_length": n, "output_length": m, "hash_ids": [...]}``,
optionally ``session_id`` and ``delay`` (ms). ``hash_ids`` name 512-token prefix blocks, so requests whose leading
ids are equal share exactly that prefix: every id becomes one fixed text of 512 of the server's tokens (seeded by
the id; its words at the tokens per word measured on the server), a prompt is its blocks' texts in order cut to
``input_length``, and words past the named blocks are the request's own.
Rows are replayed open loop: each fires at its timestamp (relative to the trace's first, divided by ``speed``)
whatever the server is doing — the load is the trace's, not the agent count's; the count only splits the rows
among drivers; a level ends early once every row was answered. Rows sharing a ``session_id`` are sent in order
(the multi-turn variant AIPerf reads): a later row waits for the previous reply, then ``delay`` ms, and never
fires before its own timestamp; each row's prompt is built whole from its own hash_ids, which already say what
it shares with the turns before it. ``context`` does not apply to traces: they fix every size.
The format: docs/background.md §7.

**Other request traces** are read into the same rows and replayed the same way (docs/trace-formats.md). Each
format fixes how many tokens a hash id names (``MooncakeTrace.block_tokens``): Mooncake 512; **Qwen-Bailian**
16 (github.com/alibaba-edu/qwen-bailian-usagetraces-anon: JSONL ``chat_id``, ``parent_chat_id`` (-1 for the
first turn), ``timestamp`` (s), ``input_length``, ``output_length``, ``type``, ``turn``, ``hash_ids``), whose
``parent_chat_id`` chains are its sessions, sent in order like Mooncake's ``session_id``; **BurstGPT** and the
**Azure LLM inference** traces are CSV (``workload.trace_csv``) with sizes and times but no hash ids, so every
prompt is its own. ``load_trace`` tells them apart: a ``.csv`` name (or a known CSV header) is CSV, and a JSON
line's fields say which JSONL format it is.

**A trace shorter than a level**: open-loop rows end when the trace does, so a trace that ends inside a level's
warm-up leaves its window empty. ``fit_to_level`` compares the trace's length with the level's (warm-up + window):
a shorter trace is replayed in a loop (``repeat``, the default when told the level's length), each pass re-salted
so no pass finds another's prompts cached as if they were shared; with ``repeat=False`` it is refused instead.

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
With ``start="mid"`` each session starts at a turn k drawn from the seed, the session and the pass: one opening
message of turn k's recorded size (a warm-up, a cache miss; the format keeps no replies to rebuild its text),
then turns k + 1 on as above. Request traces refuse it: they are replayed at their own timestamps.

Request-trace sizes (rows, blocks) are the server's tokens at the tokens per word measured before the run (one
per word on the simulator). Session-trace sizes are simulator tokens (one per word; ~1–1.3 tokens per word on real
servers), corrected by the tokens per word measured on a session's first turn. Texts are salted with the run and
the level, so a level never finds a previous level's prompts cached. A malformed file raises ``ConfigError``
naming the file and line.

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
import itertools
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
from agentload.workload.base import AgentDriver, LoadContext, Workload
from agentload.workload.conversation_trace import (
    ConversationTraceWorkload,
    Start,
    check_start,
    conversation_workload,
    is_conversation_trace,
    mid_turn,
    reply_end,
)
from agentload.workload.sizing import SIMULATOR_SIZING, TokenSizing
from agentload.workload.trace_csv import looks_like_csv_header, read_csv_trace

# How many tokens one hash id names, per format: each trace carries its own (``MooncakeTrace.block_tokens``).
MOONCAKE_BLOCK_TOKENS = 512  # the Mooncake release's README: "The block size is 512 tokens"
BAILIAN_BLOCK_TOKENS = 16  # the Qwen-Bailian README: "16 tokens per block"
BLOCK_TOKENS = MOONCAKE_BLOCK_TOKENS  # the JSONL format a trace is read as when its fields name no other
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


class BailianRow(BaseModel):
    """One request of a Qwen-Bailian trace, before its ``parent_chat_id`` chain is resolved to a session."""

    model_config = ConfigDict(frozen=True, extra="ignore", strict=True, allow_inf_nan=False)

    chat_id: int
    parent_chat_id: int = Field(ge=-1)  # -1: the first turn of its chat
    timestamp: float = Field(ge=0, le=MAX_TIMESTAMP_MS / 1000, description="arrival, s")
    input_length: int = Field(ge=1, le=MAX_TRACE_TOKENS, strict=True)
    output_length: int = Field(ge=1, le=MAX_TRACE_TOKENS, strict=True)
    hash_ids: list[int] = Field(default_factory=list)
    type: str | None = None  # text, search, image, file: kept for messages, not replayed differently
    turn: int | None = Field(default=None, ge=1)


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


TraceFormat = Literal["mooncake", "bailian", "burstgpt", "azure"]


@dataclass(frozen=True)
class MooncakeTrace:
    """Rows replayed open loop, whatever format they were read from."""

    path: Path
    rows: list[MooncakeRow]
    block_tokens: int = MOONCAKE_BLOCK_TOKENS  # what one hash id names in this format
    format: TraceFormat = "mooncake"
    skipped: int = 0  # CSV rows with 0 request or response tokens (failed at the source)


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
    """Read a request trace (Mooncake, Qwen-Bailian, BurstGPT, Azure) or a session trace, told apart by name and
    fields; ``ConfigError`` names the file and line."""
    path = Path(path)
    if path.suffix.lower() == ".csv" or _csv_header(path):
        return _load_csv(path)
    kind: Literal["mooncake", "bailian", "session"] | None = None
    rows: list[MooncakeRow] = []
    sessions: list[SessionTrace] = []
    chats = _Chats()
    for number, raw in _lines(path):
        if not raw.strip():
            continue
        where = _where(path, number)
        if len(rows) + len(sessions) >= MAX_TRACE_ROWS:
            raise ConfigError(f"{where}: a trace holds at most {MAX_TRACE_ROWS:,} rows or sessions; split it")
        obj = parse_json(raw, where)
        if not isinstance(obj, dict):
            raise ConfigError(f"{where}: expected a JSON object, got {type(obj).__name__}")
        this = _jsonl_kind(obj)
        if this == "mooncake" and "input_length" not in obj and "timestamp" not in obj and "hash_ids" not in obj:
            raise ConfigError(f"{where}: neither a Mooncake row (input_length, output_length, …) nor a session (turns)")
        if kind is None:
            kind = this
        elif this != kind:
            raise ConfigError(f"{where}: a {this} line in a {kind} trace")
        try:
            if this == "session":
                sessions.append(SessionTrace.model_validate(obj))
            elif this == "bailian":
                rows.append(chats.row(BailianRow.model_validate(obj), number, where))
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
    if kind == "bailian":
        return MooncakeTrace(path, rows, BAILIAN_BLOCK_TOKENS, "bailian")
    return MooncakeTrace(path, rows)


def _jsonl_kind(obj: Mapping[str, Any]) -> Literal["mooncake", "bailian", "session"]:
    if "turns" in obj:
        return "session"
    # Bailian's rows name their chat and its parent; Mooncake's never do.
    return "bailian" if "chat_id" in obj and "parent_chat_id" in obj else "mooncake"


class _Chats:
    """Qwen-Bailian's sessions: a row with ``parent_chat_id`` -1 starts one, a row whose parent was read joins
    its parent's, and a row whose parent is not in the file (cut off by the trace's window) joins its siblings
    under the parent's id."""

    def __init__(self) -> None:
        self.session: dict[int, str] = {}

    def row(self, row: BailianRow, line: int, where: str) -> MooncakeRow:
        if row.chat_id in self.session:
            raise ConfigError(f"{where}: chat_id {row.chat_id} appears twice")
        parent = row.parent_chat_id
        session = f"chat{row.chat_id}" if parent == -1 else self.session.get(parent, f"chat{parent}")
        self.session[row.chat_id] = session
        return MooncakeRow(
            line=line,
            timestamp=row.timestamp * 1000,
            input_length=row.input_length,
            output_length=row.output_length,
            hash_ids=list(row.hash_ids),
            session_id=session,
        )


def _csv_header(path: Path) -> bool:
    """Whether a trace not named ``.csv`` starts with the header of a CSV format (its first line only)."""
    for _, raw in _lines(path):
        return looks_like_csv_header(raw)
    return False


def _load_csv(path: Path) -> MooncakeTrace:
    table = read_csv_trace(
        str(path),
        (raw for _, raw in _lines(path)),
        max_rows=MAX_TRACE_ROWS,
        max_tokens=MAX_TRACE_TOKENS,
        max_timestamp_ms=MAX_TIMESTAMP_MS,
    )
    rows = [
        MooncakeRow(line=r.line, timestamp=r.timestamp_ms, input_length=r.input_length, output_length=r.output_length)
        for r in table.requests
    ]
    return MooncakeTrace(path, rows, MOONCAKE_BLOCK_TOKENS, table.format, table.skipped)


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
def _block_words(salt: tuple[int, ...], block: int | str, size: int) -> tuple[str, ...]:
    """The ``size`` words a hash id stands for (the same for every request of the level that names it)."""
    key = [*salt, 0, block] if isinstance(block, int) and block >= 0 else [*salt, 1, stable_int(str(block))]
    rng = np.random.default_rng(key)
    return tuple(VOCAB[rng.integers(0, len(VOCAB), size)])


def mooncake_prompt(
    row: MooncakeRow,
    salt: tuple[int, ...],
    block_tokens: int = MOONCAKE_BLOCK_TOKENS,
    sizing: TokenSizing = SIMULATOR_SIZING,
) -> str:
    """``row``'s prompt text: its hash blocks in order, then words of its own, about ``input_length`` of the
    server's tokens in all (less the chat template's). Sizes are in the server's tokens at ``sizing``'s tokens per
    word (measured on the server before the run): a block is the words that make ``block_tokens`` of them, so a
    512-token block is ~394 words where a word is 1.3 tokens, and the prefix two rows share is the trace's in
    server tokens, not 30 % longer."""
    n = max(1, math.floor((row.input_length - SINGLE_MESSAGE_OVERHEAD_TOKENS) / sizing.tokens_per_word))
    block_words = sizing.words(block_tokens)
    out: list[str] = []
    for block in row.hash_ids:
        if len(out) >= n:
            break
        out.extend(_block_words(salt, block, block_words)[: n - len(out)])
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
    block_tokens: int = MOONCAKE_BLOCK_TOKENS
    period_s: float | None = None  # trace seconds between passes when looping; None: one pass

    def conversations(self, ctx: LoadContext) -> Steps:
        origin = self.origin.at(ctx.clock.now())

        def ended(end: Ending) -> None:
            if end.reason != STOPPED:  # the level ended mid-session: not a finished session
                ctx.session_done(self.agent_id, ok=end.reason == DONE)

        for lap in itertools.count():
            # Each pass has texts of its own: a repeated row must not find its previous pass's prompt cached, as
            # if the trace said it shared it; within a pass, rows share exactly what their hash ids say.
            salt = (self.seed, ctx.level, stable_int(ctx.text_salt), *((lap,) if lap else ()))
            shift = lap * self.period_s if self.period_s is not None else 0.0
            for job in self.jobs:
                yield _due(origin + (shift + job.start_s) / self.speed)
                # Open loop: the job starts at its time whether or not the earlier ones have finished.
                yield Spawn(_JobRows(self, ctx, job, origin + shift / self.speed, salt, lap), self.origin.slots, ended)
            if self.period_s is None or not self.jobs or ctx.should_stop():
                return


class _JobRows:
    """One job's rows as a conversation of single-message requests, each sent when the trace has it due."""

    def __init__(
        self, driver: MooncakeDriver, ctx: LoadContext, job: _Job, origin: float, salt: tuple[int, ...], lap: int = 0
    ):
        self.driver, self.ctx, self.job, self.origin, self.salt = driver, ctx, job, origin, salt
        self.key = f"{job.key}@{lap}" if lap else job.key  # a later pass's requests are told apart by their ids

    def request(self, turn: int) -> Request:
        ctx, row = self.ctx, self.job.rows[turn]
        body = {
            "model": ctx.model,
            "messages": [
                {"role": "user", "content": mooncake_prompt(row, self.salt, self.driver.block_tokens, ctx.sizing)}
            ],
            "max_tokens": row.output_length,
            **self.driver.extra_body,
        }
        return Request(
            body, RequestIds(run=ctx.run_id, level=ctx.level, agent=f"{self.driver.agent_id}/{self.key}", turn=turn)
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
    """Open-loop replay of a request trace; ``speed`` > 1 compresses its time (2.0 = twice the rate).

    ``repeat``: True replays the trace in a loop until the level ends; False replays it once (and ``fit_level``
    refuses a trace shorter than the level); None (the default) replays it once unless ``fit_level`` finds it
    shorter than the level, then loops it."""

    trace: MooncakeTrace
    speed: float = 1.0
    repeat: bool | None = None
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    name: str = field(init=False)

    def __post_init__(self) -> None:
        self.name = f"trace:{self.trace.path}"
        if not self.speed > 0:
            raise ConfigError(f"the replay speed must be positive, got {self.speed}")
        if self.repeat not in (None, True, False):
            raise ConfigError(f"repeat must be true or false, got {self.repeat!r}")
        self._jobs = _jobs(self.trace.rows)
        self._loop = self.repeat is True

    @property
    def span_s(self) -> float:
        """Seconds from the trace's first arrival to its last, at ``speed``."""
        return max((j.start_s for j in self._jobs), default=0.0) / self.speed

    def _period_s(self) -> float:
        """Trace seconds from one pass's start to the next: the trace's length and one mean gap between arrivals,
        so a pass's first row does not land on the previous pass's last (at least a second, for a trace whose
        rows all arrive at once)."""
        starts = [j.start_s for j in self._jobs]
        length = max(starts, default=0.0)
        gap = length / (len(starts) - 1) if len(starts) > 1 else 0.0
        return max(length + gap, 1.0)

    def fit_level(self, warmup_s: float, window_s: float) -> str | None:
        """Make the replay fill a level of ``warmup_s`` + ``window_s``: None when the trace outlasts it; a note
        when it is shorter and will loop; ``ConfigError`` when it is shorter and ``repeat`` is False."""
        lasts = f"{self.name} lasts {self.span_s:,.0f} s"
        note = _fit(lasts, self.span_s, self.speed, self.repeat, warmup_s, window_s)
        self._loop = note is not None
        return note and f"{note}: replayed in a loop, each pass with fresh text (no pass finds another's cached)"

    def agents(self, count: int, *, context: int, seed: int) -> list[AgentDriver]:
        # ``context`` does not apply: the trace fixes every size.
        ids = agent_ids(count)
        origin = _Origin()
        period = self._period_s() if self._loop else None
        return [
            ConversationDriver(
                MooncakeDriver(
                    agent_id,
                    self._jobs[i::count],
                    origin,
                    self.speed,
                    seed,
                    dict(self.extra_body),
                    self.trace.block_tokens,
                    period,
                )
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
    start: Start = "begin"
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
        first = 0
        if self.start == "mid":  # the same session of the same pass starts at the same turn in every run
            first = mid_turn(len(session.turns), self.seed, stable_int(session.session_id), rounds)
        return _SessionTurns(self, ctx, session, name, rng, system, first)


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
        first: int = 0,
    ) -> None:
        self.driver, self.ctx, self.session, self.name, self.rng, self.system = driver, ctx, session, name, rng, system
        # The loop numbers turns from 0; the records carry the session's turn (``first`` + turn). A mid start's
        # turn 0 is turn ``first`` as one opening of its recorded size: the format keeps no replies, so the context
        # the session had there is rebuilt at its size, not its text, and is a miss as a resumed session's would be.
        self.first = first
        self.shared = session.shared_prefix_tokens
        self.first_overhead = OPENING_OVERHEAD_TOKENS if self.shared > 0 else SINGLE_MESSAGE_OVERHEAD_TOKENS
        self.grows = all(b.prompt_tokens >= a.prompt_tokens + a.completion_tokens for a, b in pairwise(session.turns))
        self.messages = self.opening(session.turns[first].prompt_tokens)
        self.head = len(self.messages)  # the opening's messages, kept when a held context drops the middle
        self.last: RequestRecord | None = None
        self.opening_tokens = 0
        self.per_word = 1.0
        self.restarted = False
        self.built: Request | None = None

    def opening(self, prompt_tokens: int) -> list[dict[str, Any]]:
        n = max(1, prompt_tokens - self.shared - self.first_overhead)
        return [*self.system, {"role": "user", "content": words(self.rng, n)}]

    def request(self, turn_no: int) -> Request:
        turn_no += self.first
        if self.built is not None and self.built.ids.turn == turn_no:  # built while its wait ran (``reply``)
            return self.built
        return self.build(turn_no)

    def build(self, turn_no: int) -> Request:
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
        turn_no += self.first
        last = records[-1]
        if not last.ok:
            return End(FAILED)
        if self.last is None:
            self.opening_tokens = last.prompt_tokens
            # Our words cost this many of the server's tokens per recorded token (1.0 when both are the simulator).
            self.per_word = tokens_per_word(last, self.session.turns[self.first].prompt_tokens)
        elif self.restarted:
            self.opening_tokens = last.prompt_tokens
        self.last = last
        turns = self.session.turns
        if turn_no + 1 >= len(turns):
            return End(DONE)
        upcoming = turns[turn_no + 1]
        # Due its recorded wait after this reply, however long building it takes: built now, inside the wait.
        due = reply_end(self.ctx.clock.now(), last) + (upcoming.tool_s + upcoming.think_s) / self.driver.speed
        self.built = self.build(turn_no + 1)
        return Next(until=due)


@dataclass
class SessionReplayWorkload:
    """Closed-loop replay of a session trace: each agent replays whole recorded agents' sessions in order."""

    trace: SessionTraceFile
    speed: float = 1.0
    timing: Timing = "recorded"
    # True: cycle through the sessions until the level ends (each pass with fresh text); False: once; None: once
    # unless ``fit_level`` finds the trace shorter than the level.
    repeat: bool | None = None
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    start: Start = "begin"  # "mid": each session starts at a drawn turn (``mid_turn``), sent whole as a warm-up
    name: str = field(init=False)

    def __post_init__(self) -> None:
        self.name = f"trace:{self.trace.path}"
        if not self.speed > 0:
            raise ConfigError(f"the replay speed must be positive, got {self.speed}")
        self.start = check_start(self.start)
        if self.timing not in ("recorded", "closed"):
            raise ConfigError(f"session timing must be 'recorded' or 'closed', got {self.timing!r}")
        if self.repeat not in (None, True, False):
            raise ConfigError(f"repeat must be true or false, got {self.repeat!r}")
        self._loop = self.repeat is True

    @property
    def span_s(self) -> float:
        """The least the replay can last, at ``speed``: each recorded agent's sessions in turn, their starts (with
        recorded timing) and the waits between their turns, as if every reply were instant."""
        longest = 0.0
        for share in _deal(self.trace.sessions, len(self.trace.sessions)):
            t = 0.0
            for s in share:
                t = max(t, s.start_s) if self.timing == "recorded" else t
                t += sum(turn.tool_s + turn.think_s for turn in s.turns[1:])
            longest = max(longest, t)
        return longest / self.speed

    def fit_level(self, warmup_s: float, window_s: float) -> str | None:
        """As ``MooncakeWorkload.fit_level``: loop (or, with ``repeat`` False, refuse) a trace shorter than a level."""
        lasts = f"{self.name} lasts at least {self.span_s:,.0f} s"
        note = _fit(lasts, self.span_s, self.speed, self.repeat, warmup_s, window_s)
        self._loop = note is not None
        return note and f"{note}: its sessions are replayed in a loop, each pass with fresh text"

    def agents(self, count: int, *, context: int, seed: int) -> list[AgentDriver]:
        # ``context`` does not apply: the trace fixes every size.
        origin = _Origin()
        shares = _deal(self.trace.sessions, len(agent_ids(count)))
        return [
            ConversationDriver(
                SessionReplayDriver(
                    agent_id,
                    share,
                    origin,
                    self.speed,
                    seed,
                    self.timing,
                    self._loop,
                    dict(self.extra_body),
                    self.start,
                )
            )
            for agent_id, share in zip(agent_ids(count), shares, strict=True)
        ]


def trace_workload(
    path: str | Path, **options: Any
) -> MooncakeWorkload | SessionReplayWorkload | ConversationTraceWorkload:
    """The replay workload for the trace at ``path`` (its format decides which)."""
    if is_conversation_trace(path):  # one JSON document of Claude Code conversations (workload/conversation_trace)
        return conversation_workload(path, **options)
    trace = load_trace(path)
    sessions = isinstance(trace, SessionTraceFile)
    known = {"speed", "repeat", "extra_body"} | ({"timing", "start"} if sessions else set())
    # A request trace starts where its timestamps say: "begin" is what it does, "mid" has no meaning there.
    if not sessions and "start" in options and check_start(options.pop("start")) == "mid":
        raise ConfigError(
            f"start=mid applies to closed-loop replays (conversation and session traces); {path} is a request "
            "trace, replayed open loop at its own timestamps, so a level sees whatever part of it the level's time "
            "covers (cut the file to start later; --trace-speed compresses it)"
        )
    unknown = sorted(set(options) - known)
    if unknown:
        # time_scale is the conversation traces' pace; these divide their time by speed instead.
        raise ConfigError(
            f"unknown trace option {', '.join(unknown)} for {path} (a {'session' if sessions else 'request'} "
            f"trace); its options: {', '.join(sorted(known))} (its pace: speed, bench --trace-speed)"
        )
    if isinstance(trace, MooncakeTrace):
        return MooncakeWorkload(trace, **options)
    return SessionReplayWorkload(trace, **options)


def _fit(lasts: str, span_s: float, speed: float, repeat: bool | None, warmup_s: float, window_s: float) -> str | None:
    """Whether a trace lasting ``span_s`` fills a level of ``warmup_s`` + ``window_s``: None when it does; the start
    of a note when it must loop; ``ConfigError`` when it must loop and ``repeat`` is False."""
    need = warmup_s + window_s
    if span_s >= need:
        return None
    lasts += f" at speed {speed:g}" if speed != 1 else ""
    needs = f"a level needs {need:,.0f} s ({warmup_s:,.0f} s warm-up + {window_s:,.0f} s window)"
    if repeat is False:
        raise ConfigError(
            f"{lasts} but {needs}: it would end before the window and measure nothing; replay it in a loop "
            "(repeat, the default), slow it down (speed) or shorten --warmup / --window"
        )
    return f"{lasts}; {needs}"


def fit_to_level(workload: Workload, warmup_s: float, window_s: float) -> str | None:
    """Fit a trace replay to a level of ``warmup_s`` + ``window_s`` (see ``MooncakeWorkload.fit_level``): a note
    when the trace is shorter and will be looped, None when it outlasts the level or is no trace; ``ConfigError``
    when it is shorter and looping was turned off. Bench calls it once, before its first level."""
    if isinstance(workload, MooncakeWorkload | SessionReplayWorkload):
        return workload.fit_level(warmup_s, window_s)
    return None
