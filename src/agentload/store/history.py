"""The run history: one SQLite table indexing every finished run under a root, for ``agentload runs``.

It is an index, not the data: each row is derived from a run's ``result.json`` and can be rebuilt from the run
directories at any time (``RunHistory.rebuild``), so a lost or damaged history loses nothing. Paths inside the
root are stored relative to it, so a root can be moved or copied to another machine as a whole.

Every call opens its own short connection (with a busy timeout): two benchmarks finishing at once on one root
serialise on SQLite's lock instead of failing, and no connection outlives the call that needed it.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import closing, contextmanager
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from agentload.bench.results import RunResult
from agentload.errors import CheckpointError
from agentload.store.catalog import RESULT_FILES, safe_dir_info
from agentload.store.manifest import KneeEntry, RunInfo, RunKind, RunStatus
from agentload.store.rundir import RESULT, bench_info

HISTORY = "history.sqlite"
HISTORY_SCHEMA = 2

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id              TEXT PRIMARY KEY,
    created         TEXT NOT NULL,      -- ISO-8601 start of the run (RunResult.created)
    target          TEXT NOT NULL,
    model           TEXT NOT NULL,
    workload        TEXT NOT NULL,
    mode            TEXT NOT NULL,
    levels          INTEGER NOT NULL,
    knee_agents     INTEGER,            -- the (first) knee; NULL when the run found none
    knees           TEXT NOT NULL,      -- JSON: every knee (a context x agents grid has one per context)
    best_output_tps REAL,               -- the highest output tok/s of any level
    path            TEXT NOT NULL,      -- relative to the root when inside it
    indexed         TEXT NOT NULL,      -- when this row was written (UTC)
    kind            TEXT NOT NULL DEFAULT 'bench',      -- bench | suite | fleet (schema 2)
    status          TEXT NOT NULL DEFAULT 'finished',
    outcome         TEXT NOT NULL DEFAULT ''            -- the headline of a suite or fleet run
);
CREATE INDEX IF NOT EXISTS runs_created ON runs (created);
"""

# Schema 1 indexed bench runs only; its rows are bench runs that finished.
_UPGRADE_FROM_1 = """
ALTER TABLE runs ADD COLUMN kind TEXT NOT NULL DEFAULT 'bench';
ALTER TABLE runs ADD COLUMN status TEXT NOT NULL DEFAULT 'finished';
ALTER TABLE runs ADD COLUMN outcome TEXT NOT NULL DEFAULT '';
"""


_COLUMNS = (
    "id, created, target, model, workload, mode, levels, knee_agents, knees, best_output_tps, path, indexed, "
    "kind, status, outcome"
)


class HistoryEntry(BaseModel):
    """One row of the history."""

    model_config = ConfigDict(frozen=True)

    id: str
    created: str
    target: str
    model: str
    workload: str
    mode: str
    levels: int
    knees: list[KneeEntry]
    best_output_tps: float | None
    path: Path  # absolute (resolved against the root)
    kind: RunKind = "bench"
    status: RunStatus = "finished"
    outcome: str = ""
    detail: str = Field(default="", description="why a run was interrupted (listed from its manifest)")

    @classmethod
    def of(cls, info: RunInfo, path: Path) -> HistoryEntry:
        return cls(
            id=info.run_id,
            created=info.created,
            target=info.target,
            model=info.model,
            workload=info.workload,
            mode=info.mode,
            levels=info.levels,
            knees=info.knees,
            best_output_tps=info.best_output_tps,
            path=path,
            kind=info.kind,
            status=info.listed_status,
            outcome=info.outcome,
            detail=info.detail,
        )

    @property
    def knee_agents(self) -> int | None:
        return self.knees[0].agents if self.knees else None


