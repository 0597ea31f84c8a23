"""``agentload plan``'s plan as tables for people: the memory and KV cache, the agents that fit, the CPU offload
tier, llama.cpp's slots, the simulated throughput curve, the serve command and where every figure comes from.

Reads only the compiled ``capacity.planner.Plan`` (and prints to the console it is given): no figure is computed
here that the plan does not hold.
"""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table

from agentload.capacity.models import AttentionKind
from agentload.capacity.planner import Plan


def _size(n: float) -> str:
    """Bytes the way docs/background.md §5 writes them: KiB per token, MiB per session, GB for memory."""
    if n >= 1e9:
        return f"{n / 1e9:,.1f} GB"
    if n >= 2**20:
        return f"{n / 2**20:,.1f} MiB"
    return f"{n / 2**10:,.1f} KiB".replace(".0 KiB", " KiB")


def _secs(s: float) -> str:
    return f"{s * 1e3:.3g} ms" if s < 1 else f"{s:.2f} s"


def render_plan(p: Plan, out: Console) -> None:
    """The plan as tables, for people. Reads only the compiled ``Plan``."""
    if p.slots is not None:
        _render_slots(p, out)
        return
    m = p.model.spec
    out.print(
        Panel.fit(
            f"[bold]{m.name}[/] on {p.memory.num_gpus}× {p.memory.gpu} — max-model-len {p.pool.max_model_len:,}, "
            f"{p.agents.context:,} tokens per agent",
            title="agentload plan",
        )
    )
    out.print(_model_line(p))
    for note in p.model.notes:
        out.print(f"  [dim]note: {escape(note)}[/]")
    _render_memory(p, out)
    _render_agents(p, out)
    if p.offload is not None:
        _render_offload(p, out)
    if p.curve is not None:
        _render_curve(p, out)
    _render_command_and_sources(p, "vLLM serve command", out)


def _three_columns(title: str) -> Table:
    """A table of figure, value and how it was found, as most of the plan's are."""
    t = Table(title=title, show_header=False, title_justify="left")
    t.add_column(justify="left")
    t.add_column(justify="right")
    t.add_column(justify="left", style="dim")
    return t


def _render_memory(p: Plan, out: Console) -> None:
    """A vLLM plan's memory and KV cache, the lines vLLM would log, and (DeepSeek-V4) the KV layout."""
    t = _three_columns("memory and KV cache")
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
    out.print(t)
    out.print("[bold]vLLM would log[/]")
    for line in p.pool.startup_lines:
        out.print(f"  {line}", markup=False)
    if p.hybrid is not None:
        _render_hybrid(p, out)
    if p.logged_pool_is_accounting:
        a = p.agents
        out.print(
            f"[yellow]note:[/] the logged {p.pool.tokens:,} tokens is accounting, not capacity: ÷ {a.context:,} it "
            f"says {a.naive_sessions:.1f} sessions, but the pool's {p.pool.num_blocks:,} blocks hold "
            f"{a.window_aware_sessions:.1f} sessions of {a.context:,} tokens while they decode"
        )


def _render_agents(p: Plan, out: Console) -> None:
    """How many agents fit at the planned context, and the step times at that width."""
    a, kv = p.agents, p.kv
    t = _three_columns(f"agents at {a.context:,} tokens of context")
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
    out.print(t)


def _render_offload(p: Plan, out: Console) -> None:
    o = p.offload
    assert o is not None
    t = _three_columns(f"CPU offload tier: {o.gib:g} GiB")
    t.add_row("extra sessions held", f"{o.extra_sessions:.1f}", f"{_size(o.session_bytes)} each")
    t.add_row("reload one session", _secs(o.reload_s), f"at {o.load_gbps:g} GB/s host link")
    t.add_row("recompute it instead", _secs(o.recompute_s), "chunked prefill")
    if o.host_memory_gb and o.gib * 2**30 > o.host_memory_gb * 1e9:
        t.add_row("[red]warning[/]", "", f"more than the {o.host_memory_gb:g} GB of host memory")
    out.print(t)


