"""The simulated engine: vLLM V1's scheduler step over a paged KV cache (``vllm/v1/core/sched/scheduler.py``;
docs/background.md §3).

``Engine.step(now)`` is a pure state transition: it schedules one batch, asks the shared step-time model how
long that batch takes, applies the batch's effects (computed tokens, cached blocks, one token per request that
finished its prefill or decoded) as of ``now + duration``, and returns what happened. Drivers own time: the HTTP
server sleeps for the duration in real time (``sim.runner``), in-process runs jump a virtual clock
(``sim.virtual``). The order of everything inside a step is deterministic.

Per step (vLLM V1, FCFS):
1. running requests first, in admission order: each gets min(remaining, budget) tokens (decode = 1, a long
   prefill continues in chunks); if its blocks cannot grow, the most recently admitted running request is
   preempted (blocks freed but their hashes kept, progress reset, back to the head of the waiting queue) until
   it fits or it was itself the one preempted;
2. then, only if nothing was preempted this step, waiting requests in order while the token budget, the
   ``max_num_seqs`` cap and the free blocks allow: prefix lookup (capped at total tokens − 1), allocate, admit.

The pool is vLLM's: of the profile's ``num_blocks`` (what vLLM reports as ``num_gpu_blocks``) the first is the
null block and never holds KV, so ``num_blocks − 1`` are allocated and cached, and usage is counted over those.

Fast mode (``Engine(profile, fast=True)``, used by virtual-time runs). Most of a long run is steps in which
dozens of requests each decode one token and nothing happens to them except, every ``block_size`` tokens, one
new block and one newly full block to cache. Fast mode keeps such steady decoders in a *cohort*: the leading
requests of the running list, whose counters advance implicitly with the cohort's tick and whose share of the
step cost is kept as running sums. Only what happens to one of them — a block to allocate, a block to cache,
the last token, a read-span breakpoint, a preemption — touches it, at the tick it is due, in the order the
step-by-step scheduler would have done it. A step then costs O(events) instead of O(running requests), and
when the cohort is all there is (nothing waiting, no prefill under way) ``decode_steps`` runs such steps back
to back until one needs the full scheduler. The results are identical to ``fast=False`` (tests/test_engine.py
and tests/test_virtual.py compare both, to the last bit); the price is that a cohort member's
``num_computed``/``num_output``/``ever_computed`` are brought up to date only when it leaves the cohort or on
``sync()`` — fine for virtual runs, not for the HTTP server, which streams ``num_output`` and therefore runs
with ``fast=False``.

Step cost sums are kept in integer "layer-token" units (``read_span × num_layers``) so that they do not depend
on the order of addition: the cohort's running sums and a request-by-request sum agree to the last bit.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from operator import attrgetter

from agentload.capacity.models import ModelSpec
from agentload.capacity.profile import ServingProfile
from agentload.capacity.steptime import BatchShape
from agentload.errors import SimulationError
from agentload.sim.kvcache import BlockTable, KVCacheManager, Lookup
from agentload.sim.slots import SlotCache
from agentload.sim.tokens import ROOT_HASH, chain_hash, extend_block_hashes


@dataclass(eq=False, slots=True)
class SimRequest:
    """One request inside the engine. ``output`` is what the model will say (its length ends the request)."""

    request_id: str
    prompt: Sequence[int]
    output: Sequence[int]
    arrival: float
    hashes: list[int] = field(default_factory=list)  # chained hashes of full blocks, prompt then generated
    handle: object = None  # the driver's own reference (a stream, a session)
    num_computed: int = 0
    num_output: int = 0
    blocks: BlockTable = field(default_factory=list)
    num_hashed: int = 0
    cached_tokens: int | None = None  # prefix hit at first admission, reported in usage
    ever_computed: int = 0  # highest position ever computed, to count recomputation after preemption
    first_scheduled: float | None = None
    first_token: float | None = None
    finished_at: float | None = None
    finish_reason: str | None = None
    preemptions: int = 0
    prompt_len: int = field(init=False, default=0)  # len(prompt), kept: a prompt may be a view that computes it
    seq: int = -1  # admission order (the running list's order); renewed on every admission
    cohort_tick: int = -1  # fast mode: the tick the counters are valid at while in the cohort, else -1
    cohort_epoch: int = 0  # fast mode: bumped on leaving the cohort, so its pending events go stale
    cohort_phase: int = -1  # fast mode: a member's place on the block wheel (Engine._wheel), else -1
    id_slot: int = -1  # slot mode: the slot the request named (llama.cpp's id_slot; -1 any), sim/slots.py
    # The hashes of the full blocks of prompt + output from block ``planned_from`` on, when the driver hashed them
    # ahead (virtual runs, in C): a generated block takes its hash from here as it fills instead of hashing its
    # tokens (the same value: the same tokens chained the same way).
    planned_hashes: list[int] | None = None
    planned_from: int = 0

    def __post_init__(self) -> None:
        self.prompt_len = len(self.prompt)

    @property
    def total_tokens(self) -> int:
        return self.prompt_len + self.num_output

    def token_at(self, pos: int) -> int:
        n = self.prompt_len
        return self.prompt[pos] if pos < n else self.output[pos - n]


@dataclass(slots=True)
class EngineStats:
    """Monotonic counters, read by /metrics and by in-process analysis."""

    steps: int = 0
    busy_seconds: float = 0.0
    prompt_tokens: int = 0  # prompt tokens of requests whose prefill completed (vLLM's prompt_tokens)
    generation_tokens: int = 0
    prefill_tokens_computed: int = 0  # every prefill token computed, recomputation included
    recomputed_tokens: int = 0  # prefill tokens recomputed after a preemption
    prefix_queries: int = 0  # tokens looked up in the prefix cache
    prefix_hits: int = 0  # tokens found there
    offload_hit_tokens: int = 0
    preemptions: int = 0
    finished: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class StepResult:
    duration: float
    end: float
    emitted: list[SimRequest]  # requests that produced one token this step, in batch order
    finished: list[SimRequest]
    preempted: list[SimRequest]
    batch: BatchShape


class ReadUnits:
    """``StepTimeModel.read_span(c) × num_layers`` as an integer: layer-tokens of KV one step reads.

    Mirrors ``read_span`` (full layers read min(c, sparse), sliding layers min(c, window)); a test pins the two
    together. ``slope(c)`` is ``units(c + 1) − units(c)``: it changes only where c reaches the window or the
    sparse-read limit, which fast mode schedules as events.
    """

    def __init__(self, model: ModelSpec) -> None:
        self.layers = model.num_layers
        self.full = model.num_full_layers
        self.sliding = model.num_sliding_layers
        self.window = model.sliding_window if self.sliding else None
        self.sparse = model.sparse_read_tokens
        self.units: Callable[[int], int] = self._general
        if self.window is None and self.sparse is None:
            self.units = self._dense

    def _dense(self, context: int) -> int:
        return self.layers * context

    def _general(self, context: int) -> int:
        full = context if self.sparse is None else min(context, self.sparse)
        local = 0 if self.window is None else min(context, self.window)
        return self.full * full + self.sliding * local

    def slope(self, context: int) -> int:
        s = self.full if self.sparse is None or context < self.sparse else 0
        if self.window is not None and context < self.window:
            s += self.sliding
        return s

    def breakpoints(self) -> list[tuple[int, int]]:
        """(context, slope lost there) for each context at which ``slope`` drops."""
        points = []
        if self.window is not None:
            points.append((self.window, self.sliding))
        if self.sparse is not None:
            points.append((self.sparse, self.full))
        return points


NULL_BLOCKS = 1  # of a vLLM-style pool, reserved (``Engine``)
_by_seq = attrgetter("seq")


class Engine:
    def __init__(self, profile: ServingProfile, *, fast: bool = False) -> None:
        self.profile = profile
        self.block_size = profile.block_size
        # Slot-based serving (llama.cpp, sim/slots.py): each slot caches its own last prompt; no shared prefix cache.
        self.slots = (
            SlotCache(profile.slots, profile.block_size, reuse=profile.enable_prefix_caching) if profile.slots else None
        )
        # vLLM's block pool takes its first block as the null block (a placeholder for skipped positions, never
        # holding KV): a pool of N blocks caches N − 1, and its kv_cache_usage_perc divides by N − 1 too. At a pool
        # sized to the agents (the real-vLLM tier's: 6 agents × 32 blocks = 192) that one block is the difference
        # between every session fitting and one losing its tail each turn. A slot server (llama.cpp) has none.
        if self.slots is None and profile.num_blocks <= NULL_BLOCKS:
            raise SimulationError(f"a {profile.num_blocks}-block pool holds nothing: vLLM keeps its first block empty")
        self.kv = KVCacheManager(
            profile.layout,
            profile.num_blocks - NULL_BLOCKS if self.slots is None else profile.num_blocks,
            prefix_caching=profile.enable_prefix_caching and self.slots is None,
            offload_blocks=profile.offload_blocks,
            remember_walks=fast,
        )
        self.step_model = profile.step_model
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.stats = EngineStats()
        self.fast = fast
        self._load_s_per_block = profile.layout.page_bytes * len(self.kv.full_groups) / profile.offload_load_bytes_per_s
        self._read = ReadUnits(profile.model)
        self._admitted = 0
        # Fast mode: running[:_members] is the cohort; _tick counts steps; _units_sum is Σ units(before) over the
        # members at the current tick and _slope_sum Σ slope(before); _events maps a tick to the members whose
        # last token is due then (with the epoch they were members in).
        self._members = 0
        self._tick = 0
        self._units_sum = 0
        self._slope_sum = 0
        self._events: dict[int, list[tuple[SimRequest, int]]] = {}
        # The block wheel: a member needs a new block at every tick t with t % block_size == its phase (its
        # computed tokens a multiple of block_size), and its newest block became full in the step before (tick
        # ≡ phase − 1). So _wheel[p] holds the members of phase p: those that allocate at ticks ≡ p and cache a
        # block at ticks ≡ p − 1. Members join in running order, which is admission order (``seq``), so each list
        # stays in the order the step-by-step scheduler serves them, with no sorting and no event per block.
        self._wheel: list[list[SimRequest]] = [[] for _ in range(self.block_size)]
        self._grow_each = self.kv.grow_one_each if self.kv.single_group else None
        self._slope_events: dict[int, list[tuple[SimRequest, int, int]]] = {}

    # -- intake --------------------------------------------------------------------------------------------
    def add(self, req: SimRequest) -> None:
        if not req.output:
            raise SimulationError(f"request {req.request_id} asks for no output tokens")
        req.blocks = self.kv.new_table()
        extend_block_hashes(req.hashes, req.prompt, self.block_size)
        self.waiting.append(req)

    def abort(self, req: SimRequest, reason: str = "abort") -> None:
        """Drop a request (client went away); its computed blocks stay cached. Not live any more: no-op."""
        if req.finished_at is not None:
            return
        if req.cohort_tick >= 0:
            self._leave(req)
            self.running.remove(req)
        elif req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        else:
            return
        self.kv.free(req.blocks)
        self._release_slot(req)
        req.finish_reason = reason
        self.stats.finished[reason] = self.stats.finished.get(reason, 0) + 1

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def sync(self) -> None:
        """Bring every request's counters up to date (fast mode defers them for steady decoders)."""
        for req in self.running[: self._members]:
            self._catch_up(req)

    # -- the cohort (fast mode) ----------------------------------------------------------------------------
    def _catch_up(self, req: SimRequest) -> int:
        """Apply the decode steps a member took since its counters were last written; returns num_computed."""
        behind = self._tick - req.cohort_tick
        if behind:
            req.num_computed += behind
            req.num_output += behind
            req.ever_computed = req.num_computed
            req.cohort_tick = self._tick
        return req.num_computed

    def _leave(self, req: SimRequest) -> None:
        """Take a member out of the cohort at the current tick (its counters written, its events stale)."""
        before = self._catch_up(req)
        self._units_sum -= self._read.units(before)
        self._slope_sum -= self._read.slope(before)
        req.cohort_tick = -1
        req.cohort_epoch += 1
        self._wheel[req.cohort_phase].remove(req)
        req.cohort_phase = -1
        self._members -= 1

    def _join(self, req: SimRequest) -> None:
        """Make a decoding request (the first non-member of the running list) a cohort member."""
        t, bs, c = self._tick, self.block_size, req.num_computed
        req.cohort_tick = t
        self._units_sum += self._read.units(c)
        self._slope_sum += self._read.slope(c)
        self._members += 1
        req.cohort_phase = (t - c) % bs  # a tick ≡ this starts with c % bs == 0: the step needs a new block
        self._wheel[req.cohort_phase].append(req)
        last = t + len(req.output) - req.num_output - 1
        due = self._events.get(last)
        if due is None:
            self._events[last] = [(req, req.cohort_epoch)]
        else:
            due.append((req, req.cohort_epoch))
        for point, lost in self._read.breakpoints():
            if c < point:
                self._slope_events.setdefault(t + point - c, []).append((req, req.cohort_epoch, lost))

    # -- the step ------------------------------------------------------------------------------------------
    def _preempt(self, victim: SimRequest) -> None:
        if victim.cohort_tick >= 0:
            self._leave(victim)
        self.kv.free(victim.blocks)
        self._release_slot(victim)
        victim.num_computed = 0
        victim.num_hashed = 0
        victim.preemptions += 1
        self.waiting.appendleft(victim)
        self.stats.preemptions += 1

    def step(self, now: float) -> StepResult:
        """Run one engine step that starts at ``now``."""
        budget = self.profile.max_num_batched_tokens
        scheduled: list[tuple[SimRequest, int]] = []  # requests outside the cohort, in batch order
        preempted: list[SimRequest] = []
        kv = self.kv
        running = self.running
        bs = self.block_size
        t = self._tick

        # Members whose last token is due this step (stale entries belong to members that have left).
        due = self._events.pop(t, None)
        finishing = [req for req, epoch in due if req.cohort_epoch == epoch] if due is not None else []

        # 1. Running requests. Members come first in the running list and each take one token; only those that
        # need a block (the wheel's, in running order) do anything.
        budget -= self._members
        stopped = False
        allocs = self._wheel[t % bs]
        if allocs and self._grow_each is not None and len(allocs) <= kv.num_free:
            self._grow_each([req.blocks[0] for req in allocs])  # one block each, in order: none can fail
        elif allocs:
            for req in list(allocs):  # (a preemption takes its victim off the wheel)
                if req.cohort_tick < 0:
                    continue  # preempted earlier in this step
                before = self._catch_up(req)
                while not kv.allocate(req.blocks, before + 1):
                    victim = running.pop()
                    if victim.cohort_tick >= 0:
                        budget += 1  # its token was counted above
                    self._preempt(victim)
                    preempted.append(victim)
                    if victim is req:
                        stopped = True
                        break
                if stopped:
                    break

        i = self._members
        while not stopped and i < len(running) and budget > 0:
            req = running[i]
            n = min(req.total_tokens - req.num_computed, budget)
            while not kv.allocate(req.blocks, req.num_computed + n):
                victim = running.pop()
                if victim.cohort_tick >= 0:
                    budget += 1
                self._preempt(victim)
                preempted.append(victim)
                if victim is req:
                    n = 0
                    break
            if n == 0:
                break
            scheduled.append((req, n))
            budget -= n
            i += 1

        # 2. Admissions, unless this step preempted.
        load_blocks = 0
        if not preempted:
            max_seqs = self.profile.max_num_seqs
            while self.waiting and budget > 0 and len(running) < max_seqs:
                pick = self.waiting[0] if self.slots is None else self._next_for_slot(self.slots)
                if pick is None:
                    break  # every waiting request named a busy slot: llama.cpp defers them until it frees
                req = pick
                total = req.total_tokens
                lookup: Lookup | None = None
                slot_hit: int | None = None
                start = req.num_computed
                if start == 0:
                    extend_block_hashes(req.hashes, _Tokens(req), bs, total)
                    if self.slots is None:
                        lookup = kv.lookup(req.hashes, (total - 1) // bs)
                        start = (lookup.num_hit_blocks + lookup.offload_blocks) * bs
                    else:
                        claimed = self.slots.claim(req, _Tokens(req), req.hashes, req.id_slot)
                        start = slot_hit = min(claimed, total - 1)
                n = min(total - start, budget)
                if not kv.allocate(req.blocks, start + n, lookup):
                    if self.slots is not None:
                        self.slots.cancel(req)
                    break
                if req is self.waiting[0]:
                    self.waiting.popleft()
                else:
                    self.waiting.remove(req)
                running.append(req)
                req.seq = self._admitted
                self._admitted += 1
                if lookup is not None:
                    hit = lookup.num_hit_blocks * bs
                    self.stats.prefix_queries += total
                    self.stats.prefix_hits += hit
                    if lookup.offload_blocks:
                        kv.note_offload_load(req.hashes, lookup.num_hit_blocks, lookup.offload_blocks)
                        load_blocks += lookup.offload_blocks
                        self.stats.offload_hit_tokens += lookup.offload_blocks * bs
                    req.num_hashed = lookup.num_hit_blocks
                elif slot_hit is not None:
                    self.stats.prefix_queries += total
                    self.stats.prefix_hits += slot_hit
                if lookup is not None or slot_hit is not None:
                    req.num_computed = start
                    if req.cached_tokens is None:
                        req.cached_tokens = start
                    if req.first_scheduled is None:
                        req.first_scheduled = now
                scheduled.append((req, n))
                budget -= n

        # Cost of the batch, from the one step-time model, in layer-token units (see the module docstring).
        members = self._members
        layers = self._read.layers
        units = self._read.units
        kv_units = self._units_sum + self._slope_sum  # Σ units(before + 1) over the members
        pair_units = 2 * self._units_sum + members * layers  # Σ n·(2·units(before) + n·layers), n = 1
        new_tokens = members
        for req, n in scheduled:
            before = req.num_computed
            new_tokens += n
            kv_units += units(before + n)
            pair_units += n * (2 * units(before) + n * layers)
        num_requests = members + len(scheduled)
        batch = BatchShape(num_requests, new_tokens, pair_units / (2 * layers), kv_units / layers)
        duration = self.step_model.step_time(batch) + load_blocks * self._load_s_per_block if num_requests else 0.0
        end = now + duration

        # Effects, as of the end of the step, in batch order: members (running order) then the rest.
        stats = self.stats
        emitted = running[:members]
        finished: list[SimRequest] = []
        self._register_due(t)
        if len(finishing) > 1:
            finishing.sort(key=_by_seq)
        finishing = [req for req in finishing if req.cohort_tick >= 0]
        for req in finishing:
            self._finish(req, end)  # its counters are written when it leaves the cohort, below
            finished.append(req)
        stats.generation_tokens += len(emitted)

        for req, n in scheduled:
            before = req.num_computed
            after = before + n
            req.num_computed = after
            if req.num_output == 0 or n > 1 or before < req.prompt_len:
                stats.prefill_tokens_computed += n
                if before < req.ever_computed:
                    stats.recomputed_tokens += min(after, req.ever_computed) - before
            req.ever_computed = max(req.ever_computed, after)
            full = after // bs
            if full > req.num_hashed:
                if len(req.hashes) < full:
                    extend_block_hashes(req.hashes, _Tokens(req), bs, after)
                kv.register(req.blocks, req.hashes, req.num_hashed, full)
                req.num_hashed = full
            if after == req.total_tokens:
                if req.num_output == 0:
                    stats.prompt_tokens += req.prompt_len
                    req.first_token = end
                req.num_output += 1
                stats.generation_tokens += 1
                emitted.append(req)
                if req.num_output >= len(req.output):
                    self._finish(req, end)
                    finished.append(req)

        # The tick advances: every member moved one token on; some reached a read-span breakpoint.
        self._units_sum += self._slope_sum
        self._tick = t + 1
        for req, epoch, lost in self._slope_events.pop(t + 1, ()):
            if req.cohort_epoch == epoch:
                self._slope_sum -= lost
        for req in finishing:
            self._leave(req)
        for req in finished:
            running.remove(req)
            kv.retire(req.blocks)  # its table goes to a new request: a finished request holds none
            req.blocks = []
            self._release_slot(req)
            reason = req.finish_reason or "length"
            stats.finished[reason] = stats.finished.get(reason, 0) + 1
        if self.fast:
            # Decoders right behind the cohort join it (the cohort stays a prefix of the running list, and
            # never outgrows the token budget, so every member gets its token every step).
            limit = min(len(running), self.profile.max_num_batched_tokens)
            while self._members < limit:
                req = running[self._members]
                if (
                    req.num_output == 0
                    or req.num_computed != req.total_tokens - 1
                    or req.ever_computed > req.num_computed
                ):
                    break
                self._join(req)
        if num_requests:
            stats.steps += 1
            stats.busy_seconds += duration
        return StepResult(duration, end, emitted, finished, preempted, batch)

    def steady(self) -> bool:
        """Fast mode: nothing waits and every running request is a cohort member (``decode_steps`` applies)."""
        return not self.waiting and 0 < self._members == len(self.running)

    def decode_steps(
        self,
        now: float,
        stop_at: float,
        before: float,
        after_step: Callable[[float, float], None],
        on_step: Callable[[StepResult], None] | None = None,
    ) -> tuple[int, float]:
        """Run steady decode steps back to back, as ``step`` would, while each starts at or before ``stop_at``
        and before ``before``; returns (steps run, when the last ended).

        A step in which a member finishes, or whose new blocks might not all fit (a preemption), is left to
        ``step``; so is everything once the engine is not ``steady``. ``after_step(start, duration)`` runs after
        each step, when the engine's state is that step's outcome, then ``on_step`` (if given) with the step's
        result. Only the cohort's running sums and the members with something due are touched, so a step costs
        O(events).
        """
        kv, bs = self.kv, self.block_size
        read, stats, events = self._read, self.stats, self._events
        layers, members = read.layers, self._members
        groups = len(self.profile.layout.groups)
        step_time = self.step_model.step_time
        wheel, grow_each = self._wheel, self._grow_each
        steps = 0
        while now <= stop_at and now < before and self.steady():
            t = self._tick
            due = events.get(t)
            if due is not None:
                if any(req.cohort_epoch == epoch for req, epoch in due):
                    break  # a member's last token: ``step`` finishes it
                del events[t]
            allocs = wheel[t % bs]
            if allocs:
                if len(allocs) * groups > kv.num_free:
                    break  # its new blocks might not all fit: ``step`` preempts
                if grow_each is not None:
                    grow_each([req.blocks[0] for req in allocs])
                else:
                    for req in allocs:
                        grew = kv.allocate(req.blocks, self._catch_up(req) + 1)
                        assert grew, "checked above: every member's new blocks fit"
            units_sum, slope_sum = self._units_sum, self._slope_sum
            batch = BatchShape(
                members, members, (2 * units_sum + members * layers) / (2 * layers), (units_sum + slope_sum) / layers
            )
            duration = step_time(batch)
            self._register_due(t)
            stats.generation_tokens += members
            stats.steps += 1
            stats.busy_seconds += duration
            self._units_sum = units_sum + slope_sum
            self._tick = t + 1
            for req, epoch, lost in self._slope_events.pop(t + 1, ()):
                if req.cohort_epoch == epoch:
                    self._slope_sum -= lost
            after_step(now, duration)
            if on_step is not None:
                on_step(StepResult(duration, now + duration, self.running[:members], [], [], batch))
            now += duration
            steps += 1
        return steps, now

    def _register_due(self, t: int) -> None:
        """The members whose newest block became full in the step at tick ``t``: hash and cache each, in order."""
        bs = self.block_size
        kv = self.kv
        # One block each, the usual case, cached together after the loop; a request with more to cache (the rare
        # generic walk) first has the ones before it cached, so the pool sees them all in the members' order.
        tables: list[BlockTable] = []
        ones: list[int] = []
        positions: list[int] = []
        for req in self._wheel[(t + 1) % bs]:
            after = req.num_computed + (t - req.cohort_tick) + 1  # as of this step (counters written lazily)
            full = after // bs
            hashes = req.hashes
            a, n = after - bs, req.prompt_len
            if a >= n and len(hashes) == full - 1:
                # The common case, without the generic walk: one block of generated tokens.
                planned = req.planned_hashes
                if planned is not None:
                    hashes.append(planned[full - 1 - req.planned_from])
                else:
                    hashes.append(chain_hash(hashes[-1] if hashes else ROOT_HASH, req.output[a - n : after - n]))
            else:
                self._catch_up(req)  # a view of prompt and reply reads the counters
                extend_block_hashes(hashes, _Tokens(req), bs, after)
            if full - req.num_hashed == 1:
                tables.append(req.blocks)
                ones.append(hashes[full - 1])
                positions.append(full - 1)
            else:
                kv.register_each(tables, ones, positions)
                tables, ones, positions = [], [], []
                kv.register(req.blocks, hashes, req.num_hashed, full)
            req.num_hashed = full
        kv.register_each(tables, ones, positions)

    def _next_for_slot(self, slots: SlotCache) -> SimRequest | None:
        """Slot mode: the first waiting request whose slot can take it; a pinned one whose slot is busy waits."""
        return next((r for r in self.waiting if slots.can_take(r.id_slot)), None)

    def _release_slot(self, req: SimRequest) -> None:
        """Slot mode: the request's slot keeps what it computed (prompt and reply so far) and is idle again."""
        if self.slots is not None:
            k, n = req.num_computed, req.prompt_len
            tokens = req.prompt[:k] if k <= n else [*req.prompt, *req.output[: k - n]]
            self.slots.release(req, tokens, req.hashes)

    def _finish(self, req: SimRequest, end: float) -> None:
        req.finished_at = end
        req.finish_reason = "length" if req.finish_reason is None else req.finish_reason


class _Tokens(Sequence[int]):
    """A read-only view of a request's prompt followed by its generated tokens, for hashing."""

    __slots__ = ("_req",)

    def __init__(self, req: SimRequest) -> None:
        self._req = req

    def __len__(self) -> int:
        return self._req.total_tokens

    def __getitem__(self, index):  # type: ignore[no-untyped-def]  # Sequence has overloads; one untyped body serves both
        req = self._req
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            n = req.prompt_len
            if step == 1:
                if stop <= n:
                    return req.prompt[start:stop]
                if start >= n:
                    return req.output[start - n : stop - n]
                return [*req.prompt[start:n], *req.output[: stop - n]]
            return [req.token_at(p) for p in range(start, stop, step)]
        return req.token_at(index)
