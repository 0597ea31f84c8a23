"""Workloads by name, with their options; unknown names and options are ConfigErrors that list the known ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentload.errors import ConfigError, UnknownNameError
from agentload.workload.agentic import AgenticWorkload
from agentload.workload.registry import get_workload, known_workloads
from agentload.workload.suite import SuiteWorkload
from agentload.workload.synthetic import SyntheticWorkload
from agentload.workload.trace import MooncakeWorkload, SessionReplayWorkload
from tests.test_workload_harness import run_level

DATA = Path(__file__).parent / "data"


def test_names_make_their_workloads() -> None:
    grow = get_workload("agentic")
    hold = get_workload(" agentic-hold ")
    assert isinstance(grow, AgenticWorkload)
    assert isinstance(hold, AgenticWorkload)
    assert (grow.name, grow.growth, hold.name, hold.growth) == ("agentic", "grow", "agentic-hold", "hold")
    assert isinstance(get_workload("synthetic"), SyntheticWorkload)
    assert isinstance(get_workload("suite"), SuiteWorkload)
    mooncake = get_workload(f"trace:{DATA / 'mooncake_sessions.jsonl'}")
    sessions = get_workload(f"trace:{DATA / 'sessions_small.jsonl'}", timing="closed", repeat=True)
    assert isinstance(mooncake, MooncakeWorkload)
    assert isinstance(sessions, SessionReplayWorkload)
    assert mooncake.name == f"trace:{DATA / 'mooncake_sessions.jsonl'}"
    assert (sessions.timing, sessions.repeat) == ("closed", True)


def test_options_reach_the_requests() -> None:
    workload = get_workload("agentic", turns=10, output_tokens=8, ignore_eos=True, extra_body={"temperature": 0.0})
    run = run_level(workload, 1, context=4096, duration_s=20.0)
    assert run.bodies
    assert all(b["ignore_eos"] is True and b["temperature"] == 0.0 for b in run.bodies)
    assert {b["max_tokens"] for b in run.bodies} <= set(range(1, 8 * 4))  # an 8-token mean, capped draws
    synthetic = run_level(get_workload("synthetic", ignore_eos=True), 1, context=4096, duration_s=2.0)
    assert all(b["ignore_eos"] is True for b in synthetic.bodies)


def test_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(UnknownNameError) as info:
        get_workload("agentc")
    assert isinstance(info.value, ConfigError)
    assert str(info.value) == f"unknown workload 'agentc'; known: {', '.join(sorted(known_workloads()))}"
    assert "trace:FILE" in str(info.value)


@pytest.mark.parametrize(
    ("spec", "options", "message"),
    [
        ("agentic", {"speed": 2}, "unknown agentic option speed; known: "),
        ("agentic-hold", {"pace": True}, "unknown agentic-hold option pace"),
        ("synthetic", {"repeat": True}, "unknown synthetic option repeat"),
        ("suite", {"turns": 3}, "unknown suite option turns"),
        ("trace:", {}, "trace: needs a file"),
        (f"trace:{DATA / 'mooncake_sessions.jsonl'}", {"timing": "closed"}, "unknown trace option timing"),
        (f"trace:{DATA / 'sessions_small.jsonl'}", {"speed": 0}, "speed must be positive"),
        (f"trace:{DATA / 'sessions_small.jsonl'}", {"timing": "open"}, "timing must be 'recorded' or 'closed'"),
        (f"trace:{DATA / 'sessions_small.jsonl'}", {"loop": True}, "unknown trace option loop"),
        ("agentic", {"extra_body": ["x"]}, "extra_body must be a mapping"),
    ],
)
def test_bad_options_are_config_errors(spec: str, options: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        get_workload(spec, **options)
