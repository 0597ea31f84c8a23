"""Claude Code conversation traces, replayed as session trees: a conversation and the subagents it started.

**The format** is the one the public repository callanjfox/agentic-coding-analysis publishes its Claude Code
traces in (its ``docs/TRACE_FORMAT.md``; MIT licence): one JSON document per file, a conversation object or an
array of them. A conversation holds ``block_size`` (tokens per hash block, 64 in the published traces),
``tool_tokens`` and ``system_tokens`` (the shared prefix), and ``requests`` in order, each ``{"t": s from the
conversation's start, "in": prompt tokens, "out": output tokens, "hash_ids": [...], "think_time": s since the
previous reply, "stop", ...}``. ``hash_ids`` name the prompt's full blocks, each hash chained on the one before
it, so two prompts share exactly their common leading ids. A subagent is an entry ``{"type": "subagent", "t": s
after the conversation's start, "requests": [...]}`` among its parent's requests, with the same request schema;
its cache context is its own (the format says subagents start cold, apart from the global prefix). One field is
agentload's own: ``hash_scope: "trace"`` (``agentload record`` writes it on every conversation) says the ids are
numbered once for the whole file, so an id two conversations name is the same block in both (a fleet's shared
system prompt); without it, or with ``"conversation"``, a conversation's ids are its own. The published traces'
``hash_id_scope`` says the same: ``"global"`` is read as ``hash_scope: "trace"``, ``"local"`` as
``"conversation"``. Other fields are kept and not used.

**The replay** is closed loop and counted in trees: a level of N agents runs N trees at once. Each agent draws
the trace's next conversation (the level's k-th draw takes conversation k, looping the file) and replays it
whole before drawing again: the conversation's requests in order, each after its recorded ``think_time``
(else the gap its ``t`` and the previous request's ``api_time`` leave) times ``time_scale``; each subagent a
child conversation spawned ``t`` seconds (times ``time_scale``) after its parent started, running beside it.
A prompt is one user message: for each hash id, ``block_size`` server tokens of text that only the id and
the draw decide (``TokenSizing`` turns tokens into words of our text), then words of the request's own up to
``in`` tokens; the reply is asked for ``out`` tokens. So equal ids within a tree are equal text and a server's
prefix cache can reuse exactly what the trace's blocks share — and no more: each draw is salted afresh (with
the run's text salt and the level, so a rerun finds nothing warm), and each subagent has a salt of its own.
The one exception is a file's shared ids (``ConversationTrace.shared``): an id that more than one
``hash_scope: "trace"`` conversation names has one text for every tree of a pass of the file (a level's draws
0 to n − 1 of an n-conversation file, then n to 2n − 1, …), salted with the pass, the level and the run, so a
server reuses it across session trees as the recorded server did, and the next pass, level or run finds it cold
again.
With ``start="mid"`` a drawn tree starts at a request k of its conversation (``mid_turn``: seeded, per draw),
sent whole as a warm-up, then goes on from k + 1; subagents started before request k are not replayed
(``ConversationTreeDriver.plan``). Each turn is due its wait after the previous reply, and is built inside that
wait, so the send is not late by the time its prompt takes to build.

**The ceiling**: what an unlimited prefix cache would have served of the requests replayed, in the trace's own
blocks (each request's leading ids already sent in its context, times ``block_size``, over its ``in``); a
shared id counts as sent everywhere but at the request where the file first names it (conversations in file
order, a tree's contexts by start), the one miss a cache shared across the pass's trees takes. The
server's measured hit rate sits at or below it: the gap is what eviction, a block size that does not divide the
trace's, and tokenisation cost. ``prefix_ceiling`` reads it from a level's records (their ids name the
conversation, the subagent and the request).

**The pace**: ``pace_truth`` reads from a level's records whether the replay kept the trace's waits: each turn's
recorded wait times ``time_scale`` against its send minus the previous reply's end (``workload.base.ReplayPace``;
bench reports both means and the turns' lateness per level).

**Limits**: a trace is one JSON document of at most ``MAX_DOCUMENT_BYTES`` (refused past it: split the
conversations into files), every number finite and bounded, subagents nested at most ``MAX_DEPTH`` deep, at
most ``MAX_TOTAL_HASH_IDS`` hash ids in all; hash ids are non-negative integers and a request's ids never name
more tokens than its ``in``; the ``hash_scope: "trace"`` conversations of a file, one numbering of blocks, have
one ``block_size``. A malformed file is one ``ConfigError`` naming the file, the conversation and the
request (``requests[3].requests[5].in``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
import math
import re
from collections.abc import Callable, Container, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError, model_validator

from agentload.agent.loop import STOPPED, ConversationDriver, End, Ending, Next, Request, Spawn, Steps, Wait
from agentload.endpoint.records import RequestIds, RequestRecord
from agentload.errors import ConfigError
from agentload.inputs import parse_json, read_text
from agentload.workload.agentic import DONE, FAILED, FAILURE_PAUSE_S, SINGLE_MESSAGE_OVERHEAD_TOKENS, agent_ids
from agentload.workload.base import AgentDriver, LoadContext, PaceTruth, SessionWall
from agentload.workload.words import VOCAB, stable_int

# One JSON document is parsed whole; its hash-id lists take ~7x their text in memory, so 64 MiB is ~0.5 GB.
MAX_DOCUMENT_BYTES = 64 * 2**20
MAX_CONVERSATIONS = 100_000
MAX_REQUESTS = 10_000  # entries of one conversation or subagent
MAX_DEPTH = 4  # subagents of subagents (Claude Code's subagents cannot start their own; others might)
MAX_TOTAL_HASH_IDS = 20_000_000
MAX_TRACE_TOKENS = 2_000_000  # one request's input or output (the longest context windows are ~1-10M)
MAX_BLOCK_SIZE = 65_536
MAX_WAIT_S = 30 * 86_400.0  # a recorded time, think time or response time: 30 days
# A tree's agent looks for the end of its conversations this often once every one of them was started; a tree
# ends at most this late, against recorded think times of seconds.
TREE_POLL_S = 0.25
WAIT_SLICE_S = 1.0  # a wait for a subagent's start is slept in slices this long, so a level's end is seen
MAX_LIVE_CONVERSATIONS = 1024  # per tree: a trace with more subagents at once than this queues the rest

_ConfigStrict = ConfigDict(frozen=True, extra="allow", strict=True, allow_inf_nan=False, populate_by_name=True)


# -- the file format ---------------------------------------------------------------------------------------------


class TraceRequest(BaseModel):
    """One recorded request (``type`` "s" streaming or "n" not; unknown fields are kept in ``model_extra``)."""

    model_config = _ConfigStrict

    t: float = Field(default=0.0, ge=0, le=MAX_WAIT_S)
    type: str = "s"
    in_: int = Field(alias="in", ge=1, le=MAX_TRACE_TOKENS)
    out: int = Field(ge=0, le=MAX_TRACE_TOKENS)
    hash_ids: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list, max_length=MAX_TRACE_TOKENS)
    think_time: float | None = Field(default=None, ge=0, le=MAX_WAIT_S)
    api_time: float | None = Field(default=None, ge=0, le=MAX_WAIT_S)


def _entry_kind(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return "subagent" if kind == "subagent" else "request"


Entry = Annotated[
    Annotated[TraceRequest, Tag("request")] | Annotated["Subagent", Tag("subagent")], Discriminator(_entry_kind)
]


class Subagent(BaseModel):
    """A subagent its parent started ``t`` seconds after the parent's start, with requests of its own."""

    model_config = _ConfigStrict

    type: Literal["subagent"]
    t: float = Field(ge=0, le=MAX_WAIT_S)
    agent_id: str | None = None
    requests: list[Entry] = Field(min_length=1, max_length=MAX_REQUESTS)


