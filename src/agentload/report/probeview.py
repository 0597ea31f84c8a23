"""``agentload probe``'s result as a table for people: which engine serves there, and the figures a fleet run is
sized from. Reads only the ``endpoint.probe.ProbeResult`` it is given."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from agentload.endpoint.probe import ENGINE_LABELS, ProbeResult


def _yes_no(value: bool | None) -> str:
    return "unknown" if value is None else ("yes" if value else "no")


def _number(value: int | None) -> str:
    return "—" if value is None else f"{value:,}"


def render_probe(result: ProbeResult) -> Table:
    """The probe as a two-column table (what was asked, what the server said)."""
    # Every value is the server's or the user's text: shown as text, never read as rich markup.
    table = Table(title=Text(f"{result.url}: {ENGINE_LABELS[result.engine]}"), title_justify="left", show_header=False)
    table.add_column("", style="bold")
    table.add_column("")
    cached = _yes_no(result.reports_cached_tokens)
    if result.cached_tokens_advice:
        cached += f" — {result.cached_tokens_advice}"
    rows = [
        ("engine", result.engine),
        ("version", result.version or "—"),
        ("detected by", "; ".join(result.evidence)),
        ("model", result.model or "—"),
        ("max context", _number(result.max_context)),
        ("KV pool tokens", _number(result.pool_tokens)),
        ("block size", _number(result.block_size)),
        ("prefix caching", _yes_no(result.prefix_caching)),
        ("usage reports cached tokens", cached),
        ("parallel slots", _number(result.parallel_slots)),
        ("max running requests", _number(result.max_running)),
        (
            "exact output lengths",
            result.output_length_control or "no way known: replies are as long as the model makes them",
        ),
        ("metrics", result.metrics_url or "none"),
        ("metric names", ", ".join(result.metric_names) or "—"),
    ]
    if len(result.models) > 1:
        rows.insert(3, ("models served", ", ".join(result.models)))
    for name, value in rows:
        table.add_row(name, Text(value))
    for note in result.notes:
        table.add_row("note", Text(note))
    return table
