"""FLEET.toml: parsing, one-line errors for every kind of mistake, replicas, waves, and each agent's spec."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentload.errors import ConfigError
from agentload.fleet.config import expand, filler, load_fleet, parse_fleet

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

GOOD = """
name = "demo"

[defaults]
tools = ["search"]
max_rounds = 4
think_time_s = 0.5

[[tasks]]
id = "setup"
prompt = "Write a plan."
tools = ["write_file"]

[[tasks]]
id = "review"
prompt = "Review module {replica}."
count = 12
depends_on = ["setup"]

[[tasks]]
id = "report"
prompt = "Summarise."
depends_on = ["review"]
tool_choice = "search"

[[tasks]]
id = "solo"
prompt = "Independent."
max_rounds = 2
"""


def test_replicas_waves_and_inherited_defaults() -> None:
    plans = expand(parse_fleet(GOOD))
    ids = [p.agent_id for p in plans]
    # Wave 0 first (setup, solo, in file order), then the twelve reviewers, then the report.
    assert ids[:2] == ["setup", "solo"]
    assert ids[2:14] == [f"review.{i:02d}" for i in range(12)]
    assert ids[14] == "report"
    assert [p.wave for p in plans] == [0, 0] + [1] * 12 + [2]
    assert [p.index for p in plans] == list(range(15))
    by_id = {p.agent_id: p for p in plans}
    assert by_id["setup"].tools == ("write_file",)  # the task's own list replaces the default
    assert by_id["review.03"].tools == ("search",)
    assert by_id["review.03"].max_rounds == 4
    assert by_id["solo"].max_rounds == 2
    assert by_id["review.03"].think_time_s == 0.5
    assert by_id["report"].depends_on == ("review",)


def test_spec_substitutes_the_replica_and_forces_a_named_tool() -> None:
    plans = {p.agent_id: p for p in expand(parse_fleet(GOOD))}
    spec = plans["review.07"].spec("m")
    assert spec.model == "m"
    assert spec.messages[-1]["content"] == "Review module 7."
    report = plans["report"].spec("m", {"review.00": "fine"})
    assert report.tool_choice == {"type": "function", "function": {"name": "search"}}
    assert "[review.00]\nfine" in report.messages[-1]["content"]


def test_context_filler_is_deterministic_and_unique_per_agent() -> None:
    text = '[[tasks]]\nid = "a"\nprompt = "p"\ncount = 2\ncontext_tokens = 500\n'
    plans = expand(parse_fleet(text))
    first = [p.spec("m").messages[-1]["content"] for p in plans]
    again = [p.spec("m").messages[-1]["content"] for p in expand(parse_fleet(text))]
    assert first == again  # a resume rebuilds the very same prompts
    assert first[0] != first[1]  # replicas do not share a prefix beyond the prompt itself
    assert len(filler("a.0", 500).split()) == 500


def test_the_example_fleet_loads() -> None:
    fleet = load_fleet(EXAMPLES / "laptop-knee.toml")
    plans = expand(fleet)
    assert fleet.name == "laptop-knee"
    assert len(plans) == 24
    # ~7k of context plus 8 rounds of ~150 tokens: about 8 agents fit a 65,536-token pool.
    assert 7_500 < plans[0].planned_context() < 8_500


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[tasks]\nid = 1", "not valid TOML"),
        ('[[tasks]]\nid = "a"\nprompt = "p"\ntools = ["shell"]\n', "unknown tool 'shell'; built-in tools: calculator"),
        ('[defaults]\ntools = ["nope"]\n[[tasks]]\nid = "a"\nprompt = "p"\n', "[defaults] names unknown tool 'nope'"),
        (
            '[[tasks]]\nid = "a"\nprompt = "p"\ndepends_on = ["b"]\n[[tasks]]\nid = "b"\nprompt = "p"\n'
            'depends_on = ["a"]\n',
            "dependency cycle: a → b → a",
        ),
        ('[[tasks]]\nid = "a"\nprompt = "p"\ndepends_on = ["a"]\n', "dependency cycle: a → a"),
        ('[[tasks]]\nid = "a"\nprompt = "p"\ndepends_on = ["ghost"]\n', "depends on 'ghost', which no task defines"),
        ('[[tasks]]\nid = "a"\nprompt = "p"\n[[tasks]]\nid = "a"\nprompt = "q"\n', "task id 'a' is used twice"),
        ('[[tasks]]\nid = "a"\nprompt = "p"\nmax_round = 3\n', 'tasks[0] (id "a").max_round: Extra inputs'),
        ('[[tasks]]\nid = "a"\nprompt = "p"\nmax_rounds = 0\n', 'tasks[0] (id "a").max_rounds'),
        ('[[tasks]]\nid = "a b"\nprompt = "p"\n', 'tasks[0] (id "a b").id: Value error, use 1-64 letters'),
        ('[[tasks]]\nid = "a"\nprompt = "p"\ntools = ["echo"]\ntool_choice = "search"\n', "forces tool 'search'"),
        ('name = "x"\n', "tasks: Field required"),
    ],
)
def test_mistakes_are_one_clear_line(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_fleet(text, "f.toml")
    assert message in str(info.value)
    assert str(info.value).startswith("f.toml: ")
    assert "\n" not in str(info.value)


def test_a_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read fleet file"):
        load_fleet(tmp_path / "absent.toml")


def test_the_file_stem_names_an_unnamed_fleet(tmp_path: Path) -> None:
    path = tmp_path / "nightly-batch.toml"
    path.write_text('[[tasks]]\nid = "a"\nprompt = "p"\n')
    assert load_fleet(path).name == "nightly-batch"


def test_a_long_dependency_chain_expands_without_recursion() -> None:
    # Recursion in the wave computation died on a chain of 350 tasks; 3,000 is three times the recursion limit.
    n = 3_000
    text = "".join(
        f'[[tasks]]\nid = "t{i}"\nprompt = "x"\n' + (f'depends_on = ["t{i - 1}"]\n' if i else "") for i in range(n)
    )
    plans = expand(parse_fleet(text))
    assert [p.wave for p in plans] == list(range(n))


def test_fleet_numbers_are_finite_and_bounded() -> None:
    for line, needle in (
        ("context_tokens = 2000000000", "less than or equal to 2000000"),
        ("think_time_s = inf", "finite number"),
        ("max_tokens = 1000000000000", "less than or equal to 1000000"),
    ):
        with pytest.raises(ConfigError, match=needle):
            parse_fleet(f'[[tasks]]\nid = "t"\nprompt = "x"\n{line}\n')
    many = "".join(f'[[tasks]]\nid = "t{i}"\nprompt = "x"\ncount = 60000\n' for i in range(2))
    with pytest.raises(ConfigError, match="120,000 agents in all; a fleet holds at most 100,000"):
        parse_fleet(many)
