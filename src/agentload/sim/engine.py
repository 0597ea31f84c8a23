"""The simulated engine: vLLM V1's scheduler step over a paged KV cache (domain.md §3).

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
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from agentload.capacity.profile import ServingProfile
from agentload.capacity.steptime import BatchShape
from agentload.errors import SimulationError
from agentload.sim.kvcache import KVCacheManager, Lookup
from agentload.sim.tokens import extend_block_hashes


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
    blocks: list[list[int]] = field(default_factory=list)
    num_hashed: int = 0
    cached_tokens: int | None = None  # prefix hit at first admission, reported in usage
    ever_computed: int = 0  # highest position ever computed, to count recomputation after preemption
    first_scheduled: float | None = None
    first_token: float | None = None
    finished_at: float | None = None
    finish_reason: str | None = None
    preemptions: int = 0

    @property
    def prompt_len(self) -> int:
        return len(self.prompt)

    @property
    def total_tokens(self) -> int:
        return len(self.prompt) + self.num_output

    def token_at(self, pos: int) -> int:
        n = len(self.prompt)
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


class Engine:
    def __init__(self, profile: ServingProfile) -> None:
        self.profile = profile
        self.block_size = profile.block_size
        self.kv = KVCacheManager(
            profile.layout,
            profile.num_blocks,
            prefix_caching=profile.enable_prefix_caching,
            offload_blocks=profile.offload_blocks,
        )
        self.step_model = profile.step_model
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.stats = EngineStats()
        self._num_groups = profile.layout.num_groups
        self._load_s_per_block = profile.layout.page_bytes * len(self.kv.full_groups) / profile.offload_load_bytes_per_s

    # -- intake --------------------------------------------------------------------------------------------
    def add(self, req: SimRequest) -> None:
        if not req.output:
            raise SimulationError(f"request {req.request_id} asks for no output tokens")
        req.blocks = [[] for _ in range(self._num_groups)]
        extend_block_hashes(req.hashes, req.prompt, self.block_size)
        self.waiting.append(req)

    def abort(self, req: SimRequest, reason: str = "abort") -> None:
        """Drop a request (client went away); its computed blocks stay cached."""
        if req.finished_at is not None:
            return
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.kv.free(req.blocks)
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

    # -- the step ------------------------------------------------------------------------------------------
    def _preempt(self, victim: SimRequest) -> None:
        self.kv.free(victim.blocks)
        victim.num_computed = 0
        victim.num_hashed = 0
        victim.preemptions += 1
        self.waiting.appendleft(victim)
        self.stats.preemptions += 1

    def step(self, now: float) -> StepResult:
        """Run one engine step that starts at ``now``."""
        budget = self.profile.max_num_batched_tokens
        scheduled: list[tuple[SimRequest, int]] = []
        preempted: list[SimRequest] = []
        kv = self.kv
        running = self.running

        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            n = min(req.total_tokens - req.num_computed, budget)
            while not kv.allocate(req.blocks, req.num_computed + n):
                victim = running.pop()
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

        load_blocks = 0
        if not preempted:
            max_seqs = self.profile.max_num_seqs
            while self.waiting and budget > 0 and len(running) < max_seqs:
                req = self.waiting[0]
                total = req.total_tokens
                lookup: Lookup | None = None
                start = req.num_computed
                if start == 0:
                    extend_block_hashes(req.hashes, _Tokens(req), self.block_size, total)
                    lookup = kv.lookup(req.hashes, (total - 1) // self.block_size)
                    start = (lookup.num_hit_blocks + lookup.offload_blocks) * self.block_size
                n = min(total - start, budget)
                if not kv.allocate(req.blocks, start + n, lookup):
                    break
                self.waiting.popleft()
                running.append(req)
                if lookup is not None:
                    hit = lookup.num_hit_blocks * self.block_size
                    self.stats.prefix_queries += total
                    self.stats.prefix_hits += hit
                    if lookup.offload_blocks:
                        kv.note_offload_load(req.hashes, lookup.num_hit_blocks, lookup.offload_blocks)
                        load_blocks += lookup.offload_blocks
                        self.stats.offload_hit_tokens += lookup.offload_blocks * self.block_size
                    req.num_hashed = lookup.num_hit_blocks
                    req.num_computed = start
                    if req.cached_tokens is None:
                        req.cached_tokens = start
                    if req.first_scheduled is None:
                        req.first_scheduled = now
                scheduled.append((req, n))
                budget -= n

        # Cost of the batch, from the one step-time model.
        sm = self.step_model
        new_tokens = 0
        pairs = 0.0
        kv_read = 0.0
        for req, n in scheduled:
            before = req.num_computed
            new_tokens += n
            if n == 1:
                kv_read += sm.read_span(before + 1)
                pairs += sm.read_span(before) + 0.5
            else:
                span = sm.read_span(before)
                pairs += n * (span + n / 2.0)
                kv_read += sm.read_span(before + n)
        batch = BatchShape(len(scheduled), new_tokens, pairs, kv_read)
        duration = sm.step_time(batch) + load_blocks * self._load_s_per_block if scheduled else 0.0
        end = now + duration

        # Effects, as of the end of the step.
        emitted: list[SimRequest] = []
        finished: list[SimRequest] = []
        stats = self.stats
        bs = self.block_size
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
                    req.finished_at = end
                    req.finish_reason = "length" if req.finish_reason is None else req.finish_reason
                    finished.append(req)
        if finished:
            done = set(map(id, finished))
            self.running = [r for r in running if id(r) not in done]
            for req in finished:
                kv.free(req.blocks)
                reason = req.finish_reason or "length"
                stats.finished[reason] = stats.finished.get(reason, 0) + 1
        if scheduled:
            stats.steps += 1
            stats.busy_seconds += duration
        return StepResult(duration, end, emitted, finished, preempted, batch)


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
            n = len(req.prompt)
            if stop <= n and step == 1:
                return req.prompt[start:stop]
            return [req.token_at(p) for p in range(start, stop, step)]
        return req.token_at(index)
