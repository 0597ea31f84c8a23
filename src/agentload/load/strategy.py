"""How many drivers run at once: the strategies the one runner (``load.runner``) starts its drivers through.

A strategy sees every driver before any starts (``prepare``), says when each may start (``admit``) and takes
back what admitted it when its run ends (``leave``, however it ended; ``finished``, after a run that returned),
and may keep a loop of its own while the load runs (``background``). The runner runs the driver itself, between
``admit`` and ``leave``: a turn's stack holds the runner, never the strategy, which is done before the first turn.
Which loads to run is the profile's business, when each driver starts is the strategy's, and
running them is the runner's (after guidellm's ``benchmark/profiles/profile.py`` and ``scheduler/strategies.py``;
docs/background.md §10).

* ``AllAtOnce`` — every driver at once, a level's fixed count; optionally staggered over ``stagger_s`` so a bench
  level's agents do not move in lockstep.
* ``Gated`` — a gate admits drivers up to a width that something else moves (the fleet's ``Limiter``: its
  ``AgentGate`` with priorities, its policy ticked by ``control`` every ``interval_s``); a driver starts once every
  group it depends on is finished (``depends_on``: the fleet's tasks, which make its waves).

The gate and the drivers are declared here as protocols (the consumer owns the interface, as in guidellm's
``scheduler/schemas/backend.py``): the fleet's ``AgentGate`` fits ``Gate``; its agent drivers fit ``GatedDriver``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, Protocol

from agentload.clock import Clock, LoopClock
from agentload.errors import ConfigError


class Strategy(Protocol):
    def prepare(self, drivers: Sequence[Any]) -> None:
        """See every driver before the first one starts."""
        ...

    async def admit(self, index: int, driver: Any) -> bool:
        """Wait until the driver may start; False when it finishes without running (nothing to give back)."""
        ...

    def leave(self, index: int, driver: Any) -> None:
        """Give back whatever admitted the driver: its run ended, however it ended."""
        ...

    async def finished(self, index: int, driver: Any) -> None:
        """The driver's run returned (after ``leave``; not called when it raised or was cancelled)."""
        ...

    def background(self) -> Coroutine[Any, Any, None] | None:
        """A loop of the strategy's own, run (and cancelled) alongside the drivers; None when it needs none."""
        ...


class AllAtOnce:
    """Every driver at once; with ``stagger_s``, driver i of n starts ``i × stagger_s / n`` seconds in.

    ``positions`` / ``of``: these drivers are a share of a larger load (one Ray actor's, ``bench.distributed``):
    driver i is number ``positions[i]`` of ``of`` and starts when it would have in the whole load.
    """

    def __init__(
        self,
        *,
        stagger_s: float = 0.0,
        clock: Clock | None = None,
        positions: Sequence[int] | None = None,
        of: int | None = None,
    ) -> None:
        if stagger_s < 0:
            raise ConfigError(f"a stagger cannot be negative, got {stagger_s:g} s")
        self.stagger_s = stagger_s
        self.clock: Clock = clock or LoopClock()
        self._positions = positions
        self._of = of
        self._count = 0

    def prepare(self, drivers: Sequence[Any]) -> None:
        self._count = len(drivers) if self._of is None else self._of

    async def admit(self, index: int, driver: Any) -> bool:
        if self.stagger_s > 0:
            at = index if self._positions is None else self._positions[index]
            await self.clock.sleep(at * self.stagger_s / max(1, self._count))
        return True

    def leave(self, index: int, driver: Any) -> None:
        return None

    async def finished(self, index: int, driver: Any) -> None:
        return None

    def background(self) -> Coroutine[Any, Any, None] | None:
        return None


class Gate(Protocol):
    """Admits keys up to a width; lower priority tuples first (``fleet.limiter.AgentGate`` fits)."""

    async def enter(self, agent: str, priority: tuple[int, ...]) -> None: ...

    def leave(self, agent: str) -> None: ...


class GatedDriver(Protocol):
    """A driver as ``Gated`` runs it: a member of a group, waiting for others, announcing where it is.

    The hooks sit where a checkpointed run needs them: ``announce`` before the dependencies are waited for,
    ``ready`` once they are finished (False: the driver finished without running, e.g. skipped), ``priority`` at
    the gate, ``done`` after the slot is given back (so recording an outcome never holds a slot). A ``settled``
    driver finished in an earlier run: its group counts it done from the start, and it only announces itself.
    """

    agent_id: str

    @property
    def group(self) -> str: ...

    @property
    def depends_on(self) -> Sequence[str]: ...

    @property
    def settled(self) -> bool: ...

    def announce(self) -> None: ...

    async def ready(self) -> bool: ...

    def priority(self) -> tuple[int, ...]: ...

    async def done(self) -> None: ...


class Gated:
    """A gate that ``control`` moves every ``interval_s``; a driver starts once its groups are done and it is let in."""

    def __init__(
        self,
        gate: Gate,
        *,
        clock: Clock,
        control: Callable[[], Awaitable[None]] | None = None,
        interval_s: float = 1.0,
    ) -> None:
        if control is not None and interval_s <= 0:
            raise ConfigError(f"a control interval must be positive, got {interval_s:g} s")
        self.gate = gate
        self.clock = clock
        self.control = control
        self.interval_s = interval_s
        self._done: dict[str, asyncio.Event] = {}
        self._remaining: dict[str, int] = {}

    def prepare(self, drivers: Sequence[Any]) -> None:
        self._remaining = {}
        for d in drivers:
            self._remaining[d.group] = self._remaining.get(d.group, 0) + 1
        self._done = {g: asyncio.Event() for g in self._remaining}
        for d in drivers:
            missing = [g for g in d.depends_on if g not in self._done]
            if missing:
                raise ConfigError(f"{d.agent_id} depends on {', '.join(missing)}, which no driver belongs to")
        # Settled before anything starts, so no driver ever waits on a group that finished in an earlier run.
        for d in drivers:
            if d.settled:
                self._finished(d)

    def group_done(self, group: str) -> bool:
        return self._done[group].is_set()

    def _finished(self, driver: GatedDriver) -> None:
        self._remaining[driver.group] -= 1
        if self._remaining[driver.group] == 0:
            self._done[driver.group].set()

    async def admit(self, index: int, driver: Any) -> bool:
        d: GatedDriver = driver
        d.announce()
        if d.settled:
            return False
        for group in d.depends_on:
            await self._done[group].wait()
        if not await d.ready():
            self._finished(d)
            return False
        await self.gate.enter(d.agent_id, d.priority())
        return True

    def leave(self, index: int, driver: Any) -> None:
        self.gate.leave(driver.agent_id)

    async def finished(self, index: int, driver: Any) -> None:
        d: GatedDriver = driver
        await d.done()
        self._finished(d)

    def background(self) -> Coroutine[Any, Any, None] | None:
        return self._control() if self.control is not None else None

    async def _control(self) -> None:
        assert self.control is not None
        while True:
            await self.clock.sleep(self.interval_s)
            await self.control()
