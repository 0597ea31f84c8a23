"""agentload against a trained model: SmolLM2-135M-Instruct on llama-server (the ``smollm2`` fixture).

Every other real-server check serves random weights; this one serves a model that writes text of its own choosing
with a real BPE vocabulary and chat template, so what agentload reads from its replies (stops, tool fields, usage)
is a trained model's. Checked here: probe reads the server right; the suite, greedy (``--temp 0`` on the server)
and run twice, gives each test the same verdict both times, so a score is the model's and not the run's (a 135M
model fails most tests; the per-test verdicts go into the tier's summary); and one short bench level realises its
target context within 5 % in the server's tokens, with replies exactly as long as asked (``ignore_eos`` +
``n_predict``) from a model that would stop early on its own.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentload.cli.main import app
from agentload.endpoint.probe import TEMPLATE_DROPS_TOOLS
from agentload.suite.results import SuiteRun, TestResult
from tests.integration.harness.process import timed
from tests.integration.harness.runs import bench, check_held_levels, held_level_text
from tests.integration.harness.runs import probe as run_probe
from tests.integration.llamacpp import FIGURES, SMOLLM2_ALIAS, SMOLLM2_SLOT_CONTEXT, SMOLLM2_SLOTS, SUMMARY, LlamaServer

# The basic tests: one turn each for a model that answers in text. --max-tokens is passed, not left to the suite's
# default, so a rambling reply is capped the same way in both runs whatever that default becomes; 128 rather than a
# tool-calling agent's usual 512 because two of these tests ramble to the cap, and at 8-18 tokens/s (two busy cores)
# 512 made the two runs take five minutes. A tool call fits in 128 tokens.
SUITE_TESTS = "T1,T2,T3,T4"
SUITE_MAX_TOKENS = 128
# One level of short held sessions, one agent per slot; the smallest context agentic sessions take. A turn's new
# prompt is prefilled at ~60 tokens/s on two busy cores, so a turn can take 10-20 s: the window allows a few.
BENCH_AGENTS = SMOLLM2_SLOTS
BENCH_CONTEXT = 1024
BENCH_ARGS = ("--workload", "agentic-hold", "--context", str(BENCH_CONTEXT), "--sweep", str(BENCH_AGENTS),
              "--warmup", "3s", "--window", "30s", "--min-turns", "4")  # fmt: skip


def test_probe_reads_the_trained_models_server(smollm2: LlamaServer) -> None:
    props = json.loads(smollm2.get("/props"))
    slots = json.loads(smollm2.get("/slots"))
    probe = run_probe(smollm2.url)
    assert props["total_slots"] == len(slots) == SMOLLM2_SLOTS
    assert {s["n_ctx"] for s in slots} == {SMOLLM2_SLOT_CONTEXT}
    assert probe["engine"] == "llamacpp"
    assert probe["model"] == SMOLLM2_ALIAS
    assert probe["models"] == [SMOLLM2_ALIAS]
    assert probe["version"] == props["build_info"]
    assert probe["parallel_slots"] == probe["max_running"] == SMOLLM2_SLOTS
    assert probe["max_context"] == SMOLLM2_SLOT_CONTEXT
    assert probe["pool_tokens"] == SMOLLM2_SLOTS * SMOLLM2_SLOT_CONTEXT
    assert probe["block_size"] is None
    assert probe["reports_cached_tokens"] is True
    assert probe["output_length_control"] == "ignore_eos + n_predict=max_tokens"
    caps = props.get("chat_template_caps", {})
    # The GGUF's own template renders no tools; llama-server says so and probe passes it on.
    assert caps.get("supports_tools") is False
    assert TEMPLATE_DROPS_TOOLS in probe["notes"]
    FIGURES["SmolLM2 probe"] = (
        f"engine {probe['engine']} {probe['version']}, model {probe['model']} ({props.get('model_ftype')}), slots "
        f"{probe['parallel_slots']} × {probe['max_context']} tokens, pool {probe['pool_tokens']}; template renders "
        f"tools: {caps.get('supports_tools')}"
    )


def suite_run(server: LlamaServer, out: Path) -> SuiteRun:
    result = CliRunner().invoke(app, ["suite", "--url", server.url, "--agents", "1", "--tests", SUITE_TESTS,
                                      "--max-tokens", str(SUITE_MAX_TOKENS), "--out", str(out), "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    runs = list(out.glob("*/suite.json"))
    assert len(runs) == 1, runs
    return SuiteRun.model_validate_json(runs[0].read_text())


def verdicts(run: SuiteRun) -> list[TestResult]:
    (level,) = run.levels
    (agent,) = level.agent_results
    return agent.tests


def replies(test: TestResult) -> list[str]:
    return [r.content for turn in test.transcript.turns for r in turn.records]


@pytest.fixture(scope="module")
def suite_twice(smollm2: LlamaServer, tmp_path_factory: pytest.TempPathFactory) -> tuple[SuiteRun, SuiteRun]:
    with timed(SUMMARY, "SmolLM2 suite, twice"):
        return suite_run(smollm2, tmp_path_factory.mktemp("suite1")), suite_run(smollm2, tmp_path_factory.mktemp("s2"))


def test_the_suite_scores_the_greedy_model_the_same_twice(suite_twice: tuple[SuiteRun, SuiteRun]) -> None:
    first, second = (verdicts(run) for run in suite_twice)
    FIGURES["SmolLM2 suite (greedy, 1 agent)"] = "; ".join(
        f"{t.test_id} {t.status.value}: {t.reason} ({len(t.transcript.turns)} turns)" for t in first
    )
    differ = [a.test_id for a, b in zip(first, second, strict=True) if replies(a) != replies(b)]
    FIGURES["SmolLM2 suite, replies that differ between the runs"] = ", ".join(differ) or "none"
    assert [t.test_id for t in first] == SUITE_TESTS.split(",")
    # Every request answered: a verdict is about the model's reply, never about a cut or a parse failure.
    for test in first + second:
        failed = [r for turn in test.transcript.turns for r in turn.records if not r.ok]
        assert not failed, (test.test_id, [(r.outcome, r.error_message) for r in failed])
    assert [(t.test_id, t.status, t.reason) for t in first] == [(t.test_id, t.status, t.reason) for t in second]
    assert suite_twice[0].model == SMOLLM2_ALIAS


def test_a_short_sweep_realises_its_context_and_exact_outputs(smollm2: LlamaServer, tmp_path: Path) -> None:
    with timed(SUMMARY, f"SmolLM2 bench, {BENCH_AGENTS} agents"):
        run = bench(tmp_path, "--url", smollm2.url, "--model", smollm2.model, *BENCH_ARGS)
    levels = sorted(run.levels, key=lambda lv: lv.agents)
    FIGURES["SmolLM2 bench"] = held_level_text(levels, hits=False)
    why = FIGURES["SmolLM2 bench"]
    check_held_levels(levels, BENCH_AGENTS, BENCH_CONTEXT, why)
