"""``agentload run FLEET.toml``: run a fleet of agents at the width the server can carry, resumable after a kill.

This module wires the concrete pieces the fleet runner only knows as protocols: the server (``--url``, or the
embedded simulator on 127.0.0.1), the probe and preflight that choose the starting width, the signal poller the
``auto`` limiter and the stall watchdog read, the streaming client with retries, the run directory, and the
display. ``run_fleet`` does the work and returns the compiled result; the command prints it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer
from aiohttp import web
from rich.console import Console
from rich.table import Table

from agentload.agent.loop import ChatBackend
from agentload.capacity.profile import load_profile
from agentload.cli.common import (
    ApiKeyEnvOption,
    DashboardRateOption,
    ExecutorOption,
    JsonOption,
    OutOption,
    RayAddressOption,
    WorkersOption,
    console,
    dashboard_interval,
    err_console,
    executor_spec,
    read_api_key,
    reports_errors,
    resolve_key_env,
)
from agentload.cli.sim import make_behaviour
from agentload.clock import LoopClock, run_virtual
from agentload.dashboard import open_board
from agentload.endpoint.connection import ConnectionOptions, open_connection
from agentload.endpoint.probe import Preflight, ProbeResult, preflight, probe, served_model
from agentload.endpoint.redact import MASK, redact_url
from agentload.endpoint.transport import Endpoint, Transport, signed_transport
from agentload.errors import ConfigError, EndpointError, ExecutorError
from agentload.fleet.checkpoint import (
    LOG,
    RESULTS,
    WORKSPACES,
    CheckpointLog,
    RunManifest,
    SegmentLine,
    load_log,
    read_manifest,
    write_manifest,
)
from agentload.fleet.config import AgentPlan, FleetConfig, expand, load_fleet
from agentload.fleet.distributed import FleetWorker, RayTurns
from agentload.fleet.limiter import Limiter, Mode, make_policy
from agentload.fleet.progress import LineProgress, LiveProgress
from agentload.fleet.results import FleetResult, compile_result, fleet_info
from agentload.fleet.runner import FleetProgress, FleetRunner
from agentload.fleet.samples import SampleLog
from agentload.load.cluster import ExecutorSpec, RayCluster
from agentload.sim.inprocess import InProcessTransport
from agentload.sim.server import SimConfig, SimServer
from agentload.store.atomic import write_atomic
from agentload.store.manifest import RunInfo, now_iso, read_info, write_info
from agentload.store.runstore import RunStore, run_root

EXIT_AGENTS_FAILED = 1
# The in-process simulator answers any URL; this one says so in the results (and resolves nowhere).
IN_PROCESS_URL = "http://simulator.invalid"


@dataclass
class RunOptions:
    fleet: Path | None = None
    # None: auto for a new run; a resumed run keeps the settings it was started with (run.json), each one given
    # again replacing its own.
    mode: Mode | None = None
    width: int | None = None
    max_width: int | None = None
    resume: Path | None = None
    out: Path | None = None  # the root of runs; None: ``store.run_root``'s default
    url: str | None = None
    model: str | None = None
    api_key_env: str | None = None  # as ``--api-key-env``: None reads OPENAI_API_KEY when it is set
    profile: str = "laptop"
    behaviour: str = "agent"  # the simulator's model (``agentload sim --behaviour``); filler for pure load
    stop_after_s: float | None = None
    progress: str = "auto"  # auto | live | lines | none
    fsync: bool = True
    virtual: bool = False  # the in-process simulator in simulated time (no sockets, no waiting)
    dashboard: bool = False  # serve the live page (agentload.dashboard) on 127.0.0.1 for the run
    dashboard_port: int = 0  # 0: a free port
    dashboard_interval_s: float | None = None  # the page's update period (``--dashboard-rate``); None: its default
    dashboard_url: str | None = None  # set once it serves (the token is in it)
    executor: ExecutorSpec = field(default_factory=ExecutorSpec)  # ray: the requests sent by Ray actors
    cluster: Callable[[ExecutorSpec], Any] = RayCluster  # what --executor ray starts (tests: an in-process one)
    run_dir: Path | None = None  # set once known, so an interrupted run can say where to resume
    notes: list[str] = field(default_factory=list)  # what was decided before the run, for the caller to print


@asynccontextmanager
async def embedded_simulator(profile: str, behaviour: str = "agent") -> AsyncIterator[str]:
    """The simulator on 127.0.0.1 (a free port) for the length of the block; yields its base URL."""
    server = SimServer(SimConfig(profile=load_profile(profile), behaviour=make_behaviour(behaviour)))
    runner = server.app_runner()  # the idle and half-sent connection limits of `agentload sim`
    # An agent stopped mid-stream (--stop-after, Ctrl-C) makes the simulator's handler fail its next write, and
    # aiohttp logs each such disconnect with a traceback; in the embedded server they are expected, not news.
    server_log = logging.getLogger("aiohttp.server")
    level = server_log.level
    server_log.setLevel(logging.CRITICAL)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
        server_log.setLevel(level)


@dataclass(frozen=True)
class WidthSettings:
    mode: Mode
    width: int | None
    max_width: int | None


def _stored_settings(manifest: RunManifest, run_dir: Path) -> WidthSettings:
    """The width settings a run was started with: run.json's, or for a run.json written before it stored them,
    what its first segment line recorded."""
    if manifest.mode is not None:
        return WidthSettings(manifest.mode, manifest.width, manifest.max_width)
    segments = load_log(run_dir / LOG, repair=False).segments
    if not segments:
        return WidthSettings(Mode.AUTO, None, None)
    first = segments[0]
    return WidthSettings(
        first.mode,
        first.start_width if first.mode is Mode.PARALLEL else None,
        first.max_limit if first.mode is Mode.AUTO else None,
    )


def _settings(opts: RunOptions, manifest: RunManifest, run_dir: Path | None) -> WidthSettings:
    """The mode and widths this process runs with: the flags, and on a resume the run's own for those not given."""
    if run_dir is None:
        settings = WidthSettings(opts.mode or Mode.AUTO, opts.width, opts.max_width)
    else:
        stored = _stored_settings(manifest, run_dir)
        mode = opts.mode or stored.mode
        if mode is not stored.mode:
            opts.notes.append(f"resuming as {mode.value} (the run started as {stored.mode.value})")
        # A width belongs to its mode: another mode given at the resume takes only the width given with it.
        width = opts.width if opts.width is not None or mode is not stored.mode else stored.width
        max_width = opts.max_width if opts.max_width is not None else stored.max_width
        settings = WidthSettings(mode, width, max_width)
    if settings.mode is Mode.PARALLEL and settings.width is None:
        raise ConfigError("--mode parallel needs --width N (or use --mode auto to let the limiter choose)")
    return settings


