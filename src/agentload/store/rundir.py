"""One run on disk: what the benchmark appends while it runs, and the compiled result it leaves at the end.

``<root>/<run_id>/``
    ``records.jsonl``  one ``RequestRecord`` per line, appended as requests finish (``RunWriter.record``)
    ``samples.jsonl``  one ``ServerSample`` per line, flat, with the ``level`` it was taken in
    ``levels.jsonl``   one ``LevelSummary`` per finished level, appended as each ends (``bench --resume`` reuses them)
    ``bench.json``     the invocation (flags, never a key), so ``agentload bench --resume RUN`` can continue it
    ``manifest.json``  the manifest every run kind carries (``store.manifest``): kind, id, status, headline
    ``result.json``    the ``RunResult``, written once at the end (atomically: a reader never sees half of it)
    ``records.csv``, ``levels.csv``, ``samples.csv``   the same data for spreadsheets, written at the end

Accumulate, then compile (as guidellm's ``benchmark/schemas`` do): the JSONL files grow while the run goes, so a run
that dies keeps everything it collected; ``result.json`` is what ``agentload report`` renders, never live state. A
directory with records but no result is a run that did not finish.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
    model_validator,
)

from agentload.bench.results import RESULT_SCHEMA, LevelSummary, RunResult
from agentload.endpoint.records import RequestRecord
from agentload.endpoint.samples import ServerSample
from agentload.errors import CheckpointError
from agentload.store.atomic import write_atomic
from agentload.store.csvexport import write_csv_files
from agentload.store.jsonl import JsonlReader, JsonlWriter
from agentload.store.manifest import KneeEntry, RunInfo, check_run_id, now_iso, read_info, write_info

RESULT = "result.json"
RECORDS = "records.jsonl"
SAMPLES = "samples.jsonl"
LEVELS = "levels.jsonl"
INVOCATION = "bench.json"
# Where a resumed run moves what the interrupted level had collected (kept, but out of the run's own records).
INTERRUPTED_RECORDS = "records.interrupted.jsonl"
INTERRUPTED_SAMPLES = "samples.interrupted.jsonl"

# Called once a run has finished writing (the store indexes it in the history with this).
FinishHook = Callable[[RunResult, Path], None]


class LevelSample(BaseModel):
    """A server sample and the load level that was running when it was taken.

    On disk it is one flat object (``{"level": 3, "t": 12.0, "running": 24, ...}``) so ``jq`` and the CSV
    export see plain columns; in Python the sample stays a ``ServerSample``.
    """

    model_config = ConfigDict(frozen=True)

    level: int
    sample: ServerSample

    @model_validator(mode="before")
    @classmethod
    def _from_flat(cls, data: Any) -> Any:
        if isinstance(data, dict) and "sample" not in data:
            flat = dict(data)
            level = flat.pop("level", None)
            return {"level": level, "sample": flat}
        return data

    @model_serializer(mode="wrap")
    def _to_flat(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        nested: dict[str, Any] = handler(self)
        return {"level": nested["level"], **nested["sample"]}


def best_output_tps(result: RunResult) -> float | None:
    return max((lv.output_tps for lv in result.levels), default=None)


def bench_info(result: RunResult) -> RunInfo:
    """A bench result as the manifest and the history hold it."""
    return RunInfo(
        kind="bench",
        run_id=result.run_id,
        created=result.created,
        agentload_version=result.agentload_version,
        status="interrupted" if result.incomplete is not None else "finished",
        detail=result.incomplete or "",
        target=result.target,
        model=result.model,
        workload=result.workload,
        mode=result.mode,
        levels=len(result.levels),
        knees=[
            KneeEntry(agents=k.agents, context=k.context, cause=k.explanation.cause, where=k.where) for k in result.knee
        ],
        best_output_tps=best_output_tps(result),
    )


def _validation_line(exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "top level"
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{where}: {first['msg']}{more}"


class RunDir:
    """A run directory, read back: the result, the records and the samples (each loaded on demand)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @property
    def run_id(self) -> str:
        return self.path.name

    @property
    def finished(self) -> bool:
        return (self.path / RESULT).is_file()

    def result(self) -> RunResult:
        path = self.path / RESULT
        if not self.path.is_dir():
            raise CheckpointError(f"{self.path} is not a run directory (no such directory)")
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError as exc:
            if (self.path / RECORDS).exists():
                raise CheckpointError(
                    f"{self.path} has no {RESULT}: the run did not finish (what it collected is in {RECORDS})"
                ) from exc
            raise CheckpointError(f"{self.path} is not a run directory (no {RESULT})") from exc
        except (OSError, UnicodeDecodeError) as exc:
            raise CheckpointError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from exc
        # Parse once as plain JSON first: a result from a newer agentload should say so, not fail on a field.
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise CheckpointError(f"{path} is not JSON (line {exc.lineno}: {exc.msg}); the file is damaged") from exc
        except RecursionError as exc:
            raise CheckpointError(f"{path} is nested too deeply to be a result; the file is damaged") from exc
        version = raw.get("schema_version") if isinstance(raw, dict) else None
        if isinstance(version, int) and version > RESULT_SCHEMA:
            raise CheckpointError(
                f"{path} has result schema {version}; this agentload reads up to {RESULT_SCHEMA} (upgrade it)"
            )
        try:
            return RunResult.model_validate(raw)
        except ValidationError as exc:
            raise CheckpointError(f"{path} is not an agentload result ({_validation_line(exc)})") from exc

    def records(self) -> JsonlReader[RequestRecord]:
        """The request records, streamed from disk (a long run holds more than is worth keeping in memory)."""
        return JsonlReader(self.path / RECORDS, RequestRecord)

    def samples(self) -> list[LevelSample]:
        return list(JsonlReader(self.path / SAMPLES, LevelSample))

    def levels(self) -> list[LevelSummary]:
        """The levels that finished, in the order they ran (a run from before ``levels.jsonl`` has none)."""
        path = self.path / LEVELS
        return list(JsonlReader(path, LevelSummary)) if path.exists() else []

    def invocation(self) -> dict[str, Any]:
        """The flags the run was started with (``bench.json``)."""
        path = self.path / INVOCATION
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise CheckpointError(f"{self.path} has no {INVOCATION}: it was not started by a resumable bench") from exc
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CheckpointError(f"cannot read {path}: {exc}") from exc
        if not isinstance(raw, dict):
            raise CheckpointError(f"{path} is not a bench invocation (expected a JSON object)")
        return raw

    def last_sample_time(self) -> float:
        """The run time of the last server sample on disk (0 when there is none): where a resumed run goes on."""
        path = self.path / SAMPLES
        if not path.exists():
            return 0.0
        return max((s.sample.t for s in JsonlReader(path, LevelSample)), default=0.0)

    def set_aside_unfinished(self, finished: int) -> int:
        """Move the records and samples of levels past the first ``finished`` to the ``*.interrupted.jsonl`` files.

        A resumed run measures the interrupted level again under the same level number; its first, cut-short
        attempt is kept beside the run rather than mixed into its records. Returns the records moved. A run the
        server's loss stopped has a result marked incomplete; it is set aside too (``result.incomplete.json``), as
        the resumed run writes its own.
        """
        if self.finished:
            if self.result().incomplete is None:
                raise CheckpointError(f"{self.path} holds a finished run; there is nothing to continue")
            (self.path / RESULT).rename(self.path / "result.incomplete.json")
        moved = 0
        for name, aside, model in (
            (RECORDS, INTERRUPTED_RECORDS, RequestRecord),
            (SAMPLES, INTERRUPTED_SAMPLES, LevelSample),
        ):
            path = self.path / name
            if not path.exists():
                continue
            keep: list[str] = []
            drop: list[str] = []
            for item in JsonlReader(path, model):
                level = item.ids.level if isinstance(item, RequestRecord) else getattr(item, "level", 0)
                (keep if level < finished else drop).append(item.model_dump_json())
            if not drop:
                continue
            out: JsonlWriter[BaseModel] = JsonlWriter(self.path / aside)
            try:
                for line in drop:
                    out.write_line(line)
            finally:
                out.close()
            write_atomic(path, "".join(f"{line}\n" for line in keep))
            moved += len(drop) if name == RECORDS else 0
        return moved


