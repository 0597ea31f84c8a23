"""Which session a recorded chat request belongs to: by header where the orchestrator names it, else by prefix.

An agent resends its whole conversation each turn, so a request whose messages *extend* an earlier request's
messages (the same leading messages, maybe more after them) continues that request's session. Messages are
compared as digests of their canonical JSON, so key order and white space between tokens do not matter and no
text is kept. Where several sessions' latest requests are prefixes of a request, the longest prefix wins (then
the most recent). A request that shares only a system prompt (or any strict prefix of a session's latest
request, not the whole of it) starts a new session: the shared prefix is the prompt every agent of a fleet sends.

``SESSION_HEADER`` names a session outright and wins over the prefix rule; ``PARENT_HEADER`` on a session's first
request names the session that started it, which makes the session a subagent of that one in the trace.

**Limits**: two agents that send exactly the same first messages are one session to the prefix rule until their
conversations part (then the second is a new session from the request that differs); the headers tell them
apart. A conversation that rewrites its history (compaction, a dropped tool result) starts a new session.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

SESSION_HEADER = "X-Agentload-Session"
PARENT_HEADER = "X-Agentload-Parent"
MAX_HEADER_CHARS = 200  # a session name longer than this is cut: it is an id, not data


def message_digests(messages: Sequence[Any]) -> tuple[bytes, ...]:
    """One digest per message, of its canonical JSON (sorted keys, no white space)."""
    return tuple(
        hashlib.blake2b(
            json.dumps(m, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode(), digest_size=16
        ).digest()
        for m in messages
    )


@dataclass
class Session:
    """One recognised conversation: its key, its parent's key if a subagent, its latest request's messages."""

    key: str
    index: int  # order of first appearance
    start: float  # the proxy clock's time at its first request
    parent: str | None = None
    named: bool = False  # named by SESSION_HEADER (then never matched by prefix)
    latest: tuple[bytes, ...] = ()
    last_seen: float = 0.0
    previous_end: float | None = None  # when its latest finished reply ended
    requests: int = 0
    continued: int = 0  # how many of the latest request's messages the one before it had sent


def _clean(value: str | None) -> str | None:
    if value is None:
        return None
    value = "".join(ch for ch in value.strip() if ch.isprintable())[:MAX_HEADER_CHARS]
    return value or None


class SessionBook:
    """Assigns each request to a session (``assign``), in arrival order."""

    def __init__(self) -> None:
        self.sessions: dict[str, Session] = {}
        self._unnamed = 0

    def assign(self, messages: Sequence[Any], now: float, *, name: str | None, parent: str | None) -> Session:
        digests = message_digests(messages)
        name, parent = _clean(name), _clean(parent)
        if name is not None:
            key = f"h:{name}"
            session = self.sessions.get(key)
            if session is None:
                parent_key = f"h:{parent}" if parent is not None and parent != name else None
                session = self._new(key, now, parent_key, named=True)
        else:
            session = self._by_prefix(digests) or self._new(self._next_key(), now, None, named=False)
        session.continued = len(session.latest) if digests[: len(session.latest)] == session.latest else 0
        session.latest = digests
        session.last_seen = now
        session.requests += 1
        return session

    def _next_key(self) -> str:
        self._unnamed += 1
        return f"s{self._unnamed}"

    def _new(self, key: str, now: float, parent: str | None, *, named: bool) -> Session:
        session = Session(key, len(self.sessions), now, parent=parent, named=named)
        self.sessions[key] = session
        return session

    def _by_prefix(self, digests: tuple[bytes, ...]) -> Session | None:
        best: Session | None = None
        for session in self.sessions.values():
            n = len(session.latest)
            if session.named or n == 0 or n > len(digests) or digests[:n] != session.latest:
                continue
            if best is None or (n, session.last_seen) >= (len(best.latest), best.last_seen):
                best = session
        return best
