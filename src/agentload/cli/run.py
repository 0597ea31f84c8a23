"""``agentload run FLEET.toml``: run a fleet of agents at the width the server can carry, resumable after a kill.

The command parses the flags into ``fleet.app.FleetSettings``, hands ``fleet.app.FleetApp`` the pieces only the
composition root may wire (the dashboard, the simulator's named behaviours), runs it — in simulated time for a
``--virtual`` run — and prints the result. Progress goes to stdout, or to stderr with ``--json`` so the JSON stays
alone on stdout.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

from agentload.cli.common import (
    ApiKeyEnvOption,
    DashboardRateOption,
    ExecutorOption,
    JsonOption,
    OutOption,
    RayAddressOption,
    WorkersOption,
    console,
    err_console,
    executor_spec,
    reports_errors,
)
from agentload.clock import run_virtual
from agentload.dashboard import open_board
from agentload.dashboard.server import dashboard_interval
from agentload.endpoint.apikey import resolve_key_env
from agentload.errors import ConfigError, EndpointError, ExecutorError
from agentload.fleet.app import FleetApp, FleetSettings
from agentload.fleet.checkpoint import read_manifest
from agentload.fleet.limiter import Mode
from agentload.fleet.results import FleetResult
from agentload.report.fleetview import render_summary
from agentload.store.runstore import run_root
from agentload.suite.app import make_behaviour

EXIT_AGENTS_FAILED = 1
PROGRESS_KINDS = ("auto", "live", "lines", "none")


# The command's own options (the shared ones are cli/common's), named once here so the signature reads as a list.
FleetArgument = Annotated[Path | None, typer.Argument(help="The FLEET.toml to run (optional with --resume).")]
ModeOption = Annotated[
    Mode | None,
    typer.Option(help="sequential, parallel (--width N) or auto (adaptive); default auto, on a resume the run's own."),
]
WidthOption = Annotated[
    int | None, typer.Option(min=1, help="parallel: agents live at once; auto: the width to start from.")
]
MaxWidthOption = Annotated[int | None, typer.Option(min=1, help="auto: never wider than this.")]
ResumeOption = Annotated[
    Path | None, typer.Option(help="Continue the run in this run directory (or of this run id under --out).")
]
UrlOption = Annotated[str | None, typer.Option(help="OpenAI-compatible server (default: the embedded simulator).")]
ModelOption = Annotated[str | None, typer.Option(help="Model for tasks that name none (default: the server's).")]
ProfileOption = Annotated[str, typer.Option(help="Profile of the embedded simulator (without --url).")]
BehaviourOption = Annotated[
    str, typer.Option(help="The embedded simulator's model: agent (calls the fleet's tools) or filler (pure load).")
]
StopAfterOption = Annotated[
    float | None, typer.Option(min=0.0, help="Stop after this many seconds, leaving the run resumable.")
]
VirtualOption = Annotated[
    bool, typer.Option(help="Without --url: run the simulator in process, in simulated time (no waiting).")
]
ProgressOption = Annotated[str, typer.Option(help="auto, live, lines or none (with --json: on stderr).")]
DashboardOption = Annotated[
    bool, typer.Option(help="Serve a live page with controls on 127.0.0.1; its URL (with a token) is printed.")
]
DashboardPortOption = Annotated[int, typer.Option(min=0, max=65535, help="The dashboard's port (0: a free one).")]


@reports_errors
def run(
    fleet: FleetArgument = None,
    mode: ModeOption = None,
    width: WidthOption = None,
    max_width: MaxWidthOption = None,
    resume: ResumeOption = None,
    out: OutOption = None,
    url: UrlOption = None,
    model: ModelOption = None,
    api_key_env: ApiKeyEnvOption = None,
    profile: ProfileOption = "laptop",
    behaviour: BehaviourOption = "agent",
    stop_after: StopAfterOption = None,
    virtual: VirtualOption = False,
    progress: ProgressOption = "auto",
    dashboard: DashboardOption = False,
    dashboard_port: DashboardPortOption = 0,
    dashboard_rate: DashboardRateOption = None,
    executor: ExecutorOption = "local",
    ray_address: RayAddressOption = None,
    workers: WorkersOption = None,
    as_json: JsonOption = False,
) -> None:
    """Run a fleet of agent tasks at the concurrency the server can carry; checkpointed, resumable after a kill."""
    if progress not in PROGRESS_KINDS:
        raise ConfigError(f"--progress {progress!r}: use auto, live, lines or none")
    resolve_key_env(api_key_env)  # a variable named but unset fails here, not as a 401 per request
    spec = executor_spec(executor, ray_address, workers)
    if resume is not None and not resume.is_dir() and len(resume.parts) == 1 and (run_root(out) / resume).is_dir():
        resume = run_root(out) / resume  # a run id, as `agentload runs` lists it, under the root of runs
    settings = FleetSettings(
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
        progress=progress,
        virtual=virtual,
        dashboard=dashboard,
        dashboard_port=dashboard_port,
        dashboard_interval_s=dashboard_interval(dashboard, dashboard_rate),
        executor=spec,
    )
    app = FleetApp(settings, open_board=open_board, behaviour=make_behaviour, say=_say)
    result = _execute(app, as_json)
    run_dir = app.run_dir or run_root(out) / result.run_id
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


def _say(message: str) -> None:
    err_console.print(message, markup=False, soft_wrap=True)


def _execute(app: FleetApp, as_json: bool) -> FleetResult:
    """The run, in simulated time where it is virtual; an interrupted one says how to resume it."""
    s = app.settings
    try:
        virtual = s.virtual or (s.resume is not None and read_manifest(s.resume).virtual)
        if s.executor.kind == "ray" and virtual:
            raise ConfigError(
                "--executor ray sends the requests from other processes, and a --virtual run's "
                "simulator lives in this one: serve it with agentload sim and give --url"
            )
        # With --json the progress goes to stderr: stdout holds the JSON alone.
        shown = err_console if as_json else console
        return run_virtual(app.run(shown)) if virtual else asyncio.run(app.run(shown))
    except KeyboardInterrupt:
        err_console.print(
            f"interrupted; continue with: agentload run --resume {app.run_dir or 'RUN_DIR'}", markup=False
        )
        raise typer.Exit(130) from None
    except ExecutorError as exc:
        raise ExecutorError(f"{exc}; continue with: agentload run --resume {app.run_dir or 'RUN_DIR'}") from None