class TraceConversation(BaseModel):
    """One conversation of the trace: its block size and its requests and subagents, in order."""

    model_config = _ConfigStrict

    id: str | None = None
    block_size: int = Field(ge=1, le=MAX_BLOCK_SIZE)
    tool_tokens: int | None = Field(default=None, ge=0, le=MAX_TRACE_TOKENS)
    system_tokens: int | None = Field(default=None, ge=0, le=MAX_TRACE_TOKENS)
    # "trace": its hash ids are numbered once for the whole file (``agentload record`` writes it), so an id another
    # conversation names is the same block there; "conversation" (absent): the ids are this conversation's own.
    hash_scope: Literal["conversation", "trace"] = "conversation"
    # The published traces' own name for it (AIPerf's reader, the traces built for it): "local", one numbering per
    # conversation (its subagents' own, as above); "global", one for the whole file, read as ``hash_scope: "trace"``.
    hash_id_scope: Literal["local", "global"] | None = None
    requests: list[Entry] = Field(min_length=1, max_length=MAX_REQUESTS)

    @model_validator(mode="before")
    @classmethod
    def _one_scope(cls, data: Any) -> Any:
        published = data.get("hash_id_scope") if isinstance(data, dict) else None
        if published not in ("local", "global"):
            return data  # absent (or a bad value, which the field refuses)
        scope = "trace" if published == "global" else "conversation"
        if data.get("hash_scope", scope) != scope:
            raise ValueError(f'hash_scope "{data["hash_scope"]}" contradicts hash_id_scope "{published}"')
        return {**data, "hash_scope": scope}


Subagent.model_rebuild()
TraceConversation.model_rebuild()


