"""The report's plotly figures, built from saved runs (``RunResult`` + the server samples).

Figures across runs overlay one line per run (and per context size, for a context × agents grid), each run in
its own colour everywhere in the report, so runs compare at a glance; figures over time are one per run.

Every y value is a field of a ``LevelSummary`` or a ``ServerSample`` as saved, with one exception: the prefix
hit rate over time is the ratio of the server's two counters' increases between adjacent samples — how any
metrics dashboard draws a rate from counters, not a summary statistic (the per-level rates are bench's, in
``LevelSummary.prefix_hit_rate_server``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from agentload.bench.results import LevelSummary, RunResult
from agentload.endpoint.samples import ServerSample
from agentload.endpoint.scrape import prefix_hit_rate
from agentload.report.text import context_label, num, secs
from agentload.store.rundir import LevelSample

PALETTE: list[str] = list(qualitative.Plotly)
FONT = "system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif"
HEIGHT = 420


@dataclass(frozen=True)
class RunData:
    """One run as the report sees it: the saved result and samples, a label, and its colour."""

    label: str
    result: RunResult
    samples: Sequence[LevelSample]
    colour: str


def colours(n: int) -> list[str]:
    return [PALETTE[i % len(PALETTE)] for i in range(n)]


def _layout(fig: go.Figure, title: str, *, height: int = HEIGHT) -> go.Figure:
    fig.update_layout(
        title={"text": title, "x": 0.01, "xanchor": "left"},
        template="plotly_white",
        height=height,
        font={"family": FONT, "size": 13},
        margin={"l": 60, "r": 20, "t": 60, "b": 50},
        hovermode="closest",
        legend={"orientation": "h", "yanchor": "top", "y": -0.18, "x": 0},
    )
    return fig


@dataclass(frozen=True)
class _Series:
    run: RunData
    context: int
    levels: list[LevelSummary]  # sorted by agents
    name: str


def _series(runs: Sequence[RunData]) -> Iterator[_Series]:
    """One series per run and context size, levels in agent order."""
    for run in runs:
        contexts = list(dict.fromkeys(lv.context for lv in run.result.levels))
        for context in contexts:
            levels = sorted((lv for lv in run.result.levels if lv.context == context), key=lambda lv: lv.agents)
            name = run.label if len(contexts) == 1 else f"{run.label} · {context_label(context)}"
            yield _Series(run, context, levels, name)


def _dash(index: int) -> str:
    return ["solid", "dash", "dot", "dashdot", "longdash"][index % 5]


def _agents_axis(fig: go.Figure, runs: Sequence[RunData]) -> bool:
    """Agent counts usually double from level to level: a log axis when they span ≥ 8×, ticked at the levels.

    Returns whether the axis is logarithmic: shapes on a log axis take log10 positions, not data values.
    """
    agents = sorted({lv.agents for run in runs for lv in run.result.levels if lv.agents > 0})
    axis: dict[str, object] = {"title": {"text": "agents"}}
    log = bool(agents) and agents[-1] / agents[0] >= 8
    if log:
        ticks = _spread(agents)
        axis |= {"type": "log", "tickmode": "array", "tickvals": ticks, "ticktext": [str(a) for a in ticks]}
    fig.update_xaxes(**axis)
    return log


# Ticks on a log axis closer than this ratio print over each other (24 and 25 beside 1 and 64): the later one is
# left out, its level still plotted and named in its hover.
TICK_RATIO = 1.25


def _spread(values: Sequence[int]) -> list[int]:
    """The ascending agent counts to tick: the first and last always, others at least ``TICK_RATIO`` apart."""
    kept: list[int] = []
    for v in values:
        if not kept or v >= kept[-1] * TICK_RATIO:
            kept.append(v)
    if values and kept[-1] != values[-1]:
        if len(kept) > 1 and values[-1] < kept[-1] * TICK_RATIO:
            kept.pop()
        kept.append(values[-1])
    return kept


def _tick_seconds(value: float) -> str:
    return f"{value * 1e3:g} ms" if value < 1 else f"{value:g} s"


def _seconds_axis(values: Sequence[float | None]) -> dict[str, object]:
    """A log axis of seconds ticked 1-2-5 and labelled "200 ms", "1.50 s" (plotly's own log ticks say "2")."""
    present = [v for v in values if v is not None and v > 0]
    axis: dict[str, object] = {"type": "log", "title": {"text": "time to first token"}}
    if present:
        lo, hi = min(present) / 1.5, max(present) * 1.5
        ticks = [m * 10.0**e for e in range(-4, 4) for m in (1, 2, 5) if lo <= m * 10.0**e <= hi]
        axis |= {"tickmode": "array", "tickvals": ticks, "ticktext": [_tick_seconds(t) for t in ticks]}
    return axis


def throughput_vs_agents(runs: Sequence[RunData]) -> go.Figure:
    """Output tok/s against agents, the knee marked, and the KV-pool estimate as a dotted line."""
    fig = go.Figure()
    per_run_index = {id(run): 0 for run in runs}
    for s in _series(runs):
        dash = _dash(per_run_index[id(s.run)])
        per_run_index[id(s.run)] += 1
        _add_throughput_line(fig, s, dash)
        _add_knees(fig, s)
    for run in runs:
        _add_synthetic_arm(fig, run)
    log = _agents_axis(fig, runs)
    for s in _series(runs):
        _add_pool_estimates(fig, s, log)
    fig.update_yaxes(title={"text": "output tokens/s"}, rangemode="tozero")
    return _layout(fig, "Output throughput vs agents")


def _add_throughput_line(fig: go.Figure, s: _Series, dash: str) -> None:
    fig.add_trace(
        go.Scatter(
            x=[lv.agents for lv in s.levels],
            y=[lv.output_tps for lv in s.levels],
            customdata=[[lv.prefill_tps, lv.throughput_source] for lv in s.levels],
            mode="lines+markers",
            name=s.name,
            line={"color": s.run.colour, "dash": dash, "width": 2.5},
            marker={"size": 8},
            hovertemplate=(
                "%{x} agents<br>output %{y:,.0f} tok/s<br>prefill %{customdata[0]:,.0f} tok/s"
                "<br>from %{customdata[1]}<extra>" + s.name + "</extra>"
            ),
        )
    )


def _add_knees(fig: go.Figure, s: _Series) -> None:
    """A star on the series at each of its run's knees at its context (one the series has a level for)."""
    by_agents = {lv.agents: lv for lv in s.levels}
    for knee in s.run.result.knee:
        if knee.context != s.context or knee.agents not in by_agents:
            continue
        fig.add_trace(
            go.Scatter(
                x=[knee.agents],
                y=[by_agents[knee.agents].output_tps],
                mode="markers+text",
                marker={"symbol": "star", "size": 18, "color": s.run.colour, "line": {"width": 1, "color": "#222"}},
                text=[f"knee {knee.agents}"],
                textposition="top center",
                name=f"knee · {s.name}",
                showlegend=False,
                hovertemplate=f"knee: {knee.agents} agents ({knee.explanation.cause})<extra>{s.name}</extra>",
            )
        )


def _add_synthetic_arm(fig: go.Figure, run: RunData) -> None:
    # The matched synthetic arm is its own series, never a point of the agents' line (``--compare-synthetic``).
    arms = run.result.synthetic
    if not arms:
        return
    fig.add_trace(
        go.Scatter(
            x=[lv.agents for lv in arms],
            y=[lv.output_tps for lv in arms],
            mode="markers",
            marker={"symbol": "diamond-open", "size": 12, "color": run.colour, "line": {"width": 2}},
            name=f"matched synthetic · {run.label}",
            hovertemplate=(
                "%{x} agents<br>output %{y:,.0f} tok/s<br>" + arms[0].workload + "<extra>matched synthetic</extra>"
            ),
        )
    )


def _add_pool_estimates(fig: go.Figure, s: _Series, log: bool) -> None:
    """A dotted line at the sessions the KV pool holds at the series' context, by the run's estimate."""
    for est in s.run.result.capacity:
        if est.context == s.context and est.sessions is not None and est.sessions > 0:
            # A shape on a log axis takes data values but an annotation takes log10 ones (plotly.js).
            fig.add_shape(
                type="line",
                x0=est.sessions,
                x1=est.sessions,
                y0=0,
                y1=1,
                yref="paper",
                line={"color": s.run.colour, "dash": "dot", "width": 1.5},
            )
            fig.add_annotation(
                x=math.log10(est.sessions) if log else est.sessions,
                y=0.02,
                yref="paper",
                text=f"KV pool ÷ context ≈ {num(est.sessions)}",
                textangle=-90,
                xanchor="right",
                yanchor="bottom",
                showarrow=False,
                font={"color": s.run.colour, "size": 11},
            )


def ttft_vs_agents(runs: Sequence[RunData]) -> go.Figure:
    """TTFT p50 / p95 / p99 against agents, on a log axis (past a knee TTFT grows by orders of magnitude)."""
    fig = go.Figure()
    values: list[float | None] = []
    for s in _series(runs):
        for key, dash in (("p50", "solid"), ("p95", "dash"), ("p99", "dot")):
            ys = [getattr(lv.ttft_s, key) for lv in s.levels]
            if all(y is None for y in ys):
                continue
            values += ys
            fig.add_trace(
                go.Scatter(
                    x=[lv.agents for lv in s.levels],
                    y=ys,
                    mode="lines+markers",
                    name=f"{key} · {s.name}",
                    line={"color": s.run.colour, "dash": dash, "width": 2},
                    marker={"size": 6},
                    customdata=[secs(y) for y in ys],
                    hovertemplate=f"%{{x}} agents<br>TTFT {key} %{{customdata}}<extra>{s.name}</extra>",
                )
            )
    _agents_axis(fig, runs)
    fig.update_yaxes(**_seconds_axis(values))
    return _layout(fig, "Time to first token vs agents (p50 solid, p95 dashed, p99 dotted)")


def pass_rate_vs_agents(runs: Sequence[RunData]) -> go.Figure | None:
    """Scored workloads only (the behaviour suite); None when no run scored anything."""
    if not any(lv.pass_rate is not None for run in runs for lv in run.result.levels):
        return None
    fig = go.Figure()
    for s in _series(runs):
        points = [(lv.agents, lv.pass_rate) for lv in s.levels if lv.pass_rate is not None]
        if not points:
            continue
        fig.add_trace(
            go.Scatter(
                x=[a for a, _ in points],
                y=[p * 100 for _, p in points],
                mode="lines+markers",
                name=s.name,
                line={"color": s.run.colour, "width": 2.5},
                marker={"size": 8},
                hovertemplate="%{x} agents<br>pass rate %{y:.1f}%<extra>" + s.name + "</extra>",
            )
        )
    _agents_axis(fig, runs)
    fig.update_yaxes(title={"text": "pass rate (%)"}, range=[0, 105])
    return _layout(fig, "Pass rate vs agents")


def _level_label(lv: LevelSummary, grid: bool) -> str:
    return f"{lv.agents} @ {context_label(lv.context)}" if grid else str(lv.agents)


def token_split(run: RunData) -> go.Figure:
    """Per level, the prompt tokens the server computed and the tokens it generated, stacked, with the three shares
    of prefill on the right axis: of computed tokens, of time (where the server's histograms say), of all prompt
    tokens (cached ones included, near 100 % for agents: why the bars show computed tokens, not all of them)."""
    levels = sorted(run.result.levels, key=lambda lv: (lv.context, lv.agents))
    grid = len({lv.context for lv in levels}) > 1
    x = [_level_label(lv, grid) for lv in levels]

    def computed(lv: LevelSummary) -> float:
        hit = lv.prefix_hit_rate_effective
        return lv.prefill_tps * (1.0 - hit) if hit is not None else lv.prefill_tps

    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(
        go.Bar(
            x=x,
            y=[computed(lv) for lv in levels],
            name="prefill tok/s computed (not cached)",
            marker={"color": "#9ab8d8"},
            hovertemplate="%{x} agents<br>prefill computed %{y:,.0f} tok/s<extra></extra>",
        ),
        secondary_y=False,
    )
    fig.add_trace(
        go.Bar(
            x=x,
            y=[lv.output_tps for lv in levels],
            name="generation tok/s",
            marker={"color": run.colour},
            hovertemplate="%{x} agents<br>generation %{y:,.0f} tok/s<extra></extra>",
        ),
        secondary_y=False,
    )
    lines = (
        ("prefill share of computed tokens (%)", [lv.computed_prefill_share for lv in levels], "solid"),
        ("prefill share of request time (%)", [lv.prefill_time_share for lv in levels], "dash"),
        ("prompt share of all tokens (%)", [lv.prefill_share for lv in levels], "dot"),
    )
    for name, values, dash in lines:
        shares = [None if v is None else v * 100 for v in values]
        if any(v is not None for v in shares):
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=shares,
                    name=name,
                    mode="lines+markers",
                    line={"color": "#444", "dash": dash},
                    hovertemplate="%{x} agents<br>" + name + " %{y:.1f}<extra></extra>",
                ),
                secondary_y=True,
            )
    fig.update_layout(barmode="stack")
    fig.update_xaxes(title={"text": "agents @ context" if grid else "agents"}, type="category")
    fig.update_yaxes(title={"text": "tokens/s"}, secondary_y=False)
    fig.update_yaxes(
        title={"text": "prefill share (%)"},
        range=[0, 100],
        tickmode="linear",
        tick0=0,
        dtick=20,
        secondary_y=True,
        showgrid=False,
    )
    return _layout(fig, f"Prefill / generation split · {run.label}")


