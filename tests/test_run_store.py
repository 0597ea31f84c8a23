"""One run store for every run kind: bench, suite and fleet runs land under one root with one manifest,
``agentload runs`` lists each with its kind and status (finished, interrupted, incomplete), ``agentload report``
renders each, and a fleet resumes from there.

Runs are made the way a user makes them — the CLI on the embedded simulator — and every assertion reads what the
commands printed or left on disk.
"""

from __future__ import annotations

import json
import re
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from agentload.cli.main import app
from agentload.endpoint.records import RequestIds, RequestRecord
from agentload.errors import CheckpointError
from agentload.fleet.checkpoint import CheckpointLog, SegmentLine, load_log
from agentload.fleet.limiter import Mode
from agentload.store import ROOT_ENV, RunStore
from agentload.store.atomic import atomic_file, write_atomic
from agentload.store.manifest import MANIFEST, RunInfo, read_info
from agentload.store.runstore import save_suite_run
from agentload.suite.results import SuiteRun
from tests.test_cli_run import SMALL
from tests.test_store import SyntheticRun, save, synthetic_run

WIDE = {"COLUMNS": "250"}

# Three agents, two rounds each with a forced tool call: 6 turns in all (the same fleet test_cli_run.py runs).
FLEET = SMALL

RUN_ID = re.compile(r"^(?:[a-z]+-)?\d{8}-\d{6}-[0-9a-f]{4}$")  # [label-]YYYYmmdd-HHMMSS-xxxx


@pytest.fixture(autouse=True)
def _no_ambient_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ROOT_ENV, raising=False)


def invoke(*args: str) -> Result:
    return CliRunner().invoke(app, list(args), env=WIDE)


def _fleet_file(tmp_path: Path) -> Path:
    path = tmp_path / "small.toml"
    path.write_text(FLEET)
    return path


def _fleet(tmp_path: Path, root: Path, *extra: str) -> str:
    result = invoke("run", str(_fleet_file(tmp_path)), "--virtual", "--json", "--out", str(root), *extra)
    assert result.exit_code == 0, result.output
    return str(json.loads(result.stdout)["run_id"])


def _suite(root: Path) -> Path:
    result = invoke("suite", "--tests", "T1,T2", "--sweep", "1,2", "--json", "--out", str(root))
    assert result.exit_code == 0, result.output
    (saved,) = root.glob("suite-*/suite.json")
    return saved.parent


def _bench(root: Path) -> str:
    result = invoke("bench", "--sim", "laptop", "--agents", "1", "--context", "2000", "--warmup", "1s",
                    "--window", "5s", "--json", "--out", str(root))  # fmt: skip
    assert result.exit_code == 0, result.output
    return str(json.loads(result.stdout)["run_id"])


def _listed(root: Path) -> dict[str, dict[str, object]]:
    result = invoke("runs", "--root", str(root), "--json")
    assert result.exit_code == 0, result.output
    return {e["id"]: e for e in json.loads(result.stdout)}


def _report(*args: str) -> Result:
    return invoke("report", *args)


