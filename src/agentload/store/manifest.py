"""The manifest every run directory carries, whatever its kind: ``<root>/<run_id>/manifest.json``.

One file, one shape for bench, suite and fleet runs: the kind, the run id, when it started, what it
ran against, and its status, plus the headline figures ``agentload runs`` lists. Each kind keeps its own data
files beside it (bench: ``records.jsonl``, ``samples.jsonl``, ``result.json``; suite: ``suite.json``; fleet:
``run.json``, ``turns.jsonl``, ``results.json``); the manifest is how the store tells them apart and lists them
without knowing their formats.

Status on disk is ``running`` from creation until the run writes its result, then ``finished`` or
``interrupted`` (it stopped early — a lost server, ``--stop-after``, agents left to resume). A directory whose
manifest still says ``running`` is listed as ``incomplete``: its process died (or is still going) before it
wrote a result, and what it collected is on disk.
"""

from __future__ import annotations

import json
import re
import secrets
from datetime import datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentload import __version__
from agentload.errors import CheckpointError
from agentload.store.atomic import write_atomic

MANIFEST = "manifest.json"

RunKind = Literal["bench", "suite", "fleet"]
# On disk. "incomplete" is never written: it is what a "running" manifest means once nobody finishes it.
SavedStatus = Literal["running", "finished", "interrupted"]
RunStatus = Literal["finished", "interrupted", "incomplete"]


class KneeEntry(BaseModel):
    """A bench knee as the listing shows it."""

    model_config = ConfigDict(frozen=True)

    agents: int
    context: int
    cause: str
    where: str = ""  # what the measured levels bound ("24", "16–63", "≥ 48"); "" in runs saved before it was kept


class RunInfo(BaseModel):
    """The manifest: what any run directory says about itself (and one row of the run history)."""

    model_config = ConfigDict(frozen=True)

    format: Literal[1] = 1
    kind: RunKind
    run_id: str
    created: str = Field(description="ISO-8601 wall-clock start of the run")
    agentload_version: str = __version__
    status: SavedStatus = "running"
    detail: str = Field(default="", description="why an interrupted run stopped")
    target: str = ""
    model: str = ""
    workload: str = Field(default="", description="bench: the workload; suite: the tests; fleet: the fleet's name")
    mode: str = Field(default="", description="bench: sweep / find-knee / grid / soak; fleet: the width mode")
    levels: int = Field(default=0, description="bench and suite: load levels run; fleet: segments (process runs)")
    knees: list[KneeEntry] = Field(default_factory=list)
    best_output_tps: float | None = None
    outcome: str = Field(default="", description="the headline in a few words (fleet: agents done; suite: pass rate)")

    @property
    def listed_status(self) -> RunStatus:
        return "incomplete" if self.status == "running" else self.status


# Run ids name directories and appear in URLs of a report; keep them to characters no shell or filesystem minds.
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def check_run_id(run_id: str) -> str:
    if not _RUN_ID.fullmatch(run_id) or run_id in (".", ".."):
        raise CheckpointError(
            f"run id {run_id!r} cannot name a directory: use letters, digits, '.', '_' and '-' (at most 128)"
        )
    return run_id


def now_iso() -> str:
    return datetime.now().astimezone().isoformat(timespec="seconds")


def new_run_id(now: datetime | None = None, *, prefix: str = "") -> str:
    """The one run id scheme: ``[label-]YYYYmmdd-HHMMSS-xxxx``, e.g. ``20261101-142305-3f9a`` (bench),
    ``suite-20261101-142305-3f9a``, ``review-20261101-142305-3f9a`` (a fleet named review).

    Sortable by date within a label; the random tail tells apart runs started in one second.
    """
    stamp = (now or datetime.now()).strftime("%Y%m%d-%H%M%S")
    return check_run_id(f"{prefix}{stamp}-{secrets.token_hex(2)}")


def write_info(run_dir: Path, info: RunInfo) -> None:
    write_atomic(run_dir / MANIFEST, info.model_dump_json(indent=2))


def read_info(run_dir: Path) -> RunInfo | None:
    """The manifest, or None for a directory without one (a run from before manifests, or not a run)."""
    path = run_dir / MANIFEST
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from exc
    try:
        return RunInfo.model_validate_json(text)
    except ValidationError as exc:
        version = None
        try:
            raw = json.loads(text)
            version = raw.get("format") if isinstance(raw, dict) else None
        except (json.JSONDecodeError, RecursionError):
            pass
        if isinstance(version, int) and version > 1:
            raise CheckpointError(f"{path} is a manifest of format {version}; this agentload reads 1") from exc
        raise CheckpointError(f"{path} is not a run manifest: {exc.errors()[0]['msg']}") from exc
