"""A fleet run's result as a console table for people: agents, turns, what each task did, tokens, the width.

Reads only the compiled ``fleet.results.FleetResult``, the same one ``results.json`` holds.
"""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

from agentload.fleet.checkpoint import RESULTS
from agentload.fleet.limiter import Mode
from agentload.fleet.results import FleetResult


def _per_task(result: FleetResult) -> str:
    """Rounds and tool calls per task, in fleet order: what the agents did, not only how fast."""
    tasks: dict[str, list[int]] = {}
    for a in result.agents:
        agg = tasks.setdefault(a.task_id, [0, 0, 0])
        agg[0] += 1
        agg[1] += a.turns
        agg[2] += a.tool_calls
    parts = []
    for task, (agents, turns, calls) in tasks.items():
        each = f" per agent ×{agents}" if agents > 1 else ""
        parts.append(f"{task} {turns / agents:.3g} rounds, {calls / agents:.3g} tool calls{each}")
    return "; ".join(parts)


def render_summary(result: FleetResult, run_dir: Path) -> Table:
    t = result.totals
    table = Table(
        title=f"{result.fleet}: {result.mode.value} on {result.server}", title_justify="left", show_header=False
    )
    table.add_column("", style="bold")
    table.add_column("", overflow="fold")  # a run directory's path must stay whole to be pasted
    rows = [
        (
            "agents",
            f"{t.agents}: {t.done} done, {t.failed} failed, {t.skipped} skipped, "
            f"{t.interrupted} interrupted, {t.unstarted} not started",
        ),
        ("turns", f"{t.turns:,} ({result.turns_per_s:.2f} per second in this run)"),
        ("per task", _per_task(result)),
        ("tokens", f"{t.prompt_tokens:,} prompt ({t.cached_tokens:,} cached), {t.completion_tokens:,} completion"),
        ("wall clock", f"{result.wall_s:.1f} s" + (" (stopped early; resumable)" if result.stopped_early else "")),
        ("width", f"started at {result.start_width}: {result.start_reason}"),
    ]
    if result.executor != "local":
        rows.append(("executor", result.executor))
    if result.mode is Mode.AUTO:
        history = result.limiter.history
        rows.append(
            (
                "auto",
                f"{len(history)} changes, now {result.limiter.limit}, "
                f"{result.settled_width:.1f} on average over the second half; parked {result.limiter.parked_total}×",
            )
        )
    if len(result.segments) > 1:
        rows.append(("segments", f"{len(result.segments)} (resumed {len(result.segments) - 1}×)"))
    rows.append(("results", str(run_dir / RESULTS)))
    for name, value in rows:
        table.add_row(name, value)
    return table
