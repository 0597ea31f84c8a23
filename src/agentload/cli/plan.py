"""``agentload plan``: how many agents one model on some GPUs carries, and the vLLM flags that realise it.

With ``--slots N`` the server is llama.cpp's ``llama-server -np N``: the plan says N agents fit, the KV each slot
allocates, what happens past N (queueing for a slot) and the llama-server command.
"""

from __future__ import annotations

import typer
from rich.markup import escape
from rich.panel import Panel
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from agentload.capacity.models import AttentionKind
from agentload.capacity.planner import CurvePoint, Plan, parse_spec
from agentload.capacity.planner import plan as make_plan
from agentload.cli.common import console, err_console, reports_errors
from agentload.sim.curve import add_throughput_curve

# PlanSpec field → the flag that sets it, so a bad value's message names the flag the user typed.
FLAGS = {
    "model": "--model",
    "gpu": "--gpu",
    "num_gpus": "--gpus",
    "max_model_len": "--max-model-len",
    "kv_cache_dtype": "--kv-cache-dtype",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "context_per_agent": "--context-per-agent",
    "offload_gib": "--offload-gib",
    "weight_dtype": "--weight-dtype",
    "activation_gib": "--activation-gib",
    "pool_tokens": "--pool-tokens",
    "num_gpu_blocks": "--num-gpu-blocks",
    "kv_memory_gib": "--kv-memory-gib",
    "agent.output_tokens": "--output-tokens",
    "agent.think_s": "--think-s",
    "slots": "--slots",
    "slot_context": "--slot-context",
}


@reports_errors
def plan(
    model: str = typer.Option(..., "--model", "-m", help="Catalogue model name, or a path to a config.json."),
    gpu: str = typer.Option(..., "--gpu", "-g", help="Catalogue GPU name (h100, gb300, ...)."),
    gpus: int = typer.Option(1, "--gpus", help="GPUs, as tensor parallelism."),
    max_model_len: int | None = typer.Option(None, "--max-model-len", help="Default: the model's context length."),
    kv_cache_dtype: str = typer.Option("auto", "--kv-cache-dtype", help="auto (= bf16), bf16, fp16 or fp8."),
    gpu_memory_utilization: float = typer.Option(0.9, "--gpu-memory-utilization"),
    context_per_agent: int | None = typer.Option(
        None, "--context-per-agent", "-c", help="Tokens each agent's conversation holds. Default: max-model-len."
    ),
    offload_gib: float = typer.Option(0.0, "--offload-gib", help="CPU KV tier (vLLM --kv-offloading-size), GiB."),
    weight_dtype: str | None = typer.Option(
        None, "--weight-dtype", help="bf16, fp8 or fp4 (also fp16, int8, int4). Default: the checkpoint's."
    ),
    pool_tokens: int | None = typer.Option(
        None, "--pool-tokens", help="The pool a real server logged ('GPU KV cache size: N tokens'), if known."
    ),
    num_gpu_blocks: int | None = typer.Option(
        None, "--num-gpu-blocks", help="The pool in blocks, exact (vLLM's cache_config_info{num_gpu_blocks})."
    ),
    kv_memory_gib: float | None = typer.Option(
        None, "--kv-memory-gib", help="vLLM's logged 'Available KV cache memory' per GPU, GiB (to 0.01)."
    ),
    activation_gib: float = typer.Option(2.0, "--activation-gib", help="Activation + runtime allowance per GPU."),
    output_tokens: int = typer.Option(400, "--output-tokens", help="Simulated reply per turn, tokens."),
    think_s: float = typer.Option(2.0, "--think-s", help="Simulated tool time between turns, seconds."),
    slots: int | None = typer.Option(
        None, "--slots", help="Plan llama.cpp's llama-server -np N instead of vLLM: N slots, each its own cache."
    ),
    slot_context: int | None = typer.Option(
        None, "--slot-context", help="Tokens per slot with --slots (llama-server's -c ÷ -np). Default: max-model-len."
    ),
    no_curve: bool = typer.Option(False, "--no-curve", help="Skip the simulated throughput curve."),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON instead of tables."),
) -> None:
    """Plan a deployment: weights, KV per token, the pool, vLLM's concurrency, agents at a context, the curve."""
    spec = parse_spec(
        {
            "model": model,
            "gpu": gpu,
            "num_gpus": gpus,
            "max_model_len": max_model_len,
            "kv_cache_dtype": kv_cache_dtype,
            "gpu_memory_utilization": gpu_memory_utilization,
            "context_per_agent": context_per_agent,
            "offload_gib": offload_gib,
            "weight_dtype": weight_dtype,
            "activation_gib": activation_gib,
            "pool_tokens": pool_tokens,
            "num_gpu_blocks": num_gpu_blocks,
            "kv_memory_gib": kv_memory_gib,
            "agent": {"output_tokens": output_tokens, "think_s": think_s},
            "slots": slots,
            "slot_context": slot_context,
        },
        FLAGS,
    )
    result = make_plan(spec)
    if no_curve:  # nothing is simulated, so the sources name no simulated figure
        result = result.model_copy(
            update={"derivations": tuple(d for d in result.derivations if d.kind != "simulated")}
        )
    else:
        with _CurveBar() as bar:
            result = add_throughput_curve(result, progress=bar)
    if as_json:
        console.print_json(result.model_dump_json())
    else:
        render(result)