def hit_rate_steps(samples: Sequence[ServerSample]) -> tuple[list[float], list[float | None]]:
    """(t, hit rate) between adjacent samples from the prefix counters; None where no lookup happened or a
    counter went backwards (a server restart), so the line shows a gap instead of a made-up value."""
    ts: list[float] = []
    rates: list[float | None] = []
    for a, b in itertools.pairwise(samples):
        if None in (a.prefix_queries, b.prefix_queries, a.prefix_hits, b.prefix_hits):
            continue
        ts.append(b.t)
        rates.append(prefix_hit_rate(a.prefix_queries, a.prefix_hits, b.prefix_queries, b.prefix_hits))
    return ts, rates


def _array(values: Sequence[float | None]) -> npt.NDArray[np.float64]:
    return np.array([np.nan if v is None else v for v in values], dtype=float)


def _level_spans(samples: Sequence[LevelSample]) -> list[tuple[int, float, float]]:
    """(level, start, end) for each stretch of consecutive samples taken in one level; a stretch ends where the
    next begins, so the shaded bands tile the time axis without gaps."""
    starts: list[tuple[int, float]] = [
        (level, next(group).sample.t) for level, group in itertools.groupby(samples, key=lambda s: s.level)
    ]
    ends = [t for _, t in starts[1:]] + [samples[-1].sample.t if samples else 0.0]
    return [(level, start, end) for (level, start), end in zip(starts, ends, strict=True)]


