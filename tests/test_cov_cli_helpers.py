"""The helpers behind the commands' flags, called directly: ``agentload sim``'s --max-model-len (``sim.server``) and
--behaviour (``suite.app``) rules, the oracle's book (``suite.app``) holding a scenario for every suite test, and the
command line's own: the seed and API-key rules, and the one error line every command prints (redacted, and with the
user's text shown as text, not as console markup)."""

from __future__ import annotations

import io

import pytest
import typer
from rich.console import Console

from agentload.capacity.profile import load_profile
from agentload.cli import common
from agentload.cli.common import clean_errors
from agentload.endpoint.apikey import read_api_key, resolve_key_env
from agentload.endpoint.redact import SECRETS
from agentload.errors import ConfigError
from agentload.inputs import MAX_SEED, check_seed
from agentload.sim.agentmodel import AgentBehaviour
from agentload.sim.behaviour import FillerBehaviour, OracleBehaviour
from agentload.sim.server import with_max_model_len
from agentload.suite.app import make_behaviour, oracle_book
from agentload.suite.cases import all_tests


def test_a_shorter_max_model_len_keeps_the_pool() -> None:
    laptop = load_profile("laptop")  # 65,536-token pool, max_model_len 16,384
    shorter = with_max_model_len(laptop, 8192)
    assert shorter.max_model_len == 8192
    assert shorter.num_blocks == laptop.num_blocks
    # vLLM's line: 65,536 ÷ 8,192 = 8.00x concurrency.
    assert shorter.startup_lines()[1] == "Maximum concurrency for 8,192 tokens per request: 8.00x"


def test_max_model_len_up_to_the_whole_pool_and_not_past_it() -> None:
    laptop = load_profile("laptop")
    assert with_max_model_len(laptop, 65536).max_concurrency == pytest.approx(1.0)  # one request fills the pool
    with pytest.raises(ConfigError, match="--max-model-len 65537 needs 4097 KV blocks per request but the pool has"):
        with_max_model_len(laptop, 65537)
    with pytest.raises(ConfigError, match="--max-model-len must be positive"):
        with_max_model_len(laptop, 0)


def test_behaviour_flags() -> None:
    assert isinstance(make_behaviour("filler"), FillerBehaviour)
    agent = make_behaviour("agent", error_rate=0.2)
    assert isinstance(agent, AgentBehaviour)
    oracle = make_behaviour("oracle", known_bad="refuse")
    assert isinstance(oracle, OracleBehaviour)
    assert isinstance(oracle.fallback, AgentBehaviour)  # a foreign client's conversation gets the agent model


@pytest.mark.parametrize(
    ("kind", "kw", "message"),
    [
        ("filler", {"error_rate": 0.1}, "--error-rate needs --behaviour agent or oracle"),
        ("agent", {"known_bad": "refuse"}, "--known-bad needs --behaviour oracle"),
        ("poet", {}, "--behaviour 'poet': use agent, filler, oracle"),
    ],
)
def test_behaviour_flags_that_do_not_go_together(kind: str, kw: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make_behaviour(kind, **kw)  # type: ignore[arg-type]  # the keyword arguments of each case


def test_the_oracle_book_has_a_scenario_for_every_suite_test() -> None:
    book = oracle_book()
    ids = {t.id for t in all_tests()}
    assert ids <= set(book.ids())
    assert {"echo", "tool-roundtrip"} <= set(book.ids())  # and the simulator's own


@pytest.mark.parametrize("seed", [0, 1, 2**32, MAX_SEED])
def test_seeds_in_range(seed: int) -> None:
    assert check_seed(seed) == seed


@pytest.mark.parametrize("seed", [-1, MAX_SEED + 1])
def test_seeds_out_of_range(seed: int) -> None:
    with pytest.raises(ConfigError, match=f"--seed {seed}: use a whole number from 0 to {MAX_SEED}"):
        check_seed(seed)


def test_a_named_key_variable_must_be_set_and_the_default_may_be_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("MY_KEY", raising=False)
    assert resolve_key_env(None) == "OPENAI_API_KEY"
    assert read_api_key(None) is None  # most local servers want no key
    with pytest.raises(ConfigError, match="--api-key-env MY_KEY: that environment variable is not set"):
        resolve_key_env("MY_KEY")
    monkeypatch.setenv("MY_KEY", "")
    with pytest.raises(ConfigError):
        resolve_key_env("MY_KEY")  # set but empty sends no key: as good as unset


def test_a_read_key_is_registered_as_a_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_KEY", "sk-test-0123456789abcdef")
    assert read_api_key("MY_KEY") == "sk-test-0123456789abcdef"
    assert SECRETS.redact("got sk-test-0123456789abcdef back") == "got *** back"


def _error_line(monkeypatch: pytest.MonkeyPatch, exc: Exception) -> tuple[str, int]:
    out = io.StringIO()
    monkeypatch.setattr(common, "err_console", Console(file=out, width=400, color_system=None))
    with pytest.raises(typer.Exit) as info, clean_errors():
        raise exc
    return out.getvalue(), info.value.exit_code


def test_an_agentload_error_is_one_line_and_exit_2(monkeypatch: pytest.MonkeyPatch) -> None:
    text, code = _error_line(monkeypatch, ConfigError("fleet.toml: tasks[0].prompt: Field required"))
    assert (text, code) == ("error: fleet.toml: tasks[0].prompt: Field required\n", 2)


def test_the_users_text_in_an_error_is_not_console_markup(monkeypatch: pytest.MonkeyPatch) -> None:
    text, _ = _error_line(monkeypatch, ConfigError("unknown profile '[/bold]x[red]'"))
    assert text == "error: unknown profile '[/bold]x[red]'\n"  # shown as typed; rich did not eat or choke on it


def test_an_error_that_quotes_a_secret_is_redacted(monkeypatch: pytest.MonkeyPatch) -> None:
    SECRETS.add("sk-live-abcdefghijklmnop")
    text, _ = _error_line(monkeypatch, ConfigError("401 from server: bad key sk-live-abcdefghijklmnop"))
    assert text == "error: 401 from server: bad key ***\n"


def test_other_exceptions_are_not_swallowed(monkeypatch: pytest.MonkeyPatch) -> None:
    # A bug is a bug: clean_errors shows agentload's own errors as one line and lets anything else through.
    with pytest.raises(KeyError), clean_errors():
        raise KeyError("x")