def test_every_kind_lands_under_one_root_with_one_manifest_and_is_listed(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    fleet_id = _fleet(tmp_path, root)
    suite_dir = _suite(root)
    bench_id = _bench(root)

    kinds = {p.name: read_info(p) for p in root.iterdir() if p.is_dir()}
    assert {name: info.kind for name, info in kinds.items() if info} == {
        fleet_id: "fleet",
        suite_dir.name: "suite",
        bench_id: "bench",
    }
    for name, info in kinds.items():
        assert info is not None
        assert info.run_id == name
        assert info.status == "finished"
        assert RUN_ID.match(name), name
    assert fleet_id.startswith("small-")  # the fleet's name (its file's stem) labels its runs
    assert suite_dir.name.startswith("suite-")

    listed = _listed(root)
    assert {i: (e["kind"], e["status"]) for i, e in listed.items()} == {
        fleet_id: ("fleet", "finished"),
        suite_dir.name: ("suite", "finished"),
        bench_id: ("bench", "finished"),
    }
    # The headlines: 3 agents × 2 rounds (FLEET above); the oracle passes T1 and T2 at 1 and 2 agents.
    assert listed[fleet_id]["outcome"] == "3/3 done, 0 failed, 6 turns, width 3.0"
    assert listed[suite_dir.name]["outcome"] == (
        "pass 100% at 1 (2 scored, 0 unscored, 0 not run), 100% at 2 (4 scored, 0 unscored, 0 not run)"
    )
    assert listed[bench_id]["mode"] == "single"
    # Every finished run is in the history, whatever its kind (the index can be rebuilt from the manifests).
    with sqlite3.connect(root / "history.sqlite") as conn:
        rows = dict(conn.execute("SELECT id, kind FROM runs").fetchall())
    assert rows == {fleet_id: "fleet", suite_dir.name: "suite", bench_id: "bench"}
    (root / "history.sqlite").unlink()
    indexed, skipped = RunStore(root).history.rebuild()
    assert (indexed, skipped) == (3, [])

    table = invoke("runs", "--root", str(root))
    assert table.exit_code == 0, table.output
    for kind in ("fleet · finished", "suite · finished", "bench · finished"):
        assert kind in table.output


def test_report_renders_a_fleet_run(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    fleet_id = _fleet(tmp_path, root, "--mode", "parallel", "--width", "2")
    out = tmp_path / "fleet.html"
    result = _report(fleet_id, "--root", str(root), "-o", str(out), "--print")
    assert result.exit_code == 0, result.output
    assert "wrote" in result.output
    assert "1 fleet run, 1 plots" in result.output
    html = out.read_text()
    assert 'data-kind="fleet"' in html
    assert "3: 3 done, 0 failed, 0 skipped, 0 interrupted, 0 not started" in html
    assert "started at 2: the requested width 2" in html
    assert 'data-plot="run0-width"' in html
    # One row per agent (t.0, t.1, t.2), each with its 2 committed turns, in the page and in the printed tables.
    for agent in ("t.0", "t.1", "t.2"):
        assert re.search(
            rf"<td[^>]*>{re.escape(agent)}</td><td[^>]*>t</td><td>0</td><td[^>]*>done</td><td>2</td>", html
        ), agent
        assert re.search(rf"{re.escape(agent)}\s+t\s+0\s+done\s+2\s", result.output), agent


def test_report_renders_a_suite_run(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    suite_dir = _suite(root)
    out = tmp_path / "suite.html"
    result = _report(str(suite_dir), "-o", str(out), "--print")
    assert result.exit_code == 0, result.output
    html = out.read_text()
    assert 'data-kind="suite"' in html
    # The test × level matrix: each of T1, T2 passed by the one agent, then by both.
    for test in ("T1", "T2"):
        assert re.search(rf"<td[^>]*>{test}</td>.*?<td>100% \(1/1\)</td><td>100% \(2/2\)</td>", html, re.S), test
    assert re.search(r"T1\s+basic tool calling.*100% \(1/1\)\s+100% \(2/2\)", result.output)
    assert "<th>1 agent</th><th>2 agents</th>" in html
    assert '<td class="text">basic tool calling</td>' in html  # words left-aligned, figures right


def test_a_report_takes_runs_of_one_kind(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    fleet_id = _fleet(tmp_path, root)
    suite_dir = _suite(root)
    result = _report(fleet_id, str(suite_dir), "--root", str(root), "-o", str(tmp_path / "x.html"))
    assert result.exit_code == 2
    (line,) = result.output.strip().splitlines()
    assert line.startswith("error: a report compares runs of one kind")
    assert not (tmp_path / "x.html").exists()


def test_an_interrupted_fleet_is_listed_then_resumed_from_its_place_to_finished(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    run_id = _fleet(tmp_path, root, "--stop-after", "0")
    listed = _listed(root)
    assert listed[run_id]["status"] == "interrupted"
    assert listed[run_id]["detail"] == "3 agents left to resume (stopped early)"
    assert not (root / "history.sqlite").exists()  # the index holds finished runs only
    table = invoke("runs", "--root", str(root))
    assert "fleet · interrupted" in table.output
    assert f"{run_id}: interrupted — 3 agents left to resume" in table.output

    again = invoke("run", "--resume", run_id, "--out", str(root), "--json")  # by its id, as `runs` lists it
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)["totals"]["turns"] == 6
    assert _listed(root)[run_id]["status"] == "finished"
    assert [e.id for e in RunStore(root).runs()] == [run_id]  # now indexed, under its first id


def test_runs_without_a_result_are_listed_as_incomplete(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    # A bench killed mid-level: records on disk, no result.json.
    writer = store.create("20261201-120000-dead")
    writer.record(RequestRecord(ids=RequestIds(run=writer.run_id, level=0, agent="a", turn=1), t_sent=0.0, t_done=1.0))
    writer.close()
    # A fleet killed before its first segment ended: the store created its directory, nothing finished it.
    store.new_dir(RunInfo(kind="fleet", run_id="", created="2026-12-01T12:30:00+00:00", workload="w"), prefix="w-")
    listed = _listed(tmp_path)
    assert sorted((e["kind"], e["status"]) for e in listed.values()) == [
        ("bench", "incomplete"),
        ("fleet", "incomplete"),
    ]
    table = invoke("runs", "--root", str(tmp_path))
    assert "bench · incomplete" in table.output
    assert "its last process wrote no result" in table.output
    # report says why it cannot render them, in one line each.
    fleet_dir = next(p for p in tmp_path.iterdir() if p.name.startswith("w-"))
    result = _report(str(fleet_dir), "-o", str(tmp_path / "r.html"))
    assert result.exit_code == 2
    assert "did not finish a segment" in result.output
    result = _report("20261201-120000-dead", "--root", str(tmp_path), "-o", str(tmp_path / "r.html"))
    assert result.exit_code == 2
    assert "the run did not finish" in result.output


def test_a_damaged_manifest_is_named_and_does_not_hide_the_other_runs(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    fleet_id = _fleet(tmp_path, root)
    (root / "broken").mkdir()
    (root / "broken" / MANIFEST).write_text('{"kind": "bench"')
    result = CliRunner().invoke(app, ["runs", "--root", str(root)], env=WIDE)
    assert result.exit_code == 0, result.output
    assert fleet_id in result.output
    assert "skipped" in result.stderr
    assert "broken" in result.stderr
    assert "not a run manifest" in result.stderr
    with pytest.raises(CheckpointError, match="not a run manifest"):
        read_info(root / "broken")


def test_a_history_of_schema_1_is_upgraded_in_place(tmp_path: Path) -> None:
    """Schema 1 indexed bench runs only; its rows stay, read as finished bench runs."""
    with sqlite3.connect(tmp_path / "history.sqlite") as conn:
        conn.executescript(
            """
            CREATE TABLE runs (id TEXT PRIMARY KEY, created TEXT NOT NULL, target TEXT NOT NULL, model TEXT NOT NULL,
                workload TEXT NOT NULL, mode TEXT NOT NULL, levels INTEGER NOT NULL, knee_agents INTEGER,
                knees TEXT NOT NULL, best_output_tps REAL, path TEXT NOT NULL, indexed TEXT NOT NULL);
            INSERT INTO runs VALUES ('old', '2026-10-01T00:00:00+00:00', 'sim', 'm', 'agentic', 'find-knee', 5, 24,
                '[{"agents": 24, "context": 40960, "cause": "preemption"}]', 686.0, 'old', '2026-10-01T00:00:00');
            PRAGMA user_version = 1;
            """
        )
    (entry,) = RunStore(tmp_path).runs()
    assert (entry.id, entry.kind, entry.status, entry.knee_agents, entry.best_output_tps) == (
        "old",
        "bench",
        "finished",
        24,
        686.0,
    )
    with sqlite3.connect(tmp_path / "history.sqlite") as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 2


def test_the_atomic_writer_leaves_the_old_file_or_the_new_one(tmp_path: Path) -> None:
    target = tmp_path / "result.json"
    write_atomic(target, "old")

    def die_mid_file() -> None:
        with atomic_file(target) as f:
            f.write("half of the new")
            raise ZeroDivisionError  # the writer dies mid-file

    with pytest.raises(ZeroDivisionError):
        die_mid_file()
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]  # no temporary file left behind
    with pytest.raises(CheckpointError, match="cannot write"):
        write_atomic(tmp_path / "no-such-dir" / "x.json", "x")


def test_a_suite_stopped_by_a_lost_server_is_listed_as_interrupted(tmp_path: Path) -> None:
    why = "http://127.0.0.1:9 has not answered for 20 s: it refuses connections (the server is down)"
    run = SuiteRun(
        suite_version="1.1",
        model="m",
        endpoint="http://127.0.0.1:9/v1",
        started_at=datetime(2026, 12, 1, 12, 0, tzinfo=UTC),
        payload_tokens=1000,
        levels=[],
        incomplete=why,
    )
    saved = save_suite_run(run, tmp_path)
    (entry,) = _listed(tmp_path).values()
    assert (entry["id"], entry["kind"], entry["status"], entry["detail"]) == (
        saved.parent.name,
        "suite",
        "interrupted",
        why,
    )
    assert entry["outcome"] == "no level ran"
    assert RunStore(tmp_path).runs() == []  # not among the finished runs of the history


def test_a_bench_stopped_by_a_lost_server_is_listed_as_interrupted_with_its_knee(tmp_path: Path) -> None:
    why = "http://127.0.0.1:9 has not answered for 20 s: it refuses connections (the server is down)"
    store = RunStore(tmp_path)
    run = synthetic_run("lost-server")
    save(store, SyntheticRun(run.result.model_copy(update={"incomplete": why}), run.records, run.samples))
    save(store, synthetic_run("whole", created="2026-10-01T00:00:00+00:00"))
    listed = _listed(tmp_path)
    assert {i: (e["kind"], e["status"]) for i, e in listed.items()} == {
        "lost-server": ("bench", "interrupted"),
        "whole": ("bench", "finished"),
    }
    assert listed["lost-server"]["detail"] == why
    assert listed["lost-server"]["knees"] == [{"agents": 24, "context": 40960, "cause": "preemption", "where": "24"}]
    assert [e.id for e in store.runs()] == ["whole"]  # the history of finished measurements is unchanged


async def test_the_fleet_log_opened_on_a_torn_file_starts_on_a_clean_line(tmp_path: Path) -> None:
    """The checkpoint log appends through store.jsonl, whose writer cuts a torn tail when it opens the file —
    even when nobody read the log first."""
    path = tmp_path / "turns.jsonl"
    segment = SegmentLine(segment=0, mode=Mode.AUTO, start_width=1, reason="r")
    log = CheckpointLog(path, sync=False)
    await log.append(segment)
    log.close()
    whole = path.read_bytes()
    path.write_bytes(whole + b'{"kind": "seg')  # killed mid-line
    log = CheckpointLog(path, sync=False)
    await log.append(segment.model_copy(update={"segment": 1}))
    log.close()
    state = load_log(path, repair=False)
    assert [s.segment for s in state.segments] == [0, 1]
    assert state.torn_bytes == 0
