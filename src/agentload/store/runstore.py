"""A root directory of runs and its history: where ``bench`` creates runs and ``runs`` / ``report`` find them."""

from __future__ import annotations

import os
from pathlib import Path

from agentload.errors import CheckpointError
from agentload.store.history import HistoryEntry, RunHistory
from agentload.store.rundir import RESULT, RunDir, RunWriter, check_run_id, new_run_id

ROOT_ENV = "AGENTLOAD_RUNS"
DEFAULT_ROOT = Path("agentload-runs")


def default_root() -> Path:
    """``$AGENTLOAD_RUNS``, else ``./agentload-runs``."""
    env = os.environ.get(ROOT_ENV)
    return Path(env) if env else DEFAULT_ROOT


class RunStore:
    def __init__(self, root: Path | None = None) -> None:
        self.root = root if root is not None else default_root()
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