def _manifest(opts: RunOptions) -> tuple[RunManifest, Path | None]:
    """The run's manifest and directory; a new run gets its directory only once the server has answered."""
    if opts.resume is not None:
        manifest = read_manifest(opts.resume)
        if opts.fleet is not None and load_fleet(opts.fleet) != manifest.fleet:
            raise ConfigError(f"{opts.fleet} is not the fleet {opts.resume} was started with (resume without it)")
        if opts.url is not None and manifest.url is not None and redact_url(opts.url) != manifest.url:
            opts.notes.append(f"resuming against {redact_url(opts.url)} (the run started against {manifest.url})")
        if opts.api_key_env is None and manifest.api_key_env is not None and manifest.url is not None:
            # The same variable, read again now (the key itself is never stored).
            if not os.environ.get(manifest.api_key_env):
                raise ConfigError(
                    f"the run was started with --api-key-env {manifest.api_key_env}, which is not set now: "
                    "set it, or give --api-key-env"
                )
            opts.api_key_env = manifest.api_key_env
        return manifest, opts.resume
    if opts.virtual and opts.url is not None:
        raise ConfigError("--virtual runs the embedded simulator in simulated time; it cannot drive --url")
    if opts.fleet is None:
        raise ConfigError("give a FLEET.toml to run, or --resume RUN_DIR to continue a run")
    fleet: FleetConfig = load_fleet(opts.fleet)
    manifest = RunManifest(
        run_id="",
        fleet=fleet,
        fleet_source=str(opts.fleet),
        url=redact_url(opts.url) if opts.url is not None else None,  # run.json holds no credential
        profile=opts.profile if opts.url is None else None,
        model=opts.model,
        virtual=opts.virtual,
        behaviour=opts.behaviour if opts.url is None else None,
        mode=opts.mode or Mode.AUTO,
        width=opts.width,
        max_width=opts.max_width,
        api_key_env=opts.api_key_env,
    )
    return manifest, None


