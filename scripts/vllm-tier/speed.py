"""Prefill and decode speed of one vLLM tier server, one request at a time (how the serving settings were chosen).

    venv/bin/python scripts/vllm-tier/speed.py PORT SERVED_NAME

Prefill: one chat request whose prompt is ~1,500 tokens of seeded words (no prefix the server has seen: a fresh
seed per run), one output token; tokens/s is the server's prompt token count over the request's wall time. Decode:
65 output tokens minus 1 on the same short prompt (ignore_eos + min_tokens, so both run to the count), over the
difference in wall time. Standard library only, so any Python runs it.
"""

from __future__ import annotations

import json
import random
import sys
import time
import urllib.request
from typing import Any

WORDS = ["alpha", "beta", "gamma", "delta", "river", "stone", "cloud", "paper", "green", "seven", "table", "window",
         "orange", "quiet", "market"]  # fmt: skip


def request(port: str, model: str, prompt: str, tokens: int) -> tuple[float, dict[str, Any]]:
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": tokens,
            "min_tokens": tokens, "ignore_eos": True, "temperature": 0}  # fmt: skip
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})  # fmt: skip
    began = time.monotonic()
    with urllib.request.urlopen(req, timeout=600) as resp:
        usage: dict[str, Any] = json.load(resp)["usage"]
    return time.monotonic() - began, usage


def main() -> None:
    port, model = sys.argv[1], sys.argv[2]
    rng = random.Random(time.time_ns())
    request(port, model, "hi", 1)  # the first request pays one-off set-up costs
    seconds, usage = request(port, model, " ".join(rng.choice(WORDS) for _ in range(1500)), 1)
    print(f"prefill {usage['prompt_tokens']} tokens in {seconds:.2f} s = {usage['prompt_tokens'] / seconds:.0f} tok/s")
    one, _ = request(port, model, "count", 1)
    many, _ = request(port, model, "count", 65)
    print(f"decode 64 tokens in {many - one:.2f} s = {64 / (many - one):.1f} tok/s")


if __name__ == "__main__":
    main()