# -- what is replayed --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReplayRequest:
    tokens: int  # the recorded ``in``
    out: int
    blocks: tuple[int, ...]  # hash ids, in order
    wait_s: float  # recorded wait after the previous reply of its context (0 for the first)
    hit_tokens: int  # what an unlimited cache held of it: leading blocks sent earlier in its context
    at_s: float = 0.0  # recorded ``t`` after its context's first request (where a mid start puts the tree's clock)
    api_s: float | None = None  # its recorded ``api_time``: how long the recorded server took (None: not given)


@dataclass(frozen=True)
class ReplayContext:
    """A conversation or a subagent: its own cache context, started ``start_s`` after its tree's start."""

    key: str  # "c3" for conversation 3, "c3.s0.s1" for the second subagent of its first subagent
    start_s: float
    requests: tuple[ReplayRequest, ...]


@dataclass(frozen=True)
class ReplayTree:
    """One conversation with every subagent under it, by start time (the conversation first)."""

    index: int
    contexts: tuple[ReplayContext, ...]
    trace_scope: bool = False  # its conversation said ``hash_scope: "trace"``: its ids of ``ConversationTrace.shared``


@dataclass(frozen=True)
class ConversationTrace:
    path: Path
    block_size: tuple[int, ...]  # per conversation
    trees: tuple[ReplayTree, ...]
    extra: tuple[dict[str, Any], ...] = ()  # each conversation's fields agentload does not use
    # The ids that more than one ``hash_scope: "trace"`` conversation names, each with where the file first names it
    # (context key, request index): the one request a cache shared across trees misses it at, in one pass.
    shared: Mapping[int, tuple[str, int]] = field(default_factory=dict)

    @functools.cached_property
    def by_key(self) -> dict[str, ReplayContext]:
        return {c.key: c for tree in self.trees for c in tree.contexts}

    def requests(self) -> Iterator[ReplayRequest]:
        for tree in self.trees:
            for context in tree.contexts:
                yield from context.requests


def trace_ceiling(trace: ConversationTrace) -> float:
    """The whole trace's prefix-hit ceiling: hit tokens ÷ prompt tokens under an unlimited cache."""
    hit = prompt = 0
    for request in trace.requests():
        hit += request.hit_tokens
        prompt += request.tokens
    return hit / prompt if prompt else 0.0


_KEY = re.compile(r"^c\d+(\.s\d+)*$")
_STARTED = re.compile(r"^k(\d+)$")  # a context a mid start began at request k: ``agent-0/d3/k5/c3``

# Where a replayed session starts: its first turn, or a turn k drawn inside it (``mid_turn``).
Start = Literal["begin", "mid"]
STARTS: tuple[Start, ...] = ("begin", "mid")


def check_start(start: object) -> Start:
    if start not in STARTS:
        raise ConfigError(f"start must be 'begin' or 'mid', got {start!r}")
    return "mid" if start == "mid" else "begin"


def mid_turn(turns: int, *key: int) -> int:
    """The turn a ``start="mid"`` replay of a ``turns``-turn session begins at: uniform over every turn that has a
    next one (so at least one turn follows the warm-up), drawn from ``key`` alone (the seed and the draw), so the
    same draw starts at the same turn in every run."""
    if turns < 2:
        return 0
    return int(np.random.default_rng([stable_int("start-mid"), *key]).integers(0, turns - 1))


def prefix_ceiling(trace: ConversationTrace, records: Sequence[RequestRecord]) -> float | None:
    """The ceiling for what ``records`` replayed (records of other workloads, or of no request, are skipped).

    A context a mid start began at request k (its name's ``k<k>`` segment) has its history from k on: k itself,
    the warm-up, is a miss, and a later request's hits count against what was sent from k, not against the
    requests the replay skipped. The name says so, so a level's window alone (its warm-up's records left out) is
    enough."""
    hit = prompt = 0
    contexts = trace.by_key
    from_first: dict[tuple[str, int], tuple[int, ...]] = {}  # by context key and first request, computed once each
    for record in records:
        parts = record.ids.agent.rsplit("/", 2)
        key = parts[-1]
        context = contexts.get(key) if _KEY.match(key) else None
        if context is None or not 0 <= record.ids.turn < len(context.requests):
            continue
        request = context.requests[record.ids.turn]
        started = _STARTED.match(parts[-2]) if len(parts) == 3 else None
        k = int(started.group(1)) if started else 0
        if k == 0:
            hit += request.hit_tokens
        elif record.ids.turn >= k:
            hits = from_first.get((key, k))
            if hits is None:
                tree = trace.trees[int(key[1:].split(".", 1)[0])]
                shared = trace.shared if tree.trace_scope else {}
                hits = from_first[key, k] = _hits_from(context, k, trace.block_size[tree.index], shared)
            hit += hits[record.ids.turn - k]
        prompt += request.tokens
    return hit / prompt if prompt else None


