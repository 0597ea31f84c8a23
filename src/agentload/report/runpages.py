"""The report of a fleet run and of a suite run: the same self-contained offline page as a bench report
(``base.html.j2``: plotly inlined, figures as JSON blocks), laid out for what those runs measure.

A fleet run: its agents (outcome, turns, tokens, TTFT, tool calls), the totals, and the width decisions — where
it started and why, and every change the limiter made, drawn over time per segment. A suite run: the test ×
agent-count matrix of pass rates (passes ÷ tests scored, with the counts of scored, unscored and not run beside
each), the pooled rate and the timing per level, and pass rate against agents.
Everything is read from the saved files (``results.json``, ``suite.json``); nothing is recomputed but the
grouping of what is there (a suite's level figures are compiled again from its stored verdicts, so a file saved
before a figure changed reads as one saved now).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import plotly.graph_objects as go
from rich import box
from rich.console import Console
from rich.table import Table

from agentload.errors import CheckpointError
from agentload.fleet.results import FleetResult
from agentload.report.console import NaturalWidth
from agentload.report.figures import FONT, HEIGHT, colours
from agentload.report.html import Plot, ReportStats, as_plot, environment, page_frame, save_page
from agentload.report.text import DASH, num, pct, secs, tokens
from agentload.store.catalog import FLEET_RESULTS
from agentload.store.suiterun import SUITE_RESULT
from agentload.suite.results import SuiteRun, TestSummary, counts, cut_short, load_run


def load_fleet(path: Path) -> FleetResult:
    """A fleet run's compiled result; one clear error when the run never finished a segment or the file is bad."""
    file = path / FLEET_RESULTS
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise CheckpointError(
            f"{path} has no {FLEET_RESULTS}: the fleet run did not finish a segment "
            f"(continue it with: agentload run --resume {path})"
        ) from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"cannot read {file}: {getattr(exc, 'strerror', None) or exc}") from exc
    try:
        return FleetResult.model_validate_json(text)
    except ValueError as exc:
        raise CheckpointError(f"{file} is not a fleet result ({str(exc).splitlines()[0]})") from exc


def load_suite(path: Path) -> SuiteRun:
    if not (path / SUITE_RESULT).is_file():
        raise CheckpointError(f"{path} has no {SUITE_RESULT}: the suite run did not finish")
    return load_run(path / SUITE_RESULT)


def _agents(n: int) -> str:
    return f"{n} agent{'s' * (n != 1)}"


def _layout(fig: go.Figure, title: str) -> go.Figure:
    fig.update_layout(
        title={"text": title, "x": 0.01, "xanchor": "left"},
        template="plotly_white",
        height=HEIGHT,
        font={"family": FONT, "size": 13},
        margin={"l": 60, "r": 20, "t": 60, "b": 50},
        legend={"orientation": "h", "yanchor": "top", "y": -0.18, "x": 0},
    )
    return fig


def width_over_time(result: FleetResult) -> go.Figure:
    """The width the run allowed, as steps over each segment's seconds (one line per segment)."""
    fig = go.Figure()
    for seg, colour in zip(result.segments, colours(len(result.segments)), strict=True):
        xs, ys = [0.0], [seg.start_width]
        for change in seg.limit_history:
            xs.append(change.t)
            ys.append(change.new)
        if seg.wall_s is not None:
            xs.append(seg.wall_s)
            ys.append(ys[-1])
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=ys,
                mode="lines+markers",
                line={"shape": "hv", "color": colour},
                name=f"segment {seg.segment} ({seg.mode.value})",
                hovertemplate="%{y} agents at %{x:.1f} s<extra></extra>",
            )
        )
    fig.update_xaxes(title={"text": "seconds into the segment"})
    fig.update_yaxes(title={"text": "agents allowed at once"}, rangemode="tozero")
    return _layout(fig, "Width over time (the limiter's decisions)")


def pass_rates(run: SuiteRun) -> go.Figure:
    """Pass rate against agents, one line per test (the pooled rate bold)."""
    fig = go.Figure()
    agents = [lv.agents for lv in run.levels]
    tests = [s.test_id for s in run.levels[0].per_test] if run.levels else []
    for test in tests:
        ys = [next((s.pass_rate for s in lv.per_test if s.test_id == test), None) for lv in run.levels]
        fig.add_trace(go.Scatter(x=agents, y=ys, mode="lines+markers", name=test, line={"width": 1}))
    fig.add_trace(
        go.Scatter(
            x=agents,
            y=[lv.pooled_pass_rate for lv in run.levels],
            mode="lines+markers",
            name="pooled",
            line={"width": 4, "color": "black"},
        )
    )
    fig.update_xaxes(title={"text": "agents at once"}, tickmode="array", tickvals=agents)
    fig.update_yaxes(title={"text": "pass rate"}, range=[0, 1.05], tickformat=".0%")
    return _layout(fig, "Pass rate against agents")


