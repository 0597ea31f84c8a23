"""``bench --reply-tokens``: the mean reply of the agentic, agentic-coding and synthetic workloads, the same at any
context, checked against what the context can hold, refused where the workload states its own replies."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from agentload.agent.shape import AgenticShape
from agentload.bench.results import LevelSummary, RunResult
from agentload.bench.settings import BenchSettings
from agentload.cli.main import app
from agentload.errors import ConfigError
from agentload.workload.agentic import AgenticWorkload
from agentload.workload.coding import CodingWorkload
from agentload.workload.registry import check_reply, get_workload
from agentload.workload.synthetic import SyntheticWorkload

CONTEXTS = (2048, 8192, 40_960)


@pytest.mark.parametrize("name", ["agentic", "agentic-hold"])
def test_the_agentic_reply_is_the_one_asked_for_at_every_context(name: str) -> None:
    workload = get_workload(name, reply_tokens=200)
    assert isinstance(workload, AgenticWorkload)
    for context in CONTEXTS:
        assert workload.shape(context).output.mean == pytest.approx(200)
        assert workload.shape(context).opening_tokens < context


def test_the_tool_result_keeps_its_size_whatever_the_reply() -> None:
    # What the agent reads each turn is the published split of the context's growth; a longer reply is more
    # decoding, not less reading (a grow session then ends sooner).
    plain, sized = AgenticShape.published(40_960), AgenticShape.published(40_960, output_tokens=444)
    assert sized.tool_result == plain.tool_result
    assert sized.output.mean == pytest.approx(444)
    assert plain.output.mean < 444


def test_the_coding_reply_mean_is_the_one_asked_for_through_its_median() -> None:
    # agentic-coding's output_tokens is its lognormal's median: the flag's mean sets it through the spread.
    for sigma in (None, 0.0, 0.5):
        options: dict[str, Any] = {"reply_tokens": 300} | ({} if sigma is None else {"output_sigma": sigma})
        workload = get_workload("agentic-coding", **options)
        assert isinstance(workload, CodingWorkload)
        reply = workload.shape(8192).reply
        assert reply.mean == pytest.approx(300)
        assert reply.median < 300 or sigma == 0.0


def test_the_synthetic_arm_draws_the_reply_asked_for() -> None:
    workload = get_workload("synthetic", reply_tokens=150)
    assert isinstance(workload, SyntheticWorkload)
    assert workload.shape_options == {"output_tokens": 150}


@pytest.mark.parametrize(
    ("spec", "options", "says"),
    [
        ("agentic", {"reply_tokens": 200, "output_tokens": 100}, "not both"),
        ("agentic-coding", {"reply_tokens": 200, "output_tokens": 100}, "not both"),
        ("agentic-hold", {"reply_tokens": 0}, "at least 1"),
        ("agentic-hold", {"reply_tokens": 2.5}, "whole number"),
        ("synthetic:1024/256", {"reply_tokens": 200}, "output_len"),
        ("suite", {"reply_tokens": 200}, "unknown suite option"),
    ],
)
def test_a_reply_option_that_cannot_apply_is_one_clear_error(spec: str, options: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        get_workload(spec, **options)


@pytest.mark.parametrize("name", ["agentic", "agentic-hold", "agentic-coding"])
def test_the_largest_reply_a_context_holds_is_the_one_the_error_names(name: str) -> None:
    with pytest.raises(ConfigError, match="at most") as refused:
        check_reply(name, 5000, [8192])
    most = int(str(refused.value).rsplit("at most ", 1)[1].split()[0])
    check_reply(name, most, [8192])  # the named reply fits …
    with pytest.raises(ConfigError, match="at most"):
        check_reply(name, most + 1, [8192])  # … and one more does not


def test_a_context_too_small_for_the_workload_itself_is_not_blamed_on_the_reply() -> None:
    check_reply("agentic-hold", 10, [512])  # the run refuses 512 on its own, as without the flag
    with pytest.raises(ConfigError, match="at least 1024"):
        get_workload("agentic-hold").agents(1, context=512, seed=0)


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        ({"workload": "trace:runs.jsonl"}, "--reply-tokens 200: a trace states its own replies"),
        ({"workload": "suite"}, "--reply-tokens 200: it sizes the replies of agentic"),
        ({"workload": "synthetic:1024/256"}, "--reply-tokens 200: synthetic:1024/256 states its own reply"),
        ({"context": "2048", "reply_tokens": 1000}, "--reply-tokens 1000: a context of 2048 leaves no room"),
        ({"context": "40960,2048", "reply_tokens": 1000}, "a context of 2048"),
        ({"reply_tokens": 0}, "--reply-tokens 0: must be at least 1"),
        ({"workload": "bogus"}, "--reply-tokens 200: unknown workload"),
    ],
)
def test_bench_refuses_a_reply_the_run_cannot_give_naming_the_flag(flags: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError, match=says.replace("(", r"\(")):
        BenchSettings.model_validate({"sim": "laptop", "agents": 1, "reply_tokens": 200} | flags)


def test_the_flag_reaches_the_workload_and_is_stored() -> None:
    settings = BenchSettings(sim="laptop", agents=1, reply_tokens=200, context="2048")
    assert settings.workload_options == {"reply_tokens": 200}
    assert BenchSettings.model_validate(settings.stored()) == settings
    assert BenchSettings(sim="laptop", agents=1).workload_options == {}


def _level(tmp_path: Path, *args: str) -> LevelSummary:
    runs = tmp_path / "runs"
    result = CliRunner().invoke(
        app,
        ["bench", "--out", str(runs), "--json", "--sim", "llama-8b-h100", "--agents", "2", "--window", "60s",
         "--warmup", "2s", *args],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    (found,) = runs.glob("*/result.json")
    (level,) = RunResult.model_validate_json(found.read_text()).levels
    return level


@pytest.mark.parametrize("workload", ["agentic-hold", "agentic"])
def test_a_small_context_bench_realises_the_reply_asked_for(tmp_path: Path, workload: str) -> None:
    # At 2,048 tokens the context-scaled default asks ~10 tokens a turn; the flag asks 200 and the server
    # generates about that (a held session shortens the few draws that would pass the target).
    plain = _level(tmp_path / "plain", "--workload", workload, "--context", "2048")
    sized = _level(tmp_path / "sized", "--workload", workload, "--context", "2048", "--reply-tokens", "200")
    assert plain.output_realised_mean is not None
    assert sized.output_realised_mean is not None
    assert sized.output_drawn_mean is not None
    assert plain.output_realised_mean < 20
    assert 160 <= sized.output_drawn_mean <= 240
    assert sized.output_realised_mean >= 0.8 * sized.output_drawn_mean


def test_a_bad_reply_flag_is_one_error_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app,
        ["bench", "--out", str(tmp_path), "--sim", "laptop", "--agents", "2", "--context", "2048",
         "--reply-tokens", "5000"],
    )  # fmt: skip
    assert result.exit_code == 2
    assert "error: --reply-tokens 5000: a context of 2048 leaves no room" in result.output
    assert "Traceback" not in result.output
