"""Suite runs in the store: ``<root>/suite-<stamp>-<tail>/suite.json`` beside ``manifest.json``.

The suite's own format (``suite.results.SuiteRun``, transcripts included) is unchanged; the store owns where it
goes and how it is written (atomically, with the manifest every run kind carries). This module is the layout and
the manifest, which ``store.catalog`` reads runs back with; writing a new one (``runstore.save_suite_run``) needs
the root of runs and its history, which sit above the catalog.
"""

from __future__ import annotations

from agentload.store.manifest import RunInfo
from agentload.suite.results import SuiteRun, counts, cut_short

SUITE_RESULT = "suite.json"
SUITE_PREFIX = "suite-"


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x:.0%}"


def suite_info(run: SuiteRun, run_id: str) -> RunInfo:
    """The manifest of a suite run: its headline is the pooled pass rate (passes ÷ tests scored) at each agent
    count with the counts it rests on, and, for a run the lost server cut short, how far it got."""
    levels = run.levels
    tests = levels[0].tests if levels else []
    outcome = ", ".join(f"{_pct(lv.pooled_pass_rate)} at {lv.agents} ({counts(lv)})" for lv in levels)
    stopped = cut_short(run) if levels else None  # with no level, "no level ran" already says it
    return RunInfo(
        kind="suite",
        run_id=run_id,
        created=run.started_at.isoformat(timespec="seconds"),
        status="interrupted" if run.incomplete is not None else "finished",
        detail="; ".join(x for x in (run.incomplete, stopped) if x),
        target=run.endpoint,
        model=run.model,
        workload=f"{len(tests)} tests" if len(tests) > 3 else ",".join(tests),
        mode=f"suite {run.suite_version}",
        levels=len(levels),
        outcome=(f"pass {outcome}" if outcome else "no level ran") + (f"; {stopped}" if stopped else ""),
    )
