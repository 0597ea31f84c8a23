"""A clock the test moves by hand: ``now`` reads ``t``; ``sleep`` records the wait and moves ``t`` past it at once."""

from __future__ import annotations


class ManualClock:
    def __init__(self, t: float = 0.0) -> None:
        self.t = t
        self.slept: list[float] = []

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.t += max(0.0, seconds)
