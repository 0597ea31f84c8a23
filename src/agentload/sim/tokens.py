"""The simulator's tokenisers and the chained block hashes of prefix caching.

One tokeniser serves usage counts, ``/tokenize``, the context-length check and prefix hashing, so a conversation's
repeated prefix hashes to the same blocks every turn. By default it is ``sim.bpe``'s model of a byte-level BPE
tokenizer: text costs what it costs a real model's server (prose about a token a word, JSON and code three or four
characters a token, a token a digit), and a token's id is the CRC-32 of its text folded into the vocabulary.
Generated text is made of that tokeniser's token texts (``split_tokens``), so re-tokenising a reply gives back the
very ids the engine generated and hashed.

A calibrated profile gives the simulator the granularity a real server's tokenizer showed instead (``Tokenizer``),
as ``agentload calibrate`` measured it with the server's ``/tokenize``: how many tokens it makes of each word
agentload's workloads write, and the shares of words it makes 1, 2, 3… tokens of (any other word takes a count
from those shares by its hash). There a token is a run of non-space characters with the white space after it
(``\\S+\\s*``), or leading white space, cut into more tokens where the word costs more. A text then costs what it
costs on the real server, and its count scatters as it does there: a prompt sized in words lands a few dozen tokens
either side of a KV block edge, which decides whether its last partial block is recomputed every turn. A reply is
generated as the default tokeniser's tokens and counted again as the calibrated one counts it when it is sent back,
as real replies re-tokenise. A chat template's special tokens (``<|im_start|>user``, ``<|im_end|>``, the pads of
``sim.chat.TemplatePads``) are one token each on such a tokenizer, and an end marker is counted apart from the word
it follows, so a message costs its words plus a fixed template.

Block hashes chain like vLLM's: ``hash(parent_hash, block_token_ids)`` over full blocks only. Hashing a tuple of
ints is deterministic across processes (PYTHONHASHSEED only salts str and bytes).
"""

from __future__ import annotations

import bisect
import itertools
import math
import re
import zlib
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Protocol

import numpy as np
import numpy.typing as npt

from agentload.capacity.profile import ServingProfile, mean_word_tokens
from agentload.sim import poolkernel
from agentload.sim.bpe import VOCAB_SIZE as VOCAB_SIZE  # re-exported: the engine and the server take it from here
from agentload.sim.bpe import BpeTokenizer, split
from agentload.sim.bpe import token_id as token_id
from agentload.sim.hashchain import HashChain
from agentload.sim.poolkernel import address

ROOT_HASH = 0x5EED_0F_A6E17  # parent of a sequence's first block

_DEFAULT = BpeTokenizer()
_WORD_RE = re.compile(r"\S+\s*|\s+")


def split_tokens(text: str) -> list[str]:
    """The texts of the default tokeniser's tokens of ``text``: what a generated reply is made of, a token each."""
    return split(text)


def tokenize(text: str) -> list[int]:
    """The default tokeniser's ids of ``text``."""
    return _DEFAULT.tokenize(text)


def split_words(text: str) -> list[str]:
    """Words with the white space after them (and leading white space): a calibrated ``Tokenizer``'s pieces."""
    return _WORD_RE.findall(text)


def tokenize_words(text: str) -> list[int]:
    """One token a word (``split_words``): the ids of a calibrated ``Tokenizer`` that counts every word one token."""
    return [zlib.crc32(p.encode("utf-8")) % VOCAB_SIZE for p in _WORD_RE.findall(text)]


class TextTokenizer(Protocol):
    """What the simulated server asks of a tokeniser."""

    @property
    def plain(self) -> bool: ...

    def tokenize(self, text: str) -> list[int]: ...

    def tokenize_pieces(self, text: str) -> list[tuple[int, str]]: ...


def profile_tokenizer(profile: ServingProfile) -> TextTokenizer:
    """The tokeniser a profile's server counts with: the calibrated split where ``agentload calibrate`` measured
    one (words counted, shares other than one token a word, or a chat template), else the default BPE model."""
    if profile.word_tokens or profile.word_pieces != (1.0,) or profile.chat_template is not None:
        return Tokenizer(profile.word_pieces, dict(profile.word_tokens))
    return BpeTokenizer()


# Salt of the hash that picks a word's token count: the count and the word's first id must not be correlated.
_PIECES_SALT = 0x9E37_79B9
# Words whose split is remembered (the workloads' vocabulary is a few hundred words; foreign text is bounded).
_SPLIT_CACHE = 65_536


