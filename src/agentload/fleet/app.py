"""A fleet run as one call: settings in, ``FleetResult`` out — what ``agentload run`` does, less parsing and printing.

``FleetApp.run`` wires the concrete pieces the fleet runner only knows as protocols: the server (a given URL, or the
simulator, embedded on 127.0.0.1 or in process in simulated time), the probe and preflight that choose the starting
width, the signal poller the ``auto`` limiter and the stall watchdog read, the streaming client with retries, the
run directory, the progress display and, when asked, the live dashboard and Ray actors. The settings are one model
(``FleetSettings``) the command builds once; a resume takes what a flag does not give from the run's own
``run.json`` (``fleet.checkpoint.RunManifest``), so runs stored before this module existed resume as they did.

The dashboard and the simulator's named behaviours come from packages that import this one or sit beside it, so the
composition root (``cli/run.py``) hands them in (``open_board``, ``behaviour``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from aiohttp import web
from pydantic import BaseModel, ConfigDict
from rich.console import Console

from agentload.agent.loop import ChatBackend
from agentload.capacity.profile import load_profile
from agentload.clock import Clock, LoopClock
from agentload.endpoint.apikey import read_api_key
from agentload.endpoint.connection import Connection, ConnectionOptions, open_connection
from agentload.endpoint.probe import Preflight, ProbeResult, preflight, probe, served_model
from agentload.endpoint.redact import MASK, redact_url
from agentload.endpoint.signals import SignalPoller
from agentload.endpoint.transport import Endpoint, Transport, signed_transport
from agentload.errors import ConfigError
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
from agentload.fleet.turns import Pause
from agentload.load.cluster import ExecutorSpec, RayCluster
from agentload.sim.agentmodel import AgentBehaviour
from agentload.sim.behaviour import Behaviour, FillerBehaviour
from agentload.sim.inprocess import InProcessTransport
from agentload.sim.server import SimConfig, SimServer
from agentload.store.atomic import write_atomic
from agentload.store.manifest import RunInfo, now_iso, read_info, write_info
from agentload.store.runstore import RunStore

# The in-process simulator answers any URL; this one says so in the results (and resolves nowhere).
IN_PROCESS_URL = "http://simulator.invalid"

ProgressKind = Literal["auto", "live", "lines", "none"]


class FleetSettings(BaseModel):
    """One ``agentload run`` invocation, as the command parsed it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

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
    progress: ProgressKind = "auto"
    fsync: bool = True
    virtual: bool = False  # the in-process simulator in simulated time (no sockets, no waiting)
    dashboard: bool = False  # serve the live page (agentload.dashboard) on 127.0.0.1 for the run
    dashboard_port: int = 0  # 0: a free port
    dashboard_interval_s: float | None = None  # the page's update period (``--dashboard-rate``); None: its default
    executor: ExecutorSpec = ExecutorSpec()  # ray: the requests sent by Ray actors


class BoardControl(Pause, Protocol):
    """The dashboard's controls as the runner reads them: its pause, and the event its Stop sets."""

    stop: asyncio.Event


class LiveBoard(Protocol):
    """The live dashboard of one run, as ``agentload.dashboard.Board`` serves it."""

    url: str

    @property
    def control(self) -> BoardControl: ...

    def connect(self, monitor: SignalPoller, watchdog: Callable[[], Any] | None, run_id: str) -> None: ...

    def progress(self, inner: FleetProgress | None) -> FleetProgress: ...

    def start(self, run: FleetRunner) -> None: ...

    def watching(self) -> AbstractContextManager[None]: ...


class BoardOpener(Protocol):
    """``agentload.dashboard.open_board``: a board serving for the length of the block."""

    def __call__(
        self,
        plans: Sequence[AgentPlan],
        clock: Clock,
        *,
        max_width: int,
        port: int = 0,
        fleet: str = "",
        interval_s: float | None = None,
    ) -> AbstractAsyncContextManager[LiveBoard]: ...