def text_columns(rows: Sequence[Sequence[str]]) -> list[bool]:
    """Which columns hold words rather than figures (left-aligned; figures stay right-aligned to compare)."""
    width = max((len(r) for r in rows), default=0)
    return [not all(r[i][:1].isdigit() or r[i] in (DASH, "") for r in rows if i < len(r)) for i in range(width)]


@dataclass
class Section:
    """One run on the page: headline facts, tables (headers + rows), notes and plots."""

    label: str
    colour: str
    facts: list[tuple[str, str]]
    tables: list[tuple[str, list[str], list[list[str]]]]
    warnings: list[str] = field(default_factory=list)
    plots: list[Plot] = field(default_factory=list)


def fleet_section(label: str, colour: str, r: FleetResult, index: int) -> Section:
    t = r.totals
    facts = [
        ("fleet", r.fleet),
        ("server", r.server),
        ("model", r.model),
        ("mode", r.mode.value),
        (
            "agents",
            f"{t.agents}: {t.done} done, {t.failed} failed, {t.skipped} skipped, {t.interrupted} interrupted, "
            f"{t.unstarted} not started",
        ),
        ("turns", f"{t.turns:,} ({r.turns_per_s:.2f} per second in the last segment)"),
        ("tokens", f"{t.prompt_tokens:,} prompt ({t.cached_tokens:,} cached), {t.completion_tokens:,} completion"),
        ("wall clock", f"{r.wall_s:.1f} s (last segment)"),
        ("width", f"started at {r.start_width}: {r.start_reason}"),
        ("settled width", f"{r.settled_width:.1f} (time-weighted, second half of the last segment)"),
        ("limiter", f"{len(r.limiter.history)} changes, ends at {r.limiter.limit}, parked {r.limiter.parked_total}×"),
        ("segments", f"{len(r.segments)}" + (f" (resumed {len(r.segments) - 1}×)" if len(r.segments) > 1 else "")),
    ]
    warnings = list(r.warnings)
    if r.server_failure is not None:
        warnings.insert(0, f"Interrupted: the server failed — {r.server_failure}; the run is resumable.")
    elif t.unfinished:
        warnings.insert(0, f"Interrupted: {t.unfinished} agents left to run; the run is resumable.")
    agents = [
        [
            a.agent_id,
            a.task_id,
            str(a.wave),
            a.outcome,
            str(a.turns),
            str(a.attempts),
            tokens(a.prompt_tokens),
            tokens(a.cached_tokens),
            tokens(a.completion_tokens),
            str(a.tool_calls),
            num(a.wall_s),
            secs(a.ttft_p50_s),
            a.stop_reason or a.detail or DASH,
        ]
        for a in r.agents
    ]
    changes = [
        [str(s.segment), f"{c.t:.1f}", f"{c.old} → {c.new}", c.reason] for s in r.segments for c in s.limit_history
    ]
    segments = [
        [str(s.segment), s.mode.value, str(s.start_width), str(s.turns), num(s.wall_s), s.reason] for s in r.segments
    ]
    tables = [
        (
            "Agents",
            [
                "agent",
                "task",
                "wave",
                "outcome",
                "turns",
                "requests",
                "prompt",
                "cached",
                "completion",
                "tool calls",
                "wall s",
                "TTFT p50",
                "stop",
            ],
            agents,
        ),
        ("Segments", ["segment", "mode", "start width", "turns", "wall s", "why that width"], segments),
    ]
    if changes:
        tables.append(("Width changes", ["segment", "t (s)", "width", "why"], changes))
    return Section(label, colour, facts, tables, warnings, [as_plot(width_over_time(r), f"run{index}-width")])


def _test_cell(s: TestSummary) -> str:
    """One test at one agent count: the rate over its judged runs and what was not judged."""
    left = [f"{n} {what}" for n, what in ((s.unscored, "unscored"), (s.not_run, "not run")) if n]
    return f"{pct(s.pass_rate)} ({s.passed}/{s.scored}" + "".join(f", {x}" for x in left) + ")"