class _CurveBar:
    """A rich progress bar on stderr (so ``--json`` output stays clean), one bar per simulated run."""

    def __init__(self) -> None:
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed:>6.0f}/{task.total:.0f} virtual s"),
            TimeElapsedColumn(),
            console=err_console,
            transient=True,
        )
        self._task = self._progress.add_task("simulating", total=1.0, visible=False)
        self._run = 0

    def __enter__(self) -> _CurveBar:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def run_started(self, agents: int, duration_s: float, runs_planned: int) -> None:
        self._run += 1
        self._progress.reset(
            self._task,
            total=duration_s,
            visible=True,
            description=f"curve: {agents} agents (run {self._run}/{max(runs_planned, self._run)})",
        )

    def advanced(self, virtual_s: float) -> None:
        self._progress.update(self._task, completed=virtual_s)

    def run_finished(self, point: CurvePoint) -> None:
        self._progress.update(self._task, completed=point.duration_s)


def _size(n: float) -> str:
    """Bytes the way docs/background.md §5 writes them: KiB per token, MiB per session, GB for memory."""
    if n >= 1e9:
        return f"{n / 1e9:,.1f} GB"
    if n >= 2**20:
        return f"{n / 2**20:,.1f} MiB"
    return f"{n / 2**10:,.1f} KiB".replace(".0 KiB", " KiB")


def _secs(s: float) -> str:
    return f"{s * 1e3:.3g} ms" if s < 1 else f"{s:.2f} s"


