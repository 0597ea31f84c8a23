"""The options every server-facing command shares: one name, one meaning, one root of runs.

``--api-key-env`` is checked on the wire — a simulator that records each request's Authorization header — and in
every file a run leaves behind; the root of runs is checked for each run kind with ``--out``, ``$AGENTLOAD_RUNS``
and neither.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from typer.testing import CliRunner, Result

from agentload.capacity.profile import load_profile
from agentload.cli.main import app
from agentload.endpoint.transport import BearerTransport, MockRequest, MockResponse, MockTransport
from agentload.sim.server import SimConfig, SimServer
from agentload.store import ROOT_ENV, run_root

SECRET = "sk-conventions-very-secret"
WIDE = {"COLUMNS": "240"}  # help text unwrapped, so an option's name is never split across lines

FLEET = """
[defaults]
tools = ["search"]
max_rounds = 2
max_tokens = 8
context_tokens = 100

[[tasks]]
id = "t"
prompt = "Task {replica}."
count = 2
"""


@pytest.fixture(autouse=True)
def _no_ambient_root_or_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests start from a shell with neither a root of runs nor a key set, whatever the developer's shell has."""
    monkeypatch.delenv(ROOT_ENV, raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)


@asynccontextmanager
async def recording_sim(profile: str = "laptop") -> AsyncIterator[tuple[str, list[tuple[str, str | None]]]]:
    """The HTTP simulator, with (path, Authorization header) of every request it was sent."""
    seen: list[tuple[str, str | None]] = []

    @web.middleware
    async def record(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        seen.append((request.path, request.headers.get("Authorization")))
        return await handler(request)

    application = SimServer(SimConfig(profile=load_profile(profile))).app()
    application.middlewares.append(record)  # before start-up, while the list is still open
    server = TestServer(application, host="127.0.0.1")
    await server.start_server()
    try:
        yield f"http://127.0.0.1:{server.port}", seen
    finally:
        await server.close()


def invoke(*args: str) -> Result:
    return CliRunner().invoke(app, list(args), env=WIDE)


def assert_secret_nowhere(result: Result, root: Path) -> None:
    assert SECRET not in result.output
    files = [f for f in root.rglob("*") if f.is_file()]
    assert files, f"nothing was written under {root}"
    for f in files:
        assert SECRET.encode() not in f.read_bytes(), f"the key leaked into {f}"


# -- the options exist, with one help text -------------------------------------------------------------------------
SHARED = {
    "bench": {"--url", "--model", "--api-key-env", "--out", "--json", "--seed"},
    "suite": {"--url", "--model", "--api-key-env", "--out", "--json"},
    "run": {"--url", "--model", "--api-key-env", "--out", "--json"},
    "probe": {"--url", "--model", "--api-key-env", "--json"},
    "calibrate": {"--url", "--model", "--api-key-env", "--json"},
}


@pytest.mark.parametrize("command", sorted(SHARED))
def test_every_server_command_has_the_shared_options(command: str) -> None:
    result = invoke(command, "--help")
    assert result.exit_code == 0, result.output
    for option in SHARED[command]:
        assert f" {option} " in result.output, f"{command} has no {option}"
    # The same words everywhere: a reader who learnt one command has learnt them all.
    assert "sent as a Bearer token and never stored" in result.output
    if "--out" in SHARED[command]:
        assert "$AGENTLOAD_RUNS" in result.output
        assert "./agentload-runs" in result.output


def test_no_seed_where_nothing_is_drawn_at_random() -> None:
    for command in ("probe", "calibrate", "suite", "run"):
        assert " --seed " not in invoke(command, "--help").output, command


# -- the root of runs ---------------------------------------------------------------------------------------------
def test_the_root_is_out_then_the_environment_then_the_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert run_root() == Path("agentload-runs")
    monkeypatch.setenv(ROOT_ENV, str(tmp_path / "env"))
    assert run_root() == tmp_path / "env"
    assert run_root(tmp_path / "given") == tmp_path / "given"


def _fleet(tmp_path: Path) -> Path:
    path = tmp_path / "fleet.toml"
    path.write_text(FLEET)
    return path


def _run_fleet(tmp_path: Path, *extra: str) -> Result:
    result = invoke("run", str(_fleet(tmp_path)), "--virtual", "--profile", "laptop", "--json", *extra)
    assert result.exit_code == 0, result.output
    return result


def test_a_fleet_run_lands_under_agentload_runs_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = _run_fleet(tmp_path)
    run_id = json.loads(result.stdout)["run_id"]
    assert (tmp_path / "agentload-runs" / run_id / "results.json").is_file()
    assert not (tmp_path / "runs").exists()  # the old default of fleet runs


def test_a_fleet_run_lands_under_the_environment_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(ROOT_ENV, str(tmp_path / "from-env"))
    run_id = json.loads(_run_fleet(tmp_path).stdout)["run_id"]
    assert (tmp_path / "from-env" / run_id / "results.json").is_file()
    assert not (tmp_path / "agentload-runs").exists()


def test_a_fleet_run_resumes_from_the_environment_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ROOT_ENV, str(tmp_path / "from-env"))
    first = json.loads(_run_fleet(tmp_path, "--stop-after", "0").stdout)
    run_dir = tmp_path / "from-env" / first["run_id"]
    again = invoke("run", "--resume", str(run_dir), "--json")
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)["totals"]["done"] == 2


def _suite(*extra: str) -> Result:
    result = invoke("suite", "--tests", "T1", "--json", *extra)
    assert result.exit_code == 0, result.output
    return result


def test_a_suite_run_lands_under_agentload_runs_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    _suite()
    (saved,) = (tmp_path / "agentload-runs").glob("suite-*/suite.json")
    assert json.loads(saved.read_text())["levels"][0]["tests"] == ["T1"]


