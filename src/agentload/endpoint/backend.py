"""What a turn goes through between the agent loop and the chat client: the connection's ``ChatBackend``s.

* ``SingleAttemptBackend`` — each turn is one request, whatever happens to it (one-shot measurements);
* ``RetryingBackend`` — resends a turn that failed for a passing reason (below); the connection's default;
* ``RecordingBackend`` — over either, for a load that keeps its records (a bench level): the level's fields added to
  every body (``endpoint.output.EngineFields``: exact output lengths, slot pins), the turn admitted through the
  level's ``QuiesceGate`` (its quiet window edges), and every attempt kept and handed to the level's record log.

They are one module because they are one path: every turn of every command enters the connection here and leaves
it here with its records, and none of them calls back into the loop or the profile that sent it
(``benchmarks/turn_modules.py``).

**Retries.** A turn is resent with the very same body, so the conversation cannot gain or lose a message: the agent loop
appends the assistant reply and tool results only after ``complete`` returns, from the final record. Every attempt
is returned (``RequestIds.attempt`` counts from 0), because failed attempts are measurements too; a turn cancelled
on the way raises ``TurnCancelled``, which carries the attempts that had ended.

Which failures are worth a resend is ``RequestRecord.transient``: connect errors, stalls (timeouts), resets,
malformed streams, HTTP 429/500/502/503/504. The wait before the next attempt:

* a ``Retry-After`` from the server is honoured — never resent earlier, plus up to 10% so that 256 agents told the
  same number do not return in the same millisecond; one longer than ``max_retry_after_s`` (a quota that resets
  in an hour) ends the turn instead;
* otherwise exponential backoff with "equal jitter" (AWS Architecture Blog, *Exponential Backoff and Jitter*):
  half of ``min(max_backoff_s, base_backoff_s × 2^attempt)`` fixed plus a random share of the other half, so
  retries spread out but never come back at once.

A server that is gone is not retried into: when the stall policy can tell (``Watchdog.server_dead()``: no answer
to its signal poller for ``dead_after_s``), the turn ends. And a server that restarts is ridden out: refused
connections are resent past ``max_attempts`` (whose backoff is 0.5 + 1 + 2 + 4 = 7.5 s at most with the defaults,
shorter than the rule's 20 s) until the server answers again, or the rule says it is gone, or ``max_ride_out_s``
runs out. Without a rule, refused connections end after ``max_attempts``.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from agentload.clock import Clock, RealClock
from agentload.endpoint.client import ChatClient, StallPolicy
from agentload.endpoint.records import Outcome, RequestIds, RequestRecord
from agentload.endpoint.watchdog import estimate_prompt_tokens


class ChatSender(Protocol):
    """What the retry layer needs of a client (``ChatClient``)."""

    policy: StallPolicy

    async def chat(
        self,
        body: Mapping[str, Any],
        *,
        ids: RequestIds | None = ...,
        policy: StallPolicy | None = ...,
        prompt_tokens_hint: int = ...,
    ) -> RequestRecord: ...


@runtime_checkable
class ServerHealth(Protocol):
    """A stall policy that can tell when the server is gone (``Watchdog``)."""

    def server_dead(self) -> bool: ...


class TurnCancelled(asyncio.CancelledError):
    """The cancel of a turn the retry layer was on, carrying the attempts that had ended by then.

    A turn can be cancelled between attempts (in a backoff) or during one (a run that stops, an agent restarted):
    its earlier attempts are measurements all the same, and a caller that keeps a cancelled turn's attempts (the
    fleet logs them as an interrupt) reads them from here. The cancel's own arguments are kept, so whoever told a
    cancel of theirs from another's by its message still can. The attempt in flight has no record: the client
    compiles one only when the response is over, and a cancel that lands before then finds nothing to keep.
    """

    def __init__(self, attempts: list[RequestRecord], *args: object) -> None:
        super().__init__(*args)
        self.attempts = attempts


@dataclass
class RetryStatistics:
    turns: int = 0
    attempts: int = 0
    retried: dict[str, int] = field(default_factory=dict)  # by failure (error kind or HTTP status)
    slept_s: float = 0.0
    gave_up: dict[str, int] = field(default_factory=dict)  # turns that ended failed, by why


def _failure(record: RequestRecord) -> str:
    if record.http_status is not None and record.http_status != 200:
        return f"http_{record.http_status}"
    return record.error.value if record.error is not None else record.outcome.value


# How often a retry's backoff asks the dead-server rule (the run's liveness check asks each second too).
DEAD_CHECK_S = 1.0


class RetryingBackend:
    """A ``ChatBackend`` that resends the same turn on transient failures; see the module docstring."""

    def __init__(
        self,
        client: ChatSender,
        *,
        policy: StallPolicy | None = None,
        max_attempts: int = 5,
        base_backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        clock: Clock | None = None,
        max_retry_after_s: float = 120.0,
        rng: random.Random | None = None,
        max_ride_out_s: float = 120.0,
    ) -> None:
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if base_backoff_s < 0 or max_backoff_s < base_backoff_s:
            raise ValueError("need 0 <= base_backoff_s <= max_backoff_s")
        self.client = client
        self.policy = policy
        self.max_attempts = max_attempts
        self.base_backoff_s = base_backoff_s
        self.max_backoff_s = max_backoff_s
        self.max_retry_after_s = max_retry_after_s
        self.max_ride_out_s = max_ride_out_s
        self.clock: Clock = clock or RealClock()
        self._rng = rng or random.Random()
        self.stats = RetryStatistics()

    def _health(self) -> ServerHealth | None:
        policy = self.policy or self.client.policy
        return policy if isinstance(policy, ServerHealth) else None

    def server_dead(self) -> bool | None:
        """The stall policy's dead-server rule, asked now (``ServerHealth``); None where the policy has none."""
        health = self._health()
        return None if health is None else health.server_dead()

    def delay(self, attempt: int, record: RequestRecord) -> float | None:
        """Seconds to wait after failed attempt ``attempt`` (0-based), or None to stop retrying."""
        if record.retry_after_s is not None:
            if record.retry_after_s > self.max_retry_after_s:
                return None
            return record.retry_after_s * (1.0 + self._rng.uniform(0.0, 0.1))
        ceiling = min(self.max_backoff_s, self.base_backoff_s * 2.0**attempt)
        return ceiling / 2 + self._rng.uniform(0.0, ceiling / 2)

    def _ride_out(self, refused_since: float | None, health: ServerHealth | None) -> bool:
        """Past the attempts, go on resending a turn whose connections are refused while the server is not known to
        be gone: a restarting server refuses for seconds, and the attempts' backoff (7.5 s with the defaults) would
        fail the turn before the dead-server rule (20 s) can tell a restart from a death. Bounded by
        ``max_ride_out_s``, for a health rule that never says dead."""
        if refused_since is None or health is None or health.server_dead():
            return False
        return self.clock.now() - refused_since < self.max_ride_out_s

    async def _wait_alive(self, wait: float, health: ServerHealth | None) -> bool:
        """Sleep ``wait`` before the next attempt; False, cutting it short, once the dead-server rule says the
        server is gone. Asked every ``DEAD_CHECK_S``, not only at the end: a backoff of 8–16 s would otherwise sleep
        through the moment the rule fires and, when the server is back by then, ride out an outage the rule calls a
        death — whether a command stopped would depend on the backoff's random draw."""
        end = self.clock.now() + wait
        while True:
            left = end - self.clock.now()
            if left > 0:
                step = left if health is None else min(left, DEAD_CHECK_S)
                self.stats.slept_s += step
                await self.clock.sleep(step)
            if health is not None and health.server_dead():
                return False
            if self.clock.now() >= end:
                return True

    async def complete(self, body: Mapping[str, Any], ids: RequestIds) -> list[RequestRecord]:
        records: list[RequestRecord] = []
        hint = estimate_prompt_tokens(body)
        health = self._health()
        stats = self.stats
        stats.turns += 1
        why = ""
        refused_since: float | None = None  # when this turn's run of refused connections began
        attempt = -1
        try:
            while True:
                attempt += 1
                record = await self.client.chat(
                    body, ids=ids.model_copy(update={"attempt": attempt}), policy=self.policy, prompt_tokens_hint=hint
                )
                # Kept before the next await: a cancel from here on finds this attempt among the ones it carries.
                records.append(record)
                stats.attempts += 1
                if record.ok:
                    return records
                if not record.transient:
                    why = "not_transient"
                    break
                if record.outcome is not Outcome.CONNECT_ERROR:
                    refused_since = None
                elif refused_since is None:  # not ``or``: a virtual clock's first refusal may come at 0.0
                    refused_since = self.clock.now()
                if attempt + 1 >= self.max_attempts and not self._ride_out(refused_since, health):
                    why = "max_attempts"
                    break
                if health is not None and health.server_dead():
                    why = "server_dead"
                    break
                wait = self.delay(attempt, record)
                if wait is None:
                    why = "retry_after_too_long"
                    break
                failure = _failure(record)
                stats.retried[failure] = stats.retried.get(failure, 0) + 1
                if not await self._wait_alive(wait, health):
                    why = "server_dead"
                    break
        except asyncio.CancelledError as cancel:
            raise TurnCancelled(list(records), *cancel.args) from cancel
        stats.gave_up[why] = stats.gave_up.get(why, 0) + 1
        return records


