"""Suite runs in the store: ``<root>/suite-<stamp>-<tail>/suite.json`` beside ``manifest.json``.

The suite's own format (``suite.results.SuiteRun``, transcripts included) is unchanged; the store owns where it
goes and how it is written (atomically, with the manifest every run kind carries).
"""

from __future__ import annotations

from pathlib import Path

from agentload.store.atomic import write_atomic
from agentload.store.manifest import RunInfo, now_iso
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


def save_suite_run(run: SuiteRun, root: Path | None = None) -> Path:
    """Write ``run`` as ``<root>/suite-<stamp>-<tail>/suite.json`` with its manifest, index it in the history
    when it finished, and return the result file (``root``: ``store.run_root``'s choice when None)."""
    # Imported here: the store's directory helpers import this module to read suite runs back.
    from agentload.store.runstore import RunStore

    store = RunStore(root)
    run_dir, _ = store.new_dir(RunInfo(kind="suite", run_id="", created=now_iso()), prefix=SUITE_PREFIX)
    path = run_dir / SUITE_RESULT
    write_atomic(path, run.model_dump_json())
    store.finish(run_dir, suite_info(run, run_dir.name))
    return path