def timeline(run: RunData) -> go.Figure | None:
    """KV usage, running / waiting and prefix hit rate over the run, levels shaded; None without samples."""
    if not run.samples:
        return None
    samples = sorted(run.samples, key=lambda s: s.sample.t)
    raw = [s.sample for s in samples]
    # NumPy arrays, not lists: plotly validates and copies a list element by element (a 30-minute soak at 1 Hz
    # took seconds), and serialises an array as compact base64 that plotly.js decodes. NaN draws as a gap.
    t = np.array([s.t for s in raw], dtype=float)
    agents = {lv.level: lv.agents for lv in run.result.levels}
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.05)
    agents_of = np.array([agents.get(s.level, -1) for s in samples], dtype=np.int64)
    _add_gauge_rows(fig, run.colour, raw, t, agents_of)
    _add_hit_rate_row(fig, raw)
    # Built as plain dicts and set once: plotly's add_vrect / add_annotation copy the whole layout each call,
    # which made a 30-level run's timeline take seconds.
    shapes, labels = _level_bands(samples, agents)
    fig.update_layout(shapes=shapes, annotations=labels)
    # Axis titles rather than subplot titles: the row above the first plot carries the level labels.
    fig.update_yaxes(title={"text": "KV cache used (%)"}, range=[0, 105], row=1, col=1)
    fig.update_yaxes(title={"text": "requests"}, rangemode="tozero", row=2, col=1)
    fig.update_yaxes(title={"text": "prefix hits (%)"}, range=[0, 105], row=3, col=1)
    fig.update_xaxes(title={"text": "seconds since the run started (shaded bands: levels, labelled by agents)"}, row=3)
    return _layout(fig, f"Server over time · {run.label}", height=640)


