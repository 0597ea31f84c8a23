"""What a directory under the root of runs holds: its manifest, or what its files say for runs written before
manifests existed (bench: ``result.json`` / ``records.jsonl``; suite: ``suite.json``; fleet: ``run.json``)."""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

from agentload.errors import CheckpointError, ConfigError
from agentload.store.manifest import RunInfo, RunStatus, read_info
from agentload.store.rundir import RECORDS, RESULT, SAMPLES, RunDir, bench_info
from agentload.store.suiterun import SUITE_RESULT, suite_info
from agentload.suite.results import load_run

FLEET_MANIFEST = "run.json"  # fleet.checkpoint.MANIFEST (the store does not import the fleet: it sits below it)
FLEET_RESULTS = "results.json"  # fleet.checkpoint.RESULTS
# Any of these in a directory means a run of that kind wrote its result there.
RESULT_FILES = (RESULT, SUITE_RESULT, FLEET_RESULTS)

_STAMP = re.compile(r"(\d{8}-\d{6})")


def _created(path: Path) -> str:
    """A run's start from its id's stamp (every scheme has one), else the directory's modification time."""
    m = _STAMP.search(path.name)
    when = datetime.strptime(m.group(1), "%Y%m%d-%H%M%S") if m else datetime.fromtimestamp(path.stat().st_mtime)
    return when.astimezone().isoformat(timespec="seconds")


def dir_info(path: Path) -> RunInfo | None:
    """The run in ``path`` described by its manifest (a bench run by its ``result.json`` when it has one: that
    file is the truth the history has always been built from), or None when ``path`` holds no run.

    A damaged file raises ``CheckpointError`` (or ``ConfigError`` for a suite result) naming it.
    """
    info = read_info(path)
    if info is not None and info.kind != "bench":
        return info
    if (path / RESULT).is_file():
        return bench_info(RunDir(path).result())
    if info is not None:
        return info
    if (path / RECORDS).exists() or (path / SAMPLES).exists():
        return RunInfo(kind="bench", run_id=path.name, created=_created(path))
    if (path / SUITE_RESULT).is_file():
        return suite_info(load_run(path / SUITE_RESULT), path.name)
    if (path / FLEET_MANIFEST).is_file():
        # A fleet run from before manifests: the store cannot read the fleet's files, only see whether it ended.
        status = "finished" if (path / FLEET_RESULTS).is_file() else "running"
        return RunInfo(kind="fleet", run_id=path.name, created=_created(path), status=status)
    return None


def safe_dir_info(path: Path) -> tuple[RunInfo | None, str | None]:
    """``dir_info`` that reports a damaged run as a reason instead of raising (one bad directory must not hide
    the others)."""
    try:
        return dir_info(path), None
    except (CheckpointError, ConfigError) as exc:
        return None, str(exc)


# What an incomplete run's manifest cannot say about itself (it was never finished to say it).
INCOMPLETE_WHY = "its last process wrote no result: killed, or still running"


def status_why(status: RunStatus, detail: str) -> str:
    """Why a run is not finished, as every view says it ("" for a finished run)."""
    if status == "finished":
        return ""
    return detail or (INCOMPLETE_WHY if status == "incomplete" else "")


def run_status(path: Path) -> tuple[RunStatus, str] | None:
    """The run in ``path``: its status and why it is not finished — what ``agentload runs`` lists and the replays
    show — or None when ``path`` holds no run (or one too damaged to say)."""
    info, _ = safe_dir_info(path)
    if info is None:
        return None
    return info.listed_status, status_why(info.listed_status, info.detail)
