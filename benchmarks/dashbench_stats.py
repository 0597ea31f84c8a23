"""The figures ``bench_dashboard.py`` prints from its runs: a percentile, and the blocks' paired shares with their
bootstrap interval."""

from __future__ import annotations

import math
import statistics

import numpy as np


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile of ``values`` (sorted here), 0 for none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def bootstrap_interval(values: list[float]) -> tuple[float, float]:
    """95 % percentile-bootstrap interval of the mean of ``values`` (seeded, so a rerun on the same figures prints the
    same)."""
    draws = np.random.default_rng(0).choice(np.asarray(values), size=(10_000, len(values)), replace=True)
    low, high = np.percentile(draws.mean(axis=1), [2.5, 97.5])
    return float(low), float(high)


def share_line(shares: list[float], limit: float = 0.05) -> str:
    """The client CPU the dashboard adds, over the blocks' paired figures: mean, 95 % interval, against ``limit``."""
    per_block = ", ".join(f"{x:+.1%}" for x in shares)
    mean = statistics.fmean(shares)
    if len(shares) < 3:
        return f"client CPU added by the dashboard: {mean:+.1%} (blocks: {per_block}); too few blocks for an interval"
    low, high = bootstrap_interval(shares)
    verdict = "shown" if high <= limit else "not shown"
    # The median beside the mean: one block whose run the machine slowed (a run at +35 % of its neighbours, its
    # dashboard's own share unchanged) moves the mean by several points and the median by little.
    return (f"client CPU added by the dashboard: mean {mean:+.1%}, 95 % interval {low:+.1%} to {high:+.1%} over "
            f"{len(shares)} blocks ({per_block}; median {statistics.median(shares):+.1%}); ≤ {limit:.0%}: "
            f"{verdict}")  # fmt: skip
