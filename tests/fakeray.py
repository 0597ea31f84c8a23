"""Ray actors stood in for in one process: real worker objects called as Ray calls them (``actor.method.remote(...)``
awaited, every argument and result pickled on the way); a killed actor fails every later call as Ray's do."""

from __future__ import annotations

import asyncio
import pickle
from collections import Counter
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any

from agentload.load.cluster import ClockOffset


class ActorDied(Exception):
    """What a call on a dead fake actor raises (Ray's ``RayActorError`` stands here)."""


class FakeActor:
    def __init__(self, worker: Any) -> None:
        self.worker = worker
        self.dead = False
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        method: Callable[..., Awaitable[Any]] = getattr(self.worker, name)

        async def call(*args: Any) -> Any:
            if self.dead:
                raise ActorDied(f"actor {self.worker.index} died")
            self.calls[name] += 1
            try:
                result = await method(*pickle.loads(pickle.dumps(args)))
            except asyncio.CancelledError:
                if self.dead:  # killed under the call: the caller sees a dead actor, as Ray's do
                    raise ActorDied(f"actor {self.worker.index} died") from None
                raise
            if self.dead:
                raise ActorDied(f"actor {self.worker.index} died")
            return pickle.loads(pickle.dumps(result))

        return SimpleNamespace(remote=call)

    def kill(self) -> None:
        """As a killed process: its loads stop where they are, its records not yet taken are gone."""
        self.dead = True
        loads = self.worker._loads if hasattr(self.worker, "_loads") else [self.worker._task]
        for t in list(loads):
            if t is not None:
                t.cancel()


class FakeCluster:
    """``count`` actors of ``cls`` (a ``LevelWorker``, a ``SuiteWorker``, a ``FleetWorker``), as ``RayCluster``
    starts them; with no ``cls``, started later by ``start`` as a command starts a ``RayCluster``."""

    def __init__(self, cls: Callable[..., Any] | None = None, count: int = 2, *args: Any) -> None:
        self.count = count
        self.actors: list[FakeActor] = []
        self.offsets: list[ClockOffset] = []
        self.ray = SimpleNamespace(exceptions=SimpleNamespace(RayActorError=ActorDied))
        self.closed = False
        if cls is not None:
            self.start(cls, *args)

    def start(self, cls: Callable[..., Any], *args: Any) -> list[FakeActor]:
        self.actors = [FakeActor(cls(i, self.count, *args)) for i in range(self.count)]
        self.offsets = [ClockOffset(0.0, 0.0, same_node=True)] * self.count
        return self.actors

    async def measure_offsets(self) -> list[ClockOffset]:
        return self.offsets

    def describe(self) -> str:
        return f"fake ray: {len(self.actors)} actors in this process"

    def cancel(self, call: Any) -> None:
        return None  # the call is a coroutine the caller awaited: its cancel reached the worker already

    def close(self) -> None:
        self.closed = True