def _hits_from(
    context: ReplayContext, first: int, block_size: int, shared: Mapping[int, tuple[str, int]]
) -> tuple[int, ...]:
    """Each request's ceiling when its context's history starts at request ``first`` (the first sent, a miss but
    for its ``shared`` ids): a leading block counts if the context sent it before, or if it is an id the file
    shares across trees and this is not the request where the file first names it (so another tree of the pass
    sent it first; under a mid start, which may skip that request, a slight overcount: still a ceiling)."""
    out: list[int] = []
    sent: set[int] = set()
    for turn, request in enumerate(context.requests[first:], first):
        hits = 0
        for block in request.blocks:
            if block not in sent and shared.get(block, (context.key, turn)) == (context.key, turn):
                break
            hits += 1
        out.append(hits * block_size)
        sent.update(request.blocks)
    return tuple(out)


def pace_truth(
    trace: ConversationTrace, records: Sequence[RequestRecord], time_scale: float, due_from: float = -math.inf
) -> PaceTruth | None:
    """The realised waits against the recorded ones for the turns ``records`` hold after a reply in their own
    context (a context's first turn has no recorded time of its own, and one after a failed reply none either),
    due (that reply's end + the recorded wait × ``time_scale``) at or after ``due_from``; None when there is no
    such turn. A turn counts by its first attempt: a retry goes out after the failed attempt and its backoff, which
    is the retry's delay, not the pace's."""
    contexts = trace.by_key
    done = {(r.ids.agent, r.ids.turn): r.t_done for r in records if r.ok}
    late: list[float] = []
    recorded = realised = 0.0
    for record in records:
        key = record.ids.agent.rsplit("/", 1)[-1]
        context = contexts.get(key) if _KEY.match(key) else None
        before = done.get((record.ids.agent, record.ids.turn - 1))
        if context is None or before is None or record.ids.attempt or not 0 < record.ids.turn < len(context.requests):
            continue
        wait = context.requests[record.ids.turn].wait_s * time_scale
        if before + wait < due_from:
            continue
        recorded += wait
        realised += record.t_sent - before
        late.append(record.t_sent - before - wait)
    if not late:
        return None
    return PaceTruth(len(late), recorded / len(late), realised / len(late), tuple(late))


def session_walls(
    trace: ConversationTrace, records: Sequence[RequestRecord], ended_from: float = -math.inf
) -> tuple[SessionWall, ...]:
    """Each context (a conversation or a subagent) ``records`` replayed to its last request, that request sent at
    or after ``ended_from``: its first request's send (its first attempt's) to its last reply's end, against the
    trace's recorded waits before its requests after the first (the ones the replay kept, unscaled) plus every one
    of its requests' recorded ``api_time``. A context with a request of no ``api_time`` is left out: its recorded
    wall is unknown. Not the span of its ``t``: a conversation's ``t`` also holds the time it waited for its
    subagents and requests a cut trace left out, which the replay, waiting ``think_time``, does not keep."""
    contexts = trace.by_key
    first_sent: dict[tuple[str, int], float] = {}
    for r in records:
        key = (r.ids.agent, r.ids.turn)
        first_sent[key] = min(r.t_sent, first_sent.get(key, math.inf))
    walls: list[SessionWall] = []
    for record in records:
        parts = record.ids.agent.rsplit("/", 2)
        context = contexts.get(parts[-1]) if _KEY.match(parts[-1]) else None
        if context is None or not record.ok or record.ids.turn != len(context.requests) - 1:
            continue
        if record.t_sent < ended_from:
            continue
        started = _STARTED.match(parts[-2]) if len(parts) == 3 else None  # a mid start's: from request k on
        first = int(started.group(1)) if started else 0
        sent = first_sent.get((record.ids.agent, first))
        replayed = context.requests[first:]
        if sent is None or not replayed or any(r.api_s is None for r in replayed):
            continue
        recorded = sum(r.wait_s for r in replayed[1:]) + sum(r.api_s or 0.0 for r in replayed)
        if recorded > 0:
            walls.append(SessionWall(record.t_done - sent, recorded))
    return tuple(walls)


# -- reading -----------------------------------------------------------------------------------------------------

_REQUESTS_KEY = re.compile(r'"(requests|block_size)"\s*:')
_SNIFF_BYTES = 64 * 2**10


def is_conversation_trace(path: str | Path) -> bool:
    """Whether ``path`` looks like this format rather than a JSONL trace (a file that cannot be read is left to
    the JSONL reader, whose error names it): a JSON array, a document whose first line is an opening brace alone
    (a JSONL row is one line), or a first line with a ``requests`` or ``block_size`` key."""
    try:
        with Path(path).open("rb") as f:
            head = f.read(_SNIFF_BYTES).decode("utf-8", errors="ignore").lstrip()
    except OSError:
        return False
    if head.startswith("["):
        return True
    if not head.startswith("{"):
        return False
    first = head.split("\n", 1)[0]
    return first.strip() == "{" or _REQUESTS_KEY.search(first) is not None