def simulator_behaviour(name: str) -> Behaviour:
    """The simulator's model for a fleet: ``agent`` (calls the fleet's tools over rounds) or ``filler`` (pure
    load). The command hands in ``agentload sim``'s own chooser, which knows the oracle too."""
    if name == "agent":
        return AgentBehaviour()
    if name == "filler":
        return FillerBehaviour()
    raise ConfigError(f"--behaviour {name!r}: use agent or filler")


_stderr = Console(stderr=True, highlight=False)


def _say(message: str) -> None:
    _stderr.print(message, markup=False, soft_wrap=True)


@asynccontextmanager
async def embedded_simulator(profile: str, behaviour: Behaviour | None = None) -> AsyncIterator[str]:
    """The simulator on 127.0.0.1 (a free port) for the length of the block; yields its base URL."""
    config = SimConfig(profile=load_profile(profile), behaviour=behaviour or AgentBehaviour())
    runner = SimServer(config).app_runner()  # the idle and half-sent connection limits of `agentload sim`
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
class Server:
    url: str
    label: str
    transport: Transport | None  # None: HTTP over aiohttp; else a signed HTTP transport or the in-process seam


@dataclass
class _Start:
    """What the run learnt before its first turn: the server, the model, the width to start at and why."""

    server: Server
    model: str
    width: int
    reason: str
    warnings: list[str]
    engine: str | None


