"""CSV request traces: sizes and arrival times only, no prefix identity.

**BurstGPT** (github.com/HPMLL/BurstGPT, ``data/BurstGPT_*.csv``): ``Timestamp`` (seconds from 0:00 of the trace's
first day), ``Model``, ``Request tokens``, ``Response tokens``, ``Total tokens``, ``Log Type``; its README says
the files with failures record a failed request as 0 response tokens.

**Azure LLM inference traces** (github.com/Azure/AzurePublicDataset, ``data/AzureLLMInferenceTrace_{code,conv}
.csv``): ``TIMESTAMP`` (a wall-clock time, ``2023-11-16 18:17:03.9799600``), ``ContextTokens``,
``GeneratedTokens``.

Neither says which requests share a prefix, so each row becomes a request of its own words (``hash_ids`` empty):
replaying them measures sizes and arrival times, never reuse the trace did not record. Columns are found by name
(case and surrounding spaces ignored), so a file whose columns come in another order, or with more columns, reads
the same. A row with 0 request or response tokens is a request that failed at the source (nothing to replay: a
request needs a prompt and a reply): it is skipped and counted. Anything else that is not a whole number of tokens,
or a time that does not parse, is one ``ConfigError`` naming the file, the line and the column.

This module parses text it is handed; the file is opened and its lines limited by ``workload.trace``.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from agentload.errors import ConfigError

CsvFormat = Literal["burstgpt", "azure"]

# (format, its time column, its input column, its output column), names as they appear once lower-cased.
_LAYOUTS: tuple[tuple[CsvFormat, str, str, str], ...] = (
    ("burstgpt", "timestamp", "request tokens", "response tokens"),
    ("azure", "timestamp", "contexttokens", "generatedtokens"),
)
KNOWN_HEADERS = (
    "BurstGPT (Timestamp, Request tokens, Response tokens, …)",
    "Azure LLM inference (TIMESTAMP, ContextTokens, GeneratedTokens)",
)
_WHOLE = re.compile(r"^\d{1,12}$")
_AZURE_TIME = re.compile(r"^(\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?$")


@dataclass(frozen=True)
class CsvRequest:
    """One replayable row: where it was read, when it arrived (ms) and its sizes."""

    line: int
    timestamp_ms: float
    input_length: int
    output_length: int


@dataclass(frozen=True)
class CsvTrace:
    format: CsvFormat
    requests: list[CsvRequest]
    skipped: int  # rows with 0 request or response tokens: failed at the source


def looks_like_csv_header(line: str) -> bool:
    """Whether ``line`` is the header of a CSV format read here (a trace named without ``.csv``)."""
    try:
        return _layout(_names(next(csv.reader([line])))) is not None
    except (csv.Error, StopIteration):
        return False


def _names(header: list[str]) -> list[str]:
    # A spreadsheet's "CSV UTF-8" starts with a byte-order mark, which would otherwise be part of the first name.
    return [c.strip().lstrip("\ufeff").strip().lower() for c in header]


def _layout(names: list[str]) -> tuple[CsvFormat, int, int, int] | None:
    for fmt, t, inp, out in _LAYOUTS:
        if {t, inp, out} <= set(names):
            return fmt, names.index(t), names.index(inp), names.index(out)
    return None


def read_csv_trace(
    where: str, lines: Iterable[str], *, max_rows: int, max_tokens: int, max_timestamp_ms: float
) -> CsvTrace:
    """The requests of the CSV trace whose text is ``lines`` (``where`` names it in messages)."""
    reader = csv.reader(lines)  # it counts the physical lines itself (``line_num``), quoted newlines included
    try:
        header = next(reader, None)
        if header is None:
            raise ConfigError(f"{where}: the trace is empty")
        layout = _layout(_names(header))
        if layout is None:
            raise ConfigError(
                f"{where}:1: a CSV header of no known trace format ({', '.join(header)[:200]}); "
                f"known: {'; '.join(KNOWN_HEADERS)}"
            )
        fmt, t_col, in_col, out_col = layout
        columns = tuple(header[i].strip().lstrip("\ufeff") for i in (t_col, in_col, out_col))
        requests: list[CsvRequest] = []
        skipped = 0
        for row in reader:
            if not any(c.strip() for c in row):
                continue
            line = reader.line_num
            if len(requests) + skipped >= max_rows:
                raise ConfigError(f"{where}:{line}: a trace holds at most {max_rows:,} rows; cut a window of it")
            if len(row) < len(header):
                raise ConfigError(f"{where}:{line}: {len(row)} columns where the header has {len(header)}")
            at = f"{where}:{line}"
            inp = _tokens(at, columns[1], row[in_col], max_tokens)
            out = _tokens(at, columns[2], row[out_col], max_tokens)
            if inp == 0 or out == 0:
                skipped += 1
                continue
            stamp = _seconds(at, columns[0], row[t_col]) * 1000 if fmt == "burstgpt" else _azure(at, row[t_col])
            if not 0 <= stamp <= max_timestamp_ms:
                raise ConfigError(f"{at}: {columns[0]} {row[t_col].strip()!r} is out of range")
            requests.append(CsvRequest(line, stamp, inp, out))
    except csv.Error as exc:
        raise ConfigError(f"{where}:{reader.line_num}: not CSV ({exc})") from exc
    if not requests:
        raise ConfigError(f"{where}: no replayable row ({skipped} with 0 request or response tokens)")
    return CsvTrace(fmt, requests, skipped)


def _tokens(at: str, column: str, text: str, most: int) -> int:
    value = text.strip()
    if not _WHOLE.match(value):
        raise ConfigError(f"{at}: {column} must be a whole number of tokens, got {value[:40]!r}")
    n = int(value)
    if n > most:
        raise ConfigError(f"{at}: {column} {n:,} is above the {most:,} a request may hold")
    return n


def _seconds(at: str, column: str, text: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise ConfigError(f"{at}: {column} must be seconds, got {text.strip()[:40]!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"{at}: {column} must be finite seconds ≥ 0, got {text.strip()[:40]!r}")
    return value


def _azure(at: str, text: str) -> float:
    """Milliseconds since the epoch of Azure's ``YYYY-MM-DD HH:MM:SS.fffffff`` (7 digits: more than ``datetime``
    reads, so the fraction is taken apart here). Read as UTC: only the differences between rows matter."""
    m = _AZURE_TIME.match(text.strip())
    try:
        if m is None:
            raise ValueError
        whole = datetime.strptime(m.group(1).replace("T", " "), "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
    except ValueError:
        raise ConfigError(
            f"{at}: TIMESTAMP must read like 2023-11-16 18:17:03.9799600, got {text.strip()[:40]!r}"
        ) from None
    fraction = float(f"0.{m.group(2)}") if m.group(2) else 0.0
    # Whole seconds and the fraction apart: a float of epoch seconds would blur the microseconds.
    return int(whole.timestamp()) * 1000 + fraction * 1000
