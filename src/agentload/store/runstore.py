"""A root directory of runs and its history: where ``bench``, ``suite`` and ``run`` create runs and ``runs`` /
``report`` find them."""

from __future__ import annotations

import os
from pathlib import Path

from agentload.errors import CheckpointError
from agentload.store.history import HistoryEntry, RunHistory
from agentload.store.rundir import RESULT, RunDir, RunWriter, check_run_id, new_run_id

ROOT_ENV = "AGENTLOAD_RUNS"
DEFAULT_ROOT = Path("agentload-runs")


def run_root(out: Path | None = None) -> Path:
    """The root of runs, for every command that writes or reads them: ``out`` (``--out`` / ``--root``), else
    ``$AGENTLOAD_RUNS``, else ``./agentload-runs``.

    The one place this is decided (issue 10): bench, suite and fleet runs used to default to different folders.
    Read at call time, not import time, so a test (or a shell) that sets the variable is obeyed.
    """
    if out is not None:
        return out
    env = os.environ.get(ROOT_ENV)
    return Path(env) if env else DEFAULT_ROOT


class RunStore:
    def __init__(self, root: Path | None = None) -> None:
        self.root = run_root(root)
        self.history = RunHistory(self.root)

    def create(self, run_id: str | None = None) -> RunWriter:
        """A new run directory ``<root>/<run_id>``; the run is indexed in the history when it finishes."""
        run_id = check_run_id(run_id) if run_id is not None else new_run_id()
        return RunWriter(self.root / run_id, on_finish=self.history.add)

    def resolve(self, ref: str) -> RunDir:
        """A run directory from what a user typed: its path, its ``result.json``, or its id in this root."""
        path = Path(ref)
        if path.name == RESULT and path.is_file():
            return RunDir(path.parent)
        if path.is_dir():
            if not (path / RESULT).is_file():
                # Let RunDir.result() say which: unfinished (records, no result) or not a run directory at all.
                RunDir(path).result()
            return RunDir(path)
        if path.exists():
            raise CheckpointError(f"{ref} is not a run directory (a file, not a directory)")
        entry = self.history.get(ref) if len(path.parts) == 1 else None
        if entry is not None:
            return RunDir(entry.path)
        candidate = self.root / ref
        if len(path.parts) == 1 and candidate.is_dir():
            return RunDir(candidate)
        raise CheckpointError(f"{ref}: no such run directory, nor a run id in {self.history.path}")

    def runs(self, limit: int | None = None) -> list[HistoryEntry]:
        return self.history.entries(limit)
