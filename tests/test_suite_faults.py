"""The suite survives what bench survives: injected stalls, resets, 5xx, 429s and a cold start leave its scores as
a clean run's, because its load goes through the same connection (watchdog + retries).

The suite runs exactly as ``agentload suite`` runs it (``suite.app.suite_over`` on an ``endpoint.connection``),
against the oracle simulator in process on virtual time, with the production watchdog and retry defaults: a
600 s stall is noticed at the 60 s idle deadline and a 15-minute cold start is waited out, in milliseconds of
wall time. The retry backoff's jitter is seeded too (``retry_rng``), so a run is the same run every time. Drawn
afresh, it moved the moment each resend went out, and with it which turn met which of the simulator's fault draws;
now and then one turn met five in a row and was given up (``max_attempts``, its test unscored): the retry budget
working as documented, in a test that then failed at random (CI twice, the 503 and the 429 cases; none in 40
jitter seeds of each here). The oracle answers every test right, so a clean run passes everything; a fault that
reached a test would turn a pass into a fail or an unscored test. One test runs the CLI against ``agentload sim``
in its own process with faults and a cold start, over HTTP.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from typing import Any

import pytest

from agentload.capacity.profile import load_profile
from agentload.clock import run_virtual
from agentload.endpoint.connection import Connection, ConnectionOptions, open_connection
from agentload.endpoint.records import ErrorKind
from agentload.sim.behaviour import OracleBehaviour
from agentload.sim.faults import FaultSpec, parse_fault
from agentload.sim.inprocess import InProcessTransport
from agentload.sim.server import SimConfig, SimServer
from agentload.suite.app import oracle_book, suite_over
from agentload.suite.cases import all_tests, select
from agentload.suite.results import SuiteRun
from agentload.suite.runner import SuiteConfig
from agentload.suite.scoring import Status
from tests.simserver import sim_process

AGENTS = 2
PROFILE = "qwen3-235b-gb300"  # the suite's default profile: room for the stress tests' payloads


def _suite(faults: list[FaultSpec], cold_start_s: float = 0.0) -> tuple[SuiteRun, SimServer, Connection]:
    async def go() -> tuple[SuiteRun, SimServer, Connection]:
        config = SimConfig(profile=load_profile(PROFILE), behaviour=OracleBehaviour(oracle_book()), faults=faults,
                           seed=7, cold_start_s=cold_start_s)  # fmt: skip
        server = SimServer(config)
        options = ConnectionOptions(retry_rng=random.Random(7))
        async with open_connection("http://sim.invalid", InProcessTransport(server), options=options,
                                   close_transport=True) as conn:  # fmt: skip
            run = await suite_over(conn, all_tests(), SuiteConfig(model=server.model_name), [AGENTS],
                                   endpoint="in-process oracle")  # fmt: skip
        return run, server, conn

    result: tuple[SuiteRun, SimServer, Connection] = run_virtual(go())
    return result


def _verdicts(run: SuiteRun) -> dict[tuple[str, str], Status]:
    return {(a.agent_id, t.test_id): t.status for lv in run.levels for a in lv.agent_results for t in a.tests}


@pytest.fixture(scope="module")
def clean() -> dict[tuple[str, str], Status]:
    run, _server, conn = _suite([])
    verdicts = _verdicts(run)
    assert len(verdicts) == AGENTS * len(all_tests())
    assert set(verdicts.values()) == {Status.PASS}  # the oracle passes everything: the scores faults must keep
    assert conn.retrying is not None
    assert conn.retrying.stats.retried == {}
    return verdicts


@pytest.mark.parametrize(
    "fault",
    [
        "stall:0.15:600",  # a stream that stops for 10 minutes: the watchdog's 60 s idle deadline, then a resend
        "reset:0.15",
        "http503:0.15",
        "http500:0.15",
        "http429:0.15:2",
    ],
)
def test_the_suite_scores_as_a_clean_run_under_injected_faults(
    fault: str, clean: dict[tuple[str, str], Status]
) -> None:
    spec = parse_fault(fault)
    run, server, conn = _suite([spec])
    injected = server.faults.injected.get(spec.kind, 0)
    assert injected >= 3, "the seed must inject this fault several times for the test to mean anything"
    assert run.incomplete is None
    assert _verdicts(run) == clean
    assert conn.retrying is not None
    stats = conn.retrying.stats
    # Every injected fault cost one resend of the same turn, and no turn was given up.
    assert sum(stats.retried.values()) == injected
    assert stats.gave_up == {}
    level = run.levels[0]
    # Every attempt is in the transcripts: the failed ones are exactly the injected faults, each resent.
    assert level.requests_failed == injected
    if spec.kind == "stall":
        # A stall before the first token or between tokens: cut by the watchdog (an idle, ready server says the
        # request is not coming), never waited out for the stall's 600 s.
        assert set(stats.retried) <= {ErrorKind.IDLE_TIMEOUT.value, ErrorKind.FIRST_TOKEN_TIMEOUT.value}
        assert sum(conn.watchdog.statistics().refused.values()) == injected


def test_the_suite_waits_out_a_15_minute_cold_start(clean: dict[tuple[str, str], Status]) -> None:
    run, _server, conn = _suite([], cold_start_s=900.0)
    assert run.incomplete is None
    assert _verdicts(run) == clean
    stats = conn.watchdog.statistics()
    assert stats.granted.get("warming", 0) > 0  # the first turns were held through the warm-up, not killed
    assert stats.refused == {}
    # Each agent's first request waited the whole cold start (its TTFT is the 900 s and more), and succeeded.
    firsts = [a.tests[0].transcript.records()[0] for a in run.levels[0].agent_results]
    assert len(firsts) == AGENTS
    assert all(r.ok and r.ttft is not None and r.ttft >= 900.0 for r in firsts)


def _cli(*args: str) -> tuple[int, str, str]:
    proc = subprocess.run([sys.executable, "-m", "agentload", "suite", *args], capture_output=True, text=True,
                          timeout=600, env=None)  # fmt: skip
    return proc.returncode, proc.stdout, proc.stderr


def _passes(data: dict[str, Any]) -> dict[str, int]:
    """Per test, how many of the level's agents passed it (what --json keeps of the verdicts)."""
    [level] = data["levels"]
    return {s["test_id"]: s["passed"] for s in level["per_test"]}


