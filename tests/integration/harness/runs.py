"""bench, probe, calibrate and the simulator driven as a user drives them, and the server's counters around requests."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from typer.testing import CliRunner, Result

from agentload.bench.results import LevelSummary, RunResult
from agentload.capacity.profile import load_profile
from agentload.cli.main import app
from agentload.endpoint.client import ChatClient
from agentload.endpoint.records import RequestRecord
from agentload.endpoint.scrape import ServerProbe


def bench(out: Path, *args: str) -> RunResult:
    """``agentload bench --json`` into ``out``; the one run it wrote."""
    result = CliRunner().invoke(app, ["bench", "--out", str(out), "--json", *args])
    assert result.exit_code == 0, result.output
    runs = list(out.glob("*/result.json"))
    assert len(runs) == 1
    return RunResult.model_validate_json(runs[0].read_text())


def probe(url: str) -> dict[str, Any]:
    """``agentload probe URL --json``, parsed."""
    result = CliRunner().invoke(app, ["probe", url, "--json"])
    assert result.exit_code == 0, result.output
    found: dict[str, Any] = json.loads(result.output)
    return found


def missing_metrics(url: str, expected: tuple[str, ...]) -> tuple[list[str], set[str]]:
    """The ``expected`` metric names probe does not list, and the names it does."""
    names = set(probe(url)["metric_names"])
    return [n for n in expected if n not in names], names


async def counter_increase(
    url: str, send: Callable[[ChatClient], Awaitable[list[RequestRecord]]]
) -> tuple[list[RequestRecord], dict[str, float]]:
    """The records ``send`` made, and how much each of the server's normalised counters rose around them."""
    async with ServerProbe(url) as scrape:
        before = (await scrape.metrics()).normalised()
        client = ChatClient(url)
        try:
            records = await send(client)
        finally:
            await client.aclose()
        after = (await scrape.metrics()).normalised()
    return records, {k: v - before.get(k, 0.0) for k, v in after.items()}


def calibrate(url: str, out: Path, max_batch: int) -> Result:
    """``agentload calibrate`` with two repeats per point; the caller judges the outcome (one engine xfails)."""
    return CliRunner().invoke(app, ["calibrate", "--url", url, "-o", str(out), "--repeats", "2",
                                    "--max-batch", str(max_batch)])  # fmt: skip


