"""The console's per-level table stays readable at any width and off a terminal.

Piped to a file or a CI log, rich assumes 80 columns (or $COLUMNS) and used to squeeze every column to "…". Now
the table is folded into parts that fit that width, on a terminal or not; times carry one unit per column, named in
the header.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from agentload.bench.results import (
    CapacityEstimate,
    Knee,
    KneeExplanation,
    LevelSummary,
    Percentiles,
    RunResult,
)
from agentload.cli.main import app
from agentload.report.console import print_result
from agentload.report.html import load_runs, render_report
from agentload.report.levels import level_table, time_unit
from agentload.report.text import capacity_sentence, knee_sentence
from agentload.store import RunStore


def level(agents: int, **changes: object) -> LevelSummary:
    fields: dict[str, object] = {
        "level": agents,
        "agents": agents,
        "context": 40960,
        "workload": "agentic",
        "window_s": 300.0,
        "warmup_s": 120.0,
        "sessions_completed": agents * 3,
        "sessions_failed": 0,
        "requests_ok": agents * 480,
        "requests_failed": 0,
        "turns": agents * 480,
        "output_tps": agents * 51.7,
        "prefill_tps": agents * 4_123.4,
        "throughput_source": "server",
        "prefill_share": 0.987,
        "prefix_hit_rate_server": 0.946,
        "prefix_hit_rate_usage": 0.951,
        "ttft_s": Percentiles(p50=0.0423 * agents, p95=0.0612 * agents, p99=0.0854 * agents),
        "itl_s": Percentiles(p50=0.0118 + agents * 0.0002),
        "queue_wait_s": Percentiles(p95=0.004 * agents),
        "peak_kv_usage": min(0.99, agents / 40),
        "preemptions": 0.0,
        "turns_per_s": agents * 1.6,
        "min_turns": 200,
        "context_mean": 38_412.7,
        "context_p95": 41_873.0,
        "output_requested_mean": 512.0,
        "output_realised_mean": 498.2,
        "output_controlled": True,
    }
    fields.update(changes)
    return LevelSummary.model_validate(fields)


def realistic_run() -> RunResult:
    """A find-knee run at 40k context: long numbers, one level too short to trust, one with short replies."""
    levels = [
        level(1, turns=41, requests_ok=41, turns_per_s=0.137, too_few_turns=True,
              warnings=["41 of the 200 turns the level wanted: the window ended first"]),
        level(8),
        level(16, output_drawn_mean=600.0, output_clamped=True),  # held sessions asked 512 of 600 drawn
        level(24, output_realised_mean=20.5, output_controlled=False, output_short=True,
              warnings=["replies averaged 4% of the requested 512 tokens: the engine stops at EOS"]),
        level(32, preemptions=1_234.0, peak_kv_usage=0.99),
        level(256, output_tps=12_345.6, prefill_tps=1_987_654.3, requests_ok=123_456, turns=123_456,
              ttft_s=Percentiles(p50=12.34, p95=56.78, p99=84.21), preemptions=98_765.0),
    ]  # fmt: skip
    knee = Knee(
        agents=24,
        context=40960,
        criterion="throughput peak",
        measured_over_predicted=0.68,
        explanation=KneeExplanation(cause="preemption", summary="past 24 agents requests no longer fit in KV."),
        decided_by="ttft",
    )
    capacity = CapacityEstimate(
        pool_tokens=1_449_792, block_size=16, context=38_413, sessions=37.7, source="profile", target_context=40960
    )
    return RunResult(
        run_id="20261201-084222-49f4",
        created="2026-12-01T08:42:22+00:00",
        agentload_version="0.1.0",
        target="sim:qwen3-235b-gb300 (in-process, virtual time)",
        model="qwen3-235b-a22b",
        workload="agentic",
        mode="find-knee",
        levels=levels,
        capacity=[capacity],
        knee=[knee],
    )


def render(width: int, *, terminal: bool) -> str:
    # color_system=None: a terminal's styles would put escape codes between the digits this test reads.
    out = io.StringIO()
    print_result(realistic_run(), Console(file=out, width=width, force_terminal=terminal, color_system=None))
    return out.getvalue()


def table_part(text: str) -> str:
    """The level table(s) and their notes: everything above the knee / capacity panel."""
    return text.split("╭", 1)[0]


def rows(text: str, agents: int) -> list[str]:
    return [line for line in table_part(text).splitlines() if line.split()[:1] == [str(agents)]]


CASES = [
    pytest.param(80, False, id="piped-80"),
    pytest.param(60, True, id="tty-60"),
    pytest.param(200, True, id="tty-200"),
]


@pytest.mark.parametrize(("width", "terminal"), CASES)
def test_no_cell_is_cut_to_an_ellipsis(width: int, terminal: bool) -> None:
    text = render(width, terminal=terminal)
    assert "…" not in text
    if terminal:  # folded to fit: no line wider than the terminal
        assert max(len(line) for line in text.splitlines()) <= width


@pytest.mark.parametrize(("width", "terminal"), CASES)
def test_every_level_shows_its_agents_and_output_throughput(width: int, terminal: bool) -> None:
    text = render(width, terminal=terminal)
    expected = {1: "52", 8: "414", 16: "827", 24: "1,241", 32: "1,654", 256: "12,346"}
    for agents, output_tps in expected.items():
        assert any(output_tps in row.split() for row in rows(text, agents)), (agents, text)


@pytest.mark.parametrize(("width", "terminal"), CASES)
def test_flags_warnings_and_the_legend_are_shown(width: int, terminal: bool) -> None:
    text = render(width, terminal=terminal)
    flat = " ".join(text.split())
    assert any("41 !" in row for row in rows(text, 1))  # too few turns
    assert any("4% !" in row for row in rows(text, 24))  # replies far shorter than requested
    assert not any("!" in row for row in rows(text, 8))
    assert any("38,413 / 41,873" in row for row in rows(text, 8))  # the context the server counted
    assert "warning: 1 agents: 41 of the 200 turns the level wanted: the window ended first" in flat
    assert "warning: 24 agents: replies averaged 4% of the requested 512 tokens" in flat
    assert "turns !: the window ended before the level completed the turns it wanted" in flat
    assert "output !: replies averaged under 80% of the requested length" in flat
    assert any("827 !" in row for row in rows(text, 16))  # output tok/s of a level that asked less than drawn
    assert "output tok/s !: the turns asked for under 95% of the reply lengths the workload drew" in flat
    assert "(decided by ttft)" in flat
    assert "realised context 38,413 (target 40,960)" in flat


@pytest.mark.parametrize(("width", "terminal"), CASES)
def test_each_time_column_uses_one_unit_named_in_its_header(width: int, terminal: bool) -> None:
    table = table_part(render(width, terminal=terminal))
    # TTFT reaches 84 s, so every TTFT cell is in seconds, even the 1-agent level's 42 ms; ITL stays in ms.
    assert "TTFT (s)" in table
    assert "ITL p50" in table
    assert "(ms)" in table
    assert "0.04 / 0.06 / 0.09" in table
    assert "12.34 / 56.78 / 84.21" in table
    assert not re.search(r"\d (ms|s)\b", table)  # numbers only in the cells


@pytest.mark.parametrize("width", [80, 300])
def test_off_a_terminal_the_table_keeps_to_the_consoles_width(width: int) -> None:
    # Piped, rich's width is $COLUMNS (else 80): the table folds into parts that fit it, as on a terminal.
    text = table_part(render(width, terminal=False))
    assert max(len(line) for line in text.splitlines()) <= width
    header_lines = [line for line in text.splitlines() if "TTFT" in line]
    assert len(header_lines) == 1
    side_by_side = "output" in header_lines[0] and "context" in header_lines[0]
    assert side_by_side == (width == 300)  # one piece only where it fits


def test_a_narrow_terminal_folds_the_core_columns_first() -> None:
    lines = table_part(render(80, terminal=True)).splitlines()
    (core,) = [line for line in lines if "TTFT" in line]
    for header in ("output", "prefix hit", "peak", "preempt-"):
        assert header in core
    assert "sessions" not in core  # the rest follows in later parts...
    assert sum(line.split()[:1] == ["agents"] for line in lines) >= 2  # ...each led by the agents column


def test_the_html_report_shows_the_same_cells_flags_and_warnings(tmp_path: Path) -> None:
    with RunStore(tmp_path).create("20261201-084222-49f4") as writer:
        saved = writer.finish(realistic_run())
    html = render_report(load_runs([saved]))
    table = level_table(realistic_run())
    assert "<th>TTFT (s) p50 / p95 / p99</th>" in html
    assert "<td>41 !</td>" in html
    assert "<td>4% !</td>" in html
    for line in [*table.warnings, *table.legend]:
        assert line.replace("'", "&#39;") in html
    assert knee_sentence(realistic_run().knee[0]) in html
    assert capacity_sentence(realistic_run().capacity[0]) in html


def test_bench_piped_prints_the_whole_level_row(tmp_path: Path) -> None:
    args = ["bench", "--sim", "laptop", "--agents", "2", "--context", "4096", "--warmup", "5s", "--window", "20s"]
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "…" not in result.output
    (run,) = [RunStore(tmp_path).resolve(p.name).result() for p in tmp_path.iterdir() if p.is_dir()]
    (lv,) = run.levels
    # The level's row in each part the table folded into (80 columns: CliRunner is no terminal, and rich's width
    # off one is $COLUMNS or 80).
    row = " ".join(line for line in result.output.splitlines() if line.split()[:1] == ["2"])
    assert f"{lv.output_tps:,.0f}" in row.split()
    assert f"{lv.requests_ok} / {lv.requests_failed}" in row


@pytest.mark.parametrize(
    ("seconds", "unit", "cells"),
    [
        ([0.0423, 0.0051], "ms", ["42.3", "5.1"]),
        ([0.16, 0.0423], "ms", ["160", "42"]),
        ([1.84, 0.004], "s", ["1.840", "0.004"]),
        ([84.2, 0.0423], "s", ["84.20", "0.04"]),
        ([250.0, 1.5], "s", ["250.0", "1.5"]),
    ],
)
def test_a_time_column_takes_its_unit_from_its_largest_value(seconds: list[float], unit: str, cells: list[str]) -> None:
    chosen = time_unit([*seconds, None])
    assert chosen is not None
    assert chosen.name == unit
    assert [chosen.format(s) for s in seconds] == cells
    assert time_unit([None, None]) is None
