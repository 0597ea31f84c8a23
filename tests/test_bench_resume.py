"""``agentload bench --resume``: an interrupted bench continues where it stopped (every run kind resumes).

The simulator runs in virtual time and is deterministic for a seed, so a run cut after some levels and resumed must
give the levels, the knee and the capacity of the same run left uninterrupted — and must not measure again the
levels it kept.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentload.cli.main import app
from agentload.store.rundir import RunDir

SWEEP = ["bench", "--sim", "laptop", "--context", "4096", "--sweep", "1,2,4", "--warmup", "5s", "--window", "20s",
         "--min-turns", "10"]  # fmt: skip


def _bench(args: list[str]) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, args)
    return result.exit_code, result.stdout, result.stderr


def _one_run(root: Path) -> Path:
    (run,) = [p for p in root.iterdir() if p.is_dir()]
    return run


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, object]]:
    root = tmp_path_factory.mktemp("runs")
    code, out, err = _bench([*SWEEP, "--out", str(root), "--json"])
    assert code == 0, err
    return _one_run(root), json.loads(out)


def _interrupt(finished_dir: Path, root: Path, keep: int) -> Path:
    """A copy of a finished run as a process killed during level ``keep`` would have left it."""
    run = root / finished_dir.name
    shutil.copytree(finished_dir, run)
    for name in ("result.json", "records.csv", "levels.csv", "samples.csv"):
        (run / name).unlink()
    lines = (run / "levels.jsonl").read_text().splitlines(keepends=True)
    (run / "levels.jsonl").write_text("".join(lines[:keep]))
    samples = [ln for ln in (run / "samples.jsonl").read_text().splitlines(keepends=True)
               if json.loads(ln)["level"] <= keep]  # fmt: skip
    (run / "samples.jsonl").write_text("".join(samples))
    return run


def test_a_resumed_bench_gives_the_uninterrupted_result_and_keeps_the_finished_levels(
    finished: tuple[Path, dict[str, object]], tmp_path: Path
) -> None:
    done_dir, whole = finished
    run = _interrupt(done_dir, tmp_path, keep=1)
    before = [ln for ln in (run / "records.jsonl").read_text().splitlines() if json.loads(ln)["ids"]["level"] == 0]
    partial = sum(1 for ln in (run / "records.jsonl").read_text().splitlines() if json.loads(ln)["ids"]["level"] >= 1)
    assert partial > 0  # the cut-short level had sent requests

    code, out, err = _bench(["bench", "--resume", run.name, "--out", str(tmp_path), "--json"])
    assert code == 0, err
    resumed = json.loads(out)
    assert resumed["run_id"] == whole["run_id"]
    assert [lv["agents"] for lv in resumed["levels"]] == [1, 2, 4]
    for a, b in zip(whole["levels"], resumed["levels"], strict=True):  # type: ignore[call-overload]
        assert b["turns"] == a["turns"]
        assert b["output_tps"] == pytest.approx(a["output_tps"], rel=1e-9)
    assert resumed["capacity"] == whole["capacity"]
    assert "1 finished level(s) kept" in err
    assert "records.interrupted.jsonl" in err
    # Level 0 was not measured again: its records are the interrupted run's, byte for byte.
    after = [ln for ln in (run / "records.jsonl").read_text().splitlines() if json.loads(ln)["ids"]["level"] == 0]
    assert after == before
    # The cut-short attempt is kept aside, not mixed into the run's records.
    aside = (run / "records.interrupted.jsonl").read_text().splitlines()
    assert len(aside) == partial
    assert {json.loads(ln)["ids"]["level"] for ln in aside} == {1, 2}
    assert RunDir(run).finished
    assert len(RunDir(run).levels()) == 3


def test_resume_takes_the_flags_the_run_was_started_with(
    finished: tuple[Path, dict[str, object]], tmp_path: Path
) -> None:
    run = _interrupt(finished[0], tmp_path, keep=1)
    stored = json.loads((run / "bench.json").read_text())
    assert stored["sweep"] == "1,2,4"
    assert stored["sim"] == "laptop"
    code, _, err = _bench(["bench", "--resume", str(run), "--window", "60s", "--sweep", "1,2"])
    assert code == 2
    assert "drop --sweep, --window" in err
    assert "Traceback" not in err
    assert not (run / "records.interrupted.jsonl").exists()  # a refused resume touched nothing


def test_resume_refuses_a_finished_run_and_a_missing_one(
    finished: tuple[Path, dict[str, object]], tmp_path: Path
) -> None:
    code, _, err = _bench(["bench", "--resume", str(finished[0])])
    assert code == 2
    assert "that run finished" in err
    code, _, err = _bench(["bench", "--resume", "no-such-run", "--out", str(tmp_path)])
    assert code == 2
    assert "no such run directory" in err


def test_resume_of_a_run_without_an_invocation_says_so(tmp_path: Path) -> None:
    run = tmp_path / "20260101-000000-abcd"
    run.mkdir()
    (run / "records.jsonl").write_text("")
    code, _, err = _bench(["bench", "--resume", str(run)])
    assert code == 2
    assert "not started by a resumable bench" in err


def test_a_url_with_credentials_is_stored_redacted_and_must_be_given_again(tmp_path: Path) -> None:
    run = tmp_path / "20260101-000000-abcd"
    run.mkdir()
    stored = {"url": "http://u:***@127.0.0.1:9/v1", "url_redacted": True, "model": "m", "find_knee": True}
    (run / "bench.json").write_text(json.dumps(stored))
    code, _, err = _bench(["bench", "--resume", str(run)])
    assert code == 2
    assert "give that --url again" in err
    code, _, err = _bench(["bench", "--resume", str(run), "--url", "http://u:p@127.0.0.1:10/v1"])
    assert code == 2
    assert "give that --url again" in err
    # The same server with its credentials: accepted, then the (closed) port answers as any bench's would.
    code, _, err = _bench(["bench", "--resume", str(run), "--url", "http://u:p@127.0.0.1:9/v1", "--wait-ready", "1s"])
    assert code == 2
    assert "give that --url again" not in err
    assert "u:p@" not in err


def test_a_run_the_server_loss_stopped_resumes_and_its_times_go_on(
    finished: tuple[Path, dict[str, object]], tmp_path: Path
) -> None:
    done_dir, whole = finished
    run = _interrupt(done_dir, tmp_path, keep=2)
    # What a lost server leaves: a result marked incomplete beside the finished levels (the lost one not among them).
    result = json.loads((done_dir / "result.json").read_text())
    result["levels"] = result["levels"][:2]
    result["knee"] = []
    result["incomplete"] = "the server stopped answering"
    (run / "result.json").write_text(json.dumps(result))
    last_kept = max(json.loads(ln)["t"] for ln in (run / "samples.jsonl").read_text().splitlines()
                    if json.loads(ln)["level"] < 2)  # fmt: skip
    code, out, err = _bench(["bench", "--resume", str(run), "--json"])
    assert code == 0, err
    resumed = json.loads(out)
    assert resumed["incomplete"] is None
    assert [lv["agents"] for lv in resumed["levels"]] == [1, 2, 4]
    assert resumed["levels"][2]["output_tps"] == pytest.approx(whole["levels"][2]["output_tps"], rel=1e-9)  # type: ignore[index]
    assert (run / "result.incomplete.json").is_file()
    # The resumed level's samples come after the kept ones on the run's one time axis.
    new = [json.loads(ln)["t"] for ln in (run / "samples.jsonl").read_text().splitlines()
           if json.loads(ln)["level"] == 2]  # fmt: skip
    assert new
    assert min(new) >= last_kept
    # Indexed in the history of the root it lives in (the resume was given by path, with no --out).
    assert (tmp_path / "history.sqlite").exists()


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [("agents", "4", "agents"), ("find_knee", "yes", "find_knee"), ("context", 4096, "context")],
)
def test_a_damaged_invocation_is_one_error_line(
    finished: tuple[Path, dict[str, object]], tmp_path: Path, field: str, value: object, says: str
) -> None:
    run = _interrupt(finished[0], tmp_path, keep=1)
    stored = json.loads((run / "bench.json").read_text())
    stored[field] = value
    (run / "bench.json").write_text(json.dumps(stored))
    code, _, err = _bench(["bench", "--resume", str(run)])
    assert code == 2
    assert f"bench.json: {says}" in err
    assert "Traceback" not in err
    assert not (run / "records.interrupted.jsonl").exists()


def test_a_resume_does_not_switch_servers(tmp_path: Path) -> None:
    run = tmp_path / "20260101-000000-abcd"
    run.mkdir()
    (run / "bench.json").write_text(json.dumps({"url": "http://127.0.0.1:9/v1", "model": "m", "find_knee": True}))
    code, _, err = _bench(["bench", "--resume", str(run), "--url", "http://127.0.0.1:10/v1"])
    assert code == 2
    assert "a resume continues against it" in err