def render(p: Plan) -> None:
    """The plan as tables, for people. Reads only the compiled ``Plan``."""
    if p.slots is not None:
        _render_slots(p)
        return
    m = p.model.spec
    console.print(
        Panel.fit(
            f"[bold]{m.name}[/] on {p.memory.num_gpus}× {p.memory.gpu} — max-model-len {p.pool.max_model_len:,}, "
            f"{p.agents.context:,} tokens per agent",
            title="agentload plan",
        )
    )
    console.print(_model_line(p))
    for note in p.model.notes:
        console.print(f"  [dim]note: {escape(note)}[/]")

    t = Table(title="memory and KV cache", show_header=False, title_justify="left")
    t.add_column(justify="left")
    t.add_column(justify="right")
    t.add_column(justify="left", style="dim")
    mem = p.memory
    per_gpu = f"{_size(mem.weights_gb_per_gpu * 1e9)} per GPU"
    t.add_row(f"weights ({mem.weight_dtype})", _size(mem.weights_gb * 1e9), per_gpu)
    t.add_row(
        f"GPU memory × {mem.gpu_memory_utilization:g}",
        _size(mem.gpu_memory_gb * mem.gpu_memory_utilization * 1e9),
        f"per GPU, minus {mem.activation_gib_per_gpu:g} GiB for activations",
    )
    kv = p.kv
    every = "if every layer kept it" if kv.attention is AttentionKind.HYBRID else "all layers"
    t.add_row(f"KV per token ({kv.dtype.value})", _size(kv.bytes_per_token), every)
    if kv.attention is AttentionKind.HYBRID:
        t.add_row("  growing per token", _size(kv.growing_bytes_per_token), "full-attention layers only")
        t.add_row("  fixed per session", _size(kv.fixed_bytes_per_session), "sliding-window layers, once full")
    if kv.replication > 1:
        t.add_row("  copies across GPUs", f"{kv.replication:g}×", "KV heads cannot split further / MLA latent")
    t.add_row("KV pool", _size(mem.kv_pool_gb * 1e9), p.pool.source)
    t.add_row(
        "  in blocks",
        f"{p.pool.num_blocks:,}",
        f"{kv.block_size} tokens × {kv.num_groups} group(s), {_size(kv.page_bytes)} each",
    )
    t.add_row("  in tokens (as logged)", f"{p.pool.tokens:,}", p.pool.logged_differs)
    console.print(t)
    console.print("[bold]vLLM would log[/]")
    for line in p.pool.startup_lines:
        console.print(f"  {line}", markup=False)
    if p.hybrid is not None:
        _render_hybrid(p)
    if p.logged_pool_is_accounting:
        a = p.agents
        console.print(
            f"[yellow]note:[/] the logged {p.pool.tokens:,} tokens is accounting, not capacity: ÷ {a.context:,} it "
            f"says {a.naive_sessions:.1f} sessions, but the pool's {p.pool.num_blocks:,} blocks hold "
            f"{a.window_aware_sessions:.1f} sessions of {a.context:,} tokens while they decode"
        )

    a = p.agents
    t = Table(title=f"agents at {a.context:,} tokens of context", show_header=False, title_justify="left")
    t.add_column(justify="left")
    t.add_column(justify="right")
    t.add_column(justify="left", style="dim")
    if p.hybrid is not None:
        h = p.hybrid
        t.add_row("dense formula: logged tokens ÷ context", f"{a.naive_sessions:.1f}", "what the article divided")
        t.add_row(
            "vLLM's worst case at this context",
            f"{h.worst_case_sessions:.1f}",
            "every request mid-prefill with a whole chunk in flight",
        )
        t.add_row(
            "[bold]fit while decoding[/]",
            f"[bold]{h.sessions_while_decoding:.1f}[/]",
            f"{h.decode_blocks:,} block ids each ({h.decode_blocks - h.groups[0].decode_pages} for the sliding groups)",
        )
        t.add_row(
            "  with one prefilling a chunk",
            f"{h.sessions_with_one_prefilling:.1f}",
            f"it holds {h.prefill_extra_blocks:,} more block ids meanwhile",
        )
    elif kv.attention is AttentionKind.HYBRID:
        t.add_row("naive: pool tokens ÷ context", f"{a.naive_sessions:.1f}", "ignores the sliding windows")
        t.add_row("window-aware", f"{a.window_aware_sessions:.1f}", f"{a.blocks_per_session:,} blocks per session")
    else:
        each = f"{a.blocks_per_session:,} blocks each"
        t.add_row("dense formula: pool ÷ context", f"{a.window_aware_sessions:.1f}", each)
    t.add_row(
        "  sharing the system prompt",
        f"{a.shared_prefix_sessions:.1f}",
        f"its {a.shared_prefix_tokens:,} tokens cached once for all agents",
    )
    t.add_row("[bold]plan for[/]", f"[bold]{a.recommended_agents}[/]", "agents (estimate, inherits the pool's error)")
    st = p.step
    t.add_row("decode step, 1 agent", _secs(st.decode_step_s_batch1), "estimate")
    t.add_row(f"decode step, {a.recommended_agents} agents", _secs(st.decode_step_s_at_estimate), "estimate")
    t.add_row("prefill of the whole context", _secs(st.prefill_s_at_context), "estimate, chunked")
    console.print(t)

    if p.offload is not None:
        o = p.offload
        t = Table(title=f"CPU offload tier: {o.gib:g} GiB", show_header=False, title_justify="left")
        t.add_column(justify="left")
        t.add_column(justify="right")
        t.add_column(justify="left", style="dim")
        t.add_row("extra sessions held", f"{o.extra_sessions:.1f}", f"{_size(o.session_bytes)} each")
        t.add_row("reload one session", _secs(o.reload_s), f"at {o.load_gbps:g} GB/s host link")
        t.add_row("recompute it instead", _secs(o.recompute_s), "chunked prefill")
        if o.host_memory_gb and o.gib * 2**30 > o.host_memory_gb * 1e9:
            t.add_row("[red]warning[/]", "", f"more than the {o.host_memory_gb:g} GB of host memory")
        console.print(t)

    if p.curve is not None:
        _render_curve(p)

    _render_command_and_sources(p, "vLLM serve command")


