"""A bench run's directory written as the run goes: the run store's observer of a bench (``bench.observe``), for a
new run or one resumed where it stopped."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from agentload.bench.analysis import LevelData
from agentload.bench.observe import Unobserved
from agentload.bench.results import LevelSummary, RunResult
from agentload.bench.session import Resumed
from agentload.errors import ConfigError
from agentload.store.manifest import read_info
from agentload.store.rundir import RunDir, RunWriter
from agentload.store.runstore import RunStore, run_root


def resumable(ref: str, out: Path | None) -> Path:
    """The directory of the interrupted run ``ref`` names (its path, or its id under ``out``'s root)."""
    path = Path(ref)
    if not path.is_dir() and len(path.parts) == 1 and (run_root(out) / ref).is_dir():
        path = run_root(out) / ref  # a run id, as `agentload runs` lists it
    if not path.is_dir():
        raise ConfigError(f"--resume {ref}: no such run directory (nor a run id under {run_root(out)})")
    run = RunDir(path)
    if run.finished and run.result().incomplete is None:
        raise ConfigError(f"--resume {ref}: that run finished; there is nothing to continue")
    return path


class BenchRecorder(Unobserved):
    """Writes what a bench hears into its run directory: each request, and each level's samples and summary as the
    level ends, so a run killed later keeps every finished level."""

    def __init__(self, writer: RunWriter, resumed: Resumed | None = None, moved: int = 0) -> None:
        super().__init__()
        self.writer = writer
        # Each record straight to the run's log: the sink a bench's turns call, with nothing in between.
        self.record = writer.record
        self.fresh = resumed is None  # a new run, not one resumed
        self.resumed = resumed or Resumed()
        self.moved = moved  # the interrupted level's records set aside (records.interrupted.jsonl)

    @classmethod
    def create(cls, out: Path | None, invocation: dict[str, Any]) -> BenchRecorder:
        """A new run under ``out``'s root, its invocation (``bench.json``) written first."""
        writer = RunStore(out).create()
        writer.invocation(invocation)
        return cls(writer)

    @classmethod
    def resume(cls, path: Path) -> BenchRecorder:
        """The interrupted run in ``path`` reopened: its finished levels kept, the level it was measuring set aside
        (measured again under the same number)."""
        previous = RunDir(path)
        levels = previous.levels()
        info = read_info(path)
        moved = previous.set_aside_unfinished(len(levels))
        # Indexed in the history of the root the run lives in, not of --out (a resume may be given by its path).
        writer = RunWriter(path, on_finish=RunStore(path.parent).history.add)
        created = info.created if info is not None else None
        return cls(writer, Resumed(levels, created, previous.last_sample_time()), moved)

    @property
    def run_id(self) -> str:
        return self.writer.run_id

    @property
    def path(self) -> Path:
        return self.writer.path

    def level_done(self, data: LevelData, summary: LevelSummary) -> None:
        for raw in data.samples:
            self.writer.sample(data.level, raw.sample)
        if data.lost is None:  # a level the server's loss cut short is measured again on resume
            self.writer.level(summary)

    def finish(self, result: RunResult) -> RunDir:
        return self.writer.finish(result)

    def close(self) -> None:
        """Stop writing; the records and finished levels gathered so far stay on disk."""
        self.writer.close()

    def discard(self) -> None:
        """Remove a new run's directory that holds nothing but its invocation (the run never began)."""
        self.writer.close()
        if self.fresh:
            shutil.rmtree(self.writer.path, ignore_errors=True)