def _create_run(
    opts: RunOptions, manifest: RunManifest, *, target: str = "", model: str = ""
) -> tuple[RunManifest, Path]:
    """``<root>/<fleet name>-<stamp>-<tail>/`` through the store (its manifest.json), then the fleet's run.json."""
    info = RunInfo(
        kind="fleet",
        run_id="",
        created=now_iso(),
        target=target,
        model=model,
        workload=manifest.fleet.name,
        mode=(manifest.mode or Mode.AUTO).value,
    )
    run_dir, _ = RunStore(opts.out).new_dir(info, prefix=f"{manifest.fleet.name}-")
    manifest = manifest.model_copy(update={"run_id": run_dir.name})
    write_manifest(run_dir, manifest)
    return manifest, run_dir


def _begin_segment(run_dir: Path, run_id: str) -> str:
    """Mark a resumed run as running again (a run from before manifests gets one); returns its start date."""
    info = read_info(run_dir)
    if info is None:
        info = RunInfo(kind="fleet", run_id=run_id, created=now_iso())
    if info.status != "running":
        write_info(run_dir, info.model_copy(update={"status": "running", "detail": ""}))
    return info.created


def start_width(
    mode: Mode, width: int | None, plans: list[AgentPlan], probed: ProbeResult
) -> tuple[int, str, list[str]]:
    """The width the run starts with, why, and the preflight's warnings."""
    if mode is Mode.SEQUENTIAL:
        if width not in (None, 1):
            raise ConfigError("--width does not apply to --mode sequential (one agent at a time)")
        return 1, "sequential: one agent at a time", []
    planned = max(p.planned_context() for p in plans)
    pf: Preflight = preflight(probed, planned_context=planned, requested_width=width)
    start, reason = pf.start_width, pf.reason
    if mode is Mode.AUTO and width is not None:
        own = preflight(probed, planned_context=planned, requested_width=None)
        reason = f"--width {width} as the starting point" + (f" ({own.reason})" if own.holds is not None else "")
    if start > len(plans):
        reason += f"; the fleet has only {len(plans)} agents"
        start = len(plans)
    return max(1, start), reason, list(pf.warnings)


@dataclass
class _Server:
    url: str
    label: str
    transport: Transport | None  # None: HTTP over aiohttp; else a signed HTTP transport or the in-process seam


async def _open_server(opts: RunOptions, manifest: RunManifest, stack: AsyncExitStack) -> _Server:
    url = opts.url or manifest.url
    if url is not None:
        if opts.url is None and MASK in url:
            raise ConfigError(
                f"the run was started against {url}, whose credentials were not stored; give --url again to resume"
            )
        # One signed transport for the probe, the signal poller and the agents, so each request carries the key
        # and the URL's credentials, and every component sees (and records) only the URL without them.
        server, signed = signed_transport(url, read_api_key(opts.api_key_env))
        stack.push_async_callback(signed.aclose)
        return _Server(server.base, server.shown, signed)
    profile = manifest.profile or opts.profile
    # The agent behaviour by default, so a fleet on the simulator calls its tools over rounds; a resume
    # keeps the model the run started with (the same conversation must get the same kind of replies).
    behaviour = manifest.behaviour or opts.behaviour
    if manifest.virtual:
        config = SimConfig(profile=load_profile(profile), behaviour=make_behaviour(behaviour))
        transport = InProcessTransport(SimServer(config))
        stack.push_async_callback(transport.aclose)
        return _Server(IN_PROCESS_URL, f"in-process simulator (profile {profile}, simulated time)", transport)
    url = await stack.enter_async_context(embedded_simulator(profile, behaviour))
    return _Server(url, f"embedded simulator (profile {profile})", None)


async def _ray_turns(
    opts: RunOptions, manifest: RunManifest, server: _Server, engine: str | None, stack: AsyncExitStack
) -> tuple[RayTurns, str]:
    """Ray actors that send the agents' requests (``fleet.distributed``), ended with the run; and what they are."""
    cluster = opts.cluster(opts.executor)
    stack.callback(cluster.close)
    # Each actor opens its own connection: the URL with its credentials and the key (never shown), or the embedded
    # simulator's 127.0.0.1 address, which actors on this machine reach.
    url = opts.url or manifest.url or server.url
    key = read_api_key(opts.api_key_env) if (opts.url or manifest.url) else None
    # A virtual run's in-process simulator is handed over as it is: only an in-process stand-in for Ray (tests) runs
    # one; the command refuses --executor ray with --virtual.
    cluster.start(FleetWorker, Endpoint(url, key, server.transport if manifest.virtual else None), engine)
    await cluster.measure_offsets()
    turns = RayTurns(cluster, warn=lambda m: err_console.print(f"warning: {m}", markup=False, soft_wrap=True))
    stack.push_async_callback(turns.close)  # before the actors are ended (the stack unwinds in reverse)
    described = cluster.describe()
    opts.notes.append(described)
    return turns, described