def _render_slots(p: Plan) -> None:
    """A llama.cpp plan (``--slots``): the slots, their KV against the memory, what happens past them."""
    s = p.slots
    assert s is not None
    console.print(
        Panel.fit(
            f"[bold]{p.model.spec.name}[/] on {p.memory.num_gpus}× {p.memory.gpu} — llama.cpp, {s.slots} slots × "
            f"{s.slot_context:,} tokens, {p.agents.context:,} tokens per agent",
            title="agentload plan --slots",
        )
    )
    console.print(_model_line(p))
    for note in p.model.notes:
        console.print(f"  [dim]note: {note}[/]")
    t = Table(title="memory and the slots' KV", show_header=False, title_justify="left")
    t.add_column(justify="left")
    t.add_column(justify="right")
    t.add_column(justify="left", style="dim")
    t.add_row(f"weights ({p.memory.weight_dtype})", _size(s.weights_gb * 1e9), "estimate")
    t.add_row(f"KV per token ({p.kv.dtype.value})", _size(p.kv.bytes_per_token), "all layers")
    t.add_row("KV per slot", _size(s.kv_bytes_per_slot), f"{s.slot_context:,} tokens, allocated at start")
    t.add_row(f"KV of all {s.slots} slots", _size(s.kv_gb_all_slots * 1e9), f"-c {s.total_context:,} tokens")
    t.add_row("GPU memory", _size(s.memory_gb * 1e9), f"{p.memory.num_gpus}× {p.memory.gpu}")
    fit = "" if s.fits_memory else "[red]more than the memory holds[/]"
    t.add_row("slots this memory holds", f"{s.slots_memory_allows}", fit or "beside the weights and activations")
    console.print(t)
    console.print("[bold]llama-server would log[/]")
    console.print(f"  {s.startup_line}")
    t = Table(title=f"agents at {p.agents.context:,} tokens of context", show_header=False, title_justify="left")
    t.add_column(justify="left")
    t.add_column(justify="right")
    t.add_column(justify="left", style="dim")
    t.add_row("[bold]agents that fit[/]", f"[bold]{s.agents_that_fit}[/]", "one per slot, whatever the memory")
    t.add_row("decode step, 1 agent", _secs(p.step.decode_step_s_batch1), "estimate")
    t.add_row(f"decode step, {s.slots} agents", _secs(p.step.decode_step_s_at_estimate), "estimate")
    t.add_row("prefill of the whole context", _secs(p.step.prefill_s_at_context), "estimate; past the slots, per turn")
    console.print(t)
    console.print(f"[bold]past {s.slots} agents:[/] {s.past_slots}")
    for note in s.notes:
        console.print(f"[yellow]note:[/] {note}")
    if not s.fits_memory:
        console.print(
            f"[red]warning:[/] {s.slots} slots of {s.slot_context:,} tokens need {_size(s.kv_gb_all_slots * 1e9)} "
            f"of KV beside {_size(s.weights_gb * 1e9)} of weights: llama-server would fail to allocate -c; use at "
            f"most {s.slots_memory_allows} slots, a smaller --slot-context or an 8-bit KV cache"
        )
    if p.curve is not None:
        _render_curve(p)
    _render_command_and_sources(p, "llama-server command")


def _render_command_and_sources(p: Plan, heading: str) -> None:
    """The serve command with its notes, then where every figure comes from (vLLM and llama.cpp plans alike)."""
    console.print(f"[bold]{heading}[/]")
    console.print("  " + " \\\n    ".join(_command_parts(p)), soft_wrap=True)
    for note in p.serve.notes:
        console.print(f"  [yellow]note:[/] {escape(note)}")
    t = Table(title="where the numbers come from", title_justify="left")
    t.add_column("figure")
    t.add_column("kind")
    t.add_column("how")
    for d in p.derivations:
        t.add_row(d.figure, d.kind, d.how)
    console.print(t)


