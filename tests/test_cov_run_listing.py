"""The root of runs as ``agentload runs`` lists it: manifests of every kind, directories from before manifests
(told apart by the files they hold), the history's finished runs only, a resumed run that stopped again taken
out of it, and a damaged directory reported beside the others instead of hiding them."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from agentload.errors import CheckpointError
from agentload.store.catalog import dir_info, safe_dir_info
from agentload.store.manifest import MANIFEST, RunInfo, read_info
from agentload.store.runstore import RunStore


def _info(kind: str = "fleet", **fields: object) -> RunInfo:
    return RunInfo.model_validate({"kind": kind, "run_id": "x", "created": "2026-11-01T10:00:00+00:00", **fields})


def test_a_new_directory_gets_a_fresh_id_and_a_running_manifest(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "runs")
    path, info = store.new_dir(_info(workload="review"), prefix="review-")
    assert re.fullmatch(r"review-\d{8}-\d{6}-[0-9a-f]{4}", path.name)
    assert (info.run_id, info.status) == (path.name, "running")
    assert read_info(path) == info
    other, _ = store.new_dir(_info(), prefix="review-")
    assert other != path  # two runs in the same second never share a directory


def test_only_a_finished_run_is_indexed_and_a_resumed_one_that_stops_again_leaves_the_index(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    path, info = store.new_dir(_info())
    (path / "results.json").write_text("{}", encoding="utf-8")  # the fleet wrote its result
    store.finish(path, info.model_copy(update={"status": "interrupted", "detail": "--stop-after 10"}))
    assert store.history.get(info.run_id) is None
    store.finish(path, info.model_copy(update={"status": "finished", "outcome": "8 of 8 done"}))
    entry = store.history.get(info.run_id)
    assert entry is not None
    assert (entry.status, entry.outcome, entry.path) == ("finished", "8 of 8 done", path)
    store.finish(path, info.model_copy(update={"status": "interrupted"}))  # resumed, then stopped again
    assert store.history.get(info.run_id) is None


def test_the_listing_merges_indexed_and_unindexed_runs_newest_first(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    done, done_info = store.new_dir(_info(created="2026-11-01T10:00:00+00:00"))
    (done / "results.json").write_text("{}", encoding="utf-8")
    store.finish(done, done_info.model_copy(update={"status": "finished"}))
    _, running = store.new_dir(_info(created="2026-11-02T10:00:00+00:00"))
    stopped, stopped_info = store.new_dir(_info(created="2026-10-30T10:00:00+00:00"))
    store.finish(stopped, stopped_info.model_copy(update={"status": "interrupted", "detail": "server lost"}))
    (tmp_path / "not-a-run").mkdir()  # an empty folder is nothing to list
    entries, damaged = store.listing()
    assert damaged == []
    assert [(e.id, e.status) for e in entries] == [
        (running.run_id, "incomplete"),  # its manifest still says running: nobody finished it
        (done_info.run_id, "finished"),
        (stopped_info.run_id, "interrupted"),
    ]
    assert entries[2].detail == "server lost"
    assert [e.id for e in store.listing(limit=1)[0]] == [running.run_id]


def test_a_damaged_directory_is_reported_and_the_rest_still_listed(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    store.new_dir(_info())
    bad = tmp_path / "broken"
    bad.mkdir()
    (bad / MANIFEST).write_text("{truncated", encoding="utf-8")
    entries, damaged = store.listing()
    assert len(entries) == 1
    assert [p for p, _ in damaged] == [bad]
    assert "is not a run manifest" in damaged[0][1]
    assert safe_dir_info(bad)[0] is None


# -- directories written before manifests --------------------------------------------------------------------
def test_a_fleet_run_from_before_manifests_is_running_or_finished_by_its_results(tmp_path: Path) -> None:
    run = tmp_path / "review-20261101-142305-3f9a"
    run.mkdir()
    (run / "run.json").write_text("{}", encoding="utf-8")
    info = dir_info(run)
    assert info is not None
    assert (info.kind, info.run_id, info.status) == ("fleet", run.name, "running")
    assert info.created.startswith("2026-11-01T14:23:05")  # from the id's stamp, not the folder's mtime
    (run / "results.json").write_text("{}", encoding="utf-8")
    finished = dir_info(run)
    assert finished is not None
    assert finished.status == "finished"


def test_a_bench_run_with_records_but_no_result_is_a_running_bench_run(tmp_path: Path) -> None:
    run = tmp_path / "old-bench"  # no stamp in the name: the directory's time stands in
    run.mkdir()
    (run / "records.jsonl").write_text("", encoding="utf-8")
    os.utime(run, (1_700_000_000, 1_700_000_000))  # 2023-11-14T22:13:20Z
    info = dir_info(run)
    assert info is not None
    assert (info.kind, info.status) == ("bench", "running")
    assert info.created[:4] == "2023"


def test_a_directory_without_run_files_is_no_run(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hi", encoding="utf-8")
    assert dir_info(tmp_path) is None


def test_a_manifest_of_another_kind_wins_over_stray_files(tmp_path: Path) -> None:
    run = tmp_path / "r"
    run.mkdir()
    (run / MANIFEST).write_text(_info("suite", run_id="r").model_dump_json(), encoding="utf-8")
    (run / "records.jsonl").write_text("", encoding="utf-8")
    info = dir_info(run)
    assert info is not None
    assert info.kind == "suite"


# -- resolving what a user typed -----------------------------------------------------------------------------
def test_resolve_refuses_a_plain_file_and_an_unknown_id(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    stray = tmp_path / "notes.txt"
    stray.write_text("hi", encoding="utf-8")
    with pytest.raises(CheckpointError, match="is not a run directory \\(a file, not a directory\\)"):
        store.resolve(str(stray))
    with pytest.raises(CheckpointError, match="no-such-run: no such run directory, nor a run id in"):
        store.resolve("no-such-run")


def test_resolve_finds_a_run_by_id_by_path_and_by_result_file(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    path, info = store.new_dir(_info())
    (path / "results.json").write_text("{}", encoding="utf-8")
    store.finish(path, info.model_copy(update={"status": "finished"}))
    assert store.resolve(info.run_id).path == path
    assert store.resolve(str(path)).path == path
    assert store.resolve(str(path / "results.json")).path == path


def test_a_root_that_cannot_be_made_is_one_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("", encoding="utf-8")
    with pytest.raises(CheckpointError, match="cannot create"):
        RunStore(blocker / "runs").new_dir(_info())
