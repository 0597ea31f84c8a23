"""Progress of a suite run as it goes, for the console the command gives (stderr, so ``--json`` output stays
clean): a bar on a terminal, plain lines anywhere else. Both only count what the runner reports (``on_level``,
``on_test``); nothing here feeds back into the run.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from agentload.suite.results import TestResult
from agentload.suite.scoring import Status

# Where no bar can redraw (a pipe, a file, CI), a progress line at most this often between a level's first and last.
PROGRESS_EVERY_S = 10.0


def _agents(n: int) -> str:
    return f"{n} agent{'s' * (n != 1)}"


class BarProgress:
    """A bar for a terminal: tests finished out of agents × tests, per level (transient: gone once the level is)."""

    def __init__(self, out: Console) -> None:
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("tests  [green]{task.fields[passed]}[/] passed"),
            TimeElapsedColumn(),
            console=out,
            transient=True,
        )
        self.task: TaskID | None = None
        self.passed = 0

    def level(self, agents: int, tests: int) -> None:
        if self.task is not None:
            self.progress.remove_task(self.task)
        self.passed = 0
        self.task = self.progress.add_task(_agents(agents), total=agents * tests, passed=0)

    def test_done(self, agents: int, result: TestResult) -> None:
        if self.task is None:
            return
        self.passed += result.status is Status.PASS
        self.progress.update(self.task, advance=1, passed=self.passed)


class LineProgress:
    """Progress as plain lines where a bar cannot redraw (a pipe, a file, CI): a line when a level
    starts, one when its last test is done, and between them one at most every ``PROGRESS_EVERY_S`` — so a long
    run is seen to move, whatever the output format, without a line per test of a thousand-agent level."""

    def __init__(self, out: Console, now: Callable[[], float] = time.monotonic) -> None:
        self.out, self.now = out, now
        self.total = self.done = self.passed = 0
        self.started = self.last = 0.0

    def level(self, agents: int, tests: int) -> None:
        self.total, self.done, self.passed = agents * tests, 0, 0
        self.started = self.last = self.now()
        self.out.print(
            f"suite: {_agents(agents)} × {tests} tests started", markup=False, highlight=False, soft_wrap=True
        )

    def test_done(self, agents: int, result: TestResult) -> None:
        self.done += 1
        self.passed += result.status is Status.PASS
        now = self.now()
        if self.done < self.total and now - self.last < PROGRESS_EVERY_S:
            return
        self.last = now
        self.out.print(
            f"suite: {_agents(agents)}: {self.done}/{self.total} tests done, {self.passed} passed "
            f"({now - self.started:.0f} s)",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
