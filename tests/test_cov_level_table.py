"""The per-level table the console and the HTML report share: one time unit per column (never "42.3 ms" beside
"1.84 s"), a column with nothing measured left out, constant columns folded into the title, flags explained
once in the legend, warnings carried with their level."""

from __future__ import annotations

from typing import Any

import pytest

from agentload.bench.results import LevelSummary, Percentiles, RunResult
from agentload.report.levels import TimeColumn, level_table, time_unit


def level(agents: int, context: int = 40960, **fields: Any) -> LevelSummary:
    base: dict[str, Any] = {
        "level": 0, "agents": agents, "context": context, "workload": "agentic", "window_s": 60.0, "warmup_s": 10.0,
        "sessions_completed": agents, "sessions_failed": 0, "requests_ok": 10 * agents, "requests_failed": 0,
        "turns": 10 * agents, "output_tps": 100.0 * agents, "prefill_tps": 1000.0 * agents,
        "throughput_source": "server",
    }  # fmt: skip
    return LevelSummary.model_validate({**base, **fields})


def result(levels: list[LevelSummary]) -> RunResult:
    return RunResult(
        run_id="r", created="2026-11-01T00:00:00", agentload_version="0", target="t", model="m", workload="w",
        mode="sweep", levels=levels,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("values", "unit", "shown"),
    [
        ([0.0423, 0.0051], "ms", ["42.3", "5.1"]),  # all under 100 ms: one decimal
        ([0.004, 0.85], "ms", ["4", "850"]),  # under 1 s: whole milliseconds
        ([0.004, 1.02], "s", ["0.004", "1.020"]),  # from 1 s: seconds, the small value keeps its milliseconds
        ([12.5, 0.2], "s", ["12.50", "0.20"]),
        ([250.0, 3.0], "s", ["250.0", "3.0"]),
        ([None, 0.5], "ms", ["—", "500"]),
    ],
)
def test_one_unit_per_column_from_its_largest_value(values: list[float | None], unit: str, shown: list[str]) -> None:
    chosen = time_unit(values)
    assert chosen is not None
    assert chosen.name == unit
    assert [chosen.format(v) for v in values] == shown


def test_no_values_no_unit() -> None:
    assert time_unit([]) is None
    assert time_unit([None, None]) is None


def test_a_time_column_names_its_unit_in_the_header() -> None:
    column = TimeColumn("TTFT ({unit})\np50 / p95", lambda lv: (lv.ttft_s.p50, lv.ttft_s.p95))
    levels = [
        level(1, ttft_s=Percentiles(p50=0.08, p95=0.2)),
        level(2, ttft_s=Percentiles(p50=1.5, p95=None)),
        level(4),  # nothing measured at this level
    ]
    header, cells = column.render(levels)
    assert header == "TTFT (s)\np50 / p95"
    assert cells == ["0.080 / 0.200", "1.500 / —", "—"]
    header, cells = column.render([level(1)])
    assert (header, cells) == ("TTFT\np50 / p95", ["—"])  # nothing at all: no unit to name


def test_columns_with_nothing_measured_are_left_out_and_levels_are_ordered() -> None:
    table = level_table(result([level(8), level(2), level(4)]))
    assert [row[0] for row in table.rows] == ["2", "4", "8"]
    assert "pass\nrate" not in table.headers  # an unscored workload has no pass rate
    assert "peak\nKV" not in table.headers  # no /metrics: no KV figures
    assert table.headers[0] == "agents"
    assert len(table.core) == len(table.headers)
    assert table.legend == []
    assert table.warnings == []


def test_constant_columns_fold_into_the_title_when_asked() -> None:
    levels = [level(2), level(4)]
    folded = level_table(result(levels), fold_constant=True)
    assert "context" not in folded.headers
    assert folded.constants == ["40k context", "tok/s from server"]
    assert "context" in level_table(result(levels)).headers  # not folded unless asked
    # A grid of two contexts keeps the column: it is not constant.
    grid = level_table(result([level(2, 8192), level(2, 40960)]), fold_constant=True)
    assert "context" in grid.headers


def test_flags_are_marked_in_the_cells_and_explained_once() -> None:
    levels = [
        level(2, too_few_turns=True, output_requested_mean=256.0, output_realised_mean=128.0, output_short=True),
        level(4, too_few_turns=True),
    ]
    table = level_table(result(levels))
    turns = table.headers.index("turns")
    assert [row[turns] for row in table.rows] == ["20 !", "40 !"]
    ratio = table.headers.index("output\n÷ requested")
    assert table.rows[0][ratio] == "50% !"
    assert len(table.legend) == 2
    assert table.legend[0].startswith("turns !: the window ended before")
    assert "under 80% of the requested length" in table.legend[1]


def test_prefix_hits_and_context_side_by_side() -> None:
    lv = level(2, prefix_hit_rate_server=0.9312, prefix_hit_rate_usage=None, context_mean=40123.4, context_p95=41000)
    table = level_table(result([lv]))
    row = dict(zip(table.headers, table.rows[0], strict=True))
    assert row["prefix hit\nserver / usage"] == "93.1 / —%"
    assert row["context\nmean / p95"] == "40,123 / 41,000"


def test_warnings_travel_with_their_level_and_name_the_context_in_a_grid() -> None:
    one = level_table(result([level(4, warnings=["3 requests failed"])]))
    assert one.warnings == ["4 agents: 3 requests failed"]
    grid = level_table(result([level(4, 8192, warnings=["slow"]), level(4, 40960)]))
    assert grid.warnings == ["4 agents @ 8k: slow"]
