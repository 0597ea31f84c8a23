"""The ``agentload`` command: registers one module per command."""

from __future__ import annotations

import sys

import typer
from rich.markup import escape

# typer vendors click; its usage errors are not re-exported, and they are what a bad flag raises.
from typer._click.exceptions import NoArgsIsHelpError, UsageError

from agentload import __version__
from agentload.cli import bench as bench_cmd
from agentload.cli import calibrate
from agentload.cli import dashboard as dashboard_cmd
from agentload.cli import plan as plan_cmd
from agentload.cli import probe as probe_cmd
from agentload.cli import profiles as profiles_cmd
from agentload.cli import record as record_cmd
from agentload.cli import report as report_cmd
from agentload.cli import run as run_cmd
from agentload.cli import runs as runs_cmd
from agentload.cli import sim as sim_cmd
from agentload.cli import suite as suite_cmd
from agentload.cli.common import EXIT_USAGE, err_console

app = typer.Typer(
    name="agentload",
    help="How many AI agents can this LLM deployment really carry? Measure, explain, plan and simulate it.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"agentload {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """agentload: capacity of LLM servers for AI agents."""


app.command("bench")(bench_cmd.bench)
app.command("sim")(sim_cmd.sim)
app.command("profiles")(profiles_cmd.profiles)
app.command("plan")(plan_cmd.plan)
app.command("calibrate")(calibrate.calibrate)
app.command("probe")(probe_cmd.probe)
app.command("suite")(suite_cmd.suite)
app.command("run")(run_cmd.run)
app.command("runs")(runs_cmd.runs)
app.command("report")(report_cmd.report)
app.command("dashboard")(dashboard_cmd.dashboard)
app.command("record")(record_cmd.record)


def main() -> None:
    """The console script: typer's app, with a bad flag reported like every other bad input.

    typer shows a usage error (a port over 65535, ``nan`` for a float) in a boxed panel; agentload's rule is one
    ``error:`` line and exit 2, the same as a malformed config or trace.
    """
    try:
        code = app(standalone_mode=False)
    except NoArgsIsHelpError as exc:
        exc.show()
        sys.exit(EXIT_USAGE)
    except UsageError as exc:
        hint = f" (see `{exc.ctx.command_path} --help`)" if exc.ctx is not None else ""
        err_console.print(
            f"[bold red]error:[/] {escape(exc.format_message())}{escape(hint)}",
            markup=True,
            soft_wrap=True,
            highlight=False,
        )
        sys.exit(EXIT_USAGE)
    except typer.TyperException as exc:
        message = escape(exc.format_message())
        err_console.print(f"[bold red]error:[/] {message}", markup=True, soft_wrap=True, highlight=False)
        sys.exit(exc.exit_code)
    except typer.Abort:
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)