def _add_gauge_rows(
    fig: go.Figure,
    colour: str,
    raw: Sequence[ServerSample],
    t: npt.NDArray[np.float64],
    agents_of: npt.NDArray[np.int64],
) -> None:
    """The timeline's first two rows: KV usage, then running and waiting requests (a gauge never exported: none)."""
    if any(s.kv_usage is not None for s in raw):
        fig.add_trace(
            go.Scatter(
                x=t,
                y=_array([None if s.kv_usage is None else s.kv_usage * 100 for s in raw]),
                name="KV usage",
                line={"color": colour, "width": 2},
                customdata=agents_of,
                hovertemplate="t %{x:.0f}s · %{customdata} agents<br>KV %{y:.1f}%<extra></extra>",
            ),
            row=1,
            col=1,
        )
    for name, line_colour, dash in (("running", colour, "solid"), ("waiting", "#d62728", "dot")):
        ys = [getattr(s, name) for s in raw]
        if all(y is None for y in ys):
            continue
        fig.add_trace(
            go.Scatter(
                x=t,
                y=_array(ys),
                name=name,
                line={"color": line_colour, "dash": dash, "width": 2},
                customdata=agents_of,
                hovertemplate=f"t %{{x:.0f}}s · %{{customdata}} agents<br>{name} %{{y:.0f}}<extra></extra>",
            ),
            row=2,
            col=1,
        )


