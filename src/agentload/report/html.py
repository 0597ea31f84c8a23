"""One self-contained HTML report for one or more saved runs: plotly's JavaScript inlined, no network at all.

The report must open on an air-gapped machine, in a mail attachment, years later: so plotly.js (about 4.8 MB)
is embedded once, each figure travels as a JSON block (``<script type="application/json">``, which the browser
never executes), and one small script draws them all. When every plot has been drawn the script sets
``<body data-plots-drawn="N">``, and ``data-plots-failed`` (plus a console error) if one cannot be — the
browser test waits for either. Reports render from the saved run directories
only (accumulate, then compile: guidellm's ``benchmark/schemas`` do the same), never from a live benchmark.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import jinja2
import plotly
import plotly.graph_objects as go
import plotly.offline

from agentload import __version__
from agentload.errors import CheckpointError, ConfigError
from agentload.report.figures import (
    RunData,
    colours,
    pass_rate_vs_agents,
    throughput_vs_agents,
    timeline,
    token_split,
    ttft_vs_agents,
)
from agentload.report.levels import LevelTable, level_table
from agentload.report.text import (
    CAUSES,
    capacity_sentence,
    evidence_rows,
    knee_context,
    knee_sentence,
    knee_short,
    num,
    ratio_text,
    synthetic_lines,
)
from agentload.store.atomic import write_atomic
from agentload.store.rundir import RunDir, best_output_tps


@dataclass(frozen=True)
class Plot:
    id: str
    json: str  # plotly's own JSON; it escapes "<", ">" and "/" so no string can close the <script> it sits in


@dataclass
class RunView:
    """What the template shows of one run (strings formatted here, so the template only lays them out)."""

    data: RunData
    index: int
    knees: list[str]
    evidence: list[tuple[str, list[tuple[str, str]]]]  # (heading, [(name, value)]) per knee
    capacity: list[str]
    table: LevelTable
    settings: list[tuple[str, str]]
    plots: list[Plot] = field(default_factory=list)
    no_samples: bool = False


def load_runs(dirs: Sequence[RunDir]) -> list[RunData]:
    """Read each run directory's result and samples; the same run given twice gets a distinct label."""
    results = [d.result() for d in dirs]
    seen: dict[str, int] = {}
    runs: list[RunData] = []
    for run_dir, result, colour in zip(dirs, results, colours(len(dirs)), strict=True):
        n = seen.get(result.run_id, 0)
        seen[result.run_id] = n + 1
        label = result.run_id if n == 0 else f"{result.run_id} ({n + 1})"
        runs.append(RunData(label=label, result=result, samples=run_dir.samples(), colour=colour))
    return runs


def as_plot(fig: go.Figure, plot_id: str) -> Plot:
    return Plot(id=plot_id, json=fig.to_json(validate=False, pretty=False))


def _one_line_headers(table: LevelTable) -> LevelTable:
    # The two-line headers are for the terminal; a browser wraps by itself ("preempt-\nions" → "preemptions").
    headers = [h.replace("-\n", "").replace("\n", " ") for h in table.headers]
    return dataclasses.replace(table, headers=headers)


def _view(run: RunData, index: int) -> RunView:
    r = run.result
    evidence = [
        (
            f"The knee at {k.where} agents ({knee_context(k)}) is put down to "
            f"{CAUSES.get(k.explanation.cause, k.explanation.cause)}; the numbers behind it, at the knee → past it:",
            evidence_rows(k.explanation.evidence),
        )
        for k in r.knee
        if k.explanation.evidence
    ]
    view = RunView(
        data=run,
        index=index,
        knees=[knee_sentence(k) for k in r.knee],
        evidence=evidence,
        capacity=[capacity_sentence(c) for c in r.capacity] + synthetic_lines(r),
        table=_one_line_headers(level_table(r)),
        settings=[(k, "—" if v is None else str(v)) for k, v in r.settings.items()],
    )
    view.plots.append(as_plot(token_split(run), f"run{index}-split"))
    over_time = timeline(run)
    if over_time is None:
        view.no_samples = True
    else:
        view.plots.append(as_plot(over_time, f"run{index}-timeline"))
    return view


def _comparison(runs: Sequence[RunData]) -> tuple[list[str], list[list[str]]]:
    headers = [
        "run",
        "date",
        "target",
        "model",
        "workload",
        "mode",
        "knee (agents)",
        "best output tok/s",
        "KV estimate (sessions)",
        "measured ÷ predicted",
        "real ÷ synthetic",
    ]
    rows = []
    for run in runs:
        r = run.result
        estimates = ", ".join(num(c.sessions) for c in r.capacity) or "—"
        ratios = ", ".join(ratio_text(k) or "—" for k in r.knee) or "—"
        rows.append(
            [
                run.label,
                r.created[:19].replace("T", " "),
                r.target,
                r.model,
                r.workload,
                r.mode,
                knee_short(r),
                num(best_output_tps(r), 0),
                estimates,
                ratios,
                num(r.real_over_synthetic, 2),
            ]
        )
    return headers, rows


def environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("agentload.report", "templates"),
        autoescape=True,  # every string from a run (ids, targets, notes) is data, never markup
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def render_report(runs: Sequence[RunData], *, title: str | None = None, generated: datetime | None = None) -> str:
    """The report's HTML for ``runs`` (one or more; several are compared side by side)."""
    if not runs:
        raise ConfigError("a report needs at least one run")
    overlay = [as_plot(throughput_vs_agents(runs), "throughput"), as_plot(ttft_vs_agents(runs), "ttft")]
    passes = pass_rate_vs_agents(runs)
    if passes is not None:
        overlay.append(as_plot(passes, "pass-rate"))
    views = [_view(run, i) for i, run in enumerate(runs)]
    headers, rows = _comparison(runs)
    default_title = f"agentload · {runs[0].label}" if len(runs) == 1 else f"agentload · {len(runs)} runs compared"
    return (
        environment()
        .get_template("report.html.j2")
        .render(
            title=title or default_title,
            runs=views,
            overlay=overlay,
            comparison_headers=headers,
            comparison_rows=rows,
            plot_count=len(overlay) + sum(len(v.plots) for v in views),
            **page_frame(generated),
        )
    )


def page_frame(generated: datetime | None) -> dict[str, str]:
    """What every page's frame (templates/base.html.j2) needs: the inlined plotly, the versions, the time."""
    return {
        "plotly_js": plotly.offline.get_plotlyjs(),
        "plotly_version": plotly.__version__,
        "agentload_version": __version__,
        "generated": (generated or datetime.now().astimezone()).isoformat(timespec="seconds"),
    }


@dataclass(frozen=True)
class ReportStats:
    path: Path
    bytes: int
    plots: int
    seconds: float


def save_page(output: Path, html: str, started: float) -> ReportStats:
    """Write a rendered page atomically; its size, plot count and the seconds since ``started`` (perf_counter)."""
    try:
        write_atomic(output, html)
    except CheckpointError as exc:
        why = getattr(exc.__cause__, "strerror", None) or exc
        raise ConfigError(f"cannot write the report to {output}: {why}") from exc
    plots = html.count('type="application/json" data-plot=')
    return ReportStats(path=output, bytes=len(html.encode()), plots=plots, seconds=time.perf_counter() - started)


def write_report(dirs: Sequence[RunDir], output: Path, *, title: str | None = None) -> ReportStats:
    """Render the runs in ``dirs`` into ``output`` (one file); returns its size, plot count and render time."""
    started = time.perf_counter()
    return save_page(output, render_report(load_runs(dirs), title=title), started)