def test_a_suite_run_lands_under_the_environment_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(ROOT_ENV, str(tmp_path / "from-env"))
    _suite()
    assert len(list((tmp_path / "from-env").glob("suite-*/suite.json"))) == 1
    assert not (tmp_path / "agentload-runs").exists()


def test_bench_lands_under_the_environment_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(ROOT_ENV, str(tmp_path / "from-env"))
    result = invoke("bench", "--sim", "laptop", "--agents", "1", "--context", "2000", "--warmup", "1s",
                    "--window", "5s", "--json")  # fmt: skip
    assert result.exit_code == 0, result.output
    run_id = json.loads(result.stdout)["run_id"]
    assert (tmp_path / "from-env" / run_id / "result.json").is_file()
    listed = invoke("runs", "--json")  # and `runs` reads the same root without being told
    assert [e["id"] for e in json.loads(listed.stdout)] == [run_id]


# -- the API key: on every request, in no file --------------------------------------------------------------------
async def test_bench_sends_the_named_key_on_every_request_and_stores_it_nowhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MYKEY", SECRET)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-the-default-not-the-named-one")
    async with recording_sim() as (url, seen):

        def run() -> Result:
            return invoke("bench", "--url", url, "--model", "Qwen/Qwen2.5-0.5B-Instruct", "--api-key-env", "MYKEY",
                          "--workload", "agentic", "--context", "2000", "--agents", "1", "--warmup", "1s",
                          "--window", "3s", "--out", str(tmp_path / "runs"), "--json")  # fmt: skip

        result = await asyncio.to_thread(run)
    assert result.exit_code == 0, result.output
    paths = {p for p, _ in seen}
    # The probe (/v1/models, /metrics), the token sizing and the load (chat), the samplers (/metrics): all of them.
    assert {"/v1/models", "/v1/chat/completions", "/metrics"} <= paths, paths
    unsigned = sorted({p for p, auth in seen if auth != f"Bearer {SECRET}"})
    assert unsigned == [], f"sent without the named key: {unsigned}"
    assert_secret_nowhere(result, tmp_path / "runs")


async def test_a_fleet_run_sends_the_named_key_and_stores_it_nowhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MYKEY", SECRET)
    async with recording_sim() as (url, seen):

        def run() -> Result:
            return invoke("run", str(_fleet(tmp_path)), "--url", url, "--api-key-env", "MYKEY",
                          "--out", str(tmp_path / "runs"), "--json")  # fmt: skip

        result = await asyncio.to_thread(run)
    assert result.exit_code == 0, result.output
    assert "/v1/chat/completions" in {p for p, _ in seen}
    unsigned = sorted({p for p, auth in seen if auth != f"Bearer {SECRET}"})
    assert unsigned == [], f"sent without the named key: {unsigned}"
    assert_secret_nowhere(result, tmp_path / "runs")


async def test_the_suite_sends_the_named_key_and_stores_it_nowhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MYKEY", SECRET)
    async with recording_sim() as (url, seen):

        def run() -> Result:
            return invoke("suite", "--url", url, "--model", "Qwen/Qwen2.5-0.5B-Instruct", "--tests", "T1",
                          "--api-key-env", "MYKEY", "--out", str(tmp_path / "runs"), "--json")  # fmt: skip

        result = await asyncio.to_thread(run)
    assert result.exit_code == 0, result.output
    assert seen
    assert {auth for _, auth in seen} == {f"Bearer {SECRET}"}
    assert_secret_nowhere(result, tmp_path / "runs")


@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "--url", "http://127.0.0.1:9", "--model", "m", "--agents", "1"],
        ["run", "--url", "http://127.0.0.1:9"],
        ["suite", "--url", "http://127.0.0.1:9", "--model", "m"],
        ["probe", "http://127.0.0.1:9"],
        ["calibrate", "--url", "http://127.0.0.1:9"],
    ],
)
def test_a_named_key_variable_that_is_unset_is_one_error_before_any_request(argv: list[str]) -> None:
    result = invoke(*argv, "--api-key-env", "AGENTLOAD_SURELY_UNSET_VARIABLE")
    assert result.exit_code == 2, result.output
    assert "AGENTLOAD_SURELY_UNSET_VARIABLE: that environment variable is not set" in result.output


def test_bench_refuses_a_key_for_the_simulator() -> None:
    result = invoke("bench", "--sim", "laptop", "--agents", "1", "--api-key-env", "OPENAI_API_KEY")
    assert result.exit_code == 2
    assert "--api-key-env goes with --url" in result.output


async def test_the_bearer_transport_signs_every_request_and_hides_the_key() -> None:
    async def ok(_: MockRequest) -> MockResponse:
        return MockResponse()

    inner = MockTransport(ok)
    signed = BearerTransport(inner, SECRET)
    await signed.send("GET", "http://x/metrics", None, {"Accept": "*/*"})
    await signed.send("POST", "http://x/v1/chat/completions", b"{}", {"Authorization": "Bearer other"})
    assert [r.headers["Authorization"] for r in inner.requests] == [f"Bearer {SECRET}"] * 2
    assert inner.requests[0].headers["Accept"] == "*/*"
    assert SECRET not in repr(signed)


# -- probe takes --url like every other command -------------------------------------------------------------------
async def test_probe_takes_url_as_an_option_too() -> None:
    async with recording_sim() as (url, _):
        result = await asyncio.to_thread(invoke, "probe", "--url", url, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["engine"] == "agentload-sim"


def test_probe_refuses_two_different_servers() -> None:
    result = invoke("probe", "http://127.0.0.1:9", "--url", "http://127.0.0.1:10")
    assert result.exit_code == 2
    assert "two servers given" in result.output
    assert invoke("probe").exit_code == 2