def simulate_knee_search(profile: Path, knee_args: tuple[str, ...], max_agents: int, out: Path,
                         timeout_s: float) -> RunResult:  # fmt: skip
    """``bench --sim PROFILE --find-knee`` with the real search's arguments, in a subprocess as a user runs it.

    With a timeout: once (before 94f4c72 fixed the client's idle guard re-arming forever in virtual time) the
    in-process run hung for 7 minutes where the command alone takes ~25 s; a regression of that kind now fails
    instead of hanging the tier.
    """
    done = subprocess.run(
        [sys.executable, "-m", "agentload", "bench", "--sim", str(profile), *knee_args, "--find-knee",
         "--max-agents", str(max_agents), "--json", "--out", str(out)],
        capture_output=True, text=True, timeout=timeout_s,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return RunResult.model_validate_json(next(out.glob("*/result.json")).read_text())


def paired_levels(real: RunResult, sim: RunResult) -> list[tuple[int, LevelSummary, LevelSummary]]:
    """(agents, real level, simulated level) for every agent count both runs measured, in order."""
    real_by, sim_by = {lv.agents: lv for lv in real.levels}, {lv.agents: lv for lv in sim.levels}
    return [(n, real_by[n], sim_by[n]) for n in sorted(set(real_by) & set(sim_by))]


def throughput_ratios(real: RunResult, sim: RunResult) -> dict[int, float]:
    """Simulated ÷ real output tok/s at every level both runs measured (and the real one served anything)."""
    return {n: s.output_tps / r.output_tps for n, r, s in paired_levels(real, sim) if r.output_tps > 0}


def turn_rate_ratios(real: RunResult, sim: RunResult) -> dict[int, float]:
    """Simulated ÷ real agent-turns/s at every level both runs measured (and the real one completed a turn in).

    Agent-turns/s is the knee rule's first signal and compares the same work in both runs. Output tok/s need not:
    a held session fits each reply into what its context leaves, and a real model's reply that re-tokenises longer
    when it is sent back leaves less room for the next one than the simulator's does.
    """
    return {n: (s.turns / s.window_s) / (r.turns / r.window_s) for n, r, s in paired_levels(real, sim) if r.turns > 0}


def gated_throughput(real: RunResult, sim: RunResult) -> dict[int, tuple[str, float]]:
    """Per level both runs measured: the throughput the knee rule compares there, and its simulated ÷ real ratio.

    Output tok/s, unless either run's level asked for shorter replies than the workload drew (``output_clamped``:
    the realistic model's replies re-tokenise longer when sent back, so its held sessions shorten the next ask
    where the simulator's do not); then agent-turns/s, the rule's signal for such a level, since the two runs'
    tok/s count different lengths.
    """
    out_ratio, turn_ratio = throughput_ratios(real, sim), turn_rate_ratios(real, sim)
    gated: dict[int, tuple[str, float]] = {}
    for n, r, s in paired_levels(real, sim):
        if r.output_clamped or s.output_clamped:
            if n in turn_ratio:
                gated[n] = ("agent-turns/s", turn_ratio[n])
        elif n in out_ratio:
            gated[n] = ("output tok/s", out_ratio[n])
    return gated


def asked_output(real: RunResult, sim: RunResult) -> dict[int, tuple[float, float]]:
    """The mean reply length each run asked for (max_tokens) at every level both measured: real, simulated."""
    return {n: (r.output_requested_mean or 0.0, s.output_requested_mean or 0.0) for n, r, s in paired_levels(real, sim)}


def drawn_output(run: RunResult) -> dict[int, float]:
    """The mean reply length the workload drew per level, before held sessions shortened long draws."""
    return {lv.agents: lv.output_drawn_mean or 0.0 for lv in run.levels}


def coefficients_text(profile_path: Path) -> str:
    """A calibrated profile's coefficients in the units they are read in."""
    profile = load_profile(str(profile_path))
    c = profile.coefficients
    split = " / ".join(f"{share:.3f}" for share in profile.word_pieces)
    return (
        f"prefill {c.prefill_s_per_token * 1e6:.1f} µs/token, weights {c.weights_s * 1e3:.2f} ms/step, "
        f"kv {c.kv_s_per_token * 1e9:.1f} ns/token, attention {c.attention_s_per_pair * 1e12:.2f} ps/pair, "
        f"api overhead {c.api_overhead_s * 1e3:.1f} ms; words made of 1, 2, … tokens: {split}"
    )


def held_level_text(levels: list[LevelSummary], *, hits: bool) -> str:
    """Each level's turns, realised context and output against the asked, (both hit rates,) tok/s and TTFT p50."""

    def hit(lv: LevelSummary) -> str:
        return f"hit {lv.prefix_hit_rate_server or 0:.3f} server / {lv.prefix_hit_rate_usage or 0:.3f} usage, "

    return ", ".join(
        f"{lv.agents}: {lv.turns} turns, context {lv.context_mean or 0:.0f} of {lv.context} (p95 "
        f"{lv.context_p95 or 0:.0f}), output {lv.output_realised_mean or 0:.1f} of {lv.output_requested_mean or 0:.1f} "
        f"asked, {hit(lv) if hits else ''}{lv.output_tps:.1f} tok/s, TTFT p50 {lv.ttft_s.p50 or 0:.2f} s"
        for lv in levels
    )


def check_held_levels(levels: list[LevelSummary], agents: int, context: int, why: str) -> None:
    """The levels are the one asked for, every turn ended well, the context the server counted is within 5 % of
    ``context`` and every reply was exactly as long as asked (the engine told to ignore its stop token)."""
    assert [lv.agents for lv in levels] == [agents], why
    for lv in levels:
        assert lv.requests_failed == 0, why
        assert lv.turns > 0, why
        assert lv.context_mean is not None, why
        assert abs(lv.context_mean / context - 1) <= 0.05, why
        assert lv.output_controlled, why
        assert lv.output_requested_mean is not None, why
        assert lv.output_realised_mean == lv.output_requested_mean, why
