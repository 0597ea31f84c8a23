"""Run manifests: the run-id rule (ids name directories and report URLs), the one id scheme, and reading a
manifest that is absent, damaged or from a newer agentload — each one ``CheckpointError`` naming the file."""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

import pytest

from agentload.errors import CheckpointError
from agentload.store.manifest import MANIFEST, KneeEntry, RunInfo, check_run_id, new_run_id, read_info, write_info


@pytest.mark.parametrize("run_id", ["20261101-142305-3f9a", "suite-1", "a", "A.b_c-9", "x" * 128])
def test_run_ids_that_can_name_a_directory(run_id: str) -> None:
    assert check_run_id(run_id) == run_id


@pytest.mark.parametrize(
    "run_id",
    ["", ".", "..", ".hidden", "-rf", "a/b", "../up", "a b", "x" * 129, "ünï", "a\nb", "run;rm"],
)
def test_run_ids_that_cannot(run_id: str) -> None:
    with pytest.raises(CheckpointError, match="cannot name a directory"):
        check_run_id(run_id)


def test_the_run_id_scheme_is_label_date_time_and_a_random_tail() -> None:
    when = datetime(2026, 11, 1, 14, 23, 5)
    bench = new_run_id(when)
    suite = new_run_id(when, prefix="suite-")
    assert re.fullmatch(r"20261101-142305-[0-9a-f]{4}", bench)
    assert re.fullmatch(r"suite-20261101-142305-[0-9a-f]{4}", suite)
    # Runs started in the same second get different ids: 65,536 tails, so 20 draws hold one collision with odds
    # of 0.3% and two with odds of 4 in a million — allow one.
    assert len({new_run_id(when) for _ in range(20)}) >= 19


def test_a_label_that_breaks_the_rule_is_refused() -> None:
    with pytest.raises(CheckpointError):
        new_run_id(prefix="my fleet/")


def _info(**fields: object) -> RunInfo:
    return RunInfo.model_validate({"kind": "bench", "run_id": "r1", "created": "2026-11-01T14:23:05+00:00", **fields})


def test_a_manifest_round_trips(tmp_path: Path) -> None:
    info = _info(status="finished", knees=[KneeEntry(agents=24, context=40960, cause="preemption")], levels=6)
    write_info(tmp_path, info)
    assert read_info(tmp_path) == info
    assert not list(tmp_path.glob("*.tmp*"))  # written atomically: no temporary file left beside it


@pytest.mark.parametrize(
    ("saved", "listed"), [("running", "incomplete"), ("finished", "finished"), ("interrupted", "interrupted")]
)
def test_a_running_manifest_nobody_finished_is_listed_incomplete(saved: str, listed: str) -> None:
    assert _info(status=saved).listed_status == listed


def test_no_manifest_is_none(tmp_path: Path) -> None:
    assert read_info(tmp_path) is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"format": 2, "kind": "bench", "run_id": "r", "created": "x"}', "of format 2; this agentload reads 1"),
        ('{"kind": "bench"}', "is not a run manifest: Field required"),
        ('{"kind": "benchmark", "run_id": "r", "created": "x"}', "is not a run manifest"),
        ("[1, 2]", "is not a run manifest"),
        ("{not json", "is not a run manifest"),
        ("[" * 100_000, "is not a run manifest"),  # too deep for json: the format probe must not raise
    ],
)  # fmt: skip
def test_a_damaged_or_newer_manifest_is_one_error_naming_the_file(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / MANIFEST).write_text(text, encoding="utf-8")
    with pytest.raises(CheckpointError, match=re.escape(str(tmp_path / MANIFEST)) + ".*" + message):
        read_info(tmp_path)


def test_a_manifest_that_is_not_utf8_is_one_error(tmp_path: Path) -> None:
    (tmp_path / MANIFEST).write_bytes(b"\xff\xfe{}")
    with pytest.raises(CheckpointError, match="cannot read"):
        read_info(tmp_path)