@dataclass(slots=True)  # slots: a misspelt attribute set from outside fails instead of being ignored
class FleetApp:
    """One fleet run (or resume) in this process: its settings, the pieces the composition root hands in, and what
    is learnt as it goes — the run directory (so an interrupted run can say where to resume), the dashboard's URL
    (the token is in it) and the notes on what was decided before the run."""

    settings: FleetSettings
    cluster: Callable[[ExecutorSpec], Any] = RayCluster  # what --executor ray starts (tests: an in-process one)
    open_board: BoardOpener | None = None  # what --dashboard serves: ``agentload.dashboard.open_board``
    behaviour: Callable[[str], Behaviour] = simulator_behaviour  # the simulator's model by name
    say: Callable[[str], None] = _say  # a note, a warning, the dashboard's URL: stderr by default
    run_dir: Path | None = None
    dashboard_url: str | None = None
    notes: list[str] = field(default_factory=list)
    # The variable the key is read from: the flag's, or on a resume the one the run was started with.
    api_key_env: str | None = None

    def __post_init__(self) -> None:
        self.api_key_env = self.api_key_env or self.settings.api_key_env

    def open_manifest(self) -> tuple[RunManifest, Path | None]:
        """The run's manifest and directory; a new run gets its directory only once the server has answered."""
        s = self.settings
        if s.resume is not None:
            return self._resumed(s.resume), s.resume
        if s.virtual and s.url is not None:
            raise ConfigError("--virtual runs the embedded simulator in simulated time; it cannot drive --url")
        if s.fleet is None:
            raise ConfigError("give a FLEET.toml to run, or --resume RUN_DIR to continue a run")
        fleet: FleetConfig = load_fleet(s.fleet)
        manifest = RunManifest(
            run_id="",
            fleet=fleet,
            fleet_source=str(s.fleet),
            url=redact_url(s.url) if s.url is not None else None,  # run.json holds no credential
            profile=s.profile if s.url is None else None,
            model=s.model,
            virtual=s.virtual,
            behaviour=s.behaviour if s.url is None else None,
            mode=s.mode or Mode.AUTO,
            width=s.width,
            max_width=s.max_width,
            api_key_env=s.api_key_env,
        )
        return manifest, None

    def _resumed(self, run_dir: Path) -> RunManifest:
        s = self.settings
        manifest = read_manifest(run_dir)
        if s.fleet is not None and load_fleet(s.fleet) != manifest.fleet:
            raise ConfigError(f"{s.fleet} is not the fleet {run_dir} was started with (resume without it)")
        if s.url is not None and manifest.url is not None and redact_url(s.url) != manifest.url:
            self.notes.append(f"resuming against {redact_url(s.url)} (the run started against {manifest.url})")
        if s.api_key_env is None and manifest.api_key_env is not None and manifest.url is not None:
            # The same variable, read again now (the key itself is never stored).
            if not os.environ.get(manifest.api_key_env):
                raise ConfigError(
                    f"the run was started with --api-key-env {manifest.api_key_env}, which is not set now: "
                    "set it, or give --api-key-env"
                )
            self.api_key_env = manifest.api_key_env
        return manifest

    def widths(self, manifest: RunManifest, run_dir: Path | None) -> WidthSettings:
        """The mode and widths this process runs with: the flags, and on a resume the run's own for those not
        given."""
        s = self.settings
        if run_dir is None:
            settings = WidthSettings(s.mode or Mode.AUTO, s.width, s.max_width)
        else:
            stored = _stored_settings(manifest, run_dir)
            mode = s.mode or stored.mode
            if mode is not stored.mode:
                self.notes.append(f"resuming as {mode.value} (the run started as {stored.mode.value})")
            # A width belongs to its mode: another mode given at the resume takes only the width given with it.
            width = s.width if s.width is not None or mode is not stored.mode else stored.width
            max_width = s.max_width if s.max_width is not None else stored.max_width
            settings = WidthSettings(mode, width, max_width)
        if settings.mode is Mode.PARALLEL and settings.width is None:
            raise ConfigError("--mode parallel needs --width N (or use --mode auto to let the limiter choose)")
        return settings

    def create_run(self, manifest: RunManifest, *, target: str = "", model: str = "") -> tuple[RunManifest, Path]:
        """``<root>/<fleet name>-<stamp>-<tail>/`` through the store (its manifest.json), then the fleet's
        run.json."""
        info = RunInfo(
            kind="fleet",
            run_id="",
            created=now_iso(),
            target=target,
            model=model,
            workload=manifest.fleet.name,
            mode=(manifest.mode or Mode.AUTO).value,
        )
        run_dir, _ = RunStore(self.settings.out).new_dir(info, prefix=f"{manifest.fleet.name}-")
        manifest = manifest.model_copy(update={"run_id": run_dir.name})
        write_manifest(run_dir, manifest)
        return manifest, run_dir

    async def open_server(self, manifest: RunManifest, stack: AsyncExitStack) -> Server:
        """The server the agents talk to, open until ``stack`` closes: the URL given (or the run's), else the
        simulator the run started with."""
        s = self.settings
        url = s.url or manifest.url
        if url is not None:
            if s.url is None and MASK in url:
                raise ConfigError(
                    f"the run was started against {url}, whose credentials were not stored; give --url again to resume"
                )
            # One signed transport for the probe, the signal poller and the agents, so each request carries the
            # key and the URL's credentials, and every component sees (and records) only the URL without them.
            server, signed = signed_transport(url, read_api_key(self.api_key_env))
            stack.push_async_callback(signed.aclose)
            return Server(server.base, server.shown, signed)
        profile = manifest.profile or s.profile
        # The agent behaviour by default, so a fleet on the simulator calls its tools over rounds; a resume
        # keeps the model the run started with (the same conversation must get the same kind of replies).
        behaviour = self.behaviour(manifest.behaviour or s.behaviour)
        if manifest.virtual:
            transport = InProcessTransport(SimServer(SimConfig(profile=load_profile(profile), behaviour=behaviour)))
            stack.push_async_callback(transport.aclose)
            return Server(IN_PROCESS_URL, f"in-process simulator (profile {profile}, simulated time)", transport)
        url = await stack.enter_async_context(embedded_simulator(profile, behaviour))
        return Server(url, f"embedded simulator (profile {profile})", None)

    async def _ray_turns(
        self, manifest: RunManifest, server: Server, engine: str | None, stack: AsyncExitStack
    ) -> tuple[RayTurns, str]:
        """Ray actors that send the agents' requests (``fleet.distributed``), ended with the run; and what they
        are."""
        cluster = self.cluster(self.settings.executor)
        stack.callback(cluster.close)
        # Each actor opens its own connection: the URL with its credentials and the key (never shown), or the
        # embedded simulator's 127.0.0.1 address, which actors on this machine reach.
        url = self.settings.url or manifest.url or server.url
        key = read_api_key(self.api_key_env) if (self.settings.url or manifest.url) else None
        # A virtual run's in-process simulator is handed over as it is: only an in-process stand-in for Ray (tests)
        # runs one; the command refuses --executor ray with --virtual.
        cluster.start(FleetWorker, Endpoint(url, key, server.transport if manifest.virtual else None), engine)
        await cluster.measure_offsets()
        turns = RayTurns(cluster, warn=lambda m: self.say(f"warning: {m}"))
        stack.push_async_callback(turns.close)  # before the actors are ended (the stack unwinds in reverse)
        described = cluster.describe()
        self.notes.append(described)
        return turns, described

    async def _serve_board(
        self, stack: AsyncExitStack, plans: list[AgentPlan], clock: Clock, manifest: RunManifest, widths: WidthSettings
    ) -> LiveBoard | None:
        """The live dashboard, serving before anything else so a port in use stops the run before it is
        recorded; None without ``--dashboard``."""
        s = self.settings
        if not s.dashboard:
            return None
        if self.open_board is None:
            raise ConfigError("--dashboard: this run was given no dashboard to serve")
        widest = min(widths.max_width or len(plans), len(plans))  # the limiter's bound, for the page's width too
        board = await stack.enter_async_context(
            self.open_board(
                plans,
                clock,
                max_width=widest,
                port=s.dashboard_port,
                fleet=manifest.fleet.name,
                interval_s=s.dashboard_interval_s,
            )
        )
        self.dashboard_url = board.url
        self.say(f"dashboard: {board.url}")
        return board

    async def _start(
        self, manifest: RunManifest, widths: WidthSettings, plans: list[AgentPlan], stack: AsyncExitStack
    ) -> _Start:
        """Open the server, probe it, and choose the model and the width to start at."""
        server = await self.open_server(manifest, stack)
        given = self.settings.model or manifest.model
        probed = await probe(server.url, model=given, transport=server.transport)
        # Tasks that name no model need one: the given one, else the server's only one (several: name one). When
        # every task names its own, the server's only labels the run.
        needed = any(p.model is None for p in plans)
        model = served_model(probed, given) if needed else given or probed.model
        width, reason, warnings = start_width(widths.mode, widths.width, plans, probed)
        return _Start(server, model or "", width, reason, warnings, probed.engine)

    def _progress(self, stack: AsyncExitStack, plans: list[AgentPlan], display: Console) -> FleetProgress | None:
        kind = self.settings.progress
        if kind == "auto":
            kind = "live" if display.is_terminal else "lines"
        ids = [p.agent_id for p in plans]
        if kind == "live":
            return stack.enter_context(LiveProgress(ids, display))
        if kind == "lines":
            return LineProgress(ids, display)
        return None

    async def _open_log(
        self, run_dir: Path, segment: int, widths: WidthSettings, start: _Start, plans: list[AgentPlan], virtual: bool
    ) -> tuple[CheckpointLog, Limiter]:
        """The checkpoint log with this segment's first line, and the limiter it records."""
        max_width = min(widths.max_width or len(plans), len(plans))
        policy = make_policy(widths.mode, start.width, max_width=max_width)
        # Simulated runs skip fsync: a thread's fsync would let virtual time run ahead while it is on disk.
        log = CheckpointLog(run_dir / LOG, sync=self.settings.fsync and not virtual)
        await log.append(SegmentLine(segment=segment, mode=widths.mode, start_width=start.width, reason=start.reason,
                                     min_limit=policy.min_limit, max_limit=policy.max_limit))  # fmt: skip
        return log, Limiter(policy)

    def _samples(self, run_dir: Path, segment: int, conn: Connection, stack: AsyncExitStack) -> None:
        """The server's samples beside the turns, for the replay (the monitor scrapes for the limiter anyway)."""
        samples = SampleLog(run_dir, segment, note=self.say, watchdog=conn.watchdog.statistics)
        stack.callback(samples.close)
        stack.callback(conn.monitor.subscribe(samples))

    async def run(self, out: Console | None = None) -> FleetResult:
        """Run (or resume) the fleet and return its compiled result; ``results.json`` is written in the run dir,
        the progress shown on ``out`` (default stdout).

        A run made with ``virtual`` must be awaited on a ``VirtualTimeLoop`` (``clock.run_virtual``).
        """
        manifest, existing = self.open_manifest()
        widths = self.widths(manifest, existing)
        if self.settings.dashboard and (self.settings.virtual or manifest.virtual):
            raise ConfigError("--dashboard shows a run as it happens; a --virtual run has no real time to watch")
        self.run_dir = existing
        plans = expand(manifest.fleet)
        clock = LoopClock()
        async with AsyncExitStack() as stack:
            board = await self._serve_board(stack, plans, clock, manifest, widths)
            start = await self._start(manifest, widths, plans, stack)
            turns: RayTurns | None = None
            executor = "local"
            if self.settings.executor.kind == "ray":  # before the run is recorded: a missing Ray leaves no empty run
                turns, executor = await self._ray_turns(manifest, start.server, start.engine, stack)
            # Only now, with a server that answers and a width to start at, is there a run to record.
            if existing is None:
                manifest, self.run_dir = self.create_run(manifest, target=start.server.label, model=start.model)
            run_dir = self.run_dir
            assert run_dir is not None
            created = _begin_segment(run_dir, manifest.run_id)
            state = load_log(run_dir / LOG)
            if state.torn_bytes:
                self.notes.append(f"dropped a torn last line ({state.torn_bytes} bytes) from {run_dir / LOG}")
            segment = len(state.segments)
            # A given transport is closed by whoever opened it (the stack); without one the connection makes its own.
            options = ConnectionOptions(engine=start.engine)
            conn = await stack.enter_async_context(
                open_connection(start.server.url, start.server.transport, options=options, clock=clock)
            )
            log, limiter = await self._open_log(run_dir, segment, widths, start, plans, manifest.virtual)
            stack.callback(log.close)
            self._samples(run_dir, segment, conn, stack)
            self.notes.append(f"{widths.mode.value}: starting at width {start.width} — {start.reason}")
            self.notes.extend(f"warning: {w}" for w in start.warnings)
            for note in self.notes:
                self.say(note)
            progress = self._progress(stack, plans, out or Console(highlight=False))
            if board is not None:
                board.connect(conn.monitor, conn.watchdog.statistics, manifest.run_id)
                progress = board.progress(progress)
            backend: ChatBackend = conn.backend if turns is None else turns
            runner = FleetRunner(plans, backend=backend, limiter=limiter, log=log,
                                 state=state, clock=clock, workspaces=run_dir / WORKSPACES, model=start.model,
                                 run_id=manifest.run_id, segment=segment, signals=conn.monitor, progress=progress,
                                 stop_after_s=self.settings.stop_after_s,
                                 stop=board.control.stop if board is not None else None,
                                 pause=board.control if board is not None else None)  # fmt: skip
            if board is not None:
                board.start(runner)
            with board.watching() if board is not None else contextlib.nullcontext():
                outcome = await runner.run()
            warnings = [*start.warnings, *(turns.warnings if turns is not None else [])]
        result = compile_result(manifest, plans, load_log(run_dir / LOG, repair=False), server=start.server.label,
                                model=start.model, segment=segment, wall_s=outcome.wall_s, limiter=outcome.limiter,
                                warnings=warnings, stopped_early=outcome.stopped_early,
                                server_failure=outcome.server_failure, executor=executor)  # fmt: skip
        write_atomic(run_dir / RESULTS, result.model_dump_json(indent=2))
        RunStore(run_dir.parent).finish(run_dir, fleet_info(result, created=created))
        return result
