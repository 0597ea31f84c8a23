"""The bench application: a run's settings opened on its target (the simulator, or a server waited for and probed)
and measured, its progress told to one observer (``bench.observe``).

What ``agentload bench`` does between parsing its flags and printing the result; the command composes the
observers (the console, the run store, the dashboard) and this drives the run. A test or a script drives a bench the
same way: ``BenchSession.open(settings)``, then ``session.drive(session.measure(observer))``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from agentload.bench.analysis import LevelData
from agentload.bench.distributed import LevelWorker
from agentload.bench.observe import BenchObserver
from agentload.bench.orchestrate import BenchPlan, run_bench
from agentload.bench.results import LevelSummary, RunResult
from agentload.bench.settings import BenchSettings
from agentload.bench.target import Target, http_target, sim_target
from agentload.capacity.profile import load_profile, with_offload
from agentload.clock import run_virtual
from agentload.endpoint.liveness import wait_until_up
from agentload.endpoint.probe import ENGINE_LABELS, probe, served_model
from agentload.endpoint.records import Outcome
from agentload.endpoint.redact import redact_url
from agentload.endpoint.signals import SignalPoller
from agentload.endpoint.transport import Endpoint, signed_transport
from agentload.errors import (
    ConfigError,
    EndpointError,
    EndpointResponseError,
    EndpointTimeoutError,
    EndpointUnreachableError,
)
from agentload.load.cluster import ExecutorSpec, RayCluster
from agentload.sim.behaviour import Behaviour, OracleBehaviour, ScenarioBook
from agentload.workload.base import Workload
from agentload.workload.registry import get_workload
from agentload.workload.trace import fit_to_level

T = TypeVar("T")
Note = Callable[[str], None]
# The KV pool a server reports: its tokens, its block size and where the figure came from.
Pool = tuple[int, int, str]


def _quiet(text: str) -> None:
    return None


@dataclass(frozen=True)
class Resumed:
    """What an interrupted run of the same settings left: its finished levels, in order, when it was created, and
    the run time its last server sample reached (the resumed levels' times go on from there)."""

    levels: Sequence[LevelSummary] = ()
    created: str | None = None
    from_s: float = 0.0


@dataclass
class BenchSession:
    """A bench run ready to measure: its plan, the target each level gets, what the server reported."""

    settings: BenchSettings
    plan: BenchPlan
    pool: Pool | None = None
    slots: int | None = None  # llama.cpp's parallel slots, from the probe
    cluster: RayCluster | None = None
    _shared: Target | None = field(default=None, repr=False)  # the one real server every level measures

    @classmethod
    def open(
        cls,
        settings: BenchSettings,
        *,
        key: str | None = None,
        executor: ExecutorSpec | None = None,
        scenarios: Callable[[], ScenarioBook] | None = None,
        note: Note = _quiet,
    ) -> BenchSession:
        """The run's target opened: the simulator's profile checked, or the server waited for (``--wait-ready``)
        and probed; on ``executor`` ray, its actors started. ``key``: the server's API key (never stored).
        ``scenarios``: the book the simulator's oracle answers the suite workload from."""
        executor = executor or ExecutorSpec()
        if executor.kind == "ray" and not settings.url:
            raise ConfigError(
                "--executor ray runs the agents against a server over HTTP; without --url the bench runs the "
                "simulator in process on simulated time, which one process runs whole (serve it with "
                "`agentload sim` and give --url)"
            )
        # A bad name, trace file or trace option fails before the target is opened.
        workload = get_workload(settings.workload, **settings.workload_options)
        # A trace that ends inside a level's warm-up would leave every window empty: it is looped (or refused).
        fitted = fit_to_level(workload, settings.warmup_s, settings.window_s)
        if fitted:
            note(fitted)
        synthetic = get_workload("synthetic") if settings.compare_synthetic else None
        sim = settings.simulator
        if sim is not None:
            profile = load_profile(sim)  # fail early on a bad name
            for c in settings.contexts:
                if c > profile.max_model_len:
                    raise ConfigError(f"--context {c} exceeds the profile's max-model-len {profile.max_model_len}")
            if settings.offload_gib is not None:
                with_offload(profile, settings.offload_gib)  # a bad size fails here, once
            book = scenarios() if settings.workload == "suite" and scenarios is not None else None
            behaviour: Behaviour | None = OracleBehaviour(book) if book is not None else None
            return cls(
                settings, _plan(settings, lambda: sim_target(sim, behaviour, settings.offload_gib), workload, synthetic)
            )
        url = settings.url
        assert url is not None  # a settings without --url runs the simulator
        asyncio.run(wait_for_server(url, key, settings.wait_ready_s, note))
        found = asyncio.run(probe_server(url, settings.model, settings.contexts, settings.api_key_env, note))
        pool, engine, slots, model = found
        shared = http_target(url, model, engine, api_key=key)
        cluster = None
        if executor.kind == "ray":
            cluster = RayCluster(executor)
            cluster.start(LevelWorker, Endpoint(url, key))  # each actor opens its own connection to the server
        plan = _plan(settings, lambda: shared, workload, synthetic, cluster)
        return cls(settings, plan, pool, slots, cluster, _shared=shared)

    @property
    def virtual(self) -> bool:
        """The simulator in process, on simulated time (a real server is measured in real time)."""
        return self._shared is None

    def drive(self, main: Coroutine[Any, Any, T]) -> T:
        """Run ``main`` (a ``measure``) on the loop this target needs: virtual time for the simulator."""
        return run_virtual(main) if self.virtual else asyncio.run(main)

    async def measure(
        self, observer: BenchObserver, *, run_id: str | None = None, resumed: Resumed = Resumed()
    ) -> tuple[RunResult, list[LevelData]]:
        """Measure the run's levels and compile its result (and the levels' raw data); see ``run_bench``."""
        try:
            if self.cluster is not None:
                await self.cluster.measure_offsets()
                self.plan.settings["executor"] = self.cluster.describe()
                observer.note(self.cluster.describe())
            return await run_bench(self.plan, pool=self.pool, slots=self.slots, observer=observer, run_id=run_id,
                                   resumed=resumed.levels, created=resumed.created,
                                   resume_from_s=resumed.from_s)  # fmt: skip
        finally:
            if self._shared is not None:
                await self._shared.transport.aclose()

    def close(self) -> None:
        """Stop the Ray actors, if any (the simulator's targets close with their levels)."""
        if self.cluster is not None:
            self.cluster.close()

    def check_measured(self, result: RunResult, data: list[LevelData], resumed: Resumed, where: Path) -> None:
        """Not one turn succeeded: the run measured nothing about the server, so it gets no result (the records in
        ``where`` say what failed)."""
        if result.incomplete is None and not resumed.levels and not any(r.ok for lv in data for r in lv.records):
            raise no_turn_succeeded(data, self.settings.url or "the simulator", where)


def _plan(
    settings: BenchSettings,
    make_target: Callable[[], Target],
    workload: Workload,
    synthetic: Workload | None,
    cluster: RayCluster | None = None,
) -> BenchPlan:
    """The levels the settings ask for, each measured on ``make_target()`` (``synthetic``: the matched arm)."""
    return BenchPlan(
        make_target=make_target,
        workload=workload,
        contexts=settings.contexts,
        mode=settings.mode,
        agents=settings.counts,
        warmup_s=settings.warmup_s,
        window_s=settings.window_s,
        slo=settings.slo_spec,
        tolerance=settings.tolerance,
        max_agents=settings.max_agents,
        synthetic=synthetic,
        seed=settings.seed,
        same_text=settings.same_text,
        exact_output=not settings.natural_output,
        min_turns=settings.min_turns,
        pin_slots=not settings.no_pin_slots,
        settings={"workload": settings.workload, "contexts": settings.context},
        cluster=cluster,
    )


async def probe_server(
    url: str, model: str | None, contexts: list[int], key_env: str | None = None, note: Note = _quiet
) -> tuple[Pool | None, str, int | None, str]:
    """The server's own KV pool (vLLM cache_config_info, SGLang server info, llama.cpp props), engine, slots and
    the model to request (``model``, else the one the server serves: ``served_model``).

    Slots are llama.cpp's parallel slots (``-np``): a server with them runs at most that many requests at once.

    Through the same probe as ``agentload probe``; a context the model cannot hold is refused here, before any
    load is sent.
    """
    # The key from --api-key-env's variable, else the probe's default one (an unset default sends none).
    found = await (probe(url, model=model, api_key_env=key_env) if key_env else probe(url, model=model))
    model = served_model(found, model)
    if found.max_context is not None:
        for c in contexts:
            if c > found.max_context:
                raise ConfigError(
                    f"--context {c:,} exceeds what {model} at {redact_url(url)} holds "
                    f"(max_model_len {found.max_context:,})"
                )
    if found.pool_tokens is None or found.block_size is None:
        note(f"note: no capacity estimate: {ENGINE_LABELS[found.engine]} reports no KV pool")
        return None, found.engine, found.parallel_slots, model
    pool = (found.pool_tokens, found.block_size, found.pool_source or "the server")
    return pool, found.engine, found.parallel_slots, model


async def wait_for_server(url: str, key: str | None, timeout_s: float, note: Note = _quiet) -> None:
    """Wait for a server that is still coming up, saying so every 10 s: what it waits for, for how long, and that
    ``--wait-ready`` sets it (a wrong port looks like a server still loading, and is waited for in vain)."""
    server, transport = signed_transport(url, key)  # the poll carries the run's credentials, its URL none
    poller = SignalPoller(server.base, transport=transport)
    why = (
        " — a server still loading refuses connections or answers /health 503 until it is ready; "
        f"--wait-ready sets how long to wait (now {timeout_s:g} s; a wrong URL or port is waited for in vain)"
    )
    said = [False]  # the reason is given with the first line only

    def report(line: str) -> None:
        note(line + ("" if said[0] else why))
        said[0] = True

    try:
        await wait_until_up(poller, timeout_s, report=report)
    except EndpointTimeoutError as exc:
        raise EndpointTimeoutError(
            f"{exc}: check the URL and port, or wait longer for a server still loading with --wait-ready"
        ) from None
    finally:
        await poller.stop()
        await transport.aclose()


def no_turn_succeeded(data: list[LevelData], where: str, path: Path) -> EndpointError:
    records = [r for level in data for r in level.records]
    if not records:
        return EndpointResponseError(f"no request was completed against {where}; records (none) in {path}")
    first = records[0]
    why = f" ({first.error_message})" if first.error_message else ""
    message = f"not one of {len(records)} requests to {where} succeeded{why}; the records are in {path}"
    if first.outcome is Outcome.CONNECT_ERROR:
        return EndpointUnreachableError(message)
    return EndpointResponseError(message, status=first.http_status)
