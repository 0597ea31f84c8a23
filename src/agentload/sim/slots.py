"""Slot-based serving, as llama.cpp's ``llama-server -np N`` does it: N slots, each with its own prompt cache.

vLLM shares one paged pool and finds any earlier request's blocks by hash. llama-server instead gives each of its
N slots a fixed share of the context (``-c`` ÷ ``-np``) and keeps in a slot only the tokens of the last request it
served. A new request takes an idle slot (none idle: it is deferred until one frees, ``llamacpp:requests_deferred``)
and reuses only the common prefix of its prompt with that slot's tokens; nothing is shared across slots. Which
idle slot (llama.cpp's ``get_available_slot``): the one whose tokens share the largest fraction of the new prompt,
if that fraction exceeds ``--slot-prompt-similarity`` (default 0.1); otherwise the least recently used.

So an agent keeps its cache while there are at least as many slots as agents (it finds its own slot idle on its
next turn), and past that its slot is often taken by another agent while it thinks: the turn queues for a slot
and then re-prefills its whole context.

A request may name its slot (``id_slot`` in the body, llama.cpp's ``task.id_slot``): it is served there and nowhere
else, deferred while that slot is busy (``pinned_slot`` / ``can_take``); an id past the last slot wraps around
(``get_slot_by_id`` takes it modulo the slot count, unsigned, so other negative ids name a slot too), -1 is any
slot. bench pins agent i to
slot i mod N: below N slots no agent takes another's; past N two agents share a slot, and a turn waits for it
(queueing) and then re-prefills what the other agent overwrote.

``SlotCache`` is that bookkeeping; the engine asks it how many prompt tokens a request finds cached when it is
admitted (``claim``) and hands the slot back when it ends (``release``).
llama.cpp's host-memory prompt cache (``--cache-ram``) is not modelled: the tier runs the server with it off.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from agentload.errors import SimulationError
from agentload.sim.tokens import extend_block_hashes

# llama-server's --slot-prompt-similarity default: a slot is chosen for its cache only above this share.
DEFAULT_SIMILARITY = 0.1


@dataclass(slots=True)
class _Slot:
    index: int
    tokens: Sequence[int] = ()
    hashes: list[int] = field(default_factory=list)  # chained hashes of the full blocks of ``tokens``
    last_used: int = -1  # claim order; -1 never used
    busy: bool = False
    task: object = None  # the key of the request it serves or last served (llama.cpp's task / task_prev)
    cached: int = 0  # tokens that request found in the slot


@dataclass(frozen=True, slots=True)
class SlotView:
    """One slot as llama-server's ``/slots`` describes it: its index, whether it is busy, its current or last task,
    how many tokens that task found cached there and how many tokens the slot holds when idle."""

    index: int
    busy: bool
    task: object
    cached: int
    held_tokens: int


class SlotCache:
    """N slots and their per-slot prompt caches. ``claim``/``release`` pair up once per admission of a request."""

    def __init__(
        self, count: int, block_size: int, similarity: float = DEFAULT_SIMILARITY, *, reuse: bool = True
    ) -> None:
        if count <= 0:
            raise SimulationError(f"a slot-based server needs at least one slot, got {count}")
        self._slots = [_Slot(i) for i in range(count)]
        self._block = block_size
        self._similarity = similarity
        self._held: dict[int, _Slot] = {}  # id(request) → its slot
        self._undo: dict[int, tuple[object, int]] = {}  # id(request) → the slot's task before the claim
        self._claims = 0
        self._reuse = reuse  # False: llama.cpp with cache_prompt off, slots but no prompt reuse

    @property
    def count(self) -> int:
        return len(self._slots)

    @property
    def busy(self) -> int:
        return len(self._held)

    def view(self) -> list[SlotView]:
        """Every slot's state, in slot order (what ``/slots`` and ``/completion``'s ``id_slot`` report)."""
        return [SlotView(s.index, s.busy, s.task, s.cached, len(s.tokens)) for s in self._slots]

    def pinned_slot(self, id_slot: int) -> int | None:
        """The slot a request naming ``id_slot`` must use, None (-1): any slot.

        llama.cpp's ``get_slot_by_id`` takes ``id_slot % slots.size()`` in unsigned arithmetic: an id past the last
        slot wraps, and a negative one other than -1 becomes 2**64 + id first (-2 on 3 slots is slot 2, as the real
        server logged "selected slot by id (-2)" for slot 2)."""
        if id_slot == -1:
            return None
        return (id_slot % (1 << 64)) % len(self._slots)

    def can_take(self, id_slot: int) -> bool:
        """Whether a request naming ``id_slot`` can be given a slot now (llama.cpp defers it otherwise)."""
        pinned = self.pinned_slot(id_slot)
        if pinned is None:
            return any(not s.busy for s in self._slots)
        return not self._slots[pinned].busy

    def _common_prefix(self, slot: _Slot, tokens: Sequence[int], hashes: Sequence[int]) -> int:
        """Tokens ``tokens`` shares from the start with the slot's: whole blocks by hash, then token by token."""
        own = slot.hashes
        # Chained hashes: block i equal implies every block before it is, so the equal run is found by bisection.
        lo, hi = 0, min(len(own), len(hashes))
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if own[mid - 1] == hashes[mid - 1]:
                lo = mid
            else:
                hi = mid - 1
        n = lo * self._block
        limit = min(len(slot.tokens), len(tokens))
        while n < limit and slot.tokens[n] == tokens[n]:
            n += 1
        return n

    def claim(self, key: object, prompt: Sequence[int], hashes: Sequence[int], id_slot: int = -1) -> int:
        """Give ``key`` an idle slot; returns how many leading tokens of ``prompt`` that slot already holds.

        ``hashes`` are the chained hashes of ``prompt``'s full blocks. ``id_slot``: the slot the request named
        (-1 any); the engine claims only when ``can_take`` says so, so the slot asked for is idle here.
        """
        pinned = self.pinned_slot(id_slot)
        idle = [s for s in self._slots if not s.busy and (pinned is None or s.index == pinned)]
        if not idle:
            raise SimulationError("no idle slot: the engine admitted a request whose slot is busy")
        chosen: _Slot | None = None
        if pinned is not None:
            # The named slot whatever its similarity; it reuses its common prefix as any slot does.
            chosen = idle[0]
        elif self._similarity > 0 and prompt:
            best = self._similarity
            for slot in idle:
                if not slot.tokens:
                    continue
                common = self._common_prefix(slot, prompt, hashes)
                if common / len(prompt) > best:
                    chosen, best = slot, common / len(prompt)
        if chosen is None:
            # llama.cpp's LRU loop keeps the last slot whose t_last_used is <= the best so far: ties go to the
            # highest id (a fresh server serves its first request in its last slot).
            chosen = min(reversed(idle), key=lambda s: s.last_used)
        reused = self._common_prefix(chosen, prompt, hashes) if chosen.tokens else 0
        chosen.busy = True
        self._undo[id(key)] = (chosen.task, chosen.cached)
        chosen.task = key
        chosen.cached = reused if self._reuse else 0
        chosen.last_used = self._claims
        self._claims += 1
        self._held[id(key)] = chosen
        return reused if self._reuse else 0

    def release(self, key: object, tokens: Sequence[int], hashes: Sequence[int] = ()) -> None:
        """``key`` is done (finished, aborted or preempted): its slot now holds ``tokens`` and is idle.

        ``hashes`` may give the full-block hashes of a leading part of ``tokens`` already known (the prompt's);
        the rest are computed here.
        """
        slot = self._held.pop(id(key), None)
        self._undo.pop(id(key), None)
        if slot is None:
            return
        slot.tokens = tokens
        slot.hashes = extend_block_hashes(list(hashes[: len(tokens) // self._block]), tokens, self._block)
        slot.busy = False

    def cancel(self, key: object) -> None:
        """Undo a ``claim`` whose admission did not go through: the slot is idle again with what it held."""
        slot = self._held.pop(id(key), None)
        undo = self._undo.pop(id(key), None)
        if slot is not None:
            slot.busy = False
            if undo is not None:
                slot.task, slot.cached = undo
