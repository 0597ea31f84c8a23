"""The HTML report and the console tables, without a browser: self-contained, escaped, plotting the saved numbers.

The browser half (plotly actually draws, no console errors) is tests/test_report_browser.py.
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import typer
from markupsafe import escape
from rich.console import Console
from typer.testing import CliRunner

from agentload.cli.report import report as report_command
from agentload.endpoint.samples import ServerSample
from agentload.report.console import levels_table, print_result
from agentload.report.figures import hit_rate_steps
from agentload.report.html import load_runs, render_report, write_report
from agentload.report.text import knee_sentence
from agentload.store import RunDir, RunStore
from tests.test_store import SyntheticRun, save, synthetic_run


def dense() -> SyntheticRun:
    return synthetic_run("qwen3-dense")


def sliding() -> SyntheticRun:
    return synthetic_run(
        "deepseek-sliding",
        agents=(1, 8, 16, 32, 48, 64),
        knee_at=48,
        pool_tokens=1_236_992,
        cause="cache_eviction",
        model="deepseek-v3",
        target="sim:deepseek-sliding-gb300 (in-process, virtual time)",
    )


def plots(html: str) -> dict[str, dict[str, Any]]:
    """The figures the report carries, by plot id, parsed back from their JSON blocks."""
    blocks = re.findall(r'<script type="application/json" data-plot="([^"]+)">(.*?)</script>', html, re.S)
    return {plot_id: json.loads(body) for plot_id, body in blocks}


def values(field: Any) -> list[Any]:
    """A trace's data array: a JSON list, or plotly's typed-array form (NumPy input travels as base64)."""
    if isinstance(field, dict):
        decoded: list[Any] = np.frombuffer(base64.b64decode(field["bdata"]), dtype=field["dtype"]).tolist()
        return decoded
    assert isinstance(field, list)
    return field


def traces(figure: dict[str, Any]) -> list[dict[str, Any]]:
    data: list[dict[str, Any]] = figure["data"]
    return data


@pytest.fixture
def two_runs(tmp_path: Path) -> list[RunDir]:
    store = RunStore(tmp_path / "runs")
    return [save(store, dense()), save(store, sliding())]


def test_the_report_is_one_self_contained_file(two_runs: list[RunDir], tmp_path: Path) -> None:
    stats = write_report(two_runs, tmp_path / "report.html")
    html = (tmp_path / "report.html").read_text(encoding="utf-8")

    assert stats.bytes == len(html.encode())
    # No external script, stylesheet, font or image: nothing a browser would fetch.
    assert not re.search(r"<script[^>]+src=", html)
    assert not re.search(r"<link\b", html)
    assert "@import" not in html
    # Outside plotly.js (whose code holds links for its logo and map tiles, never fetched for these plots: the
    # browser test proves it), the report holds no address at all.
    bundle = re.search(r"<script>\n/\* plotly\.js, embedded.*?</script>", html, re.S)
    assert bundle is not None
    assert len(bundle.group()) > 4_000_000
    assert not re.search(r"https?://", html.replace(bundle.group(), ""))
    # plotly.js itself is inside (its banner), once.
    assert html.count("* plotly.js v") == 1
    assert stats.plots == 6
    assert set(plots(html)) == {
        "throughput",
        "ttft",
        "run0-split",
        "run0-timeline",
        "run1-split",
        "run1-timeline",
    }


def test_the_report_explains_each_knee_in_words(two_runs: list[RunDir]) -> None:
    runs = load_runs(two_runs)
    html = render_report(runs)
    for run in runs:
        (knee,) = run.result.knee
        assert str(escape(knee_sentence(knee))) in html
    assert "caused by preemption: past 24 agents running requests no longer fit in the KV pool" in html
    assert "caused by prefix-cache eviction" in html
    assert "KV pool 1,449,792 tokens ÷ 40,960 tokens per session ≈ 35.4 sessions" in html
    assert "Measured ÷ predicted capacity: 0.68." in html  # 24 agents ÷ 35.4 sessions
    assert "<h4>Side by side</h4>" in html


def test_the_plots_show_the_saved_numbers(two_runs: list[RunDir]) -> None:
    runs = load_runs(two_runs)
    figures = plots(render_report(runs))

    lines = {t["name"]: t for t in traces(figures["throughput"]) if t.get("mode") == "lines+markers"}
    assert set(lines) == {"qwen3-dense", "deepseek-sliding"}
    for run in runs:
        line = lines[run.label]
        assert line["x"] == [lv.agents for lv in run.result.levels]
        assert line["y"] == [lv.output_tps for lv in run.result.levels]
    knees = [t for t in traces(figures["throughput"]) if t.get("text")]
    assert sorted(t["x"][0] for t in knees) == [24, 48]

    ttft = {t["name"]: t for t in traces(figures["ttft"])}
    assert ttft["p95 · qwen3-dense"]["y"] == [lv.ttft_s.p95 for lv in runs[0].result.levels]

    timeline = traces(figures["run0-timeline"])
    kv = next(t for t in timeline if t["name"] == "KV usage")
    assert values(kv["y"]) == [s.sample.kv_usage * 100 for s in runs[0].samples if s.sample.kv_usage is not None]
    assert values(kv["x"]) == [s.sample.t for s in runs[0].samples]
    assert set(values(kv["customdata"])) == {1, 8, 16, 24, 32, 48}  # hover names the level by its agents
    waiting = next(t for t in timeline if t["name"] == "waiting")
    assert max(values(waiting["y"])) == 48 - 26  # 48 agents, 26 running past the knee
    hits = next(t for t in timeline if t["name"] == "prefix hit rate")
    last_level_hits = runs[0].result.levels[-1].prefix_hit_rate_server
    assert last_level_hits is not None
    assert values(hits["y"])[-1] == pytest.approx(100 * last_level_hits)

    split = {t["name"]: t for t in traces(figures["run1-split"])}
    # The bars are the prompt tokens prefill computed (not those a cache served), the lines the saved shares.
    computed = split["prefill tok/s computed (not cached)"]["y"]
    assert all(c <= lv.prefill_tps for c, lv in zip(computed, runs[1].result.levels, strict=True))
    shares = split["prompt share of all tokens (%)"]["y"]
    assert shares == [None if lv.prefill_share is None else lv.prefill_share * 100 for lv in runs[1].result.levels]
    assert split["generation tok/s"]["x"] == ["1", "8", "16", "32", "48", "64"]


def test_prefix_hit_rate_over_time_is_the_counters_increase_between_samples() -> None:
    samples = [
        ServerSample(t=0, prefix_queries=1000, prefix_hits=900),
        ServerSample(t=1, prefix_queries=2000, prefix_hits=1800),  # 90% of this second's lookups hit
        ServerSample(t=2, prefix_queries=2000, prefix_hits=1800),  # no lookups: no rate, not 0%
        ServerSample(t=3, prefix_queries=3000, prefix_hits=2500),  # 70%
        ServerSample(t=4, prefix_queries=100, prefix_hits=10),  # the server restarted: counters went back
        ServerSample(t=5),  # an engine without prefix counters
    ]
    assert hit_rate_steps(samples) == ([1, 2, 3, 4], [0.9, None, 0.7, None])


def test_a_scored_workload_gets_a_pass_rate_plot(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    scored = save(store, synthetic_run("suite-run", scored=True))
    figures = plots(render_report(load_runs([scored])))
    (line,) = traces(figures["pass-rate"])
    assert line["y"] == [100.0, 100.0, 100.0, 100.0, 76.0, 40.0]
    assert "pass-rate" not in plots(render_report(load_runs([save(store, dense())])))


def test_a_grid_run_draws_one_line_per_context(tmp_path: Path) -> None:
    a = synthetic_run("grid", context=16384, knee_at=48, agents=(16, 32, 48, 64))
    b = synthetic_run("grid", context=40960, knee_at=24, agents=(8, 16, 24, 32))
    grid = a.result.model_copy(
        update={
            "mode": "grid",
            "levels": [*a.result.levels, *(lv.model_copy(update={"level": lv.level + 4}) for lv in b.result.levels)],
            "knee": [*a.result.knee, *b.result.knee],
            "capacity": [*a.result.capacity, *b.result.capacity],
        }
    )
    with RunStore(tmp_path).create("grid") as writer:
        saved = writer.finish(grid)
    html = render_report(load_runs([saved]))
    names = [t["name"] for t in traces(plots(html)["throughput"]) if t.get("mode") == "lines+markers"]
    assert names == ["grid · 16k", "grid · 40k"]
    assert "48 (preemption) @ 16k, 24 (preemption) @ 40k" not in html  # one run: no comparison table
    assert "No server samples were saved" in html  # the grid was saved without samples


def test_strings_from_a_run_cannot_inject_markup(tmp_path: Path) -> None:
    run = dense()
    hostile = run.result.model_copy(
        update={"target": "<img src=x onerror=alert(1)>", "notes": ["</script><script>alert(2)</script>"]}
    )
    with RunStore(tmp_path).create("qwen3-dense") as writer:
        saved = writer.finish(hostile)
    html = render_report(load_runs([saved]))
    assert "<img src=x" not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html
    assert "<script>alert(2)" not in html


def test_the_same_run_twice_gets_two_labels(two_runs: list[RunDir]) -> None:
    runs = load_runs([two_runs[0], two_runs[0]])
    assert [r.label for r in runs] == ["qwen3-dense", "qwen3-dense (2)"]
    assert runs[0].colour != runs[1].colour


def test_console_tables_show_levels_knee_and_capacity() -> None:
    result = dense().result
    console = Console(record=True, width=250)
    print_result(result, console)
    text = console.export_text()
    assert knee_sentence(result.knee[0]) in " ".join(text.split())
    assert "KV pool 1,449,792 tokens" in text
    table = levels_table(result)
    headers = [c.header for c in table.columns]
    assert "pass rate" not in headers  # an unscored workload: the all-empty column is left out
    assert headers[0] == "agents"
    assert "context" not in headers  # one context for every level: said once, in the title
    assert str(table.title).endswith("agentic · 40k context · tok/s from server")
    assert table.row_count == len(result.levels)
    assert table.rows[3].style == "bold yellow"  # 24 agents, the knee


# --- agentload report -----------------------------------------------------------------------------------------

APP = typer.Typer()
APP.command("report")(report_command)


def _report(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(APP, list(args), env={"COLUMNS": "250"})
    return result.exit_code, result.output


def _one_error_line(code: int, out: str) -> str:
    assert code == 2, out
    lines = out.strip().splitlines()
    assert len(lines) == 1, out
    assert lines[0].startswith("error: ")
    return lines[0]


def test_report_command_writes_the_file_by_path_and_by_id(two_runs: list[RunDir], tmp_path: Path) -> None:
    out = tmp_path / "cmp.html"
    code, text = _report(str(two_runs[0].path), "deepseek-sliding", "--root", str(tmp_path / "runs"), "-o", str(out))
    assert code == 0, text
    assert f"wrote {out}" in text
    assert "2 runs, 6 plots" in text
    assert "deepseek-sliding" in out.read_text()

    code, text = _report(str(two_runs[0].path / "result.json"), "-o", str(out), "--print")
    assert code == 0, text
    assert "Knee at 24 agents" in text
    assert "1 run, 4 plots" in text


def test_a_long_output_path_is_printed_whole(two_runs: list[RunDir], tmp_path: Path) -> None:
    """A path past the console's width (250 columns here) is not broken across lines: it can be copied."""
    out = tmp_path / ("a-directory-name-long-enough-to-pass-the-width-" * 5) / "cmp.html"
    out.parent.mkdir()
    code, text = _report(str(two_runs[0].path), "-o", str(out))
    assert code == 0, text
    assert f"wrote {out}" in text


