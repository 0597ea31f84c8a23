"""``agentload profiles``: the built-in simulator profiles and what each one holds."""

from __future__ import annotations

from rich import box
from rich.table import Table

from agentload.capacity.profile import builtin_profiles, load_profile
from agentload.cli.common import console, reports_errors


@reports_errors
def profiles() -> None:
    """List the built-in simulator profiles with their KV pool and maximum concurrency."""
    rows = []
    for name in builtin_profiles():
        p = load_profile(name)
        rows.append(
            (
                name,
                f"{p.model.name}\n{p.num_gpus}× {p.gpu.name}",
                f"{p.pool_tokens:,}",
                f"{p.max_model_len:,}",
                f"{p.max_concurrency:.2f}x",
            )
        )
    table = Table(
        title="built-in simulator profiles", box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, show_lines=True
    )
    # A profile's name (what --profile takes) and the figures are never cut or broken, however narrow the terminal:
    # those columns do not wrap, and the model and GPU names fold (never "…") into what is left.
    headers = ("profile", "model\nGPU", "KV pool\n(tokens)", "max model\nlen", "max\nconcurrency")
    for i, header in enumerate(headers):
        table.add_column(header, justify="left" if i < 2 else "right", no_wrap=i != 1, overflow="fold")
    for row in rows:
        table.add_row(*row)
    console.print(table)