def _render_hybrid(p: Plan) -> None:
    h = p.hybrid
    assert h is not None
    t = Table(title=f"DeepSeek-V4 KV layout (fp8_ds_mla), {h.formula}", title_justify="left")
    for col in ("group", "layers", "page", "positions/page", "window", "reserved (L)", "decoding"):
        t.add_column(col, justify="left" if col == "group" else "right")
    for g in h.groups:
        t.add_row(
            g.name,
            f"{g.layers}",
            f"{g.page_bytes:,} B",
            f"{g.block_tokens}",
            "-" if g.window is None else f"{g.window}",
            f"{g.reserved_pages:,}",
            f"{g.decode_pages:,}",
        )
    console.print(t)
    L = p.pool.max_model_len
    console.print(
        f"  one slab per block id: {h.slab_bytes:,} B; one {L:,}-token request reserves "
        f"{h.reserved_blocks_per_request:,} blocks (vLLM 0.22; {h.constant_reservation_bytes:,} B of it for the "
        f"sliding groups whatever L is); counting pages as block ids: {h.per_group_blocks_per_request:,}, "
        f"{h.per_group_max_concurrency:.2f}x"
    )
    console.print(
        f"  logged tokens = int({p.pool.max_concurrency:.4f} × {L:,}) = {p.pool.tokens:,}: it grows with "
        f"max-model-len because the reservation is mostly constant; the pool itself holds up to "
        f"{h.pool_capacity_tokens:,} tokens of one request's compressed context"
    )


def _model_line(p: Plan) -> str:
    m = p.model.spec
    kind = {
        AttentionKind.DENSE: f"GQA, {m.num_kv_heads} KV heads × {m.head_dim}",
        AttentionKind.MLA: f"MLA, latent {m.kv_lora_rank} + rope {m.qk_rope_head_dim}",
        AttentionKind.DEEPSEEK_V4: (
            f"DeepSeek-V4, {m.layers_with_ratio(4)} C4A + {m.layers_with_ratio(128)} C128A + "
            f"{m.layers_with_ratio(0)} sliding-only layers, one {m.head_dim}-d KV entry, W={m.sliding_window}"
        ),
        AttentionKind.HYBRID: (
            f"hybrid, {m.num_sliding_layers} of {m.num_layers} layers slide (W={m.sliding_window}), "
            f"{m.num_kv_heads} KV heads × {m.head_dim}"
        ),
    }[m.attention]
    moe = f", MoE {m.num_experts} experts / {m.experts_per_token} active" if m.is_moe else ""
    sparse = f", sparse reads of {m.sparse_read_tokens:,} tokens" if m.sparse_read_tokens else ""
    return (
        f"model: {m.num_layers} layers, {kind}{moe}{sparse}; {m.total_params / 1e9:.1f}B total / "
        f"{m.active_params / 1e9:.1f}B active ({p.model.source})"
    )


def _render_curve(p: Plan) -> None:
    c = p.curve
    assert c is not None
    t = Table(title="predicted throughput (simulated in virtual time)", title_justify="left")
    for col in ("agents", "output tok/s", "prefill tok/s", "GPU prefix hit", "KV use", "preempt", "TTFT p50", ""):
        t.add_column(col, justify="right" if col else "left")
    for pt in c.points:
        mark = "← knee" if pt.agents == c.knee else ("past" if c.knee and pt.agents > c.knee else "")
        t.add_row(
            f"{pt.agents}",
            f"{pt.output_tps:,.0f}",
            f"{pt.prefill_tps:,.0f}",
            f"{pt.prefix_hit_rate:.1%}",
            f"{pt.mean_kv_usage:.0%}",
            f"{pt.preemptions}",
            "-" if pt.ttft_p50_s is None else _secs(pt.ttft_p50_s),
            mark,
        )
    console.print(t)
    if c.knee is None:
        console.print(f"no knee up to {c.points[-1].agents} agents: output tok/s never fell by more than 10%")
    else:
        assert c.knee_vs_estimate is not None
        offload = p.offload.extra_sessions if p.offload is not None else 0.0
        shared = p.agents.shared_prefix_sessions + offload
        tiers = " (GPU pool + offload tier)" if offload else ""
        console.print(
            f"knee: [bold]{c.knee}[/] agents (first fall at {c.first_past_knee}); estimate{tiers} {c.estimate:.1f}: "
            f"knee {c.knee_vs_estimate:+.1%} off it; counting the shared system prompt once ({shared:.1f}): "
            f"{c.knee / shared - 1:+.1%}"
        )
    if c.capped_at is not None:
        console.print(f"[dim]curve capped at {c.capped_at} agents (simulation time)[/]")
    console.print(f"[dim]knee rule: {c.knee_rule}[/]")


def _command_parts(p: Plan) -> list[str]:
    parts = [f"{p.serve.program} {p.serve.model}"]
    for f in p.serve.flags:
        parts.append(f.flag if f.value is None else f"{f.flag} {f.value}")
    return parts