def test_report_command_bad_run_is_one_line_and_exit_2(tmp_path: Path) -> None:
    line = _one_error_line(*_report(str(tmp_path / "nowhere"), "--root", str(tmp_path), "-o", str(tmp_path / "r.html")))
    assert "no such run directory" in line
    assert not (tmp_path / "r.html").exists()

    (tmp_path / "empty").mkdir()
    line = _one_error_line(*_report(str(tmp_path / "empty"), "-o", str(tmp_path / "r.html")))
    assert "is not a run directory" in line


def test_report_command_corrupt_result_is_one_line_and_exit_2(two_runs: list[RunDir], tmp_path: Path) -> None:
    result_file = two_runs[1].path / "result.json"
    result_file.write_text(result_file.read_text()[:500])
    line = _one_error_line(*_report(str(two_runs[0].path), str(two_runs[1].path), "-o", str(tmp_path / "r.html")))
    assert "result.json is not JSON" in line


def test_report_command_unwritable_output_is_one_line_and_exit_2(two_runs: list[RunDir], tmp_path: Path) -> None:
    line = _one_error_line(*_report(str(two_runs[0].path), "-o", str(tmp_path / "no-such-dir" / "r.html")))
    assert "cannot write the report to" in line
    line = _one_error_line(*_report(str(two_runs[0].path), "-o", str(tmp_path)))
    assert "cannot write the report to" in line
    assert not list(tmp_path.glob(".*.tmp"))


def test_an_incomplete_run_says_so_in_the_report_and_the_console_and_is_not_in_the_history(tmp_path: Path) -> None:
    why = "http://127.0.0.1:9 has not answered for 20 s: it refuses connections (the server is down)"
    store = RunStore(tmp_path)
    partial = dense().result.model_copy(update={"incomplete": why})
    with store.create("qwen3-dense") as writer:
        saved = writer.finish(partial)
    html = render_report(load_runs([saved]))
    assert f"the run stopped early: {why}" in " ".join(html.split())
    console = Console(record=True, width=250)
    print_result(saved.result(), console)
    assert f"INCOMPLETE: the run stopped early: {why}" in console.export_text()
    assert store.runs() == []  # kept on disk for `report PATH`, never indexed among finished runs
    indexed, skipped = store.history.rebuild()
    assert indexed == 0
    assert skipped == [(saved.path, f"incomplete: {why}")]
