"""Deterministic, cheap tokenisation and the chained block hashes of prefix caching.

One tokeniser serves usage counts, ``/tokenize`` and prefix hashing, so a conversation's repeated prefix hashes
to the same blocks every turn. A token is a run of non-space characters with the white space after it
(``\\S+\\s*``), or leading white space; its id is the CRC-32 of its text folded into the vocabulary. Generated
text is made of such tokens, so re-tokenising a reply gives back the very ids the engine generated and hashed.

Block hashes chain like vLLM's: ``hash(parent_hash, block_token_ids)`` over full blocks only. Hashing a tuple of
ints is deterministic across processes (PYTHONHASHSEED only salts str and bytes).
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence

VOCAB_SIZE = 151_936  # Qwen2's vocabulary size; any fixed size works
ROOT_HASH = 0x5EED_0F_A6E17  # parent of a sequence's first block

_TOKEN_RE = re.compile(r"\S+\s*|\s+")


def split_tokens(text: str) -> list[str]:
    return _TOKEN_RE.findall(text)


def token_id(piece: str) -> int:
    return zlib.crc32(piece.encode("utf-8")) % VOCAB_SIZE


def tokenize(text: str) -> list[int]:
    return [zlib.crc32(p.encode("utf-8")) % VOCAB_SIZE for p in _TOKEN_RE.findall(text)]


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


def block_hashes(tokens: Sequence[int], block_size: int) -> list[int]:
    return extend_block_hashes([], tokens, block_size)
