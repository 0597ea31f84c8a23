"""The recorded trace: requests by session, written as the conversation trace format, whole and atomically.

The document is the one ``workload/conversation_trace.py`` reads (one conversation object per session that
started on its own, in order of first request): ``block_size``, ``tokenizer`` (how the hashes' tokens were had,
``record/tokens.py``), and ``requests`` in order of arrival, each ``t`` seconds after its conversation's first
request, with a subagent (a session whose first request named a parent) as a ``{"type": "subagent", "t": …,
"requests": […]}`` entry among its parent's, ``t`` being its first request's time after the parent's start.

Every write replaces the file whole (``store.atomic``): a reader, or a crash mid-write, sees the previous
complete document or the new one. The file is rewritten after each completed request (``keep_written``); writes
do not queue up — one runs at a time in a worker thread and the next writes whatever completed meanwhile — and
once more when the proxy stops (``close``, after any write still running), so Ctrl-C or SIGTERM keeps every
request that had completed.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentload.record.sessions import Session
from agentload.store.atomic import write_atomic

MAX_SUBAGENT_DEPTH = 4  # the reader's limit (conversation_trace.MAX_DEPTH): deeper sessions become conversations
RECORDED_BY = "agentload record"


@dataclass(frozen=True)
class RecordedRequest:
    session: str
    t: float  # the proxy clock's time at its arrival
    fields: dict[str, Any]  # the trace request's fields, "t" apart


@dataclass
class TraceWriter:
    path: Path
    block_size: int
    tokenizer: Callable[[], str]  # the method the tokens came from, once known
    requests: list[RecordedRequest] = field(default_factory=list)
    _dirty: asyncio.Event = field(default_factory=asyncio.Event)
    _running: asyncio.Future[None] | None = None  # the write now in a worker thread, if any

    def add(self, request: RecordedRequest) -> None:
        self.requests.append(request)
        self._dirty.set()

    def document(self, sessions: dict[str, Session]) -> list[dict[str, Any]]:
        by_session: dict[str, list[RecordedRequest]] = {}
        for r in self.requests:
            by_session.setdefault(r.session, []).append(r)
        recorded = [s for s in sessions.values() if s.key in by_session]

        def depth(session: Session) -> int:
            n, parent = 0, session.parent
            while parent is not None and parent in sessions and n <= MAX_SUBAGENT_DEPTH:
                n, parent = n + 1, sessions[parent].parent
            return n

        def attached(session: Session) -> bool:
            return (
                session.parent is not None
                and session.parent in by_session
                and 0 < depth(session) <= (MAX_SUBAGENT_DEPTH)
            )

        children: dict[str, list[Session]] = {}
        for s in recorded:
            if attached(s):
                assert s.parent is not None
                children.setdefault(s.parent, []).append(s)

        def entries(session: Session, origin: float) -> list[dict[str, Any]]:
            items: list[tuple[float, dict[str, Any]]] = [
                (r.t, {"t": round(r.t - origin, 6), **r.fields}) for r in by_session[session.key]
            ]
            for child in children.get(session.key, []):
                first = by_session[child.key][0].t
                sub = {"type": "subagent", "t": round(max(0.0, first - origin), 6), "agent_id": child.key,
                       "requests": entries(child, origin)}  # fmt: skip
                items.append((first, sub))
            items.sort(key=lambda item: item[0])
            return [item for _, item in items]

        doc = []
        for s in recorded:
            if attached(s):
                continue
            origin = by_session[s.key][0].t
            # hash_scope "trace": equal hash ids name equal blocks across conversations too (one numbering for
            # the whole recording), so a shared system prompt has the same leading ids in every session.
            doc.append({"id": s.key.removeprefix("h:"), "block_size": self.block_size,
                        "tokenizer": self.tokenizer(), "hash_scope": "trace", "recorded_by": RECORDED_BY,
                        "requests": entries(s, origin)})  # fmt: skip
        return doc

    def write(self, sessions: dict[str, Session]) -> None:
        """Write the document now (in this thread)."""
        write_atomic(self.path, json.dumps(self.document(sessions), indent=1) + "\n")

    async def keep_written(self, sessions: dict[str, Session]) -> None:
        """Until cancelled: write the document each time a request was added since the last write (one write at a
        time, in a worker thread; requests that complete during a write go into the next)."""
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            doc = json.dumps(self.document(sessions), indent=1) + "\n"
            self._running = asyncio.ensure_future(asyncio.to_thread(write_atomic, self.path, doc))
            # Shielded: cancelling this loop cannot stop the thread, so the write is left to finish and ``close``
            # waits for it — else an older document could replace the last one after it was written.
            await asyncio.shield(self._running)

    async def close(self, sessions: dict[str, Session]) -> None:
        """After ``keep_written`` was cancelled: wait for its write still running, then write the whole document
        a last time, so the file ends with every request added."""
        if self._running is not None:
            await asyncio.gather(self._running, return_exceptions=True)
        if self.requests:
            await asyncio.to_thread(self.write, sessions)