@pytest.mark.slow
def test_the_suite_command_over_http_survives_resets_503s_and_a_cold_start() -> None:
    """``agentload suite --url`` on a simulator that resets and 503s requests and starts 3 s late: all pass.

    One agent, so the simulator draws its faults for the same requests in the same order every run (seed 3 fails 3
    of them). With two agents the interleaving decided which turn got which draws, and at 0.36 failures an attempt
    a turn meets five in a row (``max_attempts``, a turn given up, its test unscored) in about 1 run of 13 under
    load: session 9's CI and 3 of 39 runs with a core busy. That is the retry budget working, not a fault that
    reached a score, so the test no longer bets on it.
    """
    tests = "T1,T2,T3"
    faults = ["--fault", "reset:0.2", "--fault", "http503:0.2", "--seed", "3", "--cold-start", "3"]
    with sim_process("laptop", "--behaviour", "oracle", *faults) as (_sim, url):
        code, out, err = _cli("--url", url, "--model", "Qwen/Qwen2.5-0.5B-Instruct", "--tests", tests, "--agents", "1",
                              "--json")  # fmt: skip
    assert code == 0, err
    data = json.loads(out)
    assert data.get("incomplete") is None
    assert _passes(data) == {t.id: 1 for t in select(tests.split(","))}
    # The faults reached the suite's requests (each failed attempt is recorded) and were resent, not scored.
    assert data["levels"][0]["requests_failed"] >= 2
