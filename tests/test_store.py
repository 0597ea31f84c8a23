"""Run directories and the run history: what a benchmark writes comes back the same, survives a dead process,
exports to CSV, and is listed by ``agentload runs``.

``synthetic_run`` builds a run with the shapes a real one has (throughput rising then falling past a knee, TTFT
jumping, KV usage filling, preemptions or prefix-cache eviction starting past the knee); the report tests use it
too.
"""

from __future__ import annotations

import csv
import json
import signal
import sqlite3
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

from agentload.bench.results import (
    CapacityEstimate,
    Knee,
    KneeExplanation,
    LevelSummary,
    Percentiles,
    RunResult,
)
from agentload.cli.runs import runs as runs_command
from agentload.endpoint.records import ErrorKind, Outcome, RequestIds, RequestRecord
from agentload.endpoint.samples import ServerSample
from agentload.errors import CheckpointError
from agentload.report.console import history_table
from agentload.store import JsonlReader, JsonlWriter, LevelSample, RunDir, RunStore
from agentload.store.csvexport import level_columns
from agentload.store.manifest import new_run_id


@dataclass(frozen=True)
class SyntheticRun:
    result: RunResult
    records: list[RequestRecord]
    samples: list[LevelSample]


def synthetic_run(
    run_id: str,
    *,
    agents: tuple[int, ...] = (1, 8, 16, 24, 32, 48),
    knee_at: int = 24,
    context: int = 40960,
    pool_tokens: int = 1_449_792,
    cause: Literal["preemption", "cache_eviction"] = "preemption",
    model: str = "qwen3-235b-a22b",
    target: str = "sim:qwen3-235b-gb300 (in-process, virtual time)",
    created: str = "2026-11-01T14:23:05+00:00",
    level_s: int = 20,
    scored: bool = False,
) -> SyntheticRun:
    """A finished find-knee run: levels, 1 Hz server samples and a few records per level, all consistent."""
    levels: list[LevelSummary] = []
    records: list[RequestRecord] = []
    samples: list[LevelSample] = []
    sessions_fit = pool_tokens / context
    counters = {"prompt": 0.0, "gen": 0.0, "queries": 0.0, "hits": 0.0, "preempt": 0.0}
    kv = 0.0
    t = 0.0

    def per_agent_rate(a: int) -> float:
        return 40.0 / (1.0 + a / 60.0)  # step time grows with the batch

    for level, a in enumerate(agents):
        past = max(0, a - knee_at)
        output_tps = a * per_agent_rate(a) if not past else knee_at * per_agent_rate(knee_at) * (knee_at / a) ** 0.7
        prefill_tps = output_tps * 6.0  # long, growing prompts against short replies
        hit = 0.92 - (0.30 * past / knee_at if cause == "cache_eviction" else 0.01 * past / knee_at)
        ttft50 = 0.15 + 0.01 * a if not past else (0.15 + 0.01 * knee_at) * (4 + past / 4)
        preempt_per_s = 0.05 * past if cause == "preemption" else 0.002 * past
        peak_kv = min(0.99, a * context * 0.85 / pool_tokens)
        start = t
        for k in range(level_s):
            kv = peak_kv if k >= 5 else kv + (peak_kv - kv) * 0.5
            counters["prompt"] += prefill_tps
            counters["gen"] += output_tps
            counters["queries"] += prefill_tps
            counters["hits"] += prefill_tps * hit
            counters["preempt"] += preempt_per_s
            running = min(a, knee_at + 2)
            samples.append(
                LevelSample(
                    level=level,
                    sample=ServerSample(
                        t=t,
                        running=running,
                        waiting=a - running,
                        kv_usage=round(kv, 4),
                        prompt_tokens=counters["prompt"],
                        generation_tokens=counters["gen"],
                        prefix_queries=counters["queries"],
                        prefix_hits=counters["hits"],
                        preemptions=round(counters["preempt"], 3),
                        recomputed_tokens=None,  # a real vLLM has no such counter
                    ),
                )
            )
            t += 1.0
        for i in range(4):
            sent = start + 5 + i * 3
            failed = past > 0 and i == 3
            first = sent + ttft50 * (1 + 0.1 * i)
            chunks = [] if failed else [first + 0.03 * j for j in range(20)]
            records.append(
                RequestRecord(
                    ids=RequestIds(run=run_id, level=level, agent=f"agent-{i:03d}", turn=i + 1),
                    model=model,
                    t_sent=sent,
                    t_headers=sent + 0.01,
                    t_first_byte=sent + 0.01,
                    t_first_token=None if failed else first,
                    t_done=sent + 30.0 if failed else chunks[-1],
                    chunk_times=chunks,
                    prompt_tokens=0 if failed else int(context * 0.6) + 512 * i,
                    completion_tokens=0 if failed else 20,
                    cached_tokens=None if failed else int((context * 0.6 + 512 * i) * hit),
                    finish_reason=None if failed else "stop",
                    content="" if failed else "Done: the tests pass.",
                    outcome=Outcome.TIMEOUT if failed else Outcome.OK,
                    error=ErrorKind.FIRST_TOKEN_TIMEOUT if failed else None,
                    error_message="no first token after 30 s" if failed else "",
                )
            )
        levels.append(
            LevelSummary(
                level=level,
                agents=a,
                context=context,
                workload="suite" if scored else "agentic",
                window_s=level_s - 5.0,
                warmup_s=5.0,
                sessions_completed=2 * a,
                sessions_failed=1 if past else 0,
                requests_ok=6 * a,
                requests_failed=a // 8 if past else 0,
                turns=6 * a,
                pass_rate=(1.0 if not past else max(0.4, 1.0 - 0.03 * past)) if scored else None,
                output_tps=output_tps,
                prefill_tps=prefill_tps,
                throughput_source="server",
                prefill_share=prefill_tps / (prefill_tps + output_tps),
                prefix_hit_rate_server=hit,
                prefix_hit_rate_usage=hit - 0.004,
                ttft_s=Percentiles(p50=ttft50, p95=ttft50 * 2.2, p99=ttft50 * 3.5),
                itl_s=Percentiles(p50=0.02 + 0.0004 * a, p95=0.035 + 0.0008 * a, p99=0.05 + 0.001 * a),
                queue_wait_s=Percentiles(p50=0.0, p95=0.8 * ttft50 if past else 0.0, p99=ttft50 if past else 0.0),
                peak_kv_usage=peak_kv,
                mean_kv_usage=peak_kv * 0.9,
                mean_running=float(min(a, knee_at + 2)),
                mean_waiting=float(max(0, a - knee_at - 2)),
                preemptions=round(preempt_per_s * (level_s - 5), 3),
                recomputed_tokens=None,
            )
        )
    at_knee = next(lv for lv in levels if lv.agents == knee_at)
    after = next((lv for lv in levels if lv.agents > knee_at), None)
    if cause == "cache_eviction" and after is not None:
        summary = (
            f"past {knee_at} agents the live contexts outgrow the KV pool: the prefix-cache hit rate falls from "
            f"{at_knee.prefix_hit_rate_server:.0%} to {after.prefix_hit_rate_server:.0%}, so turns re-prefill "
            "their whole context"
        )
    else:
        per_min = (after.preemptions or 0.0) / after.window_s * 60 if after is not None else 0.0
        summary = (
            f"past {knee_at} agents running requests no longer fit in the KV pool: preemptions rise to "
            f"{per_min:.1f}/min and their progress is recomputed"
        )
    evidence = {"agents_at_knee": float(knee_at), "output_tps_at_knee": round(at_knee.output_tps, 1)}
    if after is not None:
        evidence |= {
            "agents_past_knee": float(after.agents),
            "output_tps_past_knee": round(after.output_tps, 1),
            "preemptions_per_min_past_knee": round((after.preemptions or 0.0) / after.window_s * 60, 2),
            "prefix_hit_rate_past_knee": round(after.prefix_hit_rate_server or 0.0, 4),
        }
    result = RunResult(
        run_id=run_id,
        created=created,
        agentload_version="0.1.0",
        target=target,
        model=model,
        workload="suite" if scored else "agentic",
        mode="find-knee",
        settings={"context": context, "slo": None, "seed": 7, "warmup_s": 5.0, "virtual_time": True},
        levels=levels,
        capacity=[
            CapacityEstimate(
                pool_tokens=pool_tokens,
                block_size=16,
                context=context,
                sessions=sessions_fit,
                source="cache_config_info",
            )
        ],
        knee=[
            Knee(
                agents=knee_at,
                context=context,
                criterion="throughput peak",
                measured_over_predicted=knee_at / sessions_fit,
                explanation=KneeExplanation(cause=cause, summary=summary, evidence=evidence),
                agent_turns=6 * sum(agents),
            )
        ],
        notes=["synthetic data for tests"],
    )
    return SyntheticRun(result=result, records=records, samples=samples)


