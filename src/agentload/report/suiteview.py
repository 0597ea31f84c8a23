"""One level of a suite run as console tables for people: the per-test pass rates and the level's figures.

Reads only the compiled ``suite.results.LevelResult``; the same figures the run directory and ``--json`` hold.
"""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from agentload.suite.results import LevelResult, counts


def _agents(n: int) -> str:
    return f"{n} agent{'s' * (n != 1)}"


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x:.0%}" if x in (0.0, 1.0) else f"{x:.1%}"


def _secs(s: float | None) -> str:
    if s is None:
        return "—"
    return f"{s * 1e3:.0f} ms" if s < 1 else f"{s:.2f} s"


def render_suite_level(level: LevelResult, out: Console) -> None:
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
    out.print(t)
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
    out.print(figures)
    out.print()
