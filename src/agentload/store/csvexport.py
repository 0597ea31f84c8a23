"""CSV export of a run directory: ``records.csv``, ``levels.csv`` and ``samples.csv`` beside the JSON files.

For spreadsheets and pandas: one row per request, per level, per server sample, with flat columns. The JSON
files stay the source of truth (they keep every chunk time and every tool call; the CSV keeps counts).
Columns follow the models' fields, so a field added to ``LevelSummary`` or ``ServerSample`` appears here
without a change to this module. It is handed what to write and never reads a run directory itself: the run
directory (``store.rundir``) exports itself through it (``rundir.export_csv``) when a run finishes.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from agentload.bench.results import LevelSummary, Percentiles
from agentload.endpoint.records import RequestRecord
from agentload.endpoint.samples import ServerSample
from agentload.store.atomic import atomic_file

RECORDS_CSV = "records.csv"
LEVELS_CSV = "levels.csv"
SAMPLES_CSV = "samples.csv"

RECORD_COLUMNS = [
    "run",
    "level",
    "agent",
    "turn",
    "attempt",
    "model",
    "outcome",
    "error",
    "http_status",
    "t_sent",
    "t_first_token",
    "t_done",
    "ttft_s",
    "latency_s",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "usage_source",
    "finish_reason",
    "chunks",
    "tool_calls",
]


def _record_row(r: RequestRecord) -> list[Any]:
    return [
        r.ids.run,
        r.ids.level,
        r.ids.agent,
        r.ids.turn,
        r.ids.attempt,
        r.model,
        r.outcome.value,
        r.error.value if r.error is not None else "",
        r.http_status,
        r.t_sent,
        r.t_first_token,
        r.t_done,
        r.ttft,
        r.latency,
        r.prompt_tokens,
        r.completion_tokens,
        r.cached_tokens,
        r.usage_source.value,
        r.finish_reason,
        len(r.chunk_times),
        len(r.tool_calls),
    ]


def _percentile_fields() -> list[str]:
    return [name for name, info in LevelSummary.model_fields.items() if info.annotation is Percentiles]


def _flat_name(field: str, key: str) -> str:
    # ttft_s + p95 → ttft_p95_s: the unit stays last, as in every other column.
    return f"{field[:-2]}_{key}_s" if field.endswith("_s") else f"{field}_{key}"


def level_columns() -> list[str]:
    columns: list[str] = []
    nested = set(_percentile_fields())
    for name in LevelSummary.model_fields:
        if name in nested:
            columns += [_flat_name(name, key) for key in Percentiles.model_fields]
        else:
            columns.append(name)
    return columns


def _level_row(level: LevelSummary) -> list[Any]:
    row: list[Any] = []
    nested = set(_percentile_fields())
    for name, value in level.model_dump(mode="json").items():
        if name in nested:
            row += [value[key] for key in Percentiles.model_fields]
        else:
            row.append(value)
    return row


def sample_columns() -> list[str]:
    return ["level", *ServerSample.model_fields]


def _write_csv(path: Path, header: list[str], rows: Iterable[list[Any]]) -> int:
    count = 0
    with atomic_file(path, newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        for row in rows:
            # None → empty cell (csv would write "None").
            writer.writerow(["" if v is None else v for v in row])
            count += 1
    return count


def write_csv_files(
    directory: Path,
    records: Iterable[RequestRecord],
    levels: Iterable[LevelSummary],
    samples: Iterable[tuple[int, ServerSample]],
) -> dict[str, int]:
    """Write the three CSV files into ``directory`` (``samples``: each with the level it was taken in); returns
    rows written per file name."""
    return {
        RECORDS_CSV: _write_csv(directory / RECORDS_CSV, RECORD_COLUMNS, (_record_row(r) for r in records)),
        LEVELS_CSV: _write_csv(directory / LEVELS_CSV, level_columns(), (_level_row(lv) for lv in levels)),
        SAMPLES_CSV: _write_csv(
            directory / SAMPLES_CSV,
            sample_columns(),
            ([level, *sample.model_dump().values()] for level, sample in samples),
        ),
    }