class RunHistory:
    """The SQLite index at ``<root>/history.sqlite``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.path = root / HISTORY

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        try:
            with closing(sqlite3.connect(self.path, timeout=10.0)) as conn:
                version = conn.execute("PRAGMA user_version").fetchone()[0]
                if version > HISTORY_SCHEMA:
                    raise CheckpointError(
                        f"{self.path} is a run history of schema {version}; this agentload reads {HISTORY_SCHEMA}"
                    )
                if version == 1:
                    with conn:
                        conn.executescript(_UPGRADE_FROM_1)
                        conn.execute(f"PRAGMA user_version = {HISTORY_SCHEMA}")
                elif version < HISTORY_SCHEMA:
                    with conn:
                        conn.executescript(_SCHEMA)
                        conn.execute(f"PRAGMA user_version = {HISTORY_SCHEMA}")
                yield conn
        except sqlite3.DatabaseError as exc:
            # "file is not a database", "unable to open database file", a locked database past the timeout.
            raise CheckpointError(f"run history {self.path}: {exc}") from exc

    def _stored_path(self, path: Path) -> str:
        resolved = path.resolve()
        try:
            return str(resolved.relative_to(self.root.resolve()))
        except ValueError:
            return str(resolved)

    def add(self, result: RunResult, path: Path) -> None:
        """Index (or re-index) one finished bench run."""
        self.index(bench_info(result), path)

    def index(self, info: RunInfo, path: Path) -> None:
        """Index (or re-index) one finished run of any kind."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CheckpointError(f"cannot create {self.root}: {exc.strerror or exc}") from exc
        row = (
            info.run_id,
            info.created,
            info.target,
            info.model,
            info.workload,
            info.mode,
            info.levels,
            info.knees[0].agents if info.knees else None,
            json.dumps([k.model_dump() for k in info.knees]),
            info.best_output_tps,
            self._stored_path(path),
            datetime.now(UTC).isoformat(timespec="seconds"),
            info.kind,
            info.listed_status,
            info.outcome,
        )
        with self._connect() as conn, conn:
            conn.execute(f"INSERT OR REPLACE INTO runs ({_COLUMNS}) VALUES ({', '.join('?' * len(row))})", row)

    def _entry(self, row: sqlite3.Row) -> HistoryEntry:
        path = Path(row["path"])
        return HistoryEntry(
            id=row["id"],
            created=row["created"],
            target=row["target"],
            model=row["model"],
            workload=row["workload"],
            mode=row["mode"],
            levels=row["levels"],
            knees=[KneeEntry.model_validate(k) for k in json.loads(row["knees"])],
            best_output_tps=row["best_output_tps"],
            path=path if path.is_absolute() else self.root / path,
            kind=row["kind"],
            status=row["status"],
            outcome=row["outcome"],
        )

    def entries(self, limit: int | None = None) -> list[HistoryEntry]:
        """Newest first. An absent history is an empty one (reading never creates the file)."""
        if not self.path.exists():
            return []
        with self._connect() as conn:
            conn.row_factory = sqlite3.Row
            rows = conn.execute(
                "SELECT * FROM runs ORDER BY created DESC, id DESC LIMIT ?", (-1 if limit is None else limit,)
            ).fetchall()
        return [self._entry(r) for r in rows]

    def get(self, run_id: str) -> HistoryEntry | None:
        if not self.path.exists():
            return None
        with self._connect() as conn:
            conn.row_factory = sqlite3.Row
            row = conn.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        return None if row is None else self._entry(row)

    def remove(self, run_id: str) -> bool:
        if not self.path.exists():
            return False
        with self._connect() as conn, conn:
            return conn.execute("DELETE FROM runs WHERE id = ?", (run_id,)).rowcount > 0

    def rebuild(self) -> tuple[int, list[tuple[Path, str]]]:
        """Re-index every finished run directly under the root; drop rows whose directory is gone.

        Returns (runs indexed, [(directory, why it was skipped)]) — unfinished or damaged runs are skipped
        with the reason, never fatal: one bad directory must not hide the others.
        """
        indexed = 0
        skipped: list[tuple[Path, str]] = []
        if self.root.is_dir():
            for child in sorted(p for p in self.root.iterdir() if p.is_dir()):
                info, damage = safe_dir_info(child)
                if damage is not None:
                    skipped.append((child, damage))
                    continue
                if info is None:
                    continue
                if info.status == "running":
                    done = f"no {RESULT}" if info.kind == "bench" else "no result"
                    skipped.append((child, f"{done} (the run did not finish)"))
                    continue
                if info.status == "interrupted":
                    skipped.append((child, f"incomplete: {info.detail or 'it stopped early'}"))
                    continue
                if info.run_id != child.name:
                    # The history is keyed on the id, and `report ID` must find this directory: a copied run
                    # directory renamed on disk is indexed under its directory name's id only if they agree.
                    skipped.append((child, f"its result is of run {info.run_id!r}, not {child.name!r}"))
                    continue
                self.index(info, child)
                indexed += 1
        for entry in self.entries():
            if not any((entry.path / name).is_file() for name in RESULT_FILES):
                self.remove(entry.id)
        return indexed, skipped