class SingleAttemptBackend:
    """Each turn is one request, whatever happens to it."""

    def __init__(self, client: ChatClient) -> None:
        self.client = client

    async def complete(self, body: Mapping[str, Any], ids: RequestIds) -> list[RequestRecord]:
        return [await self.client.chat(body, ids=ids)]


# -- a load's recording layer ------------------------------------------------------------------------------------
class TurnSender(Protocol):
    """What the recording layer sends through (``RetryingBackend``, ``SingleAttemptBackend``, a test's fake)."""

    async def complete(self, body: Mapping[str, Any], ids: RequestIds) -> list[RequestRecord]: ...


RecordSink = Callable[[RequestRecord], None]
# What a load adds to every body before it is sent (``endpoint.output.EngineFields.add`` fits).
BodyFields = Callable[[Mapping[str, Any], RequestIds], Mapping[str, Any]]


@dataclass
class QuiesceGate:
    """Quiet window edges: both prefix-hit rates of a level cover the same requests.

    vLLM counts a prompt in ``prefix_cache_queries`` / ``_hits`` when it is *scheduled*; usage arrives when the
    request *finishes* (docs/background.md §3). A window whose edges cut through requests in flight gives the server's
    counter delta and the usage sums different sets of requests, and past the knee — where a turn waits seconds for
    its prefill — they drift apart by several points. So at each edge the level closes this gate: new requests wait,
    the ones in flight finish, the counters are sampled with nothing in flight, and the gate opens again. Then every
    request of the window is wholly inside it, on both sides of the comparison.

    Waiting requests are released with the spacing they arrived with (each one waits the drain's length and no
    more), so the agents come back in their own phases rather than as one synchronised burst.
    """

    clock: Clock
    in_flight: int = 0
    _closed_at: float | None = None
    _opened: asyncio.Event = field(default_factory=asyncio.Event)
    _idle: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self._opened.set()
        self._idle.set()

    async def enter(self) -> None:
        """Before a request is sent: wait while the gate is closed, then count it in flight."""
        if self._closed_at is not None:
            arrived = self.clock.now()
            closed_at = self._closed_at
            await self._opened.wait()
            # Keep this request's offset from the moment the gate closed, shifted by the drain.
            if arrived > closed_at:
                await self.clock.sleep(arrived - closed_at)
        self.in_flight += 1
        self._idle.clear()

    def leave(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()

    def close(self) -> None:
        self._closed_at = self.clock.now()
        self._opened.clear()

    def open(self) -> None:
        self._closed_at = None
        self._opened.set()

    async def drained(self, timeout_s: float) -> bool:
        """Wait until nothing is in flight (True), or ``timeout_s`` (False: the edge is not quiet)."""
        if self.in_flight == 0:
            return True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True


class RecordingBackend:
    """Passes a load's turns to the inner backend — the load's ``fields`` added, through its ``gate`` — and keeps
    every attempt's record (``records``, and the ``sink`` as each turn comes back)."""

    def __init__(
        self,
        inner: TurnSender,
        records: list[RequestRecord],
        sink: RecordSink | None = None,
        *,
        gate: QuiesceGate | None = None,
        fields: BodyFields | None = None,
    ) -> None:
        self.inner = inner
        self.records = records
        self.sink = sink
        self.gate = gate
        self.fields = fields

    async def complete(self, body: Mapping[str, Any], ids: RequestIds) -> list[RequestRecord]:
        if self.fields is not None:
            body = self.fields(body, ids)
        if self.gate is not None:
            await self.gate.enter()
        try:
            attempts = await self.inner.complete(body, ids)
        except TurnCancelled as cancel:
            # The load stopped mid-turn (a lost server, the runner's end): the attempts that had ended are kept.
            self._keep(cancel.attempts)
            raise
        finally:
            if self.gate is not None:
                self.gate.leave()
        self._keep(attempts)
        return attempts

    def _keep(self, attempts: list[RequestRecord]) -> None:
        self.records.extend(attempts)
        if self.sink is not None:
            for r in attempts:
                self.sink(r)
