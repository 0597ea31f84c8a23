"""``agentload bench``: how many agents this deployment carries before it stops behaving like one, and why.

The command parses its flags into ``BenchSettings`` (``bench.settings``), opens the run (``bench.session``) and
composes what hears it: the console, the run store (``store.benchrun``) and, with ``--dashboard``, the live page.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from agentload.bench.results import RunResult
from agentload.bench.session import BenchSession
from agentload.bench.settings import BenchSettings
from agentload.cli.benchview import ConsoleLines, NothingRan, measure_shown
from agentload.cli.common import (
    ApiKeyEnvOption,
    DashboardRateOption,
    ExecutorOption,
    JsonOption,
    OutOption,
    RayAddressOption,
    WorkersOption,
    err_console,
    executor_spec,
    reports_errors,
)
from agentload.dashboard.server import dashboard_interval
from agentload.endpoint.apikey import read_api_key
from agentload.errors import ConfigError, ServerLostError
from agentload.store.benchrun import BenchRecorder, resumable
from agentload.store.rundir import INVOCATION, RunDir
from agentload.suite.app import oracle_book


def _flag(name: str, *decls: str, min: float | None = None, max: float | None = None) -> Any:
    """The option of a settings field: its help is the field's description (declared once, with its type and
    default, in ``BenchSettings``)."""
    return typer.Option(*decls, help=BenchSettings.model_fields[name].description, min=min, max=max)


_D = BenchSettings()  # the flags' defaults


@reports_errors
def bench(
    url: Annotated[str | None, _flag("url")] = _D.url,
    model: Annotated[str | None, _flag("model")] = _D.model,
    api_key_env: ApiKeyEnvOption = _D.api_key_env,
    sim: Annotated[str | None, _flag("sim")] = _D.sim,
    offload_gib: Annotated[float | None, _flag("offload_gib", min=0.0)] = _D.offload_gib,
    workload: Annotated[str, _flag("workload")] = _D.workload,
    context: Annotated[str, _flag("context")] = _D.context,
    sweep: Annotated[str | None, _flag("sweep")] = _D.sweep,
    find_knee: Annotated[bool, _flag("find_knee", "--find-knee")] = _D.find_knee,
    slo: Annotated[str | None, _flag("slo")] = _D.slo,
    soak: Annotated[str | None, _flag("soak")] = _D.soak,
    agents: Annotated[int | None, _flag("agents", min=1)] = _D.agents,
    warmup: Annotated[str, _flag("warmup")] = _D.warmup,
    window: Annotated[str, _flag("window")] = _D.window,
    tolerance: Annotated[float, _flag("tolerance", min=0.01, max=0.9)] = _D.tolerance,
    max_agents: Annotated[int, _flag("max_agents", min=1)] = _D.max_agents,
    compare_synthetic: Annotated[bool, _flag("compare_synthetic")] = _D.compare_synthetic,
    out: OutOption = None,
    json_out: JsonOption = False,
    seed: Annotated[int, _flag("seed")] = _D.seed,
    same_text: Annotated[bool, _flag("same_text", "--same-text")] = _D.same_text,
    natural_output: Annotated[bool, _flag("natural_output", "--natural-output")] = _D.natural_output,
    min_turns: Annotated[int | None, _flag("min_turns", min=1)] = _D.min_turns,
    no_pin_slots: Annotated[bool, _flag("no_pin_slots", "--no-pin-slots")] = _D.no_pin_slots,
    wait_ready: Annotated[str, _flag("wait_ready")] = _D.wait_ready,
    reply_tokens: Annotated[int | None, _flag("reply_tokens", min=1)] = _D.reply_tokens,
    time_scale: Annotated[float | None, _flag("time_scale", min=0.0)] = _D.time_scale,
    trace_speed: Annotated[float | None, _flag("trace_speed")] = _D.trace_speed,
    trace_timing: Annotated[str | None, _flag("trace_timing")] = _D.trace_timing,
    trace_repeat: Annotated[bool | None, _flag("trace_repeat", "--trace-repeat/--no-trace-repeat")] = _D.trace_repeat,
    start: Annotated[str | None, _flag("start")] = _D.start,
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
    flags = {k: v for k, v in locals().items() if k in BenchSettings.model_fields}
    where = None if resume is None else resumable(resume, out)
    settings = (BenchSettings.model_validate(flags) if where is None
                else BenchSettings.resumed(RunDir(where).invocation(), flags, where / INVOCATION))  # fmt: skip
    spec = executor_spec(executor, ray_address, workers)
    interval_s = dashboard_interval(dashboard, dashboard_rate)
    if dashboard and not settings.url:
        raise ConfigError(
            "--dashboard shows a run as it happens; without --url the bench runs the simulator in simulated time "
            "(serve it with `agentload sim` and bench it with --url to watch it)"
        )
    shown = ConsoleLines()
    key = read_api_key(settings.api_key_env) if settings.url else None
    session = BenchSession.open(settings, key=key, executor=spec, scenarios=oracle_book, note=shown.note)
    try:
        recorder = BenchRecorder.create(out, settings.stored()) if where is None else BenchRecorder.resume(where)
        result = _run(session, recorder, shown, dashboard_port if dashboard else None, interval_s)
    finally:
        session.close()
    _show(result, recorder, shown, json_out)


def _run(session: BenchSession, recorder: BenchRecorder, shown: ConsoleLines, port: int | None,
         interval_s: float | None) -> RunResult:  # fmt: skip
    """Measure, the recorder first to hear each level; an interrupted run stays on disk, resumable."""
    shown.opened(session.settings, recorder)
    try:
        result, data = session.drive(measure_shown(session, recorder, shown, port, interval_s))
        session.check_measured(result, data, recorder.resumed, recorder.path)  # no result when nothing succeeded
        return result
    except KeyboardInterrupt:
        recorder.close()  # the records and finished levels gathered so far stay on disk
        err_console.print(
            f"interrupted; continue with: agentload bench --resume {recorder.path}", markup=False, soft_wrap=True
        )
        raise typer.Exit(130) from None
    except NothingRan:
        recorder.discard()  # no run directory with only bench.json
        raise
    except BaseException:
        recorder.close()  # the records gathered so far stay on disk (they say what failed)
        raise


def _show(result: RunResult, recorder: BenchRecorder, shown: ConsoleLines, json_out: bool) -> None:
    """The result saved and printed; a run that lost its server ends in an error."""
    run_dir = recorder.finish(result)
    shown.finished(result, run_dir.path, json_out)
    if result.incomplete is not None:
        saved = f"{recorder.writer.records_written} records and {recorder.writer.samples_written} metric samples"
        raise ServerLostError(
            f"{result.incomplete}; the run stopped. Saved {saved} and a result marked incomplete in {run_dir.path}"
        )
