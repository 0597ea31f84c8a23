"""Record a run as a session trace: RequestRecords in, ``trace:`` JSONL out.

A conversation is what a workload names with ``RequestIds.agent`` — ``<agent>/<session>`` by our workloads'
convention (``agent-3/s7``; the suite's ``agent-03/T5``) — within one run and level; its turns are the
``RequestIds.turn``s, each the final attempt of that turn. Only turns that ended well are kept: a failed turn
has no usage to replay. What a session trace keeps per turn is what replay needs (workload/trace.py): prompt,
completion and cached tokens, and the time the agent spent before sending it (all of it as ``think_s``: records
cannot tell a tool's latency from the harness's own time). Sessions are written in order of their start.

``shared_prefix_tokens`` — the system prompt every session shares — is not in any record. Unless given, it is
taken as the most common non-zero ``cached_tokens`` of sessions' first turns: a session's first turn can only
hit what another session left, which for agentic sessions is the shared system prompt (block-rounded).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

from pydantic import ValidationError

from agentload.endpoint.records import RequestRecord
from agentload.errors import ConfigError
from agentload.workload.trace import SessionTrace, TraceTurn


def _final_attempts(records: Sequence[RequestRecord]) -> list[tuple[RequestRecord, RequestRecord]]:
    """(first attempt, final attempt) per turn, in turn order."""
    turns: dict[int, list[RequestRecord]] = {}
    for r in records:
        turns.setdefault(r.ids.turn, []).append(r)
    out = []
    for turn in sorted(turns):
        attempts = sorted(turns[turn], key=lambda r: (r.ids.attempt, r.t_sent))
        out.append((attempts[0], attempts[-1]))
    return out


def session_traces(records: Iterable[RequestRecord], *, shared_prefix_tokens: int | None = None) -> list[SessionTrace]:
    """The sessions of a run's records, ready to write (see the module docstring)."""
    records = list(records)
    if not records:
        return []
    t0 = min(r.t_sent for r in records)
    runs = {r.ids.run for r in records}
    conversations: dict[tuple[str, int, str], list[RequestRecord]] = {}
    for r in records:
        conversations.setdefault((r.ids.run, r.ids.level, r.ids.agent), []).append(r)
    drafts: list[tuple[float, str, str, list[TraceTurn]]] = []
    for (run, level, agent), recs in conversations.items():
        turns: list[TraceTurn] = []
        previous_done: float | None = None
        start: float | None = None
        for first, final in _final_attempts(recs):
            if not final.ok or final.completion_tokens < 1 or final.prompt_tokens < 1:
                continue
            start = first.t_sent if start is None else start
            gap = 0.0 if previous_done is None else max(0.0, first.t_sent - previous_done)
            turns.append(
                TraceTurn(
                    prompt_tokens=final.prompt_tokens,
                    completion_tokens=final.completion_tokens,
                    cached_tokens=final.cached_tokens,
                    think_s=round(gap, 6),
                )
            )
            previous_done = final.t_done
        if not turns or start is None:
            continue
        # Several runs in one file keep their sessions apart; the level always does (levels are separate loads).
        scope = f"{run}:L{level}" if len(runs) > 1 else f"L{level}"
        drafts.append((start - t0, f"{scope}/{agent}", f"{scope}/{agent.split('/')[0]}", turns))
    if shared_prefix_tokens is None:
        shared_prefix_tokens = _shared_prefix(d[3][0] for d in drafts)
    drafts.sort(key=lambda d: (d[0], d[1]))
    return [
        SessionTrace(
            session_id=session_id,
            agent=agent,
            start_s=round(start_s, 6),
            # Never more than a session's own first prompt holds (a short session shares what it has).
            shared_prefix_tokens=min(shared_prefix_tokens, turns[0].prompt_tokens - 1),
            turns=turns,
        )
        for start_s, session_id, agent, turns in drafts
    ]


def _shared_prefix(first_turns: Iterable[TraceTurn]) -> int:
    counts = Counter(t.cached_tokens for t in first_turns if t.cached_tokens)
    return counts.most_common(1)[0][0] if counts else 0


def write_session_trace(path: str | Path, sessions: Iterable[SessionTrace]) -> int:
    """Write one session per line; returns how many were written."""
    path = Path(path)
    n = 0
    try:
        with path.open("w", encoding="utf-8") as f:
            for s in sessions:
                f.write(s.model_dump_json(exclude_none=True) + "\n")
                n += 1
    except OSError as exc:
        raise ConfigError(f"cannot write the session trace {path}: {exc}") from exc
    return n


def read_records(path: str | Path) -> list[RequestRecord]:
    """RequestRecords from a JSONL file (a run directory's records); ``ConfigError`` names the file and line."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read records {path}: {exc}") from exc
    out = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            out.append(RequestRecord.model_validate_json(line))
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = ".".join(str(p) for p in err["loc"])
            raise ConfigError(
                f"{path}:{number}: not a request record ({loc + ': ' if loc else ''}{err['msg']})"
            ) from exc
    return out


def record_session_trace(
    records: Iterable[RequestRecord], path: str | Path, *, shared_prefix_tokens: int | None = None
) -> int:
    """Write ``records`` as a session trace at ``path``; returns the number of sessions."""
    return write_session_trace(path, session_traces(records, shared_prefix_tokens=shared_prefix_tokens))
