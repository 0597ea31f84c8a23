"""``agentload bench``: how many agents this deployment carries before it stops behaving like one, and why."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import re
import shutil
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from rich.markup import escape

from agentload.bench.analysis import LevelData
from agentload.bench.distributed import LevelWorker
from agentload.bench.orchestrate import BenchPlan, Mode, run_bench
from agentload.bench.results import LevelSummary, RunResult
from agentload.bench.search import parse_slo
from agentload.bench.target import Target, http_target, sim_target
from agentload.capacity.profile import load_profile, with_offload
from agentload.cli.common import (
    ApiKeyEnvOption,
    DashboardRateOption,
    ExecutorOption,
    JsonOption,
    OutOption,
    RayAddressOption,
    WorkersOption,
    check_seed,
    console,
    dashboard_interval,
    default_book,
    err_console,
    executor_spec,
    read_api_key,
    reports_errors,
    resolve_key_env,
)
from agentload.clock import LoopClock, run_virtual
from agentload.dashboard.bench import open_bench_board
from agentload.endpoint.liveness import wait_until_up
from agentload.endpoint.probe import ENGINE_LABELS, probe, served_model
from agentload.endpoint.records import Outcome, RequestRecord
from agentload.endpoint.redact import redact_url
from agentload.endpoint.signals import SignalPoller
from agentload.endpoint.transport import Endpoint, signed_transport
from agentload.errors import (
    CheckpointError,
    ConfigError,
    EndpointError,
    EndpointResponseError,
    EndpointTimeoutError,
    EndpointUnreachableError,
    ServerLostError,
)
from agentload.load.cluster import ExecutorSpec, RayCluster
from agentload.report.console import print_result
from agentload.sim.behaviour import Behaviour, OracleBehaviour
from agentload.store.manifest import read_info
from agentload.store.rundir import RunDir, RunWriter
from agentload.store.runstore import RunStore, run_root
from agentload.workload.registry import get_workload

DEFAULT_SIM = "qwen3-235b-gb300"
# One decimal number ("90", "1.5", ".5"), so "1.2.3s" is refused here rather than by float() with a traceback.
_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(s|m|h)?\s*$")
# Upper bounds on the flags: far past any real run, low enough that a typo cannot start a billion
# agents or a window that never ends.
MAX_DURATION_S = 30 * 86_400.0
MAX_AGENTS = 100_000
MAX_CONTEXT = 2**24


def parse_counts(text: str, flag: str, maximum: int) -> list[int]:
    try:
        counts = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError as exc:
        raise ConfigError(f"{flag} {text!r}: expected whole numbers separated by commas, e.g. 1,16,64") from exc
    if not counts or counts[0] < 1:
        raise ConfigError(f"{flag} {text!r}: every count must be at least 1")
    if counts[-1] > maximum:
        raise ConfigError(f"{flag} {text!r}: at most {maximum:,}")
    return counts


def parse_duration(text: str, flag: str) -> float:
    m = _DURATION.match(text)
    if not m:
        raise ConfigError(f"{flag} {text!r}: expected a duration such as 90s, 30m or 2h")
    value = float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, None: 1}[m.group(2)]
    if value <= 0:
        raise ConfigError(f"{flag} {text!r}: must be positive")
    if value > MAX_DURATION_S:
        raise ConfigError(f"{flag} {text!r}: at most 30 days ({MAX_DURATION_S:,.0f} s)")
    return value


async def probe_server(
    url: str, model: str | None, contexts: list[int], key_env: str | None = None
) -> tuple[tuple[int, int, str] | None, str, int | None, str]:
    """The server's own KV pool (vLLM cache_config_info, SGLang server info, llama.cpp props), engine, slots and
    the model to request (``model``, else the one the server serves: ``served_model``).

    Slots are llama.cpp's parallel slots (``-np``): a server with them runs at most that many requests at once.

    Through the same probe as ``agentload probe``; a context the model cannot hold is refused here, before any
    load is sent.
    """
    found = await probe(url, model=model, api_key_env=resolve_key_env(key_env))
    model = served_model(found, model)
    if found.max_context is not None:
        for c in contexts:
            if c > found.max_context:
                raise ConfigError(
                    f"--context {c:,} exceeds what {model} at {redact_url(url)} holds "
                    f"(max_model_len {found.max_context:,})"
                )
    if found.pool_tokens is None or found.block_size is None:
        err_console.print(f"[yellow]note:[/] no capacity estimate: {ENGINE_LABELS[found.engine]} reports no KV pool")
        return None, found.engine, found.parallel_slots, model
    pool = (found.pool_tokens, found.block_size, found.pool_source or "the server")
    return pool, found.engine, found.parallel_slots, model


@reports_errors
def bench(
    url: Annotated[str | None, typer.Option(help="OpenAI-compatible server (real time).")] = None,
    model: Annotated[
        str | None,
        typer.Option(help="Model id to request (with --url; default: the one model the server serves)."),
    ] = None,
    api_key_env: ApiKeyEnvOption = None,
    sim: Annotated[
        str | None, typer.Option(help="Simulator profile, run in process in virtual time (no sockets).")
    ] = None,
    offload_gib: Annotated[
        float | None,
        typer.Option(
            min=0.0, help="With --sim: a CPU KV offload tier of this many GiB (vLLM --kv-offloading-size; 0: none)."
        ),
    ] = None,
    workload: Annotated[
        str, typer.Option(help="agentic, agentic-hold, synthetic, synthetic:IN/OUT, suite, or trace:FILE.")
    ] = "agentic-hold",
    context: Annotated[str, typer.Option(help="Context per agent, tokens; a list makes a context × agents grid.")] = (
        "40960"
    ),
    sweep: Annotated[str | None, typer.Option(help="Agent counts to measure, e.g. 1,16,64,128.")] = None,
    find_knee: Annotated[bool, typer.Option("--find-knee", help="Search the knee (bracket + bisect).")] = False,
    slo: Annotated[str | None, typer.Option(help="A level past this breaks the knee, e.g. ttft_p95=2s.")] = None,
    soak: Annotated[str | None, typer.Option(help="Hold --agents for this long (e.g. 30m) and report drift.")] = None,
    agents: Annotated[int | None, typer.Option(min=1, help="Agents for a single level or a soak.")] = None,
    warmup: Annotated[str, typer.Option(help="Warm-up per level, discarded.")] = "120s",
    window: Annotated[
        str,
        typer.Option(
            help="Measured window per level, a cap: at its end the requests in flight get a grace of a quarter of "
            "it (10-120 s), then are cut and recorded."
        ),
    ] = "300s",
    tolerance: Annotated[float, typer.Option(min=0.01, max=0.9, help="Drop below the best that marks the knee.")] = (
        0.10
    ),
    max_agents: Annotated[int, typer.Option(min=1, help="The knee search's largest count.")] = 1024,
    compare_synthetic: Annotated[
        bool, typer.Option(help="Also run the matched synthetic arm for the real ÷ synthetic ratio.")
    ] = False,
    out: OutOption = None,
    json_out: JsonOption = False,
    seed: Annotated[int, typer.Option(help="Seed for workload sizes.")] = 0,
    same_text: Annotated[
        bool,
        typer.Option(
            "--same-text",
            help="Draw the workload's text from --seed alone (default: salted with the run, so a rerun against the "
            "same server does not find its prefixes cached): two runs with the same seed send the same words, to "
            "compare two servers, or a server and its calibrated simulator, on identical prompts.",
        ),
    ] = False,
    natural_output: Annotated[
        bool,
        typer.Option(
            "--natural-output",
            help="Let the model end its replies (default: ask the engine for exactly the workload's lengths).",
        ),
    ] = False,
    min_turns: Annotated[
        int | None,
        typer.Option(
            min=1, help="Completed turns a level's window wants in all (default 60; and 8 per agent); --window caps it."
        ),
    ] = None,
    no_pin_slots: Annotated[
        bool,
        typer.Option(
            "--no-pin-slots",
            help="On a slot server (llama.cpp -np N), let the server choose each turn's slot (default: agent i's "
            "turns name slot i mod N with id_slot, so past N slots a turn queues for its own slot).",
        ),
    ] = False,
    wait_ready: Annotated[
        str,
        typer.Option(help="With --url: how long to wait for a server still starting (refusing, or /health 503)."),
    ] = "120s",
    resume: Annotated[
        str | None,
        typer.Option(
            help="Continue an interrupted bench (its directory, or its id under --out) with the flags it was started "
            "with; the levels it finished are kept, the rest are measured."
        ),
    ] = None,
    dashboard: Annotated[
        bool,
        typer.Option(
            help="With --url: serve a live page on 127.0.0.1 (server timelines, the level table, the knee search's "
            "steps); its URL, with a token, is printed."
        ),
    ] = False,
    dashboard_port: Annotated[int, typer.Option(min=0, max=65535, help="The dashboard's port (0: a free one).")] = 0,
    dashboard_rate: DashboardRateOption = None,
    executor: ExecutorOption = "local",
    ray_address: RayAddressOption = None,
    workers: WorkersOption = None,
) -> None:
    """Measure agents, not tokens: throughput, TTFT, prefix reuse and KV pressure across agent counts, and the knee.

    Without --url or --sim it runs the default simulated scenario: Qwen3-235B on a DGX Station GB300
    (the source article's 997,753-token pool) with agents holding ~40k tokens of context, and finds the knee.
    """
    flags: dict[str, Any] = {k: v for k, v in locals().items() if k in INVOCATION_FLAGS}
    resume_dir: Path | None = None
    if resume is not None:
        resume_dir, flags = resumed_flags(resume, out, flags)
    spec = executor_spec(executor, ray_address, workers)
    interval_s = dashboard_interval(dashboard, dashboard_rate)
    run(**flags, out=out, json_out=json_out, resume_dir=resume_dir, dashboard=dashboard, dashboard_port=dashboard_port,
        dashboard_interval_s=interval_s, executor=spec)  # fmt: skip


# The flags a bench run is started with and resumed with (``bench.json``); --out, --json and --resume are not
# the run's but the invocation's.
INVOCATION_FLAGS = (
    "url", "model", "api_key_env", "sim", "offload_gib", "workload", "context", "sweep", "find_knee", "slo", "soak",
    "agents", "warmup", "window", "tolerance", "max_agents", "compare_synthetic", "seed", "same_text",
    "natural_output", "min_turns", "no_pin_slots", "wait_ready",
)  # fmt: skip


class StoredFlags(BaseModel):
    """``bench.json`` read back: the types the flags were written with (a damaged file is one clear error)."""

    model_config = ConfigDict(extra="ignore", strict=True)

    url: str | None = None
    url_redacted: bool = False
    model: str | None = None
    api_key_env: str | None = None
    sim: str | None = None
    offload_gib: float | None = Field(default=None, strict=False)
    workload: str = "agentic-hold"
    context: str = "40960"
    sweep: str | None = None
    find_knee: bool = False
    slo: str | None = None
    soak: str | None = None
    agents: int | None = None
    warmup: str = "120s"
    window: str = "300s"
    tolerance: float = Field(default=0.10, strict=False)
    max_agents: int = 1024
    compare_synthetic: bool = False
    seed: int = 0
    same_text: bool = False
    natural_output: bool = False
    min_turns: int | None = None
    no_pin_slots: bool = False
    wait_ready: str = "120s"


# Flags a resume may give again: how to reach the server, which a run directory does not keep whole.
RESUME_MAY_REPEAT = ("url", "api_key_env", "wait_ready")


def resumed_flags(ref: str, out: Path | None, given: dict[str, Any]) -> tuple[Path, dict[str, Any]]:
    """The run directory to continue and the flags it was started with (plus how to reach the server again)."""
    path = Path(ref)
    if not path.is_dir() and len(path.parts) == 1 and (run_root(out) / ref).is_dir():
        path = run_root(out) / ref  # a run id, as `agentload runs` lists it
    if not path.is_dir():
        raise ConfigError(f"--resume {ref}: no such run directory (nor a run id under {run_root(out)})")
    run = RunDir(path)
    if run.finished and run.result().incomplete is None:
        raise ConfigError(f"--resume {ref}: that run finished; there is nothing to continue")
    stored = run.invocation()
    unknown = sorted(set(stored) - {*INVOCATION_FLAGS, "url_redacted"})
    if unknown:
        raise CheckpointError(f"{path}/bench.json has flags this agentload does not know ({', '.join(unknown)})")
    try:
        StoredFlags.model_validate(stored)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise CheckpointError(f"{path}/bench.json: {where}: {first['msg']}; the file is damaged") from exc
    defaults = {name: p.default for name, p in inspect.signature(bench).parameters.items()}
    extra = [k for k in INVOCATION_FLAGS if k not in RESUME_MAY_REPEAT and given[k] != defaults[k]]
    if extra:
        named = ", ".join("--" + k.replace("_", "-") for k in extra)
        raise ConfigError(f"--resume continues the run with the flags it was started with; drop {named}")
    flags = {**given, **stored}
    # A run started before slot pinning existed let the server choose slots: resumed, it goes on the same way.
    if "no_pin_slots" not in stored:
        flags["no_pin_slots"] = True
    if stored.get("url_redacted"):
        # The URL held credentials, which the run directory does not keep: the same server, given again.
        if given["url"] is None or redact_url(given["url"]) != stored["url"]:
            raise ConfigError(f"the run was started against {stored['url']}; give that --url again to resume it")
        flags["url"] = given["url"]
    elif given["url"] is not None and given["url"] != stored.get("url"):
        raise ConfigError(
            f"the run was started against {redact_url(str(stored.get('url')))}; a resume continues against it "
            "(drop --url, or start a new run)"
        )
    flags.pop("url_redacted", None)
    for k in ("api_key_env", "wait_ready"):
        if given[k] != defaults[k]:
            flags[k] = given[k]
    return path, flags


def run(
    *,
    url: str | None,
    model: str | None,
    api_key_env: str | None,
    sim: str | None,
    workload: str,
    context: str,
    offload_gib: float | None = None,
    sweep: str | None,
    find_knee: bool,
    slo: str | None,
    soak: str | None,
    agents: int | None,
    warmup: str,
    window: str,
    tolerance: float,
    max_agents: int,
    compare_synthetic: bool,
    seed: int,
    same_text: bool,
    natural_output: bool,
    min_turns: int | None,
    no_pin_slots: bool,
    wait_ready: str,
    out: Path | None,
    json_out: bool,
    resume_dir: Path | None,
    dashboard: bool = False,
    dashboard_port: int = 0,
    dashboard_interval_s: float | None = None,
    executor: ExecutorSpec | None = None,
) -> None:
    """The bench command after its flags are settled (``resume_dir``: continue that run directory)."""
    invocation = {k: v for k, v in locals().items() if k in INVOCATION_FLAGS}
    if url and sim:
        raise ConfigError("use --url (a real server) or --sim (the simulator), not both")
    if dashboard and not url:
        raise ConfigError(
            "--dashboard shows a run as it happens; without --url the bench runs the simulator in simulated time "
            "(serve it with `agentload sim` and bench it with --url to watch it)"
        )
    executor = executor or ExecutorSpec()
    if executor.kind == "ray" and not url:
        raise ConfigError(
            "--executor ray runs the agents against a server over HTTP; without --url the bench runs the simulator in "
            "process on simulated time, which one process runs whole (serve it with `agentload sim` and give --url)"
        )
    if offload_gib is not None and url:
        raise ConfigError("--offload-gib sizes the simulator's CPU tier; a real server's is its own (--sim only)")
    if model and not url:
        raise ConfigError("--model goes with --url; the simulator serves its profile's model")
    if api_key_env and not url:
        raise ConfigError("--api-key-env goes with --url; the simulator wants no key")
    modes = [m for m, on in (("sweep", sweep), ("find-knee", find_knee), ("soak", soak)) if on]
    if len(modes) > 1:
        raise ConfigError(f"choose one of --sweep, --find-knee, --soak (got {', '.join(modes)})")
    if not url and not sim:
        # Bare `agentload bench` searches the knee on the default simulated server; `--agents N` (or a mode)
        # alone still means what it says there.
        sim = DEFAULT_SIM
        if not modes and agents is None:
            find_knee, modes = True, ["find-knee"]
    contexts = parse_counts(context, "--context", MAX_CONTEXT)
    check_seed(seed)
    for flag, n in (("--agents", agents), ("--max-agents", max_agents)):
        if n is not None and n > MAX_AGENTS:
            raise ConfigError(f"{flag} {n:,}: at most {MAX_AGENTS:,}")
    warmup_s, window_s = parse_duration(warmup, "--warmup"), parse_duration(window, "--window")
    wait_ready_s = parse_duration(wait_ready, "--wait-ready")
    mode: Mode
    counts: list[int] = []
    if sweep:
        counts = parse_counts(sweep, "--sweep", MAX_AGENTS)
        mode = "grid" if len(contexts) > 1 else "sweep"
    elif find_knee:
        mode = "find-knee"
    elif soak:
        if agents is None:
            raise ConfigError("--soak needs --agents (the level to hold)")
        counts, mode, window_s = [agents], "soak", parse_duration(soak, "--soak")
    else:
        if agents is None:
            raise ConfigError("say what to run: --sweep, --find-knee, --soak DURATION --agents N, or --agents N")
        counts, mode = [agents], "single"
    wl = get_workload(workload)
    synthetic = get_workload("synthetic") if compare_synthetic else None
    slo_spec = parse_slo(slo) if slo else None

    behaviour: Behaviour | None = OracleBehaviour(default_book()) if workload == "suite" else None
    pool: tuple[int, int, str] | None = None
    slots: int | None = None  # llama.cpp's parallel slots, from the probe
    cluster: RayCluster | None = None
    if sim:
        profile = load_profile(sim)  # fail early on a bad name
        for c in contexts:
            if c > profile.max_model_len:
                raise ConfigError(f"--context {c} exceeds the profile's max-model-len {profile.max_model_len}")

        if offload_gib is not None:
            with_offload(profile, offload_gib)  # a bad size fails here, once

        def make_target() -> Target:
            return sim_target(sim, behaviour, offload_gib)

    else:
        assert url is not None
        key = read_api_key(api_key_env)
        asyncio.run(wait_for_server(url, key, wait_ready_s))
        pool, engine, slots, model = asyncio.run(probe_server(url, model, contexts, api_key_env))
        shared = http_target(url, model, engine, api_key=key)

        def make_target() -> Target:
            return shared

        if executor.kind == "ray":
            cluster = RayCluster(executor)
            cluster.start(LevelWorker, Endpoint(url, key))  # each actor opens its own connection to the server

    plan = BenchPlan(
        make_target=make_target,
        workload=wl,
        contexts=contexts,
        mode=mode,
        agents=counts,
        warmup_s=warmup_s,
        window_s=window_s,
        slo=slo_spec,
        tolerance=tolerance,
        max_agents=max_agents,
        synthetic=synthetic,
        seed=seed,
        same_text=same_text,
        exact_output=not natural_output,
        min_turns=min_turns,
        pin_slots=not no_pin_slots,
        settings={"workload": workload, "contexts": context},
        cluster=cluster,
    )
    store = RunStore(out)
    resumed: list[LevelSummary] = []
    created: str | None = None
    resume_from_s = 0.0
    if resume_dir is None:
        writer = store.create()
        if url is not None and redact_url(url) != url:
            invocation.update(url=redact_url(url), url_redacted=True)  # credentials stay out of the run directory
        writer.invocation(invocation)
    else:
        previous = RunDir(resume_dir)
        resumed = previous.levels()
        info = read_info(resume_dir)
        created = info.created if info is not None else None
        moved = previous.set_aside_unfinished(len(resumed))
        # Indexed in the history of the root the run lives in, not of --out (a resume may be given by its path).
        writer = RunWriter(resume_dir, on_finish=RunStore(resume_dir.parent).history.add)
        resume_from_s = previous.last_sample_time()
        kept = f"{len(resumed)} finished level(s) kept"
        aside = f"; the interrupted level's {moved} record(s) moved to records.interrupted.jsonl" if moved else ""
        err_console.print(f"[dim]resuming {escape(str(resume_dir))}: {kept}{aside}[/]")

    lost_levels: set[int] = set()

    def on_data(data: LevelData) -> None:
        # Written as each level ends, so a run killed later keeps every finished level's timeline.
        for raw in data.samples:
            writer.sample(data.level, raw.sample)
        if data.lost is not None:
            lost_levels.add(data.level)

    def on_level(s: LevelSummary) -> None:
        if s.level not in lost_levels:  # a level the server's loss cut short is measured again on resume
            writer.level(s)
        hit = s.prefix_hit_rate_effective  # both tiers' reuse where an offload tier loaded some
        ttft = s.ttft_s.p50
        ctx = "-" if s.context_mean is None else f"{s.context_mean:,.0f}"
        out = "-" if s.output_ratio is None else f"{s.output_ratio:.0%}"
        err_console.print(
            f"[dim]level {s.level}:[/] {s.agents:>4} agents × {s.context:,} tokens (server {ctx}) → "
            f"{s.output_tps:8.1f} out tok/s  {s.turns} turns{' [red](too few)[/]' if s.too_few_turns else ''}"
            f"  output {out} of asked  prefix hit {'-' if hit is None else f'{hit:.0%}'}"
            f"  TTFT p50 {'-' if ttft is None else f'{ttft:.2f}s'}  preemptions {s.preemptions or 0:.0f}"
        )
        for w in s.warnings:
            err_console.print(f"  [yellow]warning:[/] {escape(w)}")

    where = f"sim:{sim} (virtual time)" if sim else redact_url(url or "")
    err_console.print(
        f"[bold]agentload bench[/] {escape(where)} · workload {escape(workload)} · "
        f"{mode} · contexts {', '.join(f'{c:,}' for c in contexts)} · run {writer.run_id}"
    )

    board_failed = False  # the dashboard could not start (its port in use): the run never began

    async def go() -> tuple[RunResult, list[LevelData]]:
        nonlocal board_failed
        if cluster is not None:
            await cluster.measure_offsets()
            plan.settings["executor"] = cluster.describe()
            err_console.print(f"[dim]{escape(cluster.describe())}[/]")
        try:
            if not dashboard:
                return await run_bench(plan, pool=pool, slots=slots, on_level=on_level, on_data=on_data,
                                       sink=writer.record, run_id=writer.run_id, resumed=resumed, created=created,
                                       resume_from_s=resume_from_s)  # fmt: skip
            meta = {"mode": mode, "target": where, "workload": workload, "run_id": writer.run_id}
            async with contextlib.AsyncExitStack() as stack:
                try:
                    board = await stack.enter_async_context(
                        open_bench_board(LoopClock(), meta, port=dashboard_port, interval_s=dashboard_interval_s)
                    )
                except ConfigError:
                    board_failed = True
                    raise
                err_console.print(f"dashboard: {board.url}", markup=False, soft_wrap=True)

                def level_shown(s: LevelSummary) -> None:
                    on_level(s)
                    board.level_done(s)

                def recorded(r: RequestRecord) -> None:
                    writer.record(r)
                    board.record(r)

                return await run_bench(plan, pool=pool, slots=slots, on_level=level_shown, on_data=on_data,
                                       sink=recorded, run_id=writer.run_id, resumed=resumed, created=created,
                                       resume_from_s=resume_from_s, watch=board)  # fmt: skip
        finally:
            if not sim:
                await make_target().transport.aclose()

    try:
        result, data = run_virtual(go()) if sim else asyncio.run(go())
    except KeyboardInterrupt:
        if cluster is not None:
            cluster.close()
        writer.close()  # the records and finished levels gathered so far stay on disk
        err_console.print(
            f"interrupted; continue with: agentload bench --resume {writer.path}", markup=False, soft_wrap=True
        )
        raise typer.Exit(130) from None
    except BaseException:
        if cluster is not None:
            cluster.close()
        writer.close()  # the records gathered so far stay on disk
        if board_failed and resume_dir is None:
            shutil.rmtree(writer.path, ignore_errors=True)  # nothing ran: no run directory with only bench.json
        raise
    if cluster is not None:
        cluster.close()
    measured_nothing = not resumed and not any(r.ok for level in data for r in level.records)
    if result.incomplete is None and measured_nothing:
        # Not one turn succeeded: the run measured nothing about the server, so it gets no result and no history
        # row (the records stay on disk to say what failed).
        writer.close()
        raise no_turn_succeeded(data, url or "the simulator", writer.path)
    run_dir = writer.finish(result)
    if json_out:
        console.print_json(result.model_dump_json())
    else:
        print_result(result, console)
        where_saved = escape(str(run_dir.path))
        # Soft-wrapped: a path broken across lines at the console's width cannot be copied back into a command.
        console.print(f"[dim]saved {where_saved} · `agentload report {where_saved}` renders it[/]", soft_wrap=True)
    if result.incomplete is not None:
        saved = f"{writer.records_written} records and {writer.samples_written} metric samples"
        raise ServerLostError(
            f"{result.incomplete}; the run stopped. Saved {saved} and a result marked incomplete in {run_dir.path}"
        )


async def wait_for_server(url: str, key: str | None, timeout_s: float) -> None:
    """Wait for a server that is still coming up, saying so on stderr every 10 s: what it waits for, for how long,
    and that ``--wait-ready`` sets it (a wrong port looks like a server still loading, and is waited for in vain)."""
    server, transport = signed_transport(url, key)  # the poll carries the run's credentials, its URL none
    poller = SignalPoller(server.base, transport=transport)
    said: list[str] = []

    def report(line: str) -> None:
        why = (
            " — a server still loading refuses connections or answers /health 503 until it is ready; "
            f"--wait-ready sets how long to wait (now {timeout_s:g} s; a wrong URL or port is waited for in vain)"
        )
        err_console.print(line + ("" if said else why), markup=False, soft_wrap=True)
        said.append(line)

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
