"""Each tier's timings and figures, printed in its own section at the end of the run for the CI log."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest


@dataclass
class Summary:
    """How long each part of a tier took and what it measured, in the order they happened."""

    title: str
    timings: dict[str, float] = field(default_factory=dict)
    figures: dict[str, str] = field(default_factory=dict)


SUMMARIES: list[Summary] = []


def summary(title: str) -> Summary:
    """A tier's summary, registered so ``write`` prints it (in the order the tiers were imported)."""
    made = Summary(title)
    SUMMARIES.append(made)
    return made


def write(reporter: pytest.TerminalReporter) -> None:
    """One section per tier that recorded anything (a deselected tier records nothing and prints nothing)."""
    for tier in SUMMARIES:
        if not tier.timings and not tier.figures:
            continue
        reporter.section(tier.title)
        for name, seconds in tier.timings.items():
            reporter.write_line(f"{name}: {seconds:.1f} s")
        for name, text in tier.figures.items():
            reporter.write_line(f"{name}: {text}")
