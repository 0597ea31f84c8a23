"""The simulator's tokeniser and the chained block hashes that prefix caching keys on."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from agentload.sim.behaviour import _WORDS
from agentload.sim.hashchain import HashChain, hash_array
from agentload.sim.tokens import (
    VOCAB_SIZE,
    Tokenizer,
    block_hashes,
    extend_block_hashes,
    split_tokens,
    split_words,
    token_id,
    tokenize,
    tokenize_words,
)
from agentload.workload.words import WORDS

BS = 16


def test_split_tokens_keeps_every_character() -> None:
    text = "  Hello,  world!\n\tnew line  über café 東京 "
    pieces = split_tokens(text)
    assert "".join(pieces) == text
    # Pre-tokens as a GPT-2-style pre-tokenizer cuts them, each taking the single space after it.
    assert pieces[:5] == ["  ", "Hello", ",", "  ", "world"]
    assert split_words(text)[:3] == ["  ", "Hello,  ", "world!\n\t"]


def test_tokenize_is_deterministic_and_in_vocabulary() -> None:
    text = "the cat sat on the mat " * 20
    ids = tokenize(text)
    assert ids == tokenize(text)
    assert len(ids) == len(split_tokens(text)) == 120
    assert all(0 <= i < VOCAB_SIZE for i in ids)
    # "the " is one token and always the same id, wherever it occurs.
    assert ids[0] == ids[4] == token_id("the ")
    assert len(set(ids)) == 5


def test_the_default_tokenizer_counts_like_bpe_not_a_token_a_word() -> None:
    # Digits one by one (and a space before a digit apart), punctuation by its runs, a word with its space.
    assert split_tokens("id 4521, ok") == ["id", " ", "4", "5", "2", "1", ", ", "ok"]
    assert len(tokenize('{"user_id": 123456}')) == len(split_tokens('{"user_id": 123456}')) == 13
    # A generated reply re-tokenises to the very ids it was generated as (a piece is one token).
    reply = "Sure, the build passed: 14 tests ran in 3.2s and the coverage is 91%. "
    assert tokenize(reply) == [token_id(p) for p in split_tokens(reply)]
    # A template's header with its role is one token, and a message's end marker is folded into its last word, as
    # the simulator's ChatML has always cost (the workloads' sizing counts on it); after a space it is a token.
    assert len(tokenize("<|im_start|>user\nhello<|im_end|>\n")) == 2
    assert len(tokenize("<|im_start|>user\nhello <|im_end|>\n")) == 3
    assert len(tokenize("<|pad|> <|pad|> ")) == 2
    # The one-token-a-word split is a calibrated Tokenizer's (one that counted a token a word).
    text = "  Hello,  world!\n\tnew line  über café 東京 " * 3
    assert Tokenizer().tokenize(text) == Tokenizer((1.0,)).tokenize(text) == tokenize_words(text)
    assert Tokenizer().tokens_per_word == 1.0


def test_a_calibrated_split_makes_each_word_its_own_number_of_tokens() -> None:
    split = Tokenizer((3, 1, 1))  # shares, normalised: 60 % of words one token, 20 % two, 20 % three
    assert split.word_pieces == pytest.approx((0.6, 0.2, 0.2))
    words = [f"w{i}x" for i in range(6000)]
    counts = [len(split.tokenize(w)) for w in words]
    # Over many distinct words the shares come back (the count is the word's hash's place in the distribution).
    for k, share in ((1, 0.6), (2, 0.2), (3, 0.2)):
        assert counts.count(k) / len(words) == pytest.approx(share, abs=0.03)
    # A word's count is its own wherever it stands, with its white space or without, and a text's is the sum.
    text = " ".join(words[:300])
    assert len(split.tokenize(text)) == sum(counts[:300])
    assert [len(split.tokenize(f"{w}\n\n")) for w in words[:50]] == counts[:50]
    # The first of a word's ids is its one-token id; the others are further ids of the vocabulary.
    for w in words[:50]:
        ids = split.tokenize(w + " ")
        assert ids[0] == token_id(w + " ")
        assert all(0 <= i < VOCAB_SIZE for i in ids)
    assert split.tokenize(text) == split.tokenize(text)


def test_words_the_server_counted_cost_what_it_counted_and_others_follow_the_shares() -> None:
    split = Tokenizer((0.0, 1.0), {"the": 1, "prefix": 3})  # other words: two tokens each
    assert len(split.tokenize("the prefix cache ")) == 1 + 3 + 2
    assert len(split.tokenize("the\nprefix")) == 4
    with pytest.raises(ValueError, match="word_tokens"):
        Tokenizer((1.0,), {"the": 0})
    # Counts of one token for every named word and one token for the rest: the plain tokenizer.
    assert Tokenizer((1.0,), {"the": 1}).plain


def test_a_templates_special_tokens_are_one_token_and_an_end_marker_is_counted_apart() -> None:
    tok = Tokenizer((0.0, 0.0, 1.0), {"alpha": 2})  # every other word three tokens
    assert len(tok.tokenize("<|im_start|>assistant\n")) == 1
    assert len(tok.tokenize("<|pad|> <|pad|> ")) == 2
    # A message's last word and its end marker share a piece of text; they cost the word and one token.
    assert len(tok.tokenize("alpha<|im_end|>\n")) == 3
    assert len(tok.tokenize("beta<|im_end|>\n")) == 4
    assert len(tok.tokenize("<|im_start|>user\nalpha beta<|im_end|>\n")) == 1 + 2 + 3 + 1


def test_a_split_tokenizer_counts_a_generated_reply_longer_when_it_is_sent_back() -> None:
    """The simulator generates a token a word; a server whose tokenizer splits words counts the reply longer when
    the next prompt carries it, as real replies re-tokenise."""
    split = Tokenizer((0.5, 0.5))
    reply = [f"r{i} " for i in range(400)]
    resent = split.tokenize("".join(reply))
    assert len(resent) > 1.3 * len(reply)
    assert resent[0] == token_id(reply[0])


def test_the_pieces_of_a_split_word_rebuild_its_text() -> None:
    split = Tokenizer((0.2, 0.3, 0.5))
    text = "alpha beta  gamma\ndelta " * 4
    pairs = split.tokenize_pieces(text)
    assert "".join(piece for _, piece in pairs) == text
    assert [t for t, _ in pairs] == split.tokenize(text)


@pytest.mark.parametrize("shares", [(), (0.0, 0.0), (-0.1, 1.1), (float("nan"),)])
def test_a_split_must_be_shares(shares: tuple[float, ...]) -> None:
    with pytest.raises(ValueError, match="word_pieces"):
        Tokenizer(shares)


def test_retokenising_generated_text_gives_back_the_generated_ids() -> None:
    pieces = ["Sure", ", ", "here ", "is ", "the ", "answer", "."]
    assert split_tokens("".join(pieces)) == pieces
    assert tokenize("".join(pieces)) == [token_id(p) for p in pieces]
    # The simulator's filler ("word " a token) stays a token a word, as the engine generated it.
    filler = "the agent reads the file and then runs a test to check the result before it writes a patch "
    assert tokenize(filler) == [token_id(w + " ") for w in filler.split()]
    # Every word the workloads and the filler write is one token, so a text sized in words has that many tokens.
    vocabulary = sorted({*WORDS, *_WORDS})
    assert len(tokenize(" ".join(vocabulary))) == len(vocabulary)


def test_only_full_blocks_are_hashed() -> None:
    tokens = list(range(50))
    assert len(block_hashes(tokens, BS)) == 3
    assert len(block_hashes(tokens[:47], BS)) == 2
    assert block_hashes(tokens[:15], BS) == []


def test_extending_in_pieces_equals_hashing_at_once() -> None:
    tokens = [(i * 7919) % 1000 for i in range(200)]
    whole = block_hashes(tokens, BS)
    grown: list[int] = []
    for upto in (5, 16, 17, 40, 100, 200):
        same = extend_block_hashes(grown, tokens, BS, upto)
        assert same is grown
        assert grown == whole[: upto // BS]
    assert grown == whole


def test_extending_from_a_tail_of_the_sequence() -> None:
    tokens = [(i * 31) % 977 for i in range(300)]
    whole = block_hashes(tokens, BS)
    head = block_hashes(tokens[:100], BS)  # 6 blocks: positions 0-95
    # The tail must start at or before position 96, the first one the head's hashes do not cover.
    assert extend_block_hashes(list(head), tokens[90:], BS, offset=90) == whole
    assert extend_block_hashes(list(head), tokens[96:], BS, 200, offset=96) == whole[:12]


def test_hashes_chain_on_the_parent() -> None:
    a = list(range(64))
    b = list(a)
    b[20] = 999  # a change in block 1
    ha, hb = block_hashes(a, BS), block_hashes(b, BS)
    assert ha[0] == hb[0]
    # Every later block differs too, although blocks 2 and 3 hold the same tokens: a hash names a whole prefix.
    assert all(x != y for x, y in zip(ha[1:], hb[1:], strict=True))
    # The same block content at another position (another parent) hashes differently.
    rep = [7] * 32
    h0, h1 = block_hashes(rep, BS)
    assert h0 != h1


def test_hashes_do_not_depend_on_the_process_hash_seed() -> None:
    code = (
        "from agentload.sim.tokens import block_hashes, tokenize\n"
        "print(block_hashes(tokenize('x ' * 40 + 'y z ' * 30), 16))\n"
    )
    outputs = set()
    for seed in ("0", "1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        outputs.add(run.stdout)
    assert len(outputs) == 1
    assert outputs.pop().strip() == str(block_hashes(tokenize("x " * 40 + "y z " * 30), 16))


def test_a_hash_chain_mirrors_its_list_as_it_grows() -> None:
    """The array view of a HashChain is its list, converted once per entry; a change to existing entries (not an
    append) drops the mirror, and a view handed out before keeps what it showed."""
    chain = HashChain(block_hashes(list(range(64)), 16))
    first = chain.array(4)
    assert first.tolist() == chain
    chain.append(-5)
    chain.extend([2**62, -(2**63)])
    chain += [7]
    assert chain.array(len(chain)).tolist() == chain
    assert hash_array(chain, 2, 6).tolist() == chain[2:6]
    assert hash_array(list(chain), 2, 6).tolist() == chain[2:6]  # a plain list is converted
    before = chain.array(len(chain)).tolist()
    chain[1] = 99
    del chain[0]
    assert chain == [99, *before[2:]]
    assert chain.array(len(chain)).tolist() == chain
    assert first.tolist() == before[:4]
    with pytest.raises(ValueError, match="read-only"):
        first[0] = 1