def export_csv(run: RunDir, result: RunResult | None = None) -> dict[str, int]:
    """Write ``records.csv``, ``levels.csv`` and ``samples.csv`` into the run directory (its levels from
    ``result``, else its ``result.json``); returns rows written per file name."""
    result = result if result is not None else run.result()

    def samples() -> Iterator[tuple[int, ServerSample]]:  # read when its file is written, after the records'
        for s in run.samples():
            yield s.level, s.sample

    return write_csv_files(run.path, run.records(), result.levels, samples())


class RunWriter:
    """Where a running benchmark puts what it collects; ``finish`` writes the compiled result and the CSVs.

    ``record`` and ``sample`` reach the file before they return (see ``store.jsonl``), so nothing collected is
    lost when the process dies; call ``flush`` at the end of each level to make it durable against a crash of
    the machine too. Use it as a context manager, or call ``close`` (``finish`` closes it).

    A directory that holds an unfinished run is continued, not emptied (a resumed run appends to what the
    killed process wrote); one that holds a finished run is refused.
    """

    def __init__(self, path: Path, *, on_finish: FinishHook | None = None) -> None:
        self.path = path
        check_run_id(path.name)
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CheckpointError(f"cannot create the run directory {path}: {exc.strerror or exc}") from exc
        if (path / RESULT).exists():
            raise CheckpointError(f"{path} already holds a finished run ({RESULT}); choose another run id")
        if read_info(path) is None:
            # Listed (as incomplete) from the start: a bench killed mid-level still shows in `agentload runs`.
            write_info(path, RunInfo(kind="bench", run_id=path.name, created=now_iso()))
        self._records: JsonlWriter[RequestRecord] = JsonlWriter(path / RECORDS)
        self._samples: JsonlWriter[LevelSample] = JsonlWriter(path / SAMPLES)
        self._levels: JsonlWriter[LevelSummary] = JsonlWriter(path / LEVELS)
        # A request's record goes straight to its log: the sink a bench's turns call, with nothing in between.
        self.record: Callable[[RequestRecord], None] = self._records.write
        self._on_finish = on_finish

    @property
    def run_id(self) -> str:
        return self.path.name

    @property
    def records_written(self) -> int:
        return self._records.written

    @property
    def samples_written(self) -> int:
        return self._samples.written

    def sample(self, level: int, sample: ServerSample) -> None:
        self._samples.write(LevelSample(level=level, sample=sample))

    def level(self, summary: LevelSummary) -> None:
        """A finished level, appended at once (what ``--resume`` reuses instead of measuring it again)."""
        self._levels.write(summary)
        self.flush()

    def invocation(self, flags: dict[str, Any]) -> None:
        """The flags the run was started with, written once (never a key: only the name of its variable)."""
        write_atomic(self.path / INVOCATION, json.dumps(flags, indent=2))

    def flush(self) -> None:
        self._records.flush()
        self._samples.flush()
        self._levels.flush()

    def close(self) -> None:
        try:
            self._records.close()
        finally:
            try:
                self._samples.close()
            finally:
                self._levels.close()

    def finish(self, result: RunResult) -> RunDir:
        """Close the logs, write ``result.json`` and the CSV export, and index the run in the history."""
        if result.run_id != self.run_id:
            raise CheckpointError(f"result of run {result.run_id!r} written into the directory of {self.run_id!r}")
        self.close()
        write_atomic(self.path / RESULT, result.model_dump_json(indent=2))
        write_info(self.path, bench_info(result))
        run = RunDir(self.path)
        export_csv(run, result)
        # A run stopped early (its server was lost) keeps its files for `report PATH`, but the history indexes
        # finished measurements: its half-searched knee and best tok/s would stand beside complete runs unmarked.
        if self._on_finish is not None and result.incomplete is None:
            self._on_finish(result, self.path)
        return run

    def __enter__(self) -> RunWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