def suite_section(label: str, colour: str, run: SuiteRun, index: int) -> Section:
    facts = [
        ("suite", run.suite_version),
        ("server", run.endpoint),
        ("model", run.model),
        ("started", run.started_at.isoformat(timespec="seconds")),
        ("levels", ", ".join(_agents(lv.agents) for lv in run.levels) or DASH),
    ]
    headers = ["test", "category", "checks", *(_agents(lv.agents) for lv in run.levels)]
    rows: list[list[str]] = []
    if run.levels:
        for s in run.levels[0].per_test:
            cells = []
            for lv in run.levels:
                mine = next((x for x in lv.per_test if x.test_id == s.test_id), None)
                cells.append(DASH if mine is None else _test_cell(mine))
            rows.append([s.test_id, s.category.label, s.title, *cells])
    pooled = ["pooled", "", "passes ÷ tests scored",
              *(f"{pct(lv.pooled_pass_rate, 1)} ({counts(lv)})" for lv in run.levels)]  # fmt: skip
    seed = ["seed's figure", "", "passes ÷ (agents × tests): unjudged count as failed",
            *(pct(lv.seed_pooled_pass_rate, 1) for lv in run.levels)]  # fmt: skip
    figures = [
        ["completed / unscored / failed", *(f"{lv.completed} / {lv.unscored} / {lv.failed}" for lv in run.levels)],
        ["wall clock", *(secs(lv.wall_clock_s) for lv in run.levels)],
        ["median session", *(secs(lv.median_session_s) for lv in run.levels)],
        ["sessions per minute", *(num(lv.sessions_per_min) for lv in run.levels)],
        ["TTFT p50 / p95", *(f"{secs(lv.ttft_p50_s)} / {secs(lv.ttft_p95_s)}" for lv in run.levels)],
        ["requests failed", *(f"{lv.requests_failed:,} of {lv.requests:,}" for lv in run.levels)],
    ]
    tables = [
        ("Pass rate per test and agent count", headers, [*rows, pooled, seed]),
        ("Per level", ["", *(_agents(lv.agents) for lv in run.levels)], figures),
    ]
    stopped = cut_short(run)
    warnings = [f"Interrupted: {run.incomplete}; {stopped}"] if run.incomplete is not None else []
    plots = [as_plot(pass_rates(run), f"run{index}-passes")] if run.levels else []
    return Section(label, colour, facts, tables, warnings, plots)


def render_page(
    kind: str, sections: Sequence[Section], *, title: str | None = None, generated: datetime | None = None
) -> str:
    """The HTML page of fleet or suite runs (one section per run)."""
    plots = [p for s in sections for p in s.plots]
    default = (
        f"agentload {kind} · {sections[0].label}" if len(sections) == 1 else f"agentload · {len(sections)} {kind} runs"
    )
    return (
        environment()
        .get_template("runs.html.j2")
        .render(
            title=title or default,
            kind=kind,
            runs=sections,
            plots=plots,
            plot_count=len(plots),
            text_columns=text_columns,
            **page_frame(generated),
        )
    )


def _sections(kind: str, paths: Sequence[Path]) -> list[Section]:
    sections: list[Section] = []
    for i, (path, colour) in enumerate(zip(paths, colours(len(paths)), strict=True)):
        label = path.name if path.name not in {s.label for s in sections} else f"{path.name} ({i + 1})"
        if kind == "fleet":
            sections.append(fleet_section(label, colour, load_fleet(path), i))
        else:
            sections.append(suite_section(label, colour, load_suite(path), i))
    return sections


def write_run_page(kind: str, paths: Sequence[Path], output: Path, *, title: str | None = None) -> ReportStats:
    """Render the fleet or suite runs in ``paths`` into ``output``; its size, plot count and render time."""
    started = time.perf_counter()
    return save_page(output, render_page(kind, _sections(kind, paths), title=title), started)


def print_run_page(kind: str, paths: Sequence[Path], console: Console) -> None:
    """The same sections as rich tables, for ``report --print``."""
    for section in _sections(kind, paths):
        facts = Table(title=f"{kind} run {section.label}", title_justify="left", show_header=False, box=box.SIMPLE)
        facts.add_column(style="bold")
        facts.add_column(overflow="fold")
        for name, value in section.facts:
            facts.add_row(name, value)
        console.print(facts)
        for warning in section.warnings:
            console.print(f"warning: {warning}", style="yellow", markup=False)
        for heading, headers, rows in section.tables:
            table = Table(title=heading, title_justify="left", box=box.SIMPLE_HEAD)
            for h in headers:
                table.add_column(h, overflow="fold")
            for row in rows:
                table.add_row(*row)
            console.print(NaturalWidth(table), crop=False)
