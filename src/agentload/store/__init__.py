"""The one run store: every run kind (bench, suite, fleet) in ``<root>/<run id>/`` under one root, each directory
with one manifest (``store.manifest``: kind, id, status, headline), written through one atomic writer
(``store.atomic``) and one durable JSONL appender (``store.jsonl``), indexed in one SQLite history
(``store.history``) and listed by ``RunStore.listing`` — finished, interrupted or incomplete.

Layouts: bench ``store.rundir``; suite ``store.suiterun``; fleet ``fleet.checkpoint`` (the fleet sits above the
store and writes its log and files through it). ``store.catalog`` reads any of them back, old runs included.
"""

from agentload.store.history import HistoryEntry, RunHistory
from agentload.store.jsonl import JsonlReader, JsonlWriter
from agentload.store.manifest import MANIFEST, RunInfo, new_run_id
from agentload.store.rundir import LevelSample, RunDir, RunWriter, best_output_tps, export_csv
from agentload.store.runstore import DEFAULT_ROOT, ROOT_ENV, RunStore, run_root

__all__ = [
    "DEFAULT_ROOT",
    "MANIFEST",
    "ROOT_ENV",
    "HistoryEntry",
    "JsonlReader",
    "JsonlWriter",
    "LevelSample",
    "RunDir",
    "RunHistory",
    "RunInfo",
    "RunStore",
    "RunWriter",
    "best_output_tps",
    "export_csv",
    "new_run_id",
    "run_root",
]
