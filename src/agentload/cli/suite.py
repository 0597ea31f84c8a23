"""``agentload suite``: run the behaviour suite with N agents at once and print what they got right, and how fast.

Without ``--url`` it starts the embedded simulator in this process (127.0.0.1, a free port) with the oracle
behaviour, which answers every test correctly — a self-check of the harness and a baseline for the figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Annotated, Any

import typer
from aiohttp import web
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from agentload.capacity.profile import load_profile
from agentload.cli.common import (
    ApiKeyEnvOption,
    ExecutorOption,
    JsonOption,
    OutOption,
    RayAddressOption,
    WorkersOption,
    console,
    default_book,
    err_console,
    executor_spec,
    reports_errors,
    resolve_key_env,
)
from agentload.endpoint.connection import Connection, open_connection
from agentload.endpoint.probe import probe, served_model
from agentload.endpoint.records import Outcome
from agentload.endpoint.redact import redact_url
from agentload.endpoint.transport import Endpoint, Transport, signed_transport
from agentload.errors import ConfigError, EndpointResponseError, EndpointUnreachableError, ServerLostError
from agentload.load.cluster import ExecutorSpec, RayCluster
from agentload.sim.behaviour import OracleBehaviour
from agentload.sim.server import SimConfig, SimServer
from agentload.store.runstore import run_root, save_suite_run
from agentload.suite.cases import select
from agentload.suite.cases.stress import PAYLOAD_TOKENS
from agentload.suite.distributed import RaySuite, SuiteWorker
from agentload.suite.model import SuiteTest
from agentload.suite.results import LevelResult, SuiteRun, TestResult, counts, cut_short
from agentload.suite.runner import LevelStart, RemoteLevels, SuiteConfig, TestDone, check_agent_counts, run_suite
from agentload.suite.scoring import Status

EMBEDDED_PROFILE = "qwen3-235b-gb300"  # the source benchmark's deployment, and short simulated steps

# Upper bounds on the flags, far past a real suite run: a typo must not start a billion agents.
MAX_AGENTS = 100_000
MAX_TOKENS = 2_000_000


def parse_counts(agents: int | None, sweep: str | None) -> list[int]:
    """The agent counts to run from --agents or --sweep (not both); default one agent."""
    if agents is not None and sweep is not None:
        raise ConfigError("give --agents or --sweep, not both")
    if sweep is not None:
        parts = [p.strip() for p in sweep.split(",") if p.strip()]
        try:
            counts = [int(p) for p in parts]
        except ValueError as exc:
            raise ConfigError(f"--sweep {sweep!r}: use comma-separated whole numbers, e.g. 1,4,16,64") from exc
        if not counts:
            raise ConfigError("--sweep is empty: use comma-separated whole numbers, e.g. 1,4,16,64")
        if max(counts) > MAX_AGENTS:
            raise ConfigError(f"--sweep {sweep!r}: at most {MAX_AGENTS:,} agents")
        return check_agent_counts(counts)
    if agents is not None and agents <= 0:
        raise ConfigError(f"--agents must be at least 1, got {agents}")
    if agents is not None and agents > MAX_AGENTS:
        raise ConfigError(f"--agents {agents:,}: at most {MAX_AGENTS:,}")
    return [agents or 1]


def parse_tests(tests: str | None) -> list[str] | None:
    if tests is None:
        return None
    ids = [t.strip() for t in tests.split(",") if t.strip()]
    if not ids:
        raise ConfigError("--tests is empty: give test ids such as T1,T5")
    return ids


@asynccontextmanager
async def embedded_simulator(profile: str) -> AsyncIterator[tuple[str, str]]:
    """The simulator with the oracle on 127.0.0.1 (a free port) in this event loop; yields (URL, model)."""
    server = SimServer(SimConfig(profile=load_profile(profile), behaviour=OracleBehaviour(default_book())))
    runner = server.app_runner()  # the idle and half-sent connection limits of `agentload sim`
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        yield f"http://127.0.0.1:{port}", server.model_name
    finally:
        await runner.cleanup()


class _Bar:
    """Progress on stderr (so --json output stays clean): tests finished out of agents × tests, per level."""

    def __init__(self) -> None:
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("tests  [green]{task.fields[passed]}[/] passed"),
            TimeElapsedColumn(),
            console=err_console,
            transient=True,
        )
        self.task: TaskID | None = None
        self.passed = 0

    def level(self, agents: int, tests: int) -> None:
        if self.task is not None:
            self.progress.remove_task(self.task)
        self.passed = 0
        self.task = self.progress.add_task(_agents(agents), total=agents * tests, passed=0)

    def test_done(self, agents: int, result: TestResult) -> None:
        if self.task is None:
            return
        self.passed += result.status is Status.PASS
        self.progress.update(self.task, advance=1, passed=self.passed)


async def _run(
    url: str | None,
    model: str | None,
    key_env: str,
    profile: str,
    tests: list[SuiteTest],
    counts: list[int],
    payload_tokens: int,
    max_tokens: int | None,
    show_progress: bool,
    executor: ExecutorSpec,
) -> SuiteRun:
    key = os.environ.get(key_env) or None
    async with AsyncExitStack() as stack:
        base, served, label, transport = await stack.enter_async_context(_endpoint(url, model, profile, key))
        # One connection for the load, the polls and the liveness check; it closes the transport on the way out.
        conn = await stack.enter_async_context(open_connection(base, transport, close_transport=True))
        remote: RaySuite | None = None
        if executor.kind == "ray":
            # Each actor connects to the server itself (the embedded simulator listens on 127.0.0.1 of this machine).
            cluster = RayCluster(executor)
            stack.callback(cluster.close)
            cluster.start(SuiteWorker, Endpoint(url or base, key))
            await cluster.measure_offsets()
            err_console.print(f"[dim]{escape(cluster.describe())}[/]")
            remote = RaySuite(cluster)
        bar = _Bar()
        with bar.progress if show_progress else contextlib.nullcontext():
            config = SuiteConfig(model=served, max_tokens=max_tokens, payload_tokens=payload_tokens)
            return await suite_over(conn, tests, config, counts, endpoint=label, on_level=bar.level,
                                    on_test=bar.test_done, remote=remote)  # fmt: skip


async def suite_over(
    conn: Connection,
    tests: list[SuiteTest],
    config: SuiteConfig,
    counts: list[int],
    *,
    endpoint: str,
    on_level: LevelStart | None = None,
    on_test: TestDone | None = None,
    remote: RemoteLevels | None = None,
) -> SuiteRun:
    """The suite's levels through ``conn``, as ``agentload suite`` runs them on any target.

    The same stack as bench and ``run``: a passing 503 or reset is resent (same turn, same body) rather than
    costing the agent a test, the stall watchdog gives up a request on a frozen server within ~22 s and waits out
    a cold start, and the liveness watch stops the whole run when the server is gone.
    """
    # The connection's clock: wall time on a normal loop, simulated time when the target is in process.
    return await run_suite(conn.backend, tests, config, counts, conn.clock, endpoint=endpoint, on_level=on_level,
                           on_test=on_test, liveness=conn.liveness, remote=remote)  # fmt: skip


@asynccontextmanager
async def _endpoint(
    url: str | None, model: str | None, profile: str, key: str | None
) -> AsyncIterator[tuple[str, str, str, Transport | None]]:
    """(base URL, model, how results name the endpoint, transport): the given server, or the embedded simulator.

    A given server's credentials (the key, and any in the URL) go to the transport only; results name the URL
    with them masked (``endpoint.redact``).
    """
    if url is not None:
        server, transport = signed_transport(url, key)
        yield server.base, model or "", server.shown, transport
        return
    async with embedded_simulator(profile) as (base, served):
        yield base, model or served, f"embedded simulator ({profile}, oracle)", None


def redact(url: str) -> str:
    """The URL as results and messages may show it (``endpoint.redact.redact_url``: credentials masked)."""
    return redact_url(url)


def _agents(n: int) -> str:
    return f"{n} agent{'s' * (n != 1)}"


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x:.0%}" if x in (0.0, 1.0) else f"{x:.1%}"


def _secs(s: float | None) -> str:
    if s is None:
        return "—"
    return f"{s * 1e3:.0f} ms" if s < 1 else f"{s:.2f} s"


def render_level(level: LevelResult) -> None:
    """One load level as tables, for people. Reads only the compiled result."""
    n = level.agents
    t = Table(title=f"{_agents(n)}: per-test pass rate", title_justify="left")
    t.add_column("test")
    t.add_column("category")
    t.add_column("checks")
    t.add_column("pass", justify="right")
    t.add_column("rate", justify="right")
    t.add_column("note", style="dim")
    for s in level.per_test:
        notes = []
        if s.unscored:
            notes.append(f"{s.unscored} unscored ({'; '.join(s.unscored_reasons)})")
        if s.not_run:
            notes.append(f"{s.not_run} not run")
        if s.median_break_hop is not None:
            notes.append(f"median break hop {s.median_break_hop:g}")
        # Escaped: a reason quotes the server's error message, which may hold rich markup.
        t.add_row(s.test_id, s.category.label, s.title, f"{s.passed}/{s.scored}", _pct(s.pass_rate),
                  escape(", ".join(notes)))  # fmt: skip
    console.print(t)
    figures = Table(show_header=False, box=None, padding=(0, 2))
    figures.add_column()
    figures.add_column(justify="right")
    figures.add_column(style="dim")
    k = len(level.pooled_tests)
    pooled_over = f"passes ÷ tests scored: {counts(level)}" if k else "no test of T1–T17 ran"
    figures.add_row("[bold]pooled pass rate[/]", f"[bold]{_pct(level.pooled_pass_rate)}[/]", pooled_over)
    if k and level.seed_pooled_pass_rate != level.pooled_pass_rate:
        # The seed runner's figure, for comparison with its results: unjudged and unrun tests count as failures.
        figures.add_row("seed's figure", _pct(level.seed_pooled_pass_rate), f"passes ÷ ({_agents(n)} × {k} tests)")
    figures.add_row(
        "agents completed / unscored / failed",
        f"{level.completed} / {level.unscored} / {level.failed}",
        "unscored: a request failed, so a test could not be judged",
    )
    figures.add_row("wall clock", _secs(level.wall_clock_s), "")
    figures.add_row("median session", _secs(level.median_session_s), "one agent's whole suite")
    figures.add_row("sessions per minute", f"{level.sessions_per_min:.1f}", "")
    figures.add_row(
        "TTFT p50 / p95",
        f"{_secs(level.ttft_p50_s)} / {_secs(level.ttft_p95_s)}",
        f"over {level.requests - level.requests_failed:,} successful requests",
    )
    if level.requests_failed:
        figures.add_row("requests failed", f"{level.requests_failed:,} of {level.requests:,}", "")
    console.print(figures)
    console.print()


def summary(run: SuiteRun) -> dict[str, Any]:
    """The run without transcripts (those go to the run directory), and how far it got if it was cut short:
    what --json prints."""
    out = run.model_dump(mode="json", exclude={"levels": {"__all__": {"agent_results"}}})
    out["cut_short"] = cut_short(run)
    return out


@reports_errors
def suite(
    url: Annotated[
        str | None, typer.Option("--url", help="OpenAI-compatible server (…/v1). Default: the embedded simulator.")
    ] = None,
    model: Annotated[
        str | None, typer.Option("--model", "-m", help="Model to request (default: the one --url serves).")
    ] = (None),
    agents: Annotated[int | None, typer.Option("--agents", "-n", help="Agents at once (default 1).")] = None,
    sweep: Annotated[str | None, typer.Option("--sweep", help="Several agent counts in turn, e.g. 1,4,16,64.")] = (
        None
    ),
    tests: Annotated[str | None, typer.Option("--tests", help="Only these tests, e.g. T1,T5 (default: all).")] = None,
    skip_hop: Annotated[bool, typer.Option("--skip-hop", help="Leave out the 50-hop relay (H1).")] = False,
    out: OutOption = None,
    as_json: JsonOption = False,
    api_key_env: ApiKeyEnvOption = None,
    profile: Annotated[
        str | None, typer.Option("--profile", "-p", help=f"Embedded simulator's profile (default {EMBEDDED_PROFILE}).")
    ] = None,
    payload_tokens: Annotated[
        int,
        typer.Option(
            "--payload-tokens",
            help="Size of T11's large tool result in BPE tokens (1.91 characters each); lower it for short contexts.",
        ),
    ] = PAYLOAD_TOKENS,
    max_tokens: Annotated[int | None, typer.Option("--max-tokens", help="Output cap per turn (default: none).")] = None,
    executor: ExecutorOption = "local",
    ray_address: RayAddressOption = None,
    workers: WorkersOption = None,
) -> None:
    """Run the behaviour suite (T1–T17 and the H1 relay) with N agents at once; pass rates, timing, TTFT."""
    counts = parse_counts(agents, sweep)
    selected = select(parse_tests(tests), skip_hop=skip_hop, payload_tokens=payload_tokens)
    if url is not None:
        model = model or served_model(asyncio.run(probe(url, api_key_env=resolve_key_env(api_key_env))), None)
        if profile is not None:
            raise ConfigError("--profile sets up the embedded simulator; it does not apply with --url")
    if max_tokens is not None and max_tokens < 1:
        raise ConfigError(f"--max-tokens must be at least 1, got {max_tokens}")
    if max_tokens is not None and max_tokens > MAX_TOKENS:
        raise ConfigError(f"--max-tokens {max_tokens:,}: at most {MAX_TOKENS:,}")
    if payload_tokens > MAX_TOKENS:
        raise ConfigError(f"--payload-tokens {payload_tokens:,}: at most {MAX_TOKENS:,}")
    key_env = resolve_key_env(api_key_env)
    root = run_root(out)
    if root.exists() and not root.is_dir():
        raise ConfigError(f"the root of runs {root} is a file; give a directory with --out")
    try:
        run = asyncio.run(
            _run(
                url,
                model,
                key_env,
                profile or EMBEDDED_PROFILE,
                selected,
                counts,
                payload_tokens,
                max_tokens,
                show_progress=not as_json,
                executor=executor_spec(executor, ray_address, workers),
            )
        )
    except KeyboardInterrupt:
        err_console.print("interrupted: no results written")
        raise typer.Exit(130) from None
    path = save_suite_run(run, root)
    err_console.print(f"[dim]results with every transcript: {escape(str(path))}[/]")
    if as_json:
        typer.echo(json.dumps(summary(run), indent=2))
    else:
        console.print(f"[bold]agentload suite {run.suite_version}[/] — {escape(run.model)} at {escape(run.endpoint)}")
        for level in run.levels:
            render_level(level)
        stopped = cut_short(run)
        if stopped is not None:
            console.print(f"[bold yellow]cut short:[/] {escape(stopped)}; the tests not run are out of the rates")
    if run.incomplete is not None:
        done = sum(len(a.tests) for lv in run.levels for a in lv.agent_results)
        raise ServerLostError(
            f"{run.incomplete}; the run stopped. Saved the {done} tests finished so far, marked incomplete, in {path}"
        )
    _raise_if_unreachable(run)


def _raise_if_unreachable(run: SuiteRun) -> None:
    """A run in which not one request succeeded says nothing about the model: say why, and exit non-zero."""
    levels = run.levels
    if not levels or not all(lv.requests and lv.requests_failed == lv.requests for lv in levels):
        return
    first = next(rec for lv in levels for a in lv.agent_results for r in a.tests for rec in r.transcript.records())
    why = f": {first.error_message}" if first.error_message else ""
    if first.outcome is Outcome.CONNECT_ERROR:
        raise EndpointUnreachableError(f"every request to {run.endpoint} failed to connect{why}")
    raise EndpointResponseError(f"every request to {run.endpoint} failed{why}", status=first.http_status)