async def run_fleet(opts: RunOptions, out: Console | None = None) -> FleetResult:
    """Run (or resume) a fleet and return its compiled result; ``results.json`` is written in the run dir.

    A run made with ``virtual`` must be awaited on a ``VirtualTimeLoop`` (``clock.run_virtual``).
    """
    manifest, existing = _manifest(opts)
    settings = _settings(opts, manifest, existing)
    if opts.dashboard and (opts.virtual or manifest.virtual):
        raise ConfigError("--dashboard shows a run as it happens; a --virtual run has no real time to watch")
    opts.run_dir = existing
    plans = expand(manifest.fleet)
    clock = LoopClock()
    async with AsyncExitStack() as stack:
        board = None
        if opts.dashboard:  # serving before anything else, so a port in use stops the run before it is recorded
            widest = min(settings.max_width or len(plans), len(plans))  # the limiter's bound, for the page's width too
            board = await stack.enter_async_context(
                open_board(
                    plans,
                    clock,
                    max_width=widest,
                    port=opts.dashboard_port,
                    fleet=manifest.fleet.name,
                    interval_s=opts.dashboard_interval_s,
                )
            )
            opts.dashboard_url = board.url
            err_console.print(f"dashboard: {board.url}", markup=False, soft_wrap=True)
        server = await _open_server(opts, manifest, stack)
        url = server.url
        probed = await probe(url, model=opts.model or manifest.model, transport=server.transport)
        # Tasks that name no model need one: the given one, else the server's only one (several: name one). When
        # every task names its own, the server's only labels the run.
        needed = any(p.model is None for p in plans)
        given = opts.model or manifest.model
        model = served_model(probed, given) if needed else given or probed.model
        width, reason, warnings = start_width(settings.mode, settings.width, plans, probed)
        executor = "local"
        turns: RayTurns | None = None
        if opts.executor.kind == "ray":  # started before the run is recorded: a missing Ray leaves no empty run
            turns, executor = await _ray_turns(opts, manifest, server, probed.engine, stack)
        # Only now, with a server that answers and a width to start at, is there a run to record.
        if existing is None:
            manifest, run_dir = _create_run(opts, manifest, target=server.label, model=model or "")
            opts.run_dir = run_dir
        else:
            run_dir = existing
        created = _begin_segment(run_dir, manifest.run_id)
        state = load_log(run_dir / LOG)
        if state.torn_bytes:
            opts.notes.append(f"dropped a torn last line ({state.torn_bytes} bytes) from {run_dir / LOG}")
        segment = len(state.segments)
        # A given transport is closed by whoever opened it (the stack); without one the connection makes its own.
        conn = await stack.enter_async_context(
            open_connection(url, server.transport, options=ConnectionOptions(engine=probed.engine), clock=clock)
        )
        poller = conn.monitor
        backend: ChatBackend = conn.backend if turns is None else turns
        max_width = min(settings.max_width or len(plans), len(plans))
        policy = make_policy(settings.mode, width, max_width=max_width)
        limiter = Limiter(policy)
        # Simulated runs skip fsync: a thread's fsync would let virtual time run ahead while it is on disk.
        log = CheckpointLog(run_dir / LOG, sync=opts.fsync and not manifest.virtual)
        stack.callback(log.close)
        await log.append(
            SegmentLine(
                segment=segment,
                mode=settings.mode,
                start_width=width,
                reason=reason,
                min_limit=policy.min_limit,
                max_limit=policy.max_limit,
            )
        )
        # The server's samples beside the turns, for the replay (the monitor scrapes for the limiter anyway).
        samples = SampleLog(
            run_dir,
            segment,
            note=lambda m: err_console.print(m, markup=False, soft_wrap=True),
            watchdog=conn.watchdog.statistics,
        )
        stack.callback(samples.close)
        stack.callback(poller.subscribe(samples))
        opts.notes.append(f"{settings.mode.value}: starting at width {width} — {reason}")
        opts.notes.extend(f"warning: {w}" for w in warnings)
        display = out or console
        for note in opts.notes:
            err_console.print(note, markup=False, soft_wrap=True)
        ids = [p.agent_id for p in plans]
        kind = opts.progress
        if kind == "auto":
            kind = "live" if display.is_terminal else "lines"
        progress: FleetProgress | None = None
        if kind == "live":
            progress = stack.enter_context(LiveProgress(ids, display))
        elif kind == "lines":
            progress = LineProgress(ids, display)
        if board is not None:
            board.connect(conn.monitor, conn.watchdog.statistics, manifest.run_id)
        progress = progress if board is None else board.progress(progress)
        runner = FleetRunner(
            plans,
            backend=backend,
            limiter=limiter,
            log=log,
            state=state,
            clock=clock,
            workspaces=run_dir / WORKSPACES,
            model=model or "",
            run_id=manifest.run_id,
            segment=segment,
            signals=poller,
            progress=progress,
            stop_after_s=opts.stop_after_s,
            stop=board.control.stop if board is not None else None,
            pause=board.control if board is not None else None,
        )
        if board is not None:
            board.start(runner)
        with board.watching() if board is not None else contextlib.nullcontext():
            outcome = await runner.run()
        if turns is not None:
            warnings = [*warnings, *turns.warnings]
    final_state = load_log(run_dir / LOG, repair=False)
    result = compile_result(
        manifest,
        plans,
        final_state,
        server=server.label,
        model=model or "",
        segment=segment,
        wall_s=outcome.wall_s,
        limiter=outcome.limiter,
        warnings=warnings,
        stopped_early=outcome.stopped_early,
        server_failure=outcome.server_failure,
        executor=executor,
    )
    write_atomic(run_dir / RESULTS, result.model_dump_json(indent=2))
    RunStore(run_dir.parent).finish(run_dir, fleet_info(result, created=created))
    return result