class Tokenizer:
    """The simulator's tokenizer, one token per word, or several per word as a calibrated server's.

    ``word_tokens`` counts named words (white space after a word is part of its first token); any other word takes
    ``word_pieces``: its share ``k`` is that of words made ``k + 1`` tokens (normalised), and a word's count is its
    hash's place in that distribution. Either way a word costs the same wherever it appears. Its first id is the
    one-token id, so ``Tokenizer()`` tokenises exactly as ``tokenize_words``.
    """

    def __init__(self, word_pieces: Sequence[float] = (1.0,), word_tokens: Mapping[str, int] | None = None) -> None:
        weights = [float(w) for w in word_pieces]
        if not weights or any(not math.isfinite(w) or w < 0 for w in weights) or sum(weights) <= 0:
            raise ValueError(f"word_pieces must be non-negative shares with a positive sum, got {list(word_pieces)}")
        total = sum(weights)
        self.word_pieces = tuple(w / total for w in weights)
        self._cumulative = list(itertools.accumulate(self.word_pieces))
        self.word_tokens = dict(word_tokens or {})
        if any(n < 1 for n in self.word_tokens.values()):
            raise ValueError("word_tokens must count at least one token a word")
        self.plain = self.word_pieces[0] == 1.0 and all(n == 1 for n in self.word_tokens.values())
        self._split: dict[str, tuple[int, ...]] = {}

    @property
    def tokens_per_word(self) -> float:
        """Tokens a word of text this tokenizer has not been told of (``word_tokens`` counts the named ones)."""
        return mean_word_tokens(self.word_pieces)

    def pieces(self, piece: str) -> int:
        """How many tokens the text piece ``piece`` (a word and the white space after it) is made of."""
        word = piece.rstrip()
        if self.plain or not word:
            return 1
        special = word.find("<|")
        if special == 0:
            return 1  # a chat template's special token (``<|im_start|>user``): one token, as on a real vocabulary
        if special > 0:  # a message's last word and the template's end marker: counted apart, as a server does
            return self._word(word[:special]) + 1
        return self._word(word)

    def _word(self, word: str) -> int:
        known = self.word_tokens.get(word)
        if known is not None:
            return known
        u = zlib.crc32(word.encode("utf-8"), _PIECES_SALT) / 2**32
        return min(bisect.bisect_right(self._cumulative, u), len(self._cumulative) - 1) + 1

    def piece_ids(self, piece: str) -> tuple[int, ...]:
        ids = self._split.get(piece)
        if ids is None:
            first = token_id(piece)
            raw = piece.encode("utf-8")
            ids = (first, *(zlib.crc32(raw + bytes((j,))) % VOCAB_SIZE for j in range(1, self.pieces(piece))))
            if len(self._split) >= _SPLIT_CACHE:
                self._split.clear()
            self._split[piece] = ids
        return ids

    def tokenize(self, text: str) -> list[int]:
        if self.plain:
            return tokenize_words(text)
        out: list[int] = []
        for piece in _WORD_RE.findall(text):
            out.extend(self.piece_ids(piece))
        return out

    def tokenize_pieces(self, text: str) -> list[tuple[int, str]]:
        """Each token's id and text: a word made of several tokens is cut into that many runs of its characters."""
        out: list[tuple[int, str]] = []
        for piece in _WORD_RE.findall(text):
            ids = self.piece_ids(piece)
            cuts = [round(i * len(piece) / len(ids)) for i in range(len(ids) + 1)]
            out.extend((t, piece[a:b]) for t, a, b in zip(ids, cuts, cuts[1:], strict=False))
        return out


def chain_hash(parent: int, block: Sequence[int]) -> int:
    """The hash of a full block: its tokens chained on the hash of the block before it (``ROOT_HASH`` first)."""
    return hash((parent, tuple(block)))


def extend_block_hashes(
    hashes: list[int], tokens: Sequence[int], block_size: int, upto: int | None = None, *, offset: int = 0
) -> list[int]:
    """Append the hashes of the full blocks of ``tokens[:upto]`` not yet in ``hashes``; returns ``hashes``.

    ``tokens`` may hold only the tail of the sequence, starting at position ``offset`` (at or before the first
    position ``hashes`` does not cover); ``upto`` is a position in the whole sequence.
    """
    limit = offset + len(tokens) if upto is None else upto
    first = len(hashes) * block_size
    if first > limit - block_size:
        return hashes  # nothing new (the usual call: a prompt whose hashes the driver already knows)
    parent = hashes[-1] if hashes else ROOT_HASH
    append = hashes.append
    # chain_hash inlined: this loop hashes every block of every prompt. One slice of the whole span, cut into
    # block tuples by zip over a single iterator (the "grouper" recipe), builds each tuple in C: the same tuples
    # as ``tuple(tokens[start : start + block_size])`` block by block, at less than half the cost.
    start = first - offset
    span = iter(tokens[start : start + (limit - first) // block_size * block_size])
    for block in zip(*[span] * block_size, strict=True):
        parent = hash((parent, block))
        append(parent)
    return hashes


def extend_block_hashes_array(
    hashes: list[int], tokens: npt.NDArray[np.int64], block_size: int, *, offset: int
) -> list[int]:
    """``extend_block_hashes`` of an int64 array of tokens that starts at position ``offset`` (at or before the first
    position ``hashes`` does not cover): in C where the pool kernel is built and hashes as this Python does (the
    same values; no token becomes a Python int), else in Python."""
    first = len(hashes) * block_size
    count = (offset + len(tokens) - first) // block_size
    if count <= 0:
        return hashes
    span = tokens[first - offset : first - offset + count * block_size]
    kernel = poolkernel.load()
    if kernel is None or not kernel.hashes_like_python:
        return extend_block_hashes(hashes, span.tolist(), block_size, offset=first)
    span = np.ascontiguousarray(span, dtype=np.int64)
    parent = hashes[-1] if hashes else ROOT_HASH
    if isinstance(hashes, HashChain):
        # Into the chain's int64 mirror, which the prefix cache reads: no array of its own, no conversion back.
        hashes.extend_into_mirror(count, partial(kernel.al_chain_hashes, address(span), count, block_size, parent))
        return hashes
    out = np.empty(count, dtype=np.int64)
    kernel.al_chain_hashes(address(span), count, block_size, parent, address(out))
    hashes.extend(out.tolist())
    return hashes


def block_hashes(tokens: Sequence[int], block_size: int) -> list[int]:
    return extend_block_hashes([], tokens, block_size)
