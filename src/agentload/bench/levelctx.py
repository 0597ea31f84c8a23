"""The ``LoadContext`` a bench level gives its agents (in one process, or on each Ray actor of a distributed one)."""

from __future__ import annotations

from agentload.agent.loop import ChatBackend
from agentload.bench.analysis import LevelData
from agentload.clock import LoopClock
from agentload.endpoint.records import RequestIds
from agentload.load.runner import StopSignal
from agentload.workload.sizing import TokenSizing


class LevelContext:
    """The LoadContext a level gives its agents; the level ends when the runner says so."""

    def __init__(
        self,
        backend: ChatBackend,
        model: str,
        run_id: str,
        level: int,
        data: LevelData,
        sizing: TokenSizing,
        text_salt: str | None = None,
    ) -> None:
        self.backend = backend
        self.clock = LoopClock()
        self.model = model
        self.run_id = run_id
        self.text_salt = run_id if text_salt is None else text_salt
        self.level = level
        self.sizing = sizing
        self.stop = StopSignal()  # set by the runner (``load.runner``) when the level's time is up
        # Read between turns: the signal's own ``is_set``, so a turn's pause reads the runner's signal, not the level.
        self.should_stop = self.stop.is_set
        self._data = data

    def reply_clamped(self, ids: RequestIds, drawn: int) -> None:
        self._data.drawn[(ids.agent, ids.turn)] = drawn

    def session_done(self, agent_id: str, *, ok: bool, passed: int | None = None, scored: int | None = None) -> None:
        if ok:
            self._data.sessions_ok += 1
        else:
            self._data.sessions_failed += 1
        if passed is not None and scored is not None:
            self._data.passed += passed
            self._data.scored += scored
