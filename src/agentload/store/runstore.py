"""A root directory of runs and its history: where ``bench``, ``suite`` and ``run`` create runs and ``runs`` /
``report`` find them."""

from __future__ import annotations

import os
from pathlib import Path

from agentload.errors import CheckpointError
from agentload.store.atomic import write_atomic
from agentload.store.catalog import RESULT_FILES, dir_info, safe_dir_info
from agentload.store.history import HistoryEntry, RunHistory
from agentload.store.manifest import RunInfo, check_run_id, new_run_id, now_iso, write_info
from agentload.store.rundir import RESULT, RunDir, RunWriter
from agentload.store.suiterun import SUITE_PREFIX, SUITE_RESULT, suite_info
from agentload.suite.results import SuiteRun

ROOT_ENV = "AGENTLOAD_RUNS"
DEFAULT_ROOT = Path("agentload-runs")


def run_root(out: Path | None = None) -> Path:
    """The root of runs, for every command that writes or reads them: ``out`` (``--out`` / ``--root``), else
    ``$AGENTLOAD_RUNS``, else ``./agentload-runs``.

    The one place this is decided: bench, suite and fleet runs used to default to different folders.
    Read at call time, not import time, so a test (or a shell) that sets the variable is obeyed.
    """
    if out is not None:
        return out
    env = os.environ.get(ROOT_ENV)
    return Path(env) if env else DEFAULT_ROOT


def check_root(root: Path) -> None:
    """Raise ``CheckpointError`` when ``root`` cannot be a root of runs: something other than a directory, a
    directory that cannot be read, a path on a kernel file system (``/proc``, ``/sys``), or a missing one that could
    not be created. A directory that does not exist yet, where it could be made, passes: it holds no runs yet.

    Reading only (``os.access``, ``os.statvfs``): a command that lists runs creates nothing to find out.
    """
    where = Path(os.path.abspath(root))
    probe = where  # the path itself, else its nearest ancestor that exists
    while not os.path.exists(probe) and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        if probe == where:
            raise CheckpointError(f"the root of runs {root} is not a directory; give a directory")
        raise CheckpointError(f"the root of runs {root} cannot be created: {probe} is not a directory")
    if _kernel_file_system(probe):
        raise CheckpointError(f"the root of runs {root} is on a kernel file system ({probe}): no run can be kept there")
    if probe == where:
        if not os.access(probe, os.R_OK | os.X_OK):
            raise CheckpointError(f"cannot read the root of runs {root}: permission denied")
    elif not os.access(probe, os.W_OK | os.X_OK):
        raise CheckpointError(f"the root of runs {root} does not exist and cannot be created in {probe}")


def _kernel_file_system(path: Path) -> bool:
    """Whether ``path`` is on a file system with no room for files at all: what the kernel's own (proc, sysfs,
    cgroup) report. Permissions do not tell: to root, /proc looks writable, yet nothing can be made there."""
    try:
        st = os.statvfs(path)
    except OSError:
        return False
    return st.f_blocks == 0 and st.f_files == 0


class RunStore:
    def __init__(self, root: Path | None = None) -> None:
        self.root = run_root(root)
        self.history = RunHistory(self.root)

    def create(self, run_id: str | None = None) -> RunWriter:
        """A new run directory ``<root>/<run_id>``; the run is indexed in the history when it finishes."""
        run_id = check_run_id(run_id) if run_id is not None else new_run_id()
        return RunWriter(self.root / run_id, on_finish=self.history.add)

    def new_dir(self, info: RunInfo, *, prefix: str = "") -> tuple[Path, RunInfo]:
        """A new, empty run directory ``<root>/<prefix><stamp>-<tail>`` with ``info`` (its ``run_id`` set) as
        its manifest, status ``running``. For the kinds that write their own files (suite, fleet)."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CheckpointError(f"cannot create {self.root}: {exc.strerror or exc}") from exc
        for _ in range(100):
            run_id = new_run_id(prefix=prefix)
            path = self.root / run_id
            try:
                path.mkdir()  # exclusive: two runs started in the same second never share a directory
            except FileExistsError:
                continue
            except OSError as exc:
                raise CheckpointError(f"cannot create {path}: {exc.strerror or exc}") from exc
            info = info.model_copy(update={"run_id": run_id, "status": "running"})
            write_info(path, info)
            return path, info
        raise CheckpointError(f"cannot find a free run directory name under {self.root}")

    def finish(self, path: Path, info: RunInfo) -> None:
        """Record the end of a run (or of one segment of a resumable one): its manifest, and the history when it
        finished — an interrupted run stays out of the index of finished measurements (listed, marked so)."""
        write_info(path, info)
        if info.status == "finished":
            self.history.index(info, path)
        elif self.history.get(info.run_id) is not None:
            self.history.remove(info.run_id)  # an indexed run resumed and stopped again is no longer finished

    def listing(self, limit: int | None = None) -> tuple[list[HistoryEntry], list[tuple[Path, str]]]:
        """Every run under the root, newest first: the history's finished runs, then (merged by date) every run
        directory the history does not index — incomplete, interrupted, or copied in — with its status.

        Returns (entries, [(directory, why it cannot be read)]). Listing never creates anything.
        """
        entries = self.history.entries()
        indexed = {e.id for e in entries}
        damaged: list[tuple[Path, str]] = []
        if self.root.is_dir():
            for child in sorted(p for p in self.root.iterdir() if p.is_dir() and p.name not in indexed):
                info, why = safe_dir_info(child)
                if why is not None:
                    damaged.append((child, why))
                elif info is not None:
                    entries.append(HistoryEntry.of(info, child))
        entries.sort(key=lambda e: (e.created, e.id), reverse=True)
        return (entries if limit is None else entries[:limit]), damaged

    def resolve(self, ref: str) -> RunDir:
        """A run directory from what a user typed: its path, its ``result.json``, or its id in this root."""
        path = Path(ref)
        if path.name in RESULT_FILES and path.is_file():  # a run's result file: result.json, suite.json, ...
            return RunDir(path.parent)
        if path.is_dir():
            info = dir_info(path)
            if info is None or (info.kind == "bench" and not (path / RESULT).is_file()):
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


def save_suite_run(run: SuiteRun, root: Path | None = None) -> Path:
    """Write ``run`` as ``<root>/suite-<stamp>-<tail>/suite.json`` with its manifest, index it in the history
    when it finished, and return the result file (``root``: ``run_root``'s choice when None)."""
    store = RunStore(root)
    run_dir, _ = store.new_dir(RunInfo(kind="suite", run_id="", created=now_iso()), prefix=SUITE_PREFIX)
    path = run_dir / SUITE_RESULT
    write_atomic(path, run.model_dump_json())
    store.finish(run_dir, suite_info(run, run_dir.name))
    return path
