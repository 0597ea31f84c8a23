"""What a bench run tells as it goes, through one observer: the console's lines, the run store's files and the live
dashboard all hear the same calls (``bench.session`` makes them, ``bench.orchestrate`` the ones inside the levels).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Protocol

from agentload.bench.analysis import LevelData
from agentload.bench.results import LevelSummary
from agentload.bench.search import SearchStep
from agentload.endpoint.backend import RecordSink
from agentload.endpoint.connection import Connection
from agentload.endpoint.records import RequestRecord


class BenchObserver(Protocol):
    """Hears a bench run: a note for the user, each level's start, connection and end, each request, each step of the
    knee search. Called on the run's event loop, between turns; an observer must not block it."""

    def note(self, text: str) -> None:
        """A line for the user (plain text, never markup): what the run chose or could not do."""

    def level_started(self, level: int, agents: int, context: int, workload: str, warmup_s: float,
                      window_s: float) -> None: ...  # fmt: skip

    def connected(self, conn: Connection) -> Callable[[], None]:
        """A level's connection is open; returns what undoes whatever the observer subscribed to on it."""
        ...

    @property
    def record(self) -> RecordSink:
        """What takes each request attempt as it ends (every attempt, the failed ones too). A callable, not a
        method, so a turn calls the sink itself (the run store's log) with no observer in between."""
        ...

    def level_done(self, data: LevelData, summary: LevelSummary) -> None:
        """A level measured: its raw data (its server samples; ``data.lost`` when the server's loss cut it short,
        so it is measured again on resume) and its summary."""

    def step(self, step: SearchStep) -> None:
        """One step of the knee search (a level measured, and what the search made of it)."""


def _nothing() -> None:
    return None


def _ignore(record: RequestRecord) -> None:
    return None


class Unobserved:
    """An observer that hears nothing: the base of one that wants only some of the calls (one that takes the
    records sets ``record``)."""

    def __init__(self) -> None:
        self.record: RecordSink = _ignore

    def note(self, text: str) -> None:
        return None

    def level_started(self, level: int, agents: int, context: int, workload: str, warmup_s: float,
                      window_s: float) -> None:  # fmt: skip
        return None

    def connected(self, conn: Connection) -> Callable[[], None]:
        return _nothing

    def level_done(self, data: LevelData, summary: LevelSummary) -> None:
        return None

    def step(self, step: SearchStep) -> None:
        return None


class Observers:
    """Several observers heard as one, in the order given (the run store first: a level is on disk before it is
    shown)."""

    def __init__(self, observers: Sequence[BenchObserver]) -> None:
        self.observers = list(observers)
        sinks = [o.record for o in self.observers if o.record is not _ignore]
        # The one sink itself when only one observer takes the records (the usual case: the run store).
        self.record: RecordSink = sinks[0] if len(sinks) == 1 else partial(_each, sinks)

    def note(self, text: str) -> None:
        for o in self.observers:
            o.note(text)

    def level_started(self, level: int, agents: int, context: int, workload: str, warmup_s: float,
                      window_s: float) -> None:  # fmt: skip
        for o in self.observers:
            o.level_started(level, agents, context, workload, warmup_s, window_s)

    def connected(self, conn: Connection) -> Callable[[], None]:
        undo = [o.connected(conn) for o in self.observers]

        def undo_all() -> None:
            for u in reversed(undo):
                u()

        return undo_all

    def level_done(self, data: LevelData, summary: LevelSummary) -> None:
        for o in self.observers:
            o.level_done(data, summary)

    def step(self, step: SearchStep) -> None:
        for o in self.observers:
            o.step(step)


def _each(sinks: Sequence[RecordSink], record: RequestRecord) -> None:
    for sink in sinks:
        sink(record)