def _per_task(result: FleetResult) -> str:
    """Rounds and tool calls per task, in fleet order: what the agents did, not only how fast."""
    tasks: dict[str, list[int]] = {}
    for a in result.agents:
        agg = tasks.setdefault(a.task_id, [0, 0, 0])
        agg[0] += 1
        agg[1] += a.turns
        agg[2] += a.tool_calls
    parts = []
    for task, (agents, turns, calls) in tasks.items():
        each = f" per agent ×{agents}" if agents > 1 else ""
        parts.append(f"{task} {turns / agents:.3g} rounds, {calls / agents:.3g} tool calls{each}")
    return "; ".join(parts)


def render_summary(result: FleetResult, run_dir: Path) -> Table:
    t = result.totals
    table = Table(
        title=f"{result.fleet}: {result.mode.value} on {result.server}", title_justify="left", show_header=False
    )
    table.add_column("", style="bold")
    table.add_column("", overflow="fold")  # a run directory's path must stay whole to be pasted
    rows = [
        (
            "agents",
            f"{t.agents}: {t.done} done, {t.failed} failed, {t.skipped} skipped, "
            f"{t.interrupted} interrupted, {t.unstarted} not started",
        ),
        ("turns", f"{t.turns:,} ({result.turns_per_s:.2f} per second in this run)"),
        ("per task", _per_task(result)),
        ("tokens", f"{t.prompt_tokens:,} prompt ({t.cached_tokens:,} cached), {t.completion_tokens:,} completion"),
        ("wall clock", f"{result.wall_s:.1f} s" + (" (stopped early; resumable)" if result.stopped_early else "")),
        ("width", f"started at {result.start_width}: {result.start_reason}"),
    ]
    if result.executor != "local":
        rows.append(("executor", result.executor))
    if result.mode is Mode.AUTO:
        history = result.limiter.history
        rows.append(
            (
                "auto",
                f"{len(history)} changes, now {result.limiter.limit}, "
                f"{result.settled_width:.1f} on average over the second half; parked {result.limiter.parked_total}×",
            )
        )
    if len(result.segments) > 1:
        rows.append(("segments", f"{len(result.segments)} (resumed {len(result.segments) - 1}×)"))
    rows.append(("results", str(run_dir / RESULTS)))
    for name, value in rows:
        table.add_row(name, value)
    return table