def save(store: RunStore, run: SyntheticRun) -> RunDir:
    """Write a run the way a benchmark does: records and samples as they come, a flush per level, then finish."""
    with store.create(run.result.run_id) as writer:
        for level in run.result.levels:
            for record in run.records:
                if record.ids.level == level.level:
                    writer.record(record)
            for s in run.samples:
                if s.level == level.level:
                    writer.sample(s.level, s.sample)
            writer.flush()
        return writer.finish(run.result)


def test_a_run_round_trips_through_its_directory(tmp_path: Path) -> None:
    run = synthetic_run("qwen-knee")
    saved = save(RunStore(tmp_path), run)

    assert saved.path == tmp_path / "qwen-knee"
    assert saved.result() == run.result
    assert list(saved.records()) == run.records
    assert saved.samples() == run.samples
    # Samples are flat on disk (level beside the sample's own fields) so jq and the CSV see plain columns.
    first = json.loads((saved.path / "samples.jsonl").read_text().splitlines()[0])
    assert (first["level"], first["t"]) == (0, 0.0)
    assert "sample" not in first


def test_csv_export_has_one_row_per_record_level_and_sample(tmp_path: Path) -> None:
    run = synthetic_run("csv-run")
    saved = save(RunStore(tmp_path), run)

    def rows(name: str) -> list[dict[str, str]]:
        with (saved.path / name).open(newline="") as f:
            return list(csv.DictReader(f))

    records = rows("records.csv")
    assert len(records) == len(run.records)
    failed = [r for r in records if r["outcome"] == "timeout"]
    assert len(failed) == sum(1 for r in run.records if not r.ok)
    assert (failed[0]["ttft_s"], failed[0]["error"]) == ("", "first_token_timeout")
    assert float(records[0]["ttft_s"]) == pytest.approx(run.records[0].ttft)
    assert int(records[0]["chunks"]) == len(run.records[0].chunk_times)

    levels = rows("levels.csv")
    assert list(levels[0]) == level_columns()
    assert [int(lv["agents"]) for lv in levels] == [lv.agents for lv in run.result.levels]
    assert float(levels[3]["ttft_p95_s"]) == pytest.approx(run.result.levels[3].ttft_s.p95)
    assert levels[0]["pass_rate"] == ""  # unscored workload: empty, not "None"

    samples = rows("samples.csv")
    assert len(samples) == len(run.samples)
    assert float(samples[-1]["kv_usage"]) == run.samples[-1].sample.kv_usage


