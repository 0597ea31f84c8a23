"""The per-level table of a run, cell by cell: the same strings in the console and the HTML report.

Times are in one unit per column, chosen from the column's largest value and named in its header, so a
column never mixes "42.3 ms" with "1.84 s". Flags are markers in the cells ("12 !", "4% !"),
explained once by ``legend``; a level's own warnings travel with the table as sentences.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from agentload.bench.results import OUTPUT_CLAMPED_RATIO, OUTPUT_SHORT_RATIO, LevelSummary, RunResult
from agentload.report.text import DASH, context_label, count, is_knee_level, num, pct, replays_trace, secs

FLAG = "!"  # appended to a cell the run flagged; ``legend`` says what it means in each column


@dataclass(frozen=True)
class Column:
    header: str  # two short lines for the terminal ("output\ntok/s"); the HTML joins them
    cell: Callable[[LevelSummary], str]
    core: bool = False  # in the first table when a narrow terminal gets the table folded in parts

    def render(self, levels: Sequence[LevelSummary]) -> tuple[str, list[str]]:
        return self.header, [self.cell(lv) for lv in levels]


@dataclass(frozen=True)
class TimeUnit:
    name: str  # "ms" or "s"
    scale: float
    digits: int

    def format(self, seconds: float | None) -> str:
        return DASH if seconds is None else f"{seconds * self.scale:,.{self.digits}f}"


def time_unit(values: Sequence[float | None]) -> TimeUnit | None:
    """The unit for a whole column, from its largest value: under 1 s in ms, else in s; None if all missing.

    Decimals shrink as the largest value grows, so the column stays about four digits wide while a small value
    beside a large one keeps its milliseconds where it can (0.004 s beside 1.02 s, not 0.00).
    """
    present = [v for v in values if v is not None]
    if not present:
        return None
    top = max(present)
    if top < 1.0:
        return TimeUnit("ms", 1e3, 1 if top < 0.1 else 0)
    return TimeUnit("s", 1.0, 3 if top < 10.0 else 2 if top < 100.0 else 1)


@dataclass(frozen=True)
class TimeColumn:
    header: str  # holds "{unit}" where the unit goes: "TTFT ({unit})\np50 / p95 / p99"
    times: Callable[[LevelSummary], tuple[float | None, ...]]  # seconds, joined with " / " in one cell
    core: bool = False

    def render(self, levels: Sequence[LevelSummary]) -> tuple[str, list[str]]:
        per_level = [self.times(lv) for lv in levels]
        unit = time_unit([t for times in per_level for t in times])
        if unit is None:
            return self.header.replace(" ({unit})", ""), [DASH for _ in levels]
        cells = [
            DASH if all(t is None for t in times) else " / ".join(unit.format(t) for t in times) for times in per_level
        ]
        return self.header.format(unit=unit.name), cells


def _flagged(text: str, flag: bool) -> str:
    return f"{text} {FLAG}" if flag else text


def _prefill_shares(lv: LevelSummary) -> str:
    # Three ways to split a server's work between prefill and generation: all prompt tokens (cached ones
    # included, so near 100 % for agents), the prompt tokens it computed, and the time requests spent in each.
    shares = (lv.prefill_share, lv.computed_prefill_share, lv.prefill_time_share)
    if all(v is None for v in shares):
        return DASH
    return " / ".join(DASH if v is None else f"{v * 100:.0f}" for v in shares) + "%"


def _prefix_hits(lv: LevelSummary) -> str:
    # Side by side on purpose: the server counts a preempted request's lookups again, usage counts it once. The
    # server's is the reuse of both tiers when an offload tier loaded some (its own share in the next column).
    server, usage = (
        (lv.prefix_hit_rate_effective if lv.prefix_hit_rate_server is not None else None),
        lv.prefix_hit_rate_usage,
    )
    if server is None and usage is None:
        return DASH
    return " / ".join(DASH if v is None else f"{v * 100:.1f}" for v in (server, usage)) + "%"


def _context(lv: LevelSummary) -> str:
    if lv.context_mean is None and lv.context_p95 is None:
        return DASH
    return " / ".join(count(v) for v in (lv.context_mean, lv.context_p95))


def _trace_sessions(lv: LevelSummary) -> str:
    """A replayed trace's turns and sessions in one cell: "1.44 s / 11.1 s · 0.54 (16) · 0" (turn latency p50 /
    p95 · session wall ÷ recorded, p50 (sessions it is over) · stalls)."""
    p50, p95 = lv.turn_latency_p50_s, lv.turn_latency_p95_s
    if p50 is None and p95 is None and lv.sessions_timed is None and lv.turn_stalls is None:
        return DASH
    walls = DASH if lv.sessions_timed is None else f"{num(lv.session_wall_ratio_p50, 2)} ({lv.sessions_timed:,})"
    return f"{secs(p50)} / {secs(p95)} · {walls} · {count(lv.turn_stalls)}"


def _output_ratio(lv: LevelSummary) -> str:
    ratio = lv.output_ratio
    return DASH if ratio is None else _flagged(pct(ratio), lv.output_short)


KEY = "agents"  # the first column, repeated in every part of a folded table

# In the order of the full table. A column whose every cell is DASH (pass rate for an unscored workload, queue
# wait from a server without that histogram) is left out. Headers break into two short lines (the HTML shows
# the break as a space): a header wider than its numbers costs a narrow terminal a column.
LEVEL_COLUMNS: list[Column | TimeColumn] = [
    Column(KEY, lambda lv: str(lv.agents), core=True),
    # A trace's levels are the sizes it recorded, not the --context they were given: "trace" (its realised
    # context is in "context mean / p95").
    Column("context", lambda lv: "trace" if replays_trace(lv.workload) else context_label(lv.context)),
    Column("turns", lambda lv: _flagged(f"{lv.turns:,}", lv.too_few_turns), core=True),
    Column("turns/s", lambda lv: num(lv.turns_per_s, 2)),
    # Sessions that ended during the whole level, warm-up included (a held session runs until the level stops, so
    # few end); requests are counted in the window only.
    Column("sessions ended\nok / failed", lambda lv: f"{lv.sessions_completed} / {lv.sessions_failed}"),
    Column("requests\nok / failed", lambda lv: f"{lv.requests_ok:,} / {lv.requests_failed:,}"),
    Column("pass\nrate", lambda lv: pct(lv.pass_rate, 1)),
    Column("output\ntok/s", lambda lv: _flagged(num(lv.output_tps, 0), lv.output_clamped), core=True),
    Column("prefill\ntok/s", lambda lv: num(lv.prefill_tps, 0)),
    Column("tok/s\nfrom", lambda lv: lv.throughput_source),
    Column("prefill share\ntok / computed / time", _prefill_shares),
    Column("prefix hit\nserver / usage", _prefix_hits, core=True),
    # A replayed trace's own limit for the same requests (an unlimited cache over its blocks): the gap to the
    # measured rate is what the server's cache lost.
    Column("trace\nceiling", lambda lv: pct(lv.prefix_hit_ceiling, 1)),
    # A replayed trace's think time as kept against as recorded (times its time scale): a replay that could not
    # keep the pace sent its turns later, so each agent asked for less than the trace's load.
    TimeColumn("think ({unit})\nreal / rec", lambda lv: (lv.think_realised_s, lv.think_recorded_s)),
    # A replayed trace's sessions as a user of it would feel them: a turn's latency, how much longer (or shorter) a
    # session took than it did when recorded, and how many turns started over a second late (``TURN_STALL_S``).
    Column("turn p50 / p95 · session\nwall ÷ rec (n) · stalls", _trace_sessions),
    Column("of it from\noffload", lambda lv: pct(lv.prefix_hit_rate_offload, 1)),
    TimeColumn("TTFT ({unit})\np50 / p95 / p99", lambda lv: (lv.ttft_s.p50, lv.ttft_s.p95, lv.ttft_s.p99), core=True),
    TimeColumn("ITL p50\n({unit})", lambda lv: (lv.itl_s.p50,)),
    TimeColumn("queue wait\np95 ({unit})", lambda lv: (lv.queue_wait_s.p95,)),
    Column("peak\nKV", lambda lv: pct(lv.peak_kv_usage), core=True),
    Column("preempt-\nions", lambda lv: count(lv.preemptions), core=True),
    Column("context\nmean / p95", _context),  # server-counted tokens, beside the target in "context"
    Column("output\n÷ requested", _output_ratio),
]
# Columns that usually hold one value for a whole run: the console states them once, in the title.
CONSTANT_COLUMNS = ("context", "tok/s\nfrom")


@dataclass(frozen=True)
class LevelTable:
    headers: list[str]
    rows: list[list[str]]
    knee_rows: list[bool]  # the row is a knee level (highlighted)
    core: list[bool]  # per header: in the first part when the console folds the table
    constants: list[str]  # folded columns, as "40k context" (only with fold_constant)
    legend: list[str]  # what each marker in the rows means (only the markers that appear)
    warnings: list[str]  # each level's warnings, prefixed by its agent count


def legend(levels: Sequence[LevelSummary]) -> list[str]:
    lines = []
    if any(lv.too_few_turns for lv in levels):
        lines.append(f"turns {FLAG}: the window ended before the level completed the turns it wanted")
    if any(lv.output_short and lv.output_ratio is not None for lv in levels):
        lines.append(
            f"output {FLAG}: replies averaged under {OUTPUT_SHORT_RATIO:.0%} of the requested length, "
            "so output tok/s does not measure the workload's shape"
        )
    if any(lv.output_clamped for lv in levels):
        lines.append(
            f"output tok/s {FLAG}: the turns asked for under {OUTPUT_CLAMPED_RATIO:.0%} of the reply lengths the "
            "workload drew (held sessions shortened them to stay at the context), so the knee rule compares this "
            "level's agent-turns/s, not its tok/s"
        )
    return lines


def level_table(result: RunResult, *, fold_constant: bool = False) -> LevelTable:
    """The per-level table of a run, levels in (context, agents) order.

    With ``fold_constant``, a ``CONSTANT_COLUMNS`` column holding one value on every row is left out and named
    in ``constants`` instead (the console's title says "40k context · tok/s from server").
    """
    ordered = sorted(result.levels, key=lambda lv: (lv.context, lv.agents))
    grid = len({lv.context for lv in ordered}) > 1
    headers: list[str] = []
    columns: list[list[str]] = []
    core: list[bool] = []
    constants: list[str] = []
    for column in LEVEL_COLUMNS:
        header, cells = column.render(ordered)
        values = set(cells)
        if values == {DASH}:
            continue
        if fold_constant and header in CONSTANT_COLUMNS and len(values) == 1:
            value = values.pop()
            constants.append(f"{header.replace(chr(10), ' ')} {value}" if "\n" in header else f"{value} {header}")
            continue
        headers.append(header)
        columns.append(cells)
        core.append(column.core)
    return LevelTable(
        headers=headers,
        rows=[list(row) for row in zip(*columns, strict=True)],
        knee_rows=[is_knee_level(result, lv) for lv in ordered],
        core=core,
        constants=constants,
        legend=legend(ordered),
        warnings=[f"{_level_name(lv, grid)}: {w}" for lv in ordered for w in lv.warnings],
    )


def _level_name(lv: LevelSummary, grid: bool) -> str:
    return f"{lv.agents} agents @ {context_label(lv.context)}" if grid else f"{lv.agents} agents"
