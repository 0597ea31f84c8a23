"""A recorded prompt's tokens, from the upstream server's own tokenizer where it has one, and their block hashes.

**Where the tokens come from**, tried in this order until one answers (then that one only; one that has
not answered ``GIVE_UP_AFTER`` times is not tried again):

* vLLM's OpenAI server and ``agentload sim``: ``POST /tokenize`` with the request's ``messages`` (and ``tools``,
  which its chat template renders) and ``add_generation_prompt: true``; the answer's ``tokens`` are the ids the
  engine prefills (vLLM's ``TokenizeChatRequest``).
* llama.cpp's ``llama-server``: ``POST /apply-template`` with the ``messages`` (its answer's ``prompt`` is the
  templated text), then ``POST /tokenize`` with that text as ``content``. (Its ``/tokenize`` answers the first
  form with 200 and no tokens, so an answer without vLLM's ``count`` or with no tokens does not count.)
* None answers: an approximation — the request's ``messages`` and ``tools`` serialised as compact JSON, cut into
  pieces of ``APPROX_BYTES_PER_TOKEN`` bytes, each piece one "token". English BPE vocabularies average about four
  characters a token (OpenAI's tokenizer guide), so counts are rough and block boundaries are not the server's;
  the trace says so in its ``tokenizer`` field.

**Hashes**: the prompt's full blocks of ``block_size`` tokens, each hashed with a per-recording random salt and the
hash of the block before it (so two prompts share exactly their common leading hashes), numbered in order of
first sight: the trace holds small integers, never text, and the salt never leaves the process, so a block's
number says nothing about its tokens.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp

APPROX_BYTES_PER_TOKEN = 4
TOKENIZE_TIMEOUT_S = 60.0
# A method that has never answered is dropped after this many misses (one request's odd messages can be refused
# by an endpoint that otherwise works; a server without the endpoint stops costing a request each time).
GIVE_UP_AFTER = 3
MAX_TOKENIZE_BYTES = 256 * 2**20  # a /tokenize answer larger than this is not read (a 2M-token prompt is ~16 MB)

VLLM = "server /tokenize (messages, add_generation_prompt)"
LLAMACPP = "server /apply-template then /tokenize"
APPROX = f"approximate: {APPROX_BYTES_PER_TOKEN} bytes of the JSON-serialised messages per token"


def _token_ids(value: Any) -> list[int] | None:
    """``tokens`` of a /tokenize answer as ints (llama.cpp's ``with_pieces`` form too); None if it is not one."""
    if not isinstance(value, dict):
        return None
    tokens = value.get("tokens")
    if not isinstance(tokens, list):
        return None
    out: list[int] = []
    for t in tokens:
        if isinstance(t, dict):
            t = t.get("id")
        if isinstance(t, bool) or not isinstance(t, int):
            return None
        out.append(t)
    return out


def approximate_tokens(body: Mapping[str, Any]) -> list[int]:
    """The fallback: compact JSON of messages (and tools) in pieces of ``APPROX_BYTES_PER_TOKEN`` bytes."""
    text = json.dumps(
        {"messages": body.get("messages"), "tools": body.get("tools")},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    ).encode()
    step = APPROX_BYTES_PER_TOKEN
    return [int.from_bytes(text[i : i + step], "big") for i in range(0, len(text), step)]


class UpstreamTokenizer:
    """Tokenizes chat requests with the upstream's own endpoints; ``method`` says which one answered."""

    def __init__(self, session: aiohttp.ClientSession, base: str) -> None:
        self._session = session
        self._base = base.rstrip("/")
        self._methods = [VLLM, LLAMACPP]  # still worth trying
        self._misses = dict.fromkeys(self._methods, 0)
        self.method: str | None = None  # the one that answered first

    async def _post(self, path: str, payload: Mapping[str, Any], headers: Mapping[str, str]) -> Any:
        timeout = aiohttp.ClientTimeout(total=TOKENIZE_TIMEOUT_S)
        async with self._session.post(self._base + path, json=payload, headers=headers, timeout=timeout) as resp:
            if resp.status != 200:
                return None
            raw = await resp.content.read(MAX_TOKENIZE_BYTES + 1)
            if len(raw) > MAX_TOKENIZE_BYTES:
                return None
            try:
                return json.loads(raw)
            except ValueError:
                return None

    async def _vllm(self, body: Mapping[str, Any], headers: Mapping[str, str]) -> list[int] | None:
        payload: dict[str, Any] = {"messages": body["messages"], "add_generation_prompt": True}
        for key in ("model", "tools"):
            if body.get(key) is not None:
                payload[key] = body[key]
        answer = await self._post("/tokenize", payload, headers)
        # llama-server answers a /tokenize without ``content`` with 200 and no tokens; vLLM's answer has a count.
        if not isinstance(answer, dict) or not isinstance(answer.get("count"), int):
            return None
        ids = _token_ids(answer)
        return ids or None

    async def _llamacpp(self, body: Mapping[str, Any], headers: Mapping[str, str]) -> list[int] | None:
        templated = await self._post("/apply-template", {"messages": body["messages"]}, headers)
        prompt = templated.get("prompt") if isinstance(templated, dict) else None
        if not isinstance(prompt, str):
            return None
        ids = _token_ids(await self._post("/tokenize", {"content": prompt}, headers))
        return ids or None

    async def tokens(self, body: Mapping[str, Any], headers: Mapping[str, str]) -> tuple[list[int], str]:
        """The prompt's token ids and how they were had (one of ``VLLM``, ``LLAMACPP``, ``APPROX``); ``headers``
        are the client's credentials for the upstream, sent on and never kept."""
        for method in list(self._methods):
            try:
                ask = self._vllm if method == VLLM else self._llamacpp
                ids = await ask(body, headers)
            except (aiohttp.ClientError, TimeoutError, UnicodeError):
                ids = None
            if ids is not None:
                if self.method is None:  # settled: the others are not tried again
                    self.method = method
                    self._methods = [method]
                return ids, method
            self._misses[method] += 1
            if self.method is None and self._misses[method] >= GIVE_UP_AFTER:
                self._methods.remove(method)  # never answered: not asked again
        return approximate_tokens(body), APPROX


class BlockHasher:
    """Chained, salted hashes of token blocks, as small integers numbered in order of first sight."""

    def __init__(self, block_size: int, salt: bytes | None = None) -> None:
        self.block_size = block_size
        self._salt = salt if salt is not None else os.urandom(16)
        self._ids: dict[bytes, int] = {}

    def hash_ids(self, tokens: Sequence[int]) -> list[int]:
        out: list[int] = []
        previous = b""
        size = self.block_size
        for start in range(0, len(tokens) - size + 1, size):
            block = ",".join(map(str, tokens[start : start + size])).encode()
            previous = hashlib.blake2b(previous + block, key=self._salt, digest_size=16).digest()
            out.append(self._ids.setdefault(previous, len(self._ids)))
        return out
