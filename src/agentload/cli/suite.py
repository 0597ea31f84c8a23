"""``agentload suite``: run the behaviour suite with N agents at once and print what they got right, and how fast.

Without ``--url`` it starts the embedded simulator in this process (127.0.0.1, a free port) with the oracle
behaviour, which answers every test correctly — a self-check of the harness and a baseline for the figures. The
command parses the flags into ``suite.app.SuiteSettings``, runs ``suite.app.run_suite_app`` with progress on
stderr, saves the run and prints it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Annotated

import typer
from rich.markup import escape

from agentload.cli.common import (
    ApiKeyEnvOption,
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
from agentload.endpoint.apikey import resolve_key_env
from agentload.errors import ConfigError, ServerLostError
from agentload.report.suiteview import render_suite_level
from agentload.store.runstore import run_root, save_suite_run
from agentload.suite.app import EMBEDDED_PROFILE, SuiteSettings, raise_if_unreachable, run_suite_app, summary
from agentload.suite.cases.stress import PAYLOAD_TOKENS
from agentload.suite.progress import BarProgress, LineProgress
from agentload.suite.results import SuiteRun, cut_short
from agentload.suite.runner import DEFAULT_MAX_TOKENS, check_agent_counts

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


def _note(text: str) -> None:
    err_console.print(f"[dim]{escape(text)}[/]")


def _run(settings: SuiteSettings) -> SuiteRun:
    """The run, with a bar on a terminal's stderr and progress lines on any other."""
    shown = BarProgress(err_console) if err_console.is_terminal else LineProgress(err_console)
    with shown.progress if isinstance(shown, BarProgress) else contextlib.nullcontext():
        return asyncio.run(run_suite_app(settings, on_level=shown.level, on_test=shown.test_done, note=_note))


# The command's own options (the shared ones are cli/common's), named once here so the signature reads as a list.
UrlOption = Annotated[
    str | None, typer.Option("--url", help="OpenAI-compatible server (…/v1). Default: the embedded simulator.")
]
ModelOption = Annotated[
    str | None, typer.Option("--model", "-m", help="Model to request (default: the one --url serves).")
]
AgentsOption = Annotated[int | None, typer.Option("--agents", "-n", help="Agents at once (default 1).")]
SweepOption = Annotated[str | None, typer.Option("--sweep", help="Several agent counts in turn, e.g. 1,4,16,64.")]
TestsOption = Annotated[str | None, typer.Option("--tests", help="Only these tests, e.g. T1,T5 (default: all).")]
SkipHopOption = Annotated[bool, typer.Option("--skip-hop", help="Leave out the 50-hop relay (H1).")]
ProfileOption = Annotated[
    str | None, typer.Option("--profile", "-p", help=f"Embedded simulator's profile (default {EMBEDDED_PROFILE}).")
]
PayloadTokensOption = Annotated[
    int,
    typer.Option(
        "--payload-tokens",
        help="Size of T11's large tool result in BPE tokens (1.91 characters each); lower it for short contexts.",
    ),
]
MaxTokensOption = Annotated[
    int,
    typer.Option(
        "--max-tokens",
        help=f"Output cap per turn, tokens (default {DEFAULT_MAX_TOKENS:,}: a suite turn is a tool call or a short "
        "answer, so this leaves a reasoning model room and still ends a turn a weak model rambles in — uncapped, one "
        f"wrote 8,106 tokens in one turn, 325 s; the cap counts against the context, as the prompt does; at most "
        f"{MAX_TOKENS:,}).",
    ),
]


@reports_errors
def suite(
    url: UrlOption = None,
    model: ModelOption = None,
    agents: AgentsOption = None,
    sweep: SweepOption = None,
    tests: TestsOption = None,
    skip_hop: SkipHopOption = False,
    out: OutOption = None,
    as_json: JsonOption = False,
    api_key_env: ApiKeyEnvOption = None,
    profile: ProfileOption = None,
    payload_tokens: PayloadTokensOption = PAYLOAD_TOKENS,
    max_tokens: MaxTokensOption = DEFAULT_MAX_TOKENS,
    executor: ExecutorOption = "local",
    ray_address: RayAddressOption = None,
    workers: WorkersOption = None,
) -> None:
    """Run the behaviour suite (T1–T17 and the H1 relay) with N agents at once; pass rates, timing, TTFT."""
    counts = parse_counts(agents, sweep)
    if url is not None and profile is not None:
        raise ConfigError("--profile sets up the embedded simulator; it does not apply with --url")
    if max_tokens < 1:
        raise ConfigError(f"--max-tokens must be at least 1, got {max_tokens}")
    if max_tokens > MAX_TOKENS:
        raise ConfigError(f"--max-tokens {max_tokens:,}: at most {MAX_TOKENS:,}")
    if payload_tokens > MAX_TOKENS:
        raise ConfigError(f"--payload-tokens {payload_tokens:,}: at most {MAX_TOKENS:,}")
    ids = parse_tests(tests)
    settings = SuiteSettings(
        url=url,
        model=model,
        key_env=resolve_key_env(api_key_env),
        profile=profile or EMBEDDED_PROFILE,
        tests=None if ids is None else tuple(ids),
        skip_hop=skip_hop,
        counts=tuple(counts),
        payload_tokens=payload_tokens,
        max_tokens=max_tokens,
        executor=executor_spec(executor, ray_address, workers),
    )
    settings.selected()  # an unknown test id fails here, before a server is asked anything
    root = run_root(out)
    if root.exists() and not root.is_dir():
        raise ConfigError(f"the root of runs {root} is a file; give a directory with --out")
    try:
        run = _run(settings)
    except KeyboardInterrupt:
        err_console.print("interrupted: no results written")
        raise typer.Exit(130) from None
    path = save_suite_run(run, root)
    err_console.print(f"[dim]results with every transcript: {escape(str(path))}[/]")
    if as_json:
        typer.echo(json.dumps(summary(run), indent=2))
    else:
        _print(run)
    if run.incomplete is not None:
        done = sum(len(a.tests) for lv in run.levels for a in lv.agent_results)
        raise ServerLostError(
            f"{run.incomplete}; the run stopped. Saved the {done} tests finished so far, marked incomplete, in {path}"
        )
    raise_if_unreachable(run)


def _print(run: SuiteRun) -> None:
    console.print(f"[bold]agentload suite {run.suite_version}[/] — {escape(run.model)} at {escape(run.endpoint)}")
    for level in run.levels:
        render_suite_level(level, console)
    stopped = cut_short(run)
    if stopped is not None:
        console.print(f"[bold yellow]cut short:[/] {escape(stopped)}; the tests not run are out of the rates")