def test_records_written_before_the_process_is_killed_are_all_there(tmp_path: Path) -> None:
    """SIGKILL without close or flush: every record handed to the writer is in the file, whole."""
    script = textwrap.dedent(
        f"""
        import os, signal
        from pathlib import Path
        from agentload.endpoint.records import RequestIds, RequestRecord
        from agentload.store import RunStore

        writer = RunStore(Path({str(tmp_path)!r})).create("killed")
        for i in range(500):
            writer.record(RequestRecord(ids=RequestIds(run="killed", turn=i), t_sent=i, t_done=i + 0.5,
                                        chunk_times=[i + 0.1 * j for j in range(50)], completion_tokens=50))
        print("written", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert proc.stdout.strip() == "written"

    run = RunDir(tmp_path / "killed")
    records = run.records()
    got = list(records)
    assert [r.ids.turn for r in got] == list(range(500))
    assert got[499].chunk_times[-1] == pytest.approx(499 + 4.9)
    assert records.torn_bytes == 0
    with pytest.raises(CheckpointError, match="did not finish"):
        run.result()


def _record(i: int) -> RequestRecord:
    return RequestRecord(ids=RequestIds(turn=i), t_sent=float(i), t_done=i + 1.0)


def test_a_torn_last_line_is_dropped_then_cut_off_before_appending(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    with JsonlWriter[RequestRecord](path) as w:
        for i in range(3):
            w.write(_record(i))
    with path.open("ab") as f:
        f.write(b'{"ids": {"run": "x", "tur')  # the machine died mid-line

    reader = JsonlReader(path, RequestRecord)
    assert [r.ids.turn for r in reader] == [0, 1, 2]
    assert reader.torn_bytes == len(b'{"ids": {"run": "x", "tur')

    with JsonlWriter[RequestRecord](path) as w:
        w.write(_record(3))
    reader = JsonlReader(path, RequestRecord)
    assert [r.ids.turn for r in reader] == [0, 1, 2, 3]
    assert reader.torn_bytes == 0


def test_a_damaged_complete_line_is_an_error_naming_the_line(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    path.write_text(_record(0).model_dump_json() + "\n" + '{"t_sent": "soon"}\n')
    with pytest.raises(CheckpointError, match=r"records.jsonl:2: not a RequestRecord \(t_sent"):
        list(JsonlReader(path, RequestRecord))


def test_a_closed_writer_refuses_to_write(tmp_path: Path) -> None:
    writer = JsonlWriter[RequestRecord](tmp_path / "r.jsonl")
    writer.close()
    with pytest.raises(CheckpointError, match="closed"):
        writer.write(_record(0))


def test_a_finished_run_is_never_overwritten(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    save(store, synthetic_run("once"))
    with pytest.raises(CheckpointError, match="already holds a finished run"):
        store.create("once")


def test_an_unfinished_run_is_continued_not_restarted(tmp_path: Path) -> None:
    """A resumed run opens its directory again: what the first process wrote stays, the new lines follow."""
    store = RunStore(tmp_path)
    with store.create("resumed") as first:
        first.record(_record(0))
        first.record(_record(1))
    with store.create("resumed") as second:
        second.record(_record(2))
        saved = second.finish(synthetic_run("resumed").result)
    assert [r.ids.turn for r in saved.records()] == [0, 1, 2]


def test_the_result_must_belong_to_its_directory(tmp_path: Path) -> None:
    with RunStore(tmp_path).create("mine") as writer, pytest.raises(CheckpointError, match="'theirs'"):
        writer.finish(synthetic_run("theirs").result)


@pytest.mark.parametrize("bad", ["../escape", "a/b", "", ".hidden", "x" * 129, "spaces in id"])
def test_run_ids_must_name_a_plain_directory(tmp_path: Path, bad: str) -> None:
    with pytest.raises(CheckpointError, match="cannot name a directory"):
        RunStore(tmp_path).create(bad)


def test_new_run_ids_sort_by_date_and_differ(tmp_path: Path) -> None:
    ids = {new_run_id() for _ in range(20)}
    assert len(ids) == 20
    writer = RunStore(tmp_path).create()
    writer.close()
    assert writer.path.parent == tmp_path
    assert writer.path.is_dir()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "is not JSON"),
        ('{"run_id": "x"}', "is not an agentload result"),
        ('{"schema_version": 99, "run_id": "x"}', "schema 99"),
        ("[1, 2]", "is not an agentload result"),
    ],
)
def test_a_damaged_result_is_one_clear_error(tmp_path: Path, content: str, message: str) -> None:
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "result.json").write_text(content)
    with pytest.raises(CheckpointError, match=message):
        RunDir(tmp_path / "r").result()


def test_history_lists_finished_runs_newest_first(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    save(store, synthetic_run("older", created="2026-10-30T09:00:00+00:00"))
    entries_source = synthetic_run("newer", created="2026-11-01T09:00:00+00:00", knee_at=32, agents=(8, 16, 32, 48))
    save(store, entries_source)
    unfinished = store.create("running-now")
    unfinished.record(_record(0))
    unfinished.close()

    entries = store.runs()
    assert [e.id for e in entries] == ["newer", "older"]
    newer = entries[0]
    assert newer.knee_agents == 32
    assert newer.knees[0].cause == "preemption"
    assert newer.best_output_tps == pytest.approx(max(lv.output_tps for lv in entries_source.result.levels))
    assert newer.path == tmp_path / "newer"
    assert (newer.model, newer.mode, newer.levels) == ("qwen3-235b-a22b", "find-knee", 4)
    assert [e.id for e in store.runs(limit=1)] == ["newer"]
    # Inside the root, paths are stored relative to it: the root can move as a whole.
    with sqlite3.connect(tmp_path / "history.sqlite") as conn:
        assert conn.execute("SELECT path FROM runs WHERE id = 'older'").fetchone()[0] == "older"


def test_history_rebuilds_from_the_run_directories(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    save(store, synthetic_run("a", created="2026-10-30T09:00:00+00:00"))
    save(store, synthetic_run("b", created="2026-10-31T09:00:00+00:00"))
    store.create("unfinished").close()
    (tmp_path / "unfinished" / "records.jsonl").write_text(_record(0).model_dump_json() + "\n")
    (tmp_path / "history.sqlite").unlink()
    assert store.runs() == []

    indexed, skipped = store.history.rebuild()
    assert indexed == 2
    assert [(p.name, "did not finish" in why) for p, why in skipped] == [("unfinished", True)]
    assert [e.id for e in store.runs()] == ["b", "a"]

    # A run directory deleted by hand drops out of the history on the next rebuild.
    for f in (tmp_path / "a").iterdir():
        f.unlink()
    (tmp_path / "a").rmdir()
    store.history.rebuild()
    assert [e.id for e in store.runs()] == ["b"]


def test_a_history_that_is_not_sqlite_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "history.sqlite").write_bytes(b"this is not a database, just text" * 100)
    with pytest.raises(CheckpointError, match=r"history\.sqlite: file is not a database"):
        RunStore(tmp_path).runs()


def test_resolve_finds_a_run_by_path_result_file_or_id(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "root")
    saved = save(store, synthetic_run("by-id"))
    assert store.resolve(str(saved.path)).path == saved.path
    assert store.resolve(str(saved.path / "result.json")).path == saved.path
    assert store.resolve("by-id").path == saved.path

    with pytest.raises(CheckpointError, match="no such run directory, nor a run id"):
        store.resolve("nope")
    (tmp_path / "plain").mkdir()
    with pytest.raises(CheckpointError, match="is not a run directory"):
        store.resolve(str(tmp_path / "plain"))
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(CheckpointError, match="a file, not a directory"):
        store.resolve(str(tmp_path / "file.txt"))


# --- agentload runs -------------------------------------------------------------------------------------------

APP = typer.Typer()
APP.command("runs")(runs_command)


def _runs(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(APP, list(args), env={"COLUMNS": "250"})
    return result.exit_code, result.output


def test_runs_lists_the_history(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    save(store, synthetic_run("first-run", created="2026-10-30T09:00:00+00:00"))
    save(store, synthetic_run("second-run", knee_at=16, agents=(1, 8, 16, 24)))

    code, out = _runs("--root", str(tmp_path))
    assert code == 0, out
    assert out.index("second-run") < out.index("first-run")
    first_row = next(line for line in out.splitlines() if "first-run" in line).split()
    assert first_row[:6] == ["first-run", "2026-10-30", "qwen3-235b-a22b", "agentic", "24", "686"]
    assert "preemption" in out

    code, out = _runs("--root", str(tmp_path), "--json")
    assert code == 0, out
    listed = json.loads(out)
    assert [r["id"] for r in listed] == ["second-run", "first-run"]
    assert listed[0]["knees"] == [{"agents": 16, "context": 40960, "cause": "preemption", "where": "16"}]


def test_runs_fits_a_narrow_terminal(tmp_path: Path) -> None:
    """At 80 columns long targets wrap; the id, the knee and the throughput are never cut or dropped."""
    store = RunStore(tmp_path)
    save(store, synthetic_run("a-rather-long-run-id", target="http://gpu-node-17.example.internal:8000/v1"))
    console = Console(record=True, width=80)
    console.print(history_table(store.runs(), tmp_path))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    row = next(line for line in text.splitlines() if "a-rather-long-run-id" in line)
    assert row.split()[-2:] == ["24", "686"]


def test_runs_on_an_empty_root_says_so(tmp_path: Path) -> None:
    code, out = _runs("--root", str(tmp_path / "none"))
    assert code == 0, out
    assert "no runs" in out
    assert not (tmp_path / "none").exists()  # listing never creates anything


def test_runs_rebuild_reindexes(tmp_path: Path) -> None:
    save(RunStore(tmp_path), synthetic_run("kept"))
    (tmp_path / "history.sqlite").unlink()
    code, out = _runs("--root", str(tmp_path), "--rebuild")
    assert code == 0, out
    assert "indexed 1 run under" in out
    assert "kept" in out


def test_runs_with_a_damaged_history_is_one_error_line_and_exit_2(tmp_path: Path) -> None:
    (tmp_path / "history.sqlite").write_text("garbage" * 1000)
    code, out = _runs("--root", str(tmp_path))
    assert code == 2
    lines = out.strip().splitlines()
    assert len(lines) == 1, out
    assert lines[0].startswith("error: run history")
    assert lines[0].endswith("file is not a database")


def test_the_environment_sets_the_default_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    save(RunStore(tmp_path), synthetic_run("from-env"))
    monkeypatch.setenv("AGENTLOAD_RUNS", str(tmp_path))
    assert [e.id for e in RunStore().runs()] == ["from-env"]
