"""Closed-loop agent sessions against the engine in virtual time: the simulator without sockets.

Each session is one agent: it sends a turn, waits for the whole reply, "runs tools" for ``think_s``, then sends
the next turn, whose prompt repeats the conversation so far (prefix reuse) plus the reply and a tool result.
``growth="grow"`` lets the context grow turn by turn (restarting, like a compaction, when the next turn would
pass ``max_context``); ``growth="hold"`` keeps the context near a fixed size — a stable long prefix plus the last
exchange — which is how a sweep holds sessions "near 40k tokens" to find the KV knee.

Throughput is counted over a measurement window after a warm-up, so the burst of first prefills does not
dominate; the engine's counters are diffed across the window.

With ``fast=True`` (the default) the engine runs in fast mode (see ``sim.engine``) and the driver chains steps
without clock events while nothing else is due; ``fast=False`` is the plain event-by-event, request-by-request
path, kept to prove the fast one gives the very same results (tests/test_virtual.py).
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np
import numpy.typing as npt

from agentload.agent.shape import TURN_OVERHEAD_TOKENS, AgenticShape
from agentload.capacity.profile import ServingProfile
from agentload.clock import PRIORITY_ENGINE, VirtualClock
from agentload.errors import ConfigError, SimulationError
from agentload.sim import poolkernel
from agentload.sim.engine import Engine, EngineStats, SimRequest, StepResult
from agentload.sim.hashchain import HashChain
from agentload.sim.poolkernel import address
from agentload.sim.tokens import ROOT_HASH, VOCAB_SIZE, extend_block_hashes, extend_block_hashes_array

Tokens = npt.NDArray[np.int64]


@dataclass(frozen=True)
class SessionShape:
    """What one agent's conversation looks like, in tokens and seconds."""

    context: int = 40_000  # context the session holds (hold) or may reach (grow)
    system_tokens: int = 2_000  # shared by every session
    turn_input_tokens: int = 1_000  # tool result appended per turn
    output_tokens: int = 400
    think_s: float = 2.0
    growth: Literal["hold", "grow"] = "hold"
    start_context: int | None = None  # grow: first-turn prompt (default: a quarter of ``context``)

    @classmethod
    def from_agentic(cls, shape: AgenticShape) -> SessionShape:
        """The kernel's form of bench's agent shape: its opening, and its mean reply, tool result and pause.

        The kernel has no chat template, so the template's tokens between turns ride on the tool result, and a
        grow session starts at the shape's opening and ends where the agentic driver's would (the next turn's
        prompt and reply would pass the target). The kernel's turns are all of mean size — the spread of the
        sizes and pauses is not modelled — and a held session keeps its one conversation for the whole run
        (bench's held agents start a fresh one every ``shape.turns`` turns).
        """
        turn_input = round(shape.tool_result.mean) + TURN_OVERHEAD_TOKENS
        output = round(shape.output.mean)
        opening = shape.opening_tokens
        # A held kernel session's base is ``context`` less one turn's input and output: the shape's opening.
        context = shape.context if shape.growth == "grow" else opening + turn_input + output
        return cls(
            context=context,
            system_tokens=shape.system_tokens,
            turn_input_tokens=turn_input,
            output_tokens=output,
            think_s=shape.tool_latency_s.mean + shape.think_s.mean,
            growth=shape.growth,
            start_context=opening if shape.growth == "grow" else None,
        )

    def check(self, max_model_len: int) -> None:
        if self.context + self.output_tokens > max_model_len:
            raise ConfigError(
                f"context {self.context} + output {self.output_tokens} exceeds max_model_len {max_model_len}"
            )
        if self.system_tokens + self.turn_input_tokens + self.output_tokens >= self.context:
            raise ConfigError("context must exceed system prompt + one turn's input and output")


@dataclass(frozen=True)
class VirtualRunResult:
    """What a virtual-time run measured over its window."""

    sessions: int
    window_s: float
    output_tokens: int
    prefill_tokens: int
    recomputed_tokens: int
    prefix_queries: int
    prefix_hits: int
    preemptions: int
    turns_completed: int
    ttft_s: list[float] = field(repr=False)
    mean_kv_usage: float
    peak_kv_usage: float
    mean_running: float
    mean_waiting: float
    wall_events: int  # engine steps simulated
    end_s: float = 0.0  # virtual time the run stopped: ``duration_s``, or earlier once every session is done

    @property
    def output_tps(self) -> float:
        return self.output_tokens / self.window_s if self.window_s > 0 else 0.0

    @property
    def prefill_tps(self) -> float:
        return self.prefill_tokens / self.window_s if self.window_s > 0 else 0.0

    @property
    def prefix_hit_rate(self) -> float:
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0

    def ttft_percentile(self, q: float) -> float:
        return float(np.percentile(self.ttft_s, q)) if self.ttft_s else float("nan")


