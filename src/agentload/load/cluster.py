"""The Ray executor's generic part: a cluster of async actors that run a load's agents, one per core.

One process runs its agents on one event loop, so on one core; past a few thousand streams the client, not the
server, would set the figures. ``--executor ray`` spreads a load's agents over Ray **async actors** — each its own
process with its own event loop, client, watchdog and records — while the driver (the command's own process)
keeps what must be global: the strategy, the server monitor, the run directory. What an actor runs is the
profile's (``bench.distributed`` for a bench level); this module only connects to Ray, starts the actors and
puts their clocks on the driver's.

**Clocks.** Records carry the loop's clock, which is ``CLOCK_MONOTONIC``: one clock for every process of a machine,
so an actor on the driver's node needs no correction at all. An actor on another node has its own; its offset is
estimated from a few round trips (the driver's clock at the midpoint of the round trip with the smallest
time), its error bound is half that round trip, and the run says so. Durations (TTFT, ITL, latency) are taken on
one clock inside one actor and never depend on the offset.

Ray is an optional extra (``agentload[ray]``); without it ``--executor ray`` says how to install it. When this
process starts Ray itself (no ``--ray-address``) it starts a local one: with ``include_dashboard=False`` and no
port opened beyond what Ray needs on this node; tests run it in a network namespace with only loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal

from agentload.errors import ConfigError

ExecutorKind = Literal["local", "ray"]
# Ray runs an async actor on uvloop when it is installed, whose loop clock is libuv's, in whole milliseconds and read
# once per loop iteration: every record's timing would be coarse and late. Actors run on asyncio's own loop, whose
# clock is time.monotonic() and whose socket reads take the kernel's receive stamps (``endpoint.transport``).
ACTOR_ENV = {"env_vars": {"RAY_USE_UVLOOP": "0"}}
# Round trips taken to estimate a remote actor's clock offset (the one with the smallest time wins).
OFFSET_PINGS = 8


def require_ray() -> ModuleType:
    """The ``ray`` module, or a ConfigError that says how to install it."""
    try:
        return importlib.import_module("ray")
    except ImportError as exc:
        raise ConfigError(
            "--executor ray needs Ray, which is an optional extra: pip install 'agentload[ray]' "
            "(on every machine of the cluster, with the same agentload)"
        ) from exc


@dataclass(frozen=True)
class ExecutorSpec:
    """``--executor`` with its options, as a command parses them."""

    kind: ExecutorKind = "local"
    address: str | None = None  # --ray-address: an existing cluster ("auto", "ray://host:10001", "host:6379")
    workers: int | None = None  # --workers: actors (default: one per CPU the cluster has)

    def __post_init__(self) -> None:
        if self.kind not in ("local", "ray"):
            raise ConfigError(f"--executor must be local or ray, got {self.kind!r}")
        if self.workers is not None and self.workers < 1:
            raise ConfigError(f"--workers must be at least 1, got {self.workers}")
        if self.kind == "local" and (self.address is not None or self.workers is not None):
            raise ConfigError("--ray-address and --workers are options of --executor ray")


@dataclass(frozen=True)
class ClockOffset:
    """An actor's clock minus the driver's (seconds), and the bound on that estimate's error."""

    offset_s: float
    error_s: float
    same_node: bool


def now() -> float:
    """This process's loop clock (``LoopClock``: asyncio's loop time is ``time.monotonic``)."""
    return time.monotonic()


# How often the driver takes the actors' new records.
PULL_INTERVAL_S = 0.5


class ClockedActor:
    """What every actor class started by ``RayCluster`` answers: its node and its clock (``measure_offsets``)."""

    async def node(self) -> str:
        ray = require_ray()  # in an actor, which Ray itself started
        return str(ray.get_runtime_context().get_node_id())

    async def now(self) -> float:
        return now()


