"""Small helpers whose rules others rely on: the workload's word list (one simulator token per word, as its
docstring promises, and so the sizes the workloads state), the process-independent seed, the think-block
stripper the suite scores with, and the fault injector's draws (seeded, one fault per request, a rate of 0
consuming no draw so adding one changes nothing)."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

from agentload.agent.text import strip_think
from agentload.sim.faults import FaultInjector, FaultSpec
from agentload.sim.tokens import split_tokens, tokenize
from agentload.workload.sizing import words
from agentload.workload.words import WORDS, stable_int


def test_every_word_is_one_simulator_token_and_a_text_of_n_words_is_n_tokens() -> None:
    assert all(len(split_tokens(w)) == 1 for w in WORDS)
    rng = np.random.default_rng(3)
    for n in (1, 2, 17, 500):
        text = words(rng, n)
        assert len(tokenize(text)) == n
        assert not text.endswith(" ")  # the last word ends the message: no dangling white-space token


def test_the_word_list_has_no_repeats_and_is_large_enough_for_blocks_never_to_collide() -> None:
    assert len(set(WORDS)) == len(WORDS)
    # The docstring's odds (~256^-16 for a 16-token block) need about 256 distinct words.
    assert len(WORDS) >= 250
    assert all(w.isalpha() and w.islower() for w in WORDS)


def test_no_words_for_a_count_of_zero_or_less() -> None:
    rng = np.random.default_rng(0)
    assert words(rng, 0) == ""
    assert words(rng, -3) == ""


def test_the_same_seed_gives_the_same_text_and_words_are_drawn_evenly() -> None:
    assert words(np.random.default_rng(11), 64) == words(np.random.default_rng(11), 64)
    counts = Counter(words(np.random.default_rng(5), 100_000).split())
    expected = 100_000 / len(WORDS)
    # Uniform draws: ~388 per word (sd ≈ 20), so twice or half the share is ~20 sd away: only a skew fails.
    assert set(counts) == set(WORDS)
    assert max(counts.values()) < 2 * expected
    assert min(counts.values()) > expected / 2


def test_stable_int_is_crc32_and_the_same_in_another_process() -> None:
    assert stable_int("hello") == 0x3610A686  # the published CRC-32 of "hello"
    assert stable_int("") == 0
    code = "from agentload.workload.words import stable_int; print(stable_int('agent-7|task'))"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert int(other.stdout) == stable_int("agent-7|task")  # unlike hash(str), which is salted per process


@pytest.mark.parametrize(
    ("said", "scored"),
    [
        ("<think>let me see</think>The answer is 4.", "The answer is 4."),
        ("<think>a\nb\nc</think>\n\n42", "42"),  # reasoning spans lines
        ("<think>one</think>A <think>two</think>B", "A B"),  # each block, not from the first to the last
        ("Answer: 7 <think>still going", "Answer: 7"),  # an unclosed block runs to the end
        ("<think>only thinking", ""),
        ("no reasoning here", "no reasoning here"),
        ("  padded  ", "padded"),
    ],
)
def test_strip_think(said: str, scored: str) -> None:
    assert strip_think(said) == scored


# -- fault draws -----------------------------------------------------------------------------------------------
def _draws(specs: list[FaultSpec], seed: int, n: int = 2000) -> list[str | None]:
    injector = FaultInjector(specs, seed=seed)
    return [None if (s := injector.draw()) is None else s.kind for _ in range(n)]


def test_the_same_seed_injects_the_same_faults_in_the_same_order() -> None:
    specs = [FaultSpec("reset", 0.1), FaultSpec("http503", 0.2)]
    assert _draws(specs, 7) == _draws(specs, 7)
    assert _draws(specs, 7) != _draws(specs, 8)


def test_a_rate_is_the_share_of_requests_hit() -> None:
    hits = Counter(_draws([FaultSpec("http500", 0.25)], seed=1, n=20_000))
    # Binomial(20000, 0.25): sd ≈ 61; ±400 is more than six sd.
    assert abs(hits["http500"] - 5000) < 400


def test_at_most_one_fault_per_request_the_first_kind_that_hits() -> None:
    injector = FaultInjector([FaultSpec("stall", 1.0, 600.0), FaultSpec("reset", 1.0)], seed=0)
    assert [injector.draw() for _ in range(5)] == [FaultSpec("stall", 1.0, 600.0)] * 5
    assert injector.injected == {"stall": 5}  # reset was never reached


def test_a_zero_rate_fault_consumes_no_draw() -> None:
    alone = _draws([FaultSpec("reset", 0.3)], seed=4)
    with_idle = _draws([FaultSpec("http429", 0.0, 1.0), FaultSpec("reset", 0.3)], seed=4)
    assert with_idle == alone


def test_no_faults_draws_nothing_and_the_mid_stream_point_is_within_the_reply() -> None:
    injector = FaultInjector([], seed=2)
    assert injector.draw() is None
    assert injector.injected == {}
    points = {injector.mid_stream_point(10) for _ in range(500)}
    assert points == set(range(10))  # after 0 to 9 tokens of a 10-token reply, each possible
    assert injector.mid_stream_point(0) == 0