class _Prompt(Sequence[int]):
    """A turn's prompt without copying the conversation: the first ``n`` tokens of ``head`` then ``tail``.

    ``head`` is never changed below ``n`` (a growing conversation only appends; a held one's base is fixed), so
    earlier turns' prompts stay as they were. It is an int64 array, not a list: a list would keep every token of
    every conversation as a Python int (256 agents near 100k tokens is 25M objects, and allocating them cost more
    than the rest of a turn's work). Slices come back as lists of ints, the form the engine hashes.
    """

    __slots__ = ("_head", "_len", "_n", "_tail")

    def __init__(self, head: Tokens, n: int, tail: list[int] | None = None) -> None:
        self._head = head
        self._n = n
        self._tail = tail or []
        self._len = n + len(self._tail)

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, index):  # type: ignore[no-untyped-def]  # Sequence has overloads; one untyped body serves both
        n = self._n
        if isinstance(index, slice):
            start, stop, step = index.indices(self._len)
            if step == 1 and stop <= n:
                return self._head[start:stop].tolist()
            if step == 1 and start >= n:
                return self._tail[start - n : stop - n]
            if step == 1:
                return self._head[start:n].tolist() + self._tail[: stop - n]
            return [self[i] for i in range(start, stop, step)]
        if not -self._len <= index < self._len:
            raise IndexError(index)
        index %= self._len
        return int(self._head[index]) if index < n else self._tail[index - n]


