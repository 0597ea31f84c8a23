"""Run directories (records, samples, the compiled result, CSV export) and the SQLite run history.

See ``store.rundir`` for the layout and ``store.history`` for the index.
"""

from agentload.store.csvexport import export_csv
from agentload.store.history import HistoryEntry, RunHistory
from agentload.store.jsonl import JsonlReader, JsonlWriter
from agentload.store.manifest import new_run_id
from agentload.store.rundir import LevelSample, RunDir, RunWriter, best_output_tps
from agentload.store.runstore import DEFAULT_ROOT, ROOT_ENV, RunStore, run_root

__all__ = [
    "DEFAULT_ROOT",
    "ROOT_ENV",
    "HistoryEntry",
    "JsonlReader",
    "JsonlWriter",
    "LevelSample",
    "RunDir",
    "RunHistory",
    "RunStore",
    "RunWriter",
    "best_output_tps",
    "export_csv",
    "new_run_id",
    "run_root",
]
