"""Ray actors stood in for in one process: real worker objects called as Ray calls them (``actor.method.remote(...)``
awaited, every argument and result pickled on the way); a killed actor fails every later call as Ray's do."""

from __future__ import annotations

import pickle
from collections import Counter
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any

from agentload.endpoint.transport import Endpoint
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
            result = await method(*pickle.loads(pickle.dumps(args)))
            if self.dead:
                raise ActorDied(f"actor {self.worker.index} died")
            return pickle.loads(pickle.dumps(result))

        return SimpleNamespace(remote=call)

    def kill(self) -> None:
        """As a killed process: its loads stop where they are, its records not yet taken are gone."""
        self.dead = True
        for t in getattr(self.worker, "_loads", None) or [self.worker._task]:
            if t is not None:
                t.cancel()


class FakeCluster:
    """``count`` actors of ``cls`` (a ``LevelWorker``, a ``SuiteWorker``), as ``RayCluster`` starts them."""

    def __init__(self, cls: Callable[[int, int, Endpoint], Any], count: int, endpoint: Endpoint) -> None:
        self.actors = [FakeActor(cls(i, count, endpoint)) for i in range(count)]
        self.offsets = [ClockOffset(0.0, 0.0, same_node=True)] * count
        self.ray = SimpleNamespace(exceptions=SimpleNamespace(RayActorError=ActorDied))
