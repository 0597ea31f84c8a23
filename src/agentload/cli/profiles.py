"""``agentload profiles``: the built-in simulator profiles and what each one holds."""

from __future__ import annotations

from rich.table import Table

from agentload.capacity.profile import builtin_profiles, load_profile
from agentload.cli.common import console, reports_errors


@reports_errors
def profiles() -> None:
    """List the built-in simulator profiles with their KV pool and maximum concurrency."""
    table = Table(title="built-in simulator profiles")
    for col in ("profile", "model", "GPU", "KV pool (tokens)", "max-model-len", "max concurrency"):
        table.add_column(col, justify="right" if col[0] in "KMm" else "left")
    for name in builtin_profiles():
        p = load_profile(name)
        table.add_row(
            name,
            p.model.name,
            f"{p.num_gpus}× {p.gpu.name}",
            f"{p.pool_tokens:,}",
            f"{p.max_model_len:,}",
            f"{p.max_concurrency:.2f}x",
        )
    console.print(table)