class RayCluster:
    """Connected to Ray, with ``workers`` actors of one class started over the cluster's CPUs."""

    def __init__(self, spec: ExecutorSpec) -> None:
        self.ray = require_ray()
        self.spec = spec
        self.started_here = False
        self.actors: list[Any] = []
        self.offsets: list[ClockOffset] = []

    def connect(self) -> None:
        ray = self.ray
        if ray.is_initialized():
            return
        options: dict[str, Any] = {"include_dashboard": False, "configure_logging": False, "log_to_driver": False}
        if self.spec.address is None:
            # A local Ray of this machine's cores, started by and for this run.
            options["num_cpus"] = os.cpu_count() or 1
            self.started_here = True
        else:
            options["address"] = self.spec.address
        _ray_messages_to_stderr()
        try:
            ray.init(**options)
        except Exception as exc:  # Ray raises ConnectionError, RuntimeError, ValueError … for a bad address
            where = self.spec.address or "a local Ray"
            raise ConfigError(f"--executor ray: could not start or reach {where}: {exc}") from exc

    def worker_count(self) -> int:
        if self.spec.workers is not None:
            return self.spec.workers
        return max(1, int(self.ray.cluster_resources().get("CPU", 1)))

    def start(self, cls: type, *args: Any) -> list[Any]:
        """``worker_count()`` actors of ``cls`` (an async class), each given (index, count, *args), over the nodes."""
        self.connect()
        count = self.worker_count()
        # One CPU each, so Ray places one per core and spreads them over nodes (async actors run many agents each);
        # more actors than CPUs share them, rather than wait for CPUs that will never come free.
        cpus = float(self.ray.cluster_resources().get("CPU", 1))
        remote = self.ray.remote(num_cpus=min(1.0, cpus / count), max_concurrency=1000, max_restarts=0)(cls)
        self.actors = [remote.options(scheduling_strategy="SPREAD", runtime_env=ACTOR_ENV).remote(i, count, *args)
                       for i in range(count)]  # fmt: skip
        return self.actors

    async def measure_offsets(self) -> list[ClockOffset]:
        """Every actor's clock offset from this process's (0 exactly on this node: one CLOCK_MONOTONIC)."""
        here = self.ray.get_runtime_context().get_node_id()
        self.offsets = list(await asyncio.gather(*(self._offset(a, here) for a in self.actors)))
        return self.offsets

    async def _offset(self, actor: Any, node: str) -> ClockOffset:
        their_node = await actor.node.remote()
        if their_node == node:
            return ClockOffset(0.0, 0.0, same_node=True)
        best: tuple[float, float] | None = None  # (round trip, offset)
        for _ in range(OFFSET_PINGS):
            sent = now()
            theirs = await actor.now.remote()
            back = now()
            trip = back - sent
            if best is None or trip < best[0]:
                best = (trip, theirs - (sent + back) / 2)
        assert best is not None
        return ClockOffset(best[1], best[0] / 2, same_node=False)

    def kill(self, index: int) -> None:
        """End one actor at once, as a crash would (for fault tests and benchmarks)."""
        self.ray.kill(self.actors[index], no_restart=True)

    def cancel(self, call: Any) -> None:
        """Cancel an actor call in flight (an async actor cancels the call's task); a finished one is left alone."""
        with contextlib.suppress(Exception):
            self.ray.cancel(call)

    def close(self) -> None:
        for a in self.actors:
            with contextlib.suppress(Exception):  # already dead: nothing left to end
                self.ray.kill(a, no_restart=True)
        self.actors = []
        if self.started_here and self.ray.is_initialized():
            self.ray.shutdown()

    def describe(self) -> str:
        nodes = {o.same_node for o in self.offsets}
        where = "this machine" if nodes == {True} else "a cluster"
        worst = max((o.error_s for o in self.offsets), default=0.0)
        clock = "one clock" if worst == 0 else f"clocks aligned to within {worst * 1e3:.2f} ms"
        return f"ray: {len(self.actors)} actors on {where} ({clock})"


def _ray_messages_to_stderr() -> None:
    """Ray's driver prints the raylet's messages (e.g. "A worker died or was killed …") on stdout, where ``--json``
    writes the result; they go to stderr instead, with the other diagnostics. Left alone if Ray's internals moved."""
    try:
        worker = importlib.import_module("ray._private.worker")
    except ImportError:
        return
    original = getattr(worker, "print_to_stdstream", None)
    if not callable(original) or getattr(original, "_agentload", False):
        return

    def to_stderr(data: dict[str, Any], ignore_prefix: bool) -> None:
        original({**data, "is_err": True}, ignore_prefix)

    to_stderr._agentload = True  # type: ignore[attr-defined]
    worker.print_to_stdstream = to_stderr  # type: ignore[attr-defined]  # a module: its attributes are not typed


def dead_actor_errors(ray: ModuleType) -> tuple[type[BaseException], ...]:
    """What Ray raises for a call on an actor that died."""
    names: Sequence[str] = ("RayActorError", "ActorDiedError", "ActorUnavailableError")
    return tuple(t for n in names if isinstance(t := getattr(ray.exceptions, n, None), type))