@reports_errors
def run(
    fleet: Annotated[Path | None, typer.Argument(help="The FLEET.toml to run (optional with --resume).")] = None,
    mode: Annotated[
        Mode | None,
        typer.Option(
            help="sequential, parallel (--width N) or auto (adaptive); default auto, on a resume the run's own."
        ),
    ] = None,
    width: Annotated[
        int | None, typer.Option(min=1, help="parallel: agents live at once; auto: the width to start from.")
    ] = None,
    max_width: Annotated[int | None, typer.Option(min=1, help="auto: never wider than this.")] = None,
    resume: Annotated[
        Path | None, typer.Option(help="Continue the run in this run directory (or of this run id under --out).")
    ] = None,
    out: OutOption = None,
    url: Annotated[str | None, typer.Option(help="OpenAI-compatible server (default: the embedded simulator).")] = (
        None
    ),
    model: Annotated[str | None, typer.Option(help="Model for tasks that name none (default: the server's).")] = None,
    api_key_env: ApiKeyEnvOption = None,
    profile: Annotated[str, typer.Option(help="Profile of the embedded simulator (without --url).")] = "laptop",
    behaviour: Annotated[
        str,
        typer.Option(help="The embedded simulator's model: agent (calls the fleet's tools) or filler (pure load)."),
    ] = "agent",
    stop_after: Annotated[
        float | None, typer.Option(min=0.0, help="Stop after this many seconds, leaving the run resumable.")
    ] = None,
    virtual: Annotated[
        bool,
        typer.Option(help="Without --url: run the simulator in process, in simulated time (no waiting)."),
    ] = False,
    progress: Annotated[str, typer.Option(help="auto, live, lines or none.")] = "auto",
    dashboard: Annotated[
        bool, typer.Option(help="Serve a live page with controls on 127.0.0.1; its URL (with a token) is printed.")
    ] = False,
    dashboard_port: Annotated[int, typer.Option(min=0, max=65535, help="The dashboard's port (0: a free one).")] = 0,
    dashboard_rate: DashboardRateOption = None,
    executor: ExecutorOption = "local",
    ray_address: RayAddressOption = None,
    workers: WorkersOption = None,
    as_json: JsonOption = False,
) -> None:
    """Run a fleet of agent tasks at the concurrency the server can carry; checkpointed, resumable after a kill."""
    if progress not in ("auto", "live", "lines", "none"):
        raise ConfigError(f"--progress {progress!r}: use auto, live, lines or none")
    resolve_key_env(api_key_env)  # a variable named but unset fails here, not as a 401 per request
    spec = executor_spec(executor, ray_address, workers)
    if resume is not None and not resume.is_dir() and len(resume.parts) == 1 and (run_root(out) / resume).is_dir():
        resume = run_root(out) / resume  # a run id, as `agentload runs` lists it, under the root of runs
    opts = RunOptions(
        fleet=fleet,
        mode=mode,
        width=width,
        max_width=max_width,
        resume=resume,
        out=out,
        url=url,
        model=model,
        api_key_env=api_key_env,
        profile=profile,
        behaviour=behaviour,
        stop_after_s=stop_after,
        progress="none" if as_json else progress,
        virtual=virtual,
        dashboard=dashboard,
        dashboard_port=dashboard_port,
        dashboard_interval_s=dashboard_interval(dashboard, dashboard_rate),
        executor=spec,
    )
    try:
        resumed_virtual = resume is not None and read_manifest(resume).virtual
        if spec.kind == "ray" and (virtual or resumed_virtual):
            raise ConfigError(
                "--executor ray sends the requests from other processes, and a --virtual run's "
                "simulator lives in this one: serve it with agentload sim and give --url"
            )
        if virtual or resumed_virtual:
            result: FleetResult = run_virtual(run_fleet(opts))
        else:
            result = asyncio.run(run_fleet(opts))
    except KeyboardInterrupt:
        where = opts.run_dir or "RUN_DIR"
        err_console.print(f"interrupted; continue with: agentload run --resume {where}", markup=False)
        raise typer.Exit(130) from None
    except ExecutorError as exc:
        where = opts.run_dir or "RUN_DIR"
        raise ExecutorError(f"{exc}; continue with: agentload run --resume {where}") from None
    run_dir = opts.run_dir or run_root(opts.out) / result.run_id
    if as_json:
        typer.echo(result.model_dump_json(indent=2))
    else:
        console.print(render_summary(result, run_dir))
    if result.server_failure is not None:
        # Everything is saved and nothing is failed for good: say how to go on, and exit 2 like any other error.
        t = result.totals
        raise EndpointError(
            f"the server failed mid-run ({result.server_failure}); stopped with {t.done} agents done, "
            f"{t.interrupted} interrupted, {t.unstarted} not started — continue with: "
            f"agentload run --resume {run_dir}"
        )
    if result.totals.failed:
        raise typer.Exit(EXIT_AGENTS_FAILED)