def _render_slots(p: Plan, out: Console) -> None:
    """A llama.cpp plan (``--slots``): the slots, their KV against the memory, what happens past them."""
    s = p.slots
    assert s is not None
    out.print(
        Panel.fit(
            f"[bold]{p.model.spec.name}[/] on {p.memory.num_gpus}× {p.memory.gpu} — llama.cpp, {s.slots} slots × "
            f"{s.slot_context:,} tokens, {p.agents.context:,} tokens per agent",
            title="agentload plan --slots",
        )
    )
    out.print(_model_line(p))
    for note in p.model.notes:
        out.print(f"  [dim]note: {escape(note)}[/]")
    t = _three_columns("memory and the slots' KV")
    t.add_row(f"weights ({p.memory.weight_dtype})", _size(s.weights_gb * 1e9), "estimate")
    t.add_row(f"KV per token ({p.kv.dtype.value})", _size(p.kv.bytes_per_token), "all layers")
    t.add_row("KV per slot", _size(s.kv_bytes_per_slot), f"{s.slot_context:,} tokens, allocated at start")
    t.add_row(f"KV of all {s.slots} slots", _size(s.kv_gb_all_slots * 1e9), f"-c {s.total_context:,} tokens")
    t.add_row("GPU memory", _size(s.memory_gb * 1e9), f"{p.memory.num_gpus}× {p.memory.gpu}")
    fit = "" if s.fits_memory else "[red]more than the memory holds[/]"
    t.add_row("slots this memory holds", f"{s.slots_memory_allows}", fit or "beside the weights and activations")
    out.print(t)
    out.print("[bold]llama-server would log[/]")
    out.print(f"  {s.startup_line}")
    t = _three_columns(f"agents at {p.agents.context:,} tokens of context")
    t.add_row("[bold]agents that fit[/]", f"[bold]{s.agents_that_fit}[/]", "one per slot, whatever the memory")
    t.add_row("decode step, 1 agent", _secs(p.step.decode_step_s_batch1), "estimate")
    t.add_row(f"decode step, {s.slots} agents", _secs(p.step.decode_step_s_at_estimate), "estimate")
    t.add_row("prefill of the whole context", _secs(p.step.prefill_s_at_context), "estimate; past the slots, per turn")
    out.print(t)
    out.print(f"[bold]past {s.slots} agents:[/] {s.past_slots}")
    for note in s.notes:
        out.print(f"[yellow]note:[/] {note}")
    if not s.fits_memory:
        out.print(
            f"[red]warning:[/] {s.slots} slots of {s.slot_context:,} tokens need {_size(s.kv_gb_all_slots * 1e9)} "
            f"of KV beside {_size(s.weights_gb * 1e9)} of weights: llama-server would fail to allocate -c; use at "
            f"most {s.slots_memory_allows} slots, a smaller --slot-context or an 8-bit KV cache"
        )
    if p.curve is not None:
        _render_curve(p, out)
    _render_command_and_sources(p, "llama-server command", out)


def _render_command_and_sources(p: Plan, heading: str, out: Console) -> None:
    """The serve command with its notes, then where every figure comes from (vLLM and llama.cpp plans alike)."""
    out.print(f"[bold]{heading}[/]")
    out.print("  " + " \\\n    ".join(_command_parts(p)), soft_wrap=True)
    for note in p.serve.notes:
        out.print(f"  [yellow]note:[/] {escape(note)}")
    t = Table(title="where the numbers come from", title_justify="left")
    t.add_column("figure")
    t.add_column("kind")
    t.add_column("how")
    for d in p.derivations:
        t.add_row(d.figure, d.kind, d.how)
    out.print(t)


def _render_hybrid(p: Plan, out: Console) -> None:
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
    out.print(t)
    L = p.pool.max_model_len
    out.print(
        f"  one slab per block id: {h.slab_bytes:,} B; one {L:,}-token request reserves "
        f"{h.reserved_blocks_per_request:,} blocks (vLLM 0.22; {h.constant_reservation_bytes:,} B of it for the "
        f"sliding groups whatever L is); counting pages as block ids: {h.per_group_blocks_per_request:,}, "
        f"{h.per_group_max_concurrency:.2f}x"
    )
    out.print(
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


def _render_curve(p: Plan, out: Console) -> None:
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
    out.print(t)
    if c.knee is None:
        out.print(f"no knee up to {c.points[-1].agents} agents: output tok/s never fell by more than 10%")
    else:
        assert c.knee_vs_estimate is not None
        offload = p.offload.extra_sessions if p.offload is not None else 0.0
        shared = p.agents.shared_prefix_sessions + offload
        tiers = " (GPU pool + offload tier)" if offload else ""
        out.print(
            f"knee: [bold]{c.knee}[/] agents (first fall at {c.first_past_knee}); estimate{tiers} {c.estimate:.1f}: "
            f"knee {c.knee_vs_estimate:+.1%} off it; counting the shared system prompt once ({shared:.1f}): "
            f"{c.knee / shared - 1:+.1%}"
        )
    if c.capped_at is not None:
        out.print(f"[dim]curve capped at {c.capped_at} agents (simulation time)[/]")
    out.print(f"[dim]knee rule: {c.knee_rule}[/]")


def _command_parts(p: Plan) -> list[str]:
    parts = [f"{p.serve.program} {p.serve.model}"]
    for f in p.serve.flags:
        parts.append(f.flag if f.value is None else f"{f.flag} {f.value}")
    return parts
