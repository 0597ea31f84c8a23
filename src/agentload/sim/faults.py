"""Fault injection for reliability tests: each ``--fault KIND:RATE[:SECONDS]`` hits that share of requests.

Kinds:

- ``stall``: stop sending mid-stream for SECONDS (default 600), keeping the connection open;
- ``reset``: abort the TCP connection mid-stream;
- ``http500``, ``http503``, ``http429`` (with ``Retry-After: SECONDS``, default 1): the status, no stream;
- ``malformed``: one malformed SSE line mid-stream;
- ``comments``: the response begins (200, SSE headers) and then carries only SSE comment lines (``: ping``), one
  every SECONDS (default 1), forever: never a data event, as a proxy keeping a connection to a stuck upstream warm.
  The request never reaches the engine;
- ``comments_mid``: tokens at first, then from a point mid-stream only comment lines, one every SECONDS (default
  1), forever (the engine finishes the request unseen);
- ``endless``: the reply's tokens, then more content tokens forever, one every SECONDS (default 0: the request's
  own decode pace), past ``max_tokens``: never a ``finish_reason``, a usage chunk or ``[DONE]``.

A response that is not streamed gets, for the three unending kinds, headers and then no body at all. Each unending
response ends only when the client goes away. Draws come from a seeded generator, so a run with the same seed and
request order injects the same faults.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Literal

from agentload.errors import ConfigError

FaultKind = Literal[
    "stall", "reset", "http500", "http503", "http429", "malformed", "comments", "comments_mid", "endless"
]
KINDS: tuple[FaultKind, ...] = (
    "stall", "reset", "http500", "http503", "http429", "malformed", "comments", "comments_mid", "endless"
)  # fmt: skip
DEFAULT_SECONDS: dict[str, float] = {"stall": 600.0, "http429": 1.0, "comments": 1.0, "comments_mid": 1.0}
# The kinds whose response never ends by itself, and the shortest gap between their writes: a gap of 0 would spin
# (on a virtual-time loop, forever at one instant).
UNENDING: frozenset[str] = frozenset({"comments", "comments_mid", "endless"})
MIN_GAP_S = 0.001
MAX_SECONDS = 86_400.0  # a day: longer than any run, so any larger figure is a typo (or "inf")


@dataclass(frozen=True)
class FaultSpec:
    kind: FaultKind
    rate: float
    seconds: float = 0.0


def parse_fault(text: str) -> FaultSpec:
    parts = text.split(":")
    if len(parts) not in (2, 3) or parts[0] not in KINDS:
        raise ConfigError(f"--fault {text!r}: expected KIND:RATE[:SECONDS] with KIND one of {', '.join(KINDS)}")
    kind = next(k for k in KINDS if k == parts[0])
    try:
        rate = float(parts[1])
        seconds = float(parts[2]) if len(parts) == 3 else DEFAULT_SECONDS.get(kind, 0.0)
    except ValueError as exc:
        raise ConfigError(f"--fault {text!r}: RATE and SECONDS must be numbers") from exc
    # Range checks written so that NaN fails them: "stall:0.5:nan" used to be accepted and inject nothing.
    if not 0.0 <= rate <= 1.0:
        raise ConfigError(f"--fault {text!r}: RATE must be between 0 and 1")
    if not (math.isfinite(seconds) and 0.0 <= seconds <= MAX_SECONDS):
        raise ConfigError(f"--fault {text!r}: SECONDS must be a number from 0 to {MAX_SECONDS:g}")
    if kind in ("comments", "comments_mid") and seconds < MIN_GAP_S:
        raise ConfigError(f"--fault {text!r}: the comments' period must be at least {MIN_GAP_S:g} s")
    return FaultSpec(kind, rate, seconds)


class FaultInjector:
    def __init__(self, specs: list[FaultSpec], seed: int = 0) -> None:
        self.specs = specs
        self._rng = random.Random(seed)
        self.injected: dict[str, int] = {}

    def draw(self) -> FaultSpec | None:
        """At most one fault per request: the first kind whose draw hits."""
        for spec in self.specs:
            if spec.rate > 0 and self._rng.random() < spec.rate:
                self.injected[spec.kind] = self.injected.get(spec.kind, 0) + 1
                return spec
        return None

    def mid_stream_point(self, total_tokens: int) -> int:
        """After how many tokens a mid-stream fault strikes."""
        return self._rng.randint(0, max(0, total_tokens - 1))