def _where(loc: Sequence[int | str]) -> str:
    """A pydantic location as a path: ``requests[3].requests[5].in`` (the union's tags left out)."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part not in ("request", "subagent"):
            out += f".{part}" if out else part
    return out


def _conversation_name(index: int, obj: Any) -> str:
    ident = obj.get("id") if isinstance(obj, dict) else None
    return f"conversation {index}" + (f" ({ident})" if isinstance(ident, str) and ident else "")


def load_conversation_trace(path: str | Path) -> ConversationTrace:
    """Read a conversation trace; ``ConfigError`` names the file, the conversation, the request and the field."""
    path = Path(path)
    text = read_text(path, "conversation trace", max_bytes=MAX_DOCUMENT_BYTES)
    doc = parse_json(text, str(path))
    items = doc if isinstance(doc, list) else [doc]
    if not items:
        raise ConfigError(f"{path}: the trace holds no conversation")
    if len(items) > MAX_CONVERSATIONS:
        raise ConfigError(f"{path}: a trace holds at most {MAX_CONVERSATIONS:,} conversations; split it")
    trees: list[ReplayTree] = []
    sizes: list[int] = []
    extras: list[dict[str, Any]] = []
    total_ids = 0
    for index, obj in enumerate(items):
        name = _conversation_name(index, obj)
        if not isinstance(obj, dict):
            raise ConfigError(f"{path}: {name}: expected a JSON object, got {type(obj).__name__}")
        try:
            conversation = TraceConversation.model_validate(obj)
        except ValidationError as exc:
            err = exc.errors()[0]
            msg = str(err["msg"]).removeprefix("Value error, ")
            raise ConfigError(f"{path}: {name}: {_where(err['loc']) or 'the conversation'}: {msg}") from exc
        contexts: list[ReplayContext] = []
        total_ids = _flatten(path, name, conversation.block_size, conversation.requests, f"c{index}", "requests",
                             0.0, 0, contexts, total_ids)  # fmt: skip
        contexts.sort(key=lambda c: c.start_s)  # stable: the conversation (at 0) first
        trees.append(ReplayTree(index, tuple(contexts), conversation.hash_scope == "trace"))
        sizes.append(conversation.block_size)
        extras.append(dict(conversation.model_extra or {}))
    shared = _shared_ids(path, trees, sizes)
    if shared:  # their ceilings count what another tree of the pass sent first
        trees = [_with_shared_hits(t, sizes[t.index], shared) if t.trace_scope else t for t in trees]
    return ConversationTrace(path, tuple(sizes), tuple(trees), tuple(extras), shared)


def _shared_ids(path: Path, trees: Sequence[ReplayTree], sizes: Sequence[int]) -> dict[int, tuple[str, int]]:
    """The ids more than one ``hash_scope: "trace"`` conversation names, each with where the file first names it
    (trees in file order, a tree's contexts by start, requests in order)."""
    scoped = [tree for tree in trees if tree.trace_scope]
    if len({sizes[tree.index] for tree in scoped}) > 1:  # one numbering of blocks is one block size
        raise ConfigError(
            f'{path}: conversations with hash_scope "trace" number their blocks together, so they must have one '
            f"block_size; got {sorted({sizes[tree.index] for tree in scoped})}"
        )
    first: dict[int, tuple[int, str, int]] = {}  # id → the conversation, context and request first naming it
    shared: set[int] = set()
    for tree in scoped:
        for context in tree.contexts:
            for turn, request in enumerate(context.requests):
                for block in request.blocks:
                    if block not in first:
                        first[block] = (tree.index, context.key, turn)
                    elif first[block][0] != tree.index:
                        shared.add(block)
    return {block: first[block][1:] for block in sorted(shared)}


def _with_shared_hits(tree: ReplayTree, block_size: int, shared: Mapping[int, tuple[str, int]]) -> ReplayTree:
    contexts = []
    for context in tree.contexts:
        hits = _hits_from(context, 0, block_size, shared)
        requests = tuple(dataclasses.replace(r, hit_tokens=h) for r, h in zip(context.requests, hits, strict=True))
        contexts.append(dataclasses.replace(context, requests=requests))
    return dataclasses.replace(tree, contexts=tuple(contexts))


def _flatten(
    path: Path,
    name: str,
    block_size: int,
    entries: Sequence[TraceRequest | Subagent],
    key: str,
    where: str,
    start_s: float,
    depth: int,
    out: list[ReplayContext],
    total_ids: int,
) -> int:
    """Append ``entries``' context and, depth first, its subagents' to ``out``; returns the hash ids seen so far."""
    if depth > MAX_DEPTH:
        raise ConfigError(f"{path}: {name}: {where}: subagents nested deeper than {MAX_DEPTH}")
    requests: list[ReplayRequest] = []
    cache: set[int] = set()
    origin: float | None = None  # the context's first request's t: subagents start relative to it
    previous: TraceRequest | None = None
    subagents: list[tuple[int, Subagent]] = []
    for i, entry in enumerate(entries):
        if isinstance(entry, Subagent):
            subagents.append((i, entry))
            continue
        if len(entry.hash_ids) * block_size > entry.in_:
            raise ConfigError(
                f"{path}: {name}: {where}[{i}].hash_ids: {len(entry.hash_ids)} blocks of {block_size} tokens are "
                f"more than its {entry.in_} input tokens (a hash id names a full block)"
            )
        total_ids += len(entry.hash_ids)
        if total_ids > MAX_TOTAL_HASH_IDS:
            raise ConfigError(f"{path}: more than {MAX_TOTAL_HASH_IDS:,} hash ids in all; split the trace")
        if origin is None:
            origin = entry.t
        if previous is None:
            wait = 0.0
        elif entry.think_time is not None:
            wait = entry.think_time
        else:  # the gap the timestamps leave once the previous reply was complete (if its time is known)
            wait = max(0.0, entry.t - previous.t - (previous.api_time or 0.0))
        hits = 0
        for block in entry.hash_ids:
            if block not in cache:
                break
            hits += 1
        cache.update(entry.hash_ids)
        requests.append(
            ReplayRequest(
                entry.in_, entry.out, tuple(entry.hash_ids), wait, hits * block_size, entry.t - origin, entry.api_time
            )
        )
        previous = entry
    out.append(ReplayContext(key, start_s, tuple(requests)))
    for n, (i, sub) in enumerate(subagents):
        offset = max(0.0, sub.t - (origin or 0.0))
        total_ids = _flatten(path, name, block_size, sub.requests, f"{key}.s{n}", f"{where}[{i}].requests",
                             start_s + offset, depth + 1, out, total_ids)  # fmt: skip
    return total_ids


def reply_end(now: float, record: RequestRecord) -> float:
    """When the reply a wait is measured from ended: its record's ``t_done`` (the client's clock, the loop's as the
    level's is), so the time the record took to reach the workload is inside the wait; ``now`` when that stamp is
    not a moment of the last second on this clock (a client given a clock of its own)."""
    return record.t_done if now - 1.0 <= record.t_done <= now else now


# -- replay ------------------------------------------------------------------------------------------------------


def _hashed_words(key: tuple[int, ...], n: int) -> str:
    """``n`` words of ``VOCAB`` that ``key`` alone decides. An extendable-output hash of the key, not a seeded numpy
    generator: seeding one costs ~0.1 ms, and a replay builds a prompt for every turn on the loop that paces the
    others' (SHAKE-128, FIPS 202, gives as many uniform bytes as asked)."""
    if n <= 0:
        return ""
    picks = np.frombuffer(hashlib.shake_128(repr(key).encode()).digest(4 * n), dtype=np.uint32) % len(VOCAB)
    return " ".join(VOCAB[picks])


@functools.lru_cache(maxsize=65_536)
def _block_text(salt: tuple[int, ...], block: int, n_words: int) -> str:
    """The text a hash id stands for in one tree context: the same for every request that names it there."""
    return _hashed_words((*salt, 0, block), n_words)


def prompt_text(
    request: ReplayRequest,
    salt: tuple[int, ...],
    turn: int,
    block_words: int,
    tokens_per_word: float,
    shared: Container[int] = frozenset(),
    shared_salt: tuple[int, ...] = (),
) -> str:
    """``request``'s prompt: its blocks' texts in order, then words of its own to ``in`` server tokens in all
    (less the chat template's, so the server counts ~``in``). A block of ``shared`` (an id the file's trees share)
    takes ``shared_salt``'s text, the same in every tree that salt is given to."""
    parts = [_block_text(shared_salt if block in shared else salt, block, block_words) for block in request.blocks]
    rest = request.tokens - SINGLE_MESSAGE_OVERHEAD_TOKENS - len(request.blocks) * block_words * tokens_per_word
    own = max(0 if parts else 1, math.floor(rest / tokens_per_word))
    if own:
        parts.append(_hashed_words((*salt, 1, turn), own))
    return " ".join(parts)


class _Draws:
    """The level's draw counter, shared by its agents: the k-th tree of the level is conversation k mod n."""

    def __init__(self) -> None:
        self.next = 0

    def take(self) -> int:
        k, self.next = self.next, self.next + 1
        return k


@dataclass
class _TreeState:
    """A drawn tree's conversations in flight; the tree is reported when its last one ends (here, not in the agent:
    a level that stops as that one ends closes the agent before it could look)."""

    done: Callable[[bool], None]
    pending: int = 0
    all_started: bool = False
    failed: bool = False
    stopped: bool = False

    def ended(self, end: Ending) -> None:
        self.pending -= 1
        if end.reason == STOPPED:  # the level ended mid-tree: not a finished session
            self.stopped = True
        elif end.reason != DONE:
            self.failed = True
        if self.pending == 0 and self.all_started and not self.stopped:
            self.done(not self.failed)


@dataclass
class ConversationTreeDriver:
    """One agent: a session tree at a time, drawn from the trace, its conversations spawned at their times."""

    agent_id: str
    trace: ConversationTrace
    draws: _Draws
    time_scale: float
    seed: int
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    start: Start = "begin"

    def conversations(self, ctx: LoadContext) -> Steps:
        slots = asyncio.Semaphore(MAX_LIVE_CONVERSATIONS)
        while not ctx.should_stop():
            draw = self.draws.take()
            tree = self.trace.trees[draw % len(self.trace.trees)]
            state = _TreeState(functools.partial(self._tree_done, ctx))
            start = ctx.clock.now()
            contexts = [c for c in tree.contexts if c.requests]  # a conversation of subagents only sends none itself
            plan = self.plan(contexts, draw)
            if len(plan) == 1:  # no subagent: the conversation runs here, no tree to watch (``TREE_POLL_S``)
                context, first, at_s = plan[0]
                if at_s > 0:  # a conversation of one subagent: it starts when the trace started it
                    yield Wait(until=start + at_s * self.time_scale, slice_s=WAIT_SLICE_S)
                end = yield _ContextTurns(self, ctx, tree.index, context, draw, first)
                if end is None or end.reason == STOPPED:  # the level ended mid-session: not a finished one
                    return
                ctx.session_done(self.agent_id, ok=end.reason == DONE)
                if end.reason != DONE:
                    yield Wait(FAILURE_PAUSE_S)
                continue
            for n, (context, first, at_s) in enumerate(plan):
                if at_s > 0:
                    yield Wait(until=start + at_s * self.time_scale, slice_s=WAIT_SLICE_S)
                state.pending += 1
                state.all_started = n == len(plan) - 1
                yield Spawn(_ContextTurns(self, ctx, tree.index, context, draw, first), slots, state.ended)
            while state.pending > 0:  # the tree is the unit of concurrency: the next starts when it has ended
                yield Wait(TREE_POLL_S)
            if state.stopped:
                return
            if state.failed:
                yield Wait(FAILURE_PAUSE_S)

    def plan(self, contexts: Sequence[ReplayContext], draw: int) -> list[tuple[ReplayContext, int, float]]:
        """Each context to start, the request it starts at and when (recorded seconds after the tree's start).

        From the beginning: every context at its first request and its recorded start. From the middle: the
        tree's first context (the conversation) at request ``mid_turn`` of the draw, sent at once; the tree's
        clock starts at that request's recorded time, so a subagent started after it starts that much later, and
        one started before it is not replayed (it was the past of the sampled point)."""
        if self.start == "begin" or not contexts:
            return [(c, 0, c.start_s) for c in contexts]
        root = contexts[0]
        k = mid_turn(len(root.requests), self.seed, draw)
        now = root.start_s + root.requests[k].at_s
        return [(root, k, 0.0)] + [(c, 0, c.start_s - now) for c in contexts[1:] if c.start_s >= now]

    def _tree_done(self, ctx: LoadContext, ok: bool) -> None:
        ctx.session_done(self.agent_id, ok=ok)


class _ContextTurns:
    """One conversation or subagent of a drawn tree as a conversation of single-message requests."""

    def __init__(
        self,
        driver: ConversationTreeDriver,
        ctx: LoadContext,
        index: int,
        context: ReplayContext,
        draw: int,
        first: int = 0,
    ) -> None:
        self.driver, self.ctx, self.context = driver, ctx, context
        # The loop numbers turns from 0; the records carry the trace's request index (``first`` + turn), which the
        # ceiling reads. A mid start's turn 0 is request ``first`` whole: its text is the full replay's (the same
        # salt and ids), its context cold, as a resumed session's would be.
        self.first = first
        self.name = f"{driver.agent_id}/d{draw}/{f'k{first}/' if first else ''}{context.key}"
        # Fresh per draw and per context (a subagent's cache is its own), and the run's and the level's, so a rerun
        # against the same server finds nothing of this level warm. The agent too: a distributed level's actors
        # each count their own draws.
        self.salt = (
            driver.seed, ctx.level, stable_int(ctx.text_salt), stable_int(driver.agent_id), draw,
            stable_int(context.key),
        )  # fmt: skip
        # An id more than one conversation of a ``hash_scope: "trace"`` file names is one block across its trees (a
        # shared system prompt): its text is the pass's (draw ÷ trees), the run's and the level's, not the draw's,
        # so the trees of one pass of the file share it as the recorded sessions did, and the next pass does not.
        trace = driver.trace
        self.shared: Container[int] = trace.shared if trace.trees[index].trace_scope else frozenset()
        self.shared_salt = (
            driver.seed, ctx.level, stable_int(ctx.text_salt), stable_int("shared"), draw // len(trace.trees),
        )  # fmt: skip
        self.block_size = trace.block_size[index]
        self.built: Request | None = None

    def request(self, turn: int) -> Request | None:
        turn += self.first
        if self.built is not None and self.built.ids.turn == turn:  # built while its wait ran (``reply``)
            return self.built
        return self.build(turn)

    def build(self, turn: int) -> Request | None:
        if turn >= len(self.context.requests):
            return None
        ctx, request = self.ctx, self.context.requests[turn]
        sizing = ctx.sizing
        text = prompt_text(
            request, self.salt, turn, sizing.words(self.block_size), sizing.tokens_per_word,
            self.shared, self.shared_salt,
        )  # fmt: skip
        body = {
            "model": ctx.model,
            "messages": [{"role": "user", "content": text}],
            "max_tokens": max(1, request.out),
            **self.driver.extra_body,
        }
        return Request(body, RequestIds(run=ctx.run_id, level=ctx.level, agent=self.name, turn=turn))

    async def reply(self, turn: int, records: list[RequestRecord]) -> Next | End:
        turn += self.first
        if not records[-1].ok:
            return End(FAILED)
        if turn + 1 >= len(self.context.requests):
            return End(DONE)
        # The next turn is due its recorded wait after this reply, however long building it takes: it is built now,
        # inside the wait, and the wait runs to a time, so the send is not late by the build.
        due = (
            reply_end(self.ctx.clock.now(), records[-1])
            + self.context.requests[turn + 1].wait_s * self.driver.time_scale
        )
        self.built = self.build(turn + 1)
        return Next(until=due)


@dataclass(eq=False)
class ConversationTraceWorkload:
    """Closed-loop replay of a conversation trace in session trees (one tree per agent at a time)."""

    trace: ConversationTrace
    time_scale: float = 1.0  # recorded waits times this: 0.5 halves think times and subagent start offsets
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    start: Start = "begin"  # "mid": each tree starts at a drawn request of its conversation (``plan``)
    name: str = field(init=False)

    def __post_init__(self) -> None:
        self.name = f"trace:{self.trace.path}"
        scale = self.time_scale
        if isinstance(scale, bool) or not isinstance(scale, int | float) or not 0 <= scale <= 1e6:
            raise ConfigError(f"time_scale must be a number from 0 to 1e6 (1 = as recorded), got {scale!r}")
        self.start = check_start(self.start)

    def agents(self, count: int, *, context: int, seed: int) -> list[AgentDriver]:
        # ``context`` does not apply: the trace fixes every size.
        draws = _Draws()
        return [
            ConversationDriver(
                ConversationTreeDriver(
                    agent_id, self.trace, draws, float(self.time_scale), seed, dict(self.extra_body), self.start
                )
            )
            for agent_id in agent_ids(count)
        ]

    def ceiling(self, records: Sequence[RequestRecord]) -> float | None:
        """The trace's own prefix-hit ceiling over what ``records`` replayed (``workload.base.ReplayCeiling``)."""
        return prefix_ceiling(self.trace, records)

    def pace(self, records: Sequence[RequestRecord]) -> PaceTruth | None:
        """The realised think times against the recorded ones (times ``time_scale``) over ``records``."""
        return self.turn_pace(records)

    def turn_pace(self, records: Sequence[RequestRecord], *, due_from: float = -math.inf) -> PaceTruth | None:
        """``pace`` over the turns due at or after ``due_from`` (``workload.base.ReplayPace``)."""
        return pace_truth(self.trace, records, float(self.time_scale), due_from)

    def session_walls(
        self, records: Sequence[RequestRecord], *, ended_from: float = -math.inf
    ) -> tuple[SessionWall, ...]:
        """Each session replayed to its end, its wall time and the recorded one (``workload.base.ReplaySessions``)."""
        return session_walls(self.trace, records, ended_from)


CONVERSATION_OPTIONS = ("time_scale", "start", "extra_body")


def conversation_workload(path: str | Path, **options: Any) -> ConversationTraceWorkload:
    unknown = sorted(set(options) - set(CONVERSATION_OPTIONS))
    if unknown:
        # speed, timing and repeat are the JSONL replays' (their time divided by speed); here time_scale paces it.
        raise ConfigError(
            f"unknown trace option {', '.join(unknown)} for a conversation trace ({path}); its options: "
            f"{', '.join(CONVERSATION_OPTIONS)} (its pace: time_scale, bench --time-scale)"
        )
    return ConversationTraceWorkload(load_conversation_trace(path), **options)