def _add_hit_rate_row(fig: go.Figure, raw: Sequence[ServerSample]) -> None:
    """The timeline's third row: the prefix hit rate between adjacent samples (``hit_rate_steps``)."""
    ht, rates = hit_rate_steps(raw)
    if any(r is not None for r in rates):
        fig.add_trace(
            go.Scatter(
                x=np.array(ht, dtype=float),
                y=_array([None if r is None else r * 100 for r in rates]),
                name="prefix hit rate",
                line={"color": "#2ca02c", "width": 2},
                connectgaps=False,
                hovertemplate="t %{x:.0f}s<br>hit rate %{y:.1f}%<extra></extra>",
            ),
            row=3,
            col=1,
        )


def _level_bands(
    samples: Sequence[LevelSample], agents: dict[int, int]
) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """The timeline's level bands (every other one shaded) and their labels (the level's agents), as layout dicts."""
    shapes: list[dict[str, object]] = []
    labels: list[dict[str, object]] = []
    for i, (level, start, end) in enumerate(_level_spans(samples)):
        # Shade every other level, over all three rows (shared x axis), so the boundaries show everywhere.
        if i % 2 == 0:
            shapes.append(
                {
                    "type": "rect",
                    "xref": "x",
                    "yref": "paper",
                    "x0": start,
                    "x1": end,
                    "y0": 0,
                    "y1": 1,
                    "fillcolor": "#888",
                    "opacity": 0.08,
                    "line": {"width": 0},
                    "layer": "below",
                }
            )
        labels.append(
            {
                "x": (start + end) / 2,
                "y": 1.0,
                "xref": "x",
                "yref": "paper",
                "text": str(agents.get(level, "?")),
                "showarrow": False,
                "yanchor": "bottom",
                "font": {"size": 11, "color": "#555"},
            }
        )
    return shapes, labels