class _Session:
    def __init__(
        self, index: int, shape: SessionShape, system: Sequence[int] | Tokens, system_hashes: list[int], bs: int
    ):
        self.index = index
        self.shape = shape
        self.rng = np.random.default_rng(1_000_003 * (index + 1))
        # The pool kernel, where it hashes as this Python does and draws as this numpy does (else None: Python's and
        # numpy's own ways, the same values).
        kernel = poolkernel.load()
        self._hasher = kernel if kernel is not None and kernel.hashes_like_python else None
        self._drawer = kernel if kernel is not None and kernel.draws_like_numpy else None
        self._source = (0, 0) if self._drawer is None else self._drawer.generator(self.rng)
        self.bs = bs
        self.system: Tokens = np.asarray(system, dtype=np.int64)
        self.system_hashes = system_hashes
        self.turn = 0
        self.restart()

    def fresh(self, n: int) -> list[int]:
        """``n`` random tokens as a list: what the model will say (the engine hashes its blocks as they fill).
        The draw is kept as an array too (``reply``): the next turn copies it into the conversation from there."""
        self.reply: Tokens = self._draw(n)
        tokens: list[int] = self.reply.tolist()
        return tokens

    def _draw(self, n: int) -> Tokens:
        """``n`` random tokens as an array (the same draws as ``fresh``): a tool result, an opening. Numpy's
        ``rng.integers(0, VOCAB_SIZE, n)``, in C where the kernel draws as numpy does (numpy's call costs more before
        its first draw than the draws of a turn's reply)."""
        if self._drawer is not None:
            return self._drawer.draw_below(self._source, VOCAB_SIZE, n)
        return self.rng.integers(0, VOCAB_SIZE, n)

    def _draw_into(self, start: int, n: int) -> None:
        """``_draw(n)`` written to ``tokens[start : start + n]``, in C straight into the conversation's buffer."""
        if start + n > len(self.tokens):
            raise SimulationError(f"a draw of {n} tokens at {start} would pass the conversation's buffer")
        if self._drawer is not None:
            self._drawer.al_draw_below(*self._source, VOCAB_SIZE, n, self._tokens_at + 8 * start)
        else:
            self.tokens[start : start + n] = self.rng.integers(0, VOCAB_SIZE, n)

    def _hash_from(self, hashes: list[int], tokens: Tokens, n: int) -> None:
        """Append to ``hashes`` the hashes of the full blocks of ``tokens[:n]`` it does not have yet."""
        covered = len(hashes) * self.bs
        if covered <= n - self.bs:
            # Only the new span is read (in C where the pool kernel is built, else as Python ints until hashed).
            extend_block_hashes_array(hashes, tokens[covered:n], self.bs, offset=covered)

    def reply_hashes(self, known: list[int]) -> list[int] | None:
        """The hashes of the blocks this turn's reply (``reply``, just drawn) will fill, from the prompt's partial
        last block on, given ``known``, the prompt's full blocks': hashed ahead in one C call from the conversation's
        buffer, for the engine to take as each block fills (the same values it would compute, block by block, from
        the same tokens). None for a held conversation, or where the pool kernel does not hash as this Python does."""
        kernel = self._hasher
        if self.shape.growth != "grow" or kernel is None:
            return None
        tail = np.concatenate((self.tokens[len(known) * self.bs : self.length], self.reply))
        out = np.empty(len(tail) // self.bs, dtype=np.int64)
        kernel.al_chain_hashes(address(tail), len(out), self.bs, known[-1] if known else ROOT_HASH, address(out))
        hashes: list[int] = out.tolist()
        return hashes

    def restart(self) -> None:
        """Start a new conversation (first turn, or after a compaction)."""
        s = self.shape
        if s.growth == "hold":
            base_len = s.context - s.turn_input_tokens - s.output_tokens
        else:
            base_len = s.start_context or max(s.context // 4, s.system_tokens + s.turn_input_tokens)
        self.base: Tokens = np.concatenate((self.system, self._draw(base_len - len(self.system))))
        self.base_hashes = list(self.system_hashes)
        self._hash_from(self.base_hashes, self.base, len(self.base))
        # The conversation so far is tokens[:length]. A growing one never passes ``context`` (it restarts first),
        # so its buffer is allocated once per conversation; a new conversation gets a new one, so a prompt
        # handed out earlier keeps its tokens.
        if s.growth == "grow":
            self.tokens: Tokens = np.empty(max(s.context, len(self.base)), dtype=np.int64)
            self.tokens[: len(self.base)] = self.base
        else:
            self.tokens = self.base
        self._tokens_at = address(self.tokens)  # where _draw_into writes
        self.length = len(self.base)
        # A growing conversation's one hash list for its whole life (see next_prompt): a HashChain, so the
        # prefix cache converts each hash to an array once, not once a turn.
        self.hashes: list[int] = HashChain(self.base_hashes) if s.growth == "grow" else list(self.base_hashes)

    def next_prompt(self, last_output: Sequence[int] | Tokens | None) -> tuple[Sequence[int], list[int]]:
        """The prompt for the next turn and the block hashes already known for it.

        A growing conversation hands the engine its own hash list, not a copy: the engine only appends to it, the
        hashes of the reply's blocks as they fill, which are the very hashes this session would compute for those
        positions next turn (the same tokens, chained the same way), and earlier entries never change. So the
        next turn's list extends the last one in place, and the prefix cache sees the same list object again: its
        remembered walk applies without comparing thousands of hashes, and no turn copies them.
        """
        s = self.shape
        if last_output is None:
            return _Prompt(self.tokens, self.length), self.hashes if s.growth == "grow" else list(self.hashes)
        if s.growth == "hold":
            tool = self._draw(s.turn_input_tokens)
            tail = (last_output.tolist() if isinstance(last_output, np.ndarray) else list(last_output)) + tool.tolist()
            hashes = list(self.base_hashes)
            # The blocks after the base, from the base's partial last block on, without joining the lists.
            covered = len(hashes) * self.bs
            extend_block_hashes(hashes, self.base[covered:].tolist() + tail, self.bs, offset=covered)
            return _Prompt(self.base, len(self.base), tail), hashes
        n, t = self.length, s.turn_input_tokens
        if n + len(last_output) + t + s.output_tokens > s.context:
            self._draw(t)  # the tool result, drawn (and dropped) before the compaction's opening, as ever
            self.restart()
        else:
            # In place: earlier turns' prompts are prefixes of this buffer and stay as they were.
            mid, end = n + len(last_output), n + len(last_output) + t
            self.tokens[n:mid] = last_output
            self._draw_into(mid, t)  # the tool result
            self.length = end
            self._hash_from(self.hashes, self.tokens, end)
        return _Prompt(self.tokens, self.length), self.hashes


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for the run (it is switched back on after, as it was).

    A run builds millions of block-hash tuples, each of which counts towards the collector's next pass, and
    every few passes the collector walks everything alive: the sessions' token lists alone hold tens of millions
    of entries (5 % of a 256-agent run went there). The run itself creates no reference cycles that need the
    collector (sessions, requests and block tables are trees), so nothing piles up while it is off.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def run_sessions(
    profile: ServingProfile,
    sessions: int,
    shape: SessionShape,
    *,
    duration_s: float = 600.0,
    warmup_s: float = 120.0,
    stagger_s: float = 1.0,
    on_step: Callable[[StepResult], None] | None = None,
    turns_per_session: int | None = None,
    fast: bool = True,
) -> VirtualRunResult:
    """Drive ``sessions`` closed-loop agents for ``duration_s`` of virtual time; measure after ``warmup_s``.

    With ``turns_per_session`` each agent stops after that many turns and the run ends when all have (or at
    ``duration_s``); the measurement window then ends there too.
    """
    if sessions <= 0:
        raise ConfigError("sessions must be positive")
    if turns_per_session is not None and turns_per_session <= 0:
        raise ConfigError("turns_per_session must be positive")
    if not 0 <= warmup_s < duration_s:
        raise ConfigError("warm-up must be shorter than the run")
    shape.check(profile.max_model_len)
    run = _Run(profile, shape, duration_s, warmup_s, on_step, turns_per_session, fast)
    agents = run.start(sessions, stagger_s)
    with _collector_paused():
        run.clock.run(until=duration_s)
    return run.result(agents)


class _Run:
    """One run of :func:`run_sessions`: its engine, clock and sums, and the three events that drive it.

    A turn is submitted (it reaches the engine after the API overhead), the engine steps (chaining steps while
    nothing else is due), and a step's finished replies are delivered (each agent thinks, then submits its next
    turn). The engine's pool and queues are held as attributes so the per-step accounting reads them directly.
    """

    def __init__(
        self,
        profile: ServingProfile,
        shape: SessionShape,
        duration_s: float,
        warmup_s: float,
        on_step: Callable[[StepResult], None] | None,
        turns_per_session: int | None,
        fast: bool,
    ) -> None:
        self.profile, self.shape = profile, shape
        self.duration_s, self.warmup_s = duration_s, warmup_s
        self.on_step, self.turns_per_session, self.fast = on_step, turns_per_session, fast
        self.engine = engine = Engine(profile, fast=fast)
        self.clock = VirtualClock()
        self.overhead = profile.coefficients.api_overhead_s
        self.kv, self.running, self.waiting = engine.kv, engine.running, engine.waiting
        self.stepping = False
        self.events = 0
        self.submitted = 0
        self.ttfts: list[float] = []
        self.turns = 0
        self.last_turn = 0.0
        self.snap: dict[str, EngineStats] = {}
        # Time-weighted kv usage, running and waiting, and the peak usage, over the measurement window.
        self.usage_time = self.running_time = self.waiting_time = self.peak_usage = 0.0

    def start(self, sessions: int, stagger_s: float) -> list[_Session]:
        """The agents, their first turns staggered over ``stagger_s``, and the warm-up's snapshot, scheduled."""
        bs = self.profile.block_size
        system = np.random.default_rng(42).integers(0, VOCAB_SIZE, self.shape.system_tokens)
        system_hashes = extend_block_hashes([], system.tolist(), bs)
        agents = [_Session(i, self.shape, system, system_hashes, bs) for i in range(sessions)]
        for i, agent in enumerate(agents):
            self.clock.call_at(stagger_s * i / max(1, sessions), lambda a=agent: self.submit(a, None))  # type: ignore[misc]
        self.clock.call_at(self.warmup_s, lambda: self.take_snapshot("start"), PRIORITY_ENGINE)
        return agents

    def submit(self, agent: _Session, last_output: Tokens | None) -> None:
        prompt, known = agent.next_prompt(last_output)
        out = agent.fresh(self.shape.output_tokens)
        self.submitted += 1
        clock = self.clock
        req = SimRequest(f"s{agent.index}-{self.submitted}", prompt, out, clock.now(), hashes=known, handle=agent)
        req.planned_hashes, req.planned_from = agent.reply_hashes(known), len(known)
        req.finish_reason = "stop"

        def arrive() -> None:
            self.engine.add(req)
            self.kick()

        clock.call_later(self.overhead, arrive)

    def kick(self) -> None:
        if not self.stepping and self.engine.has_work():
            self.stepping = True
            self.clock.call_at(self.clock.now(), self.do_step, PRIORITY_ENGINE)

    def account(self, start: float, duration: float) -> None:
        """Time-weighted occupancy, after a step that started at ``start`` (it runs after every step: the
        engine's lists and pool are read directly rather than through its properties)."""
        if start >= self.warmup_s:
            usage = self.kv.usage
            self.usage_time += usage * duration
            self.running_time += len(self.running) * duration
            self.waiting_time += len(self.waiting) * duration
            if usage > self.peak_usage:
                self.peak_usage = usage

    def do_step(self) -> None:
        engine, clock, on_step, duration_s = self.engine, self.clock, self.on_step, self.duration_s
        now = clock.now()
        while True:
            res = engine.step(now)
            self.events += 1
            if res.batch.num_requests == 0:
                if not engine.running:
                    raise SimulationError("the head of the waiting queue can never be admitted (pool too small)")
                raise SimulationError("an engine step scheduled nothing while requests were running")
            self.account(now, res.duration)
            if on_step is not None:
                on_step(res)
            # Fast path: when nothing else is due by the end of this step and no agent has a reply to act on,
            # the next step follows at once — what the deliver and do_step events would have done, without
            # them. Only a later event may be pending; one due at the very instant falls back to the queue.
            end = res.end
            if not self.fast or res.finished or not engine.has_work() or end > duration_s:
                break
            due = clock.next_time()
            if due is not None and due <= end:
                break
            now = end
            if engine.steady():
                # Steady decoding: the engine runs the steps itself until something is due.
                horizon = math.inf if due is None else due
                steps, now = engine.decode_steps(now, duration_s, horizon, self.account, on_step)
                self.events += steps
                if now > duration_s or (due is not None and due <= now):
                    clock.call_at(now, lambda: self.deliver([]), PRIORITY_ENGINE)
                    return
        clock.call_at(res.end, lambda: self.deliver(res.finished), PRIORITY_ENGINE)

    def deliver(self, finished: list[SimRequest]) -> None:
        now = self.clock.now()
        if finished:
            self.last_turn = now
        for req in finished:
            agent = req.handle
            assert isinstance(agent, _Session)
            if now >= self.warmup_s:
                self.turns += 1
                assert req.first_token is not None
                self.ttfts.append(req.first_token - req.arrival)
            agent.turn += 1
            if self.turns_per_session is not None and agent.turn >= self.turns_per_session:
                continue
            # The reply as drawn (an array: copied into the conversation without a conversion); a virtual request
            # always says all of it.
            out = agent.reply
            assert req.num_output == len(out)
            self.clock.call_later(self.shape.think_s, lambda a=agent, o=out: self.submit(a, o))  # type: ignore[misc]
        self.stepping = False
        self.kick()

    def take_snapshot(self, key: str) -> None:
        self.snap[key] = replace(self.engine.stats, finished=dict(self.engine.stats.finished))

    def result(self, agents: list[_Session]) -> VirtualRunResult:
        """The engine's counters diffed across the measurement window, and the sums over it."""
        end = min(self.clock.now(), self.duration_s)
        if self.turns_per_session is not None and all(s.turn >= self.turns_per_session for s in agents):
            end = self.last_turn
        self.take_snapshot("end")
        a, b = self.snap.get("start", self.snap["end"]), self.snap["end"]
        window = max(0.0, end - self.warmup_s)
        span = window or 1.0  # a run that ended before its warm-up measured nothing: its sums are zero too
        return VirtualRunResult(
            sessions=len(agents),
            window_s=window,
            output_tokens=b.generation_tokens - a.generation_tokens,
            prefill_tokens=b.prefill_tokens_computed - a.prefill_tokens_computed,
            recomputed_tokens=b.recomputed_tokens - a.recomputed_tokens,
            prefix_queries=b.prefix_queries - a.prefix_queries,
            prefix_hits=b.prefix_hits - a.prefix_hits,
            preemptions=b.preemptions - a.preemptions,
            turns_completed=self.turns,
            ttft_s=self.ttfts,
            mean_kv_usage=self.usage_time / span,
            peak_kv_usage=self.peak_usage,
            mean_running=self.running_time / span,
            mean_waiting=self.waiting_time / span,
            wall_events=self.events,
            end_s=end,
        )
