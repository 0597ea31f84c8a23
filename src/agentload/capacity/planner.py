"""The capacity planner: one model on some GPUs with one vLLM configuration → how many agents it carries.

``plan`` resolves the configuration into a ``ServingProfile`` through ``profile.resolve`` — the same KV layout,
pool sizing and step-time model the simulator runs, never a second formula — and compiles the figures into an
immutable ``Plan``. ``sim.curve.add_throughput_curve`` then runs the simulator on ``planned_profile(plan)``
and returns the plan with the measured curve and its knee. Renderers (the CLI's rich tables, ``--json``) only
read the ``Plan``; it round-trips through JSON.

What is exact and what is estimated (each figure carries its own note in ``Plan.derivations``):

* KV bytes per token, block layout and vLLM's "Maximum concurrency" follow from the architecture and the pool
  exactly as vLLM computes them (docs/background.md §3, §5);
* weights memory and the pool from GPU memory are estimates (datasheet memory × utilisation − weights −
  activation allowance); real pools are often 20-30% off, so ``pool_tokens`` from a real server's startup log
  replaces the estimate when known;
* agents at a context = pool blocks ÷ blocks one session holds (sliding-window groups hold only their window);
* offload reload seconds use the datasheet host-link bandwidth, recompute seconds the step-time model;
* the throughput curve is simulated: closed-loop agents that hold the planned context, with think time.

With ``slots`` (llama.cpp's ``llama-server -np N``) the question is llama.cpp's: the server allocates ``-c`` =
N × per-slot context tokens of KV at start and runs at most N requests, each slot caching only its own last prompt
(sim/slots.py). Agents that fit = N (when one agent's context fits a slot), whatever the memory; the plan gives the
KV per slot and for all slots against the GPUs' memory, and past N agents turns queue for a slot (bench's knee
cause ``slots_full``) and re-prefill their context in whichever slot they get. The curve simulates that profile.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, computed_field, field_validator, model_validator

from agentload.capacity import catalog
from agentload.capacity.hfconfig import load_hf_config, looks_like_config_path
from agentload.capacity.hybrid_kv import ConcurrencyFormula
from agentload.capacity.kv import KVDtype, KVLayout, parse_kv_dtype
from agentload.capacity.models import WEIGHT_BYTES, AttentionKind, ModelSpec
from agentload.capacity.profile import (
    MAX_BATCHED_TOKENS,
    MAX_GIB,
    MAX_GPUS,
    MAX_MODEL_LEN,
    MAX_NUM_SEQS,
    MAX_OFFLOAD_GIB,
    MAX_POOL_BLOCKS,
    MAX_POOL_TOKENS,
    KVPoolSpec,
    OffloadSpec,
    ProfileFile,
    ServingProfile,
    resolve,
    slot_startup_line,
)
from agentload.errors import ConfigError

# llama-server's --slot-prompt-similarity default (sim/slots.py models the rule).
SLOT_PROMPT_SIMILARITY = 0.1

# vLLM's defaults (vllm/engine/arg_utils.py): 8,192 batched tokens and 1,024 sequences on big GPUs, 2,048 / 256
# otherwise.
BIG_GPU_GB = 70.0
MAX_NUM_SEQS_CAP = 1024


MAX_TOKENS = 2_000_000  # an agent's system prompt, tool result or reply (a bound on user input)


class AgentShape(BaseModel):
    """What each simulated agent does per turn (defaults: the agent traffic of docs/background.md §1, shortened)."""

    # Finite and bounded: these come from flags.
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    system_tokens: int = Field(default=2_000, gt=0, le=MAX_TOKENS, description="system prompt shared by every agent")
    turn_input_tokens: int = Field(default=1_000, gt=0, le=MAX_TOKENS, description="tool result appended per turn")
    output_tokens: int = Field(default=400, gt=0, le=MAX_TOKENS, description="reply per turn")
    think_s: float = Field(default=2.0, ge=0, le=86_400, description="tool time between turns")

    @property
    def per_turn_tokens(self) -> int:
        return self.system_tokens + self.turn_input_tokens + self.output_tokens


class PlanSpec(BaseModel):
    """What was asked: the configuration to plan (unset fields take vLLM's or the model's defaults)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    model: str = Field(description="catalogue name or path to a config.json (or a folder holding one)")
    gpu: str
    num_gpus: int = Field(default=1, gt=0, le=MAX_GPUS, description="tensor-parallel size")
    max_model_len: int | None = Field(default=None, gt=0, le=MAX_MODEL_LEN)
    kv_cache_dtype: str = "auto"
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    context_per_agent: int | None = Field(default=None, gt=0, le=MAX_MODEL_LEN, description="default: max_model_len")
    offload_gib: float = Field(default=0.0, ge=0, le=MAX_OFFLOAD_GIB)
    weight_dtype: str | None = Field(default=None, description="default: the checkpoint's dtype")
    activation_gib: float = Field(
        default=2.0, ge=0, le=MAX_GIB, description="activation peak + runtime overhead per GPU"
    )
    pool_tokens: int | None = Field(
        default=None, gt=0, le=MAX_POOL_TOKENS, description="the pool a real server logged, if known"
    )
    num_gpu_blocks: int | None = Field(
        default=None, gt=0, le=MAX_POOL_BLOCKS, description="vLLM's cache_config_info{num_gpu_blocks} (exact)"
    )
    kv_memory_gib: float | None = Field(
        default=None, gt=0, le=MAX_GIB, description="vLLM's 'Available KV cache memory' per GPU, GiB"
    )
    max_num_batched_tokens: int | None = Field(default=None, gt=0, le=MAX_BATCHED_TOKENS)
    slots: int | None = Field(default=None, gt=0, le=MAX_NUM_SEQS, description="llama.cpp's -np: parallel slots")
    slot_context: int | None = Field(
        default=None,
        gt=0,
        le=MAX_MODEL_LEN,
        description="tokens per slot (-c ÷ -np); default max_model_len",
    )
    agent: AgentShape = Field(default_factory=AgentShape)

    @model_validator(mode="after")
    def _one_pool(self) -> PlanSpec:
        stated = [n for n in ("pool_tokens", "num_gpu_blocks", "kv_memory_gib") if getattr(self, n) is not None]
        if len(stated) > 1:
            raise ValueError("state the pool once: --pool-tokens, --num-gpu-blocks or --kv-memory-gib")
        if self.slot_context is not None and self.slots is None:
            raise ValueError("--slot-context is the context of each llama.cpp slot: give --slots too")
        if self.slots is not None:
            if stated:
                raise ValueError(
                    "llama.cpp sizes its KV as --slots × --slot-context (its -c); drop --pool-tokens, "
                    "--num-gpu-blocks and --kv-memory-gib"
                )
            if self.offload_gib > 0:
                raise ValueError("llama.cpp has no CPU KV offload tier: drop --offload-gib with --slots")
            if self.slot_context is not None and self.max_model_len not in (None, self.slot_context):
                raise ValueError("--slot-context and --max-model-len both set the per-slot context: give one")
        return self

    @field_validator("weight_dtype")
    @classmethod
    def _known_weight_dtype(cls, value: str | None) -> str | None:
        if value is not None and value not in WEIGHT_BYTES:
            raise ValueError(f"must be one of {', '.join(WEIGHT_BYTES)}")
        return value

    @field_validator("kv_cache_dtype")
    @classmethod
    def _known_kv_dtype(cls, value: str) -> str:
        try:
            parse_kv_dtype(value)
        except ConfigError as exc:
            raise ValueError(str(exc)) from exc
        return value


# PlanSpec field → the ``agentload plan`` flag that sets it, so a bad value's message names the flag the user typed
# (``parse_spec``'s ``names``; the command declares the same spellings as its options).
PLAN_FLAGS = {
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


def parse_spec(fields: Mapping[str, object], names: Mapping[str, str] | None = None) -> PlanSpec:
    """A ``PlanSpec`` from loose values, bad ones reported as one ``ConfigError`` line.

    ``names`` maps field names to what the caller calls them (the CLI's flags), so the message names the flag.
    """
    try:
        return PlanSpec.model_validate(fields)
    except ValidationError as exc:
        parts = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"])
            parts.append(f"{(names or {}).get(where, where) or 'plan'}: {err['msg']}")
        raise ConfigError("; ".join(parts)) from exc


# -- the compiled plan -----------------------------------------------------------------------------------------


class Derivation(BaseModel):
    """Where one figure comes from."""

    model_config = ConfigDict(frozen=True)

    figure: str
    kind: Literal["exact", "vLLM formula", "estimate", "stated", "simulated"]
    how: str


class ModelFigures(BaseModel):
    model_config = ConfigDict(frozen=True)

    spec: ModelSpec
    source: str  # "catalogue" or the config.json path
    notes: tuple[str, ...] = ()


class MemoryFigures(BaseModel):
    model_config = ConfigDict(frozen=True)

    gpu: str
    num_gpus: int
    gpu_memory_gb: float
    weight_dtype: str
    weights_gb: float  # all GPUs together
    weights_gb_per_gpu: float
    activation_gib_per_gpu: float
    gpu_memory_utilization: float
    kv_pool_gb: float  # what the pool's blocks occupy, all GPUs together


class KVFigures(BaseModel):
    model_config = ConfigDict(frozen=True)

    dtype: KVDtype
    attention: AttentionKind
    bytes_per_token: int  # every layer keeps the token (the dense figure)
    growing_bytes_per_token: int  # once sliding windows are full (full-attention layers only)
    fixed_bytes_per_session: int  # sliding-window layers of a long session
    block_size: int
    page_bytes: int
    num_groups: int
    replication: float  # copies of each token's KV across tensor-parallel ranks


class PoolFigures(BaseModel):
    model_config = ConfigDict(frozen=True)

    num_blocks: int
    tokens: int  # as vLLM logs it
    source: str
    max_model_len: int
    max_concurrency: float
    startup_lines: tuple[str, ...]
    # Why the logged tokens differ from a stated --pool-tokens ("" when they do not).
    logged_differs: str = ""


class V4GroupFigures(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    layers: int
    page_bytes: int
    block_tokens: int
    window: int | None
    reserved_pages: int  # vLLM's worst case for one max-model-len request
    decode_pages: int  # what a request decoding at the planned context holds


class HybridKVFigures(BaseModel):
    """DeepSeek-V4: vLLM's layout, its logged accounting, and what decoding requests really hold."""

    model_config = ConfigDict(frozen=True)

    formula: str
    slab_bytes: int
    groups: tuple[V4GroupFigures, ...]
    constant_reservation_bytes: int  # the sliding groups' part of one request's worst case
    reserved_blocks_per_request: int  # vLLM 0.22's memory-weighted blocks per max-model-len request
    per_group_blocks_per_request: int  # Σ pages as block ids (the later formula)
    per_group_max_concurrency: float
    decode_blocks: int  # block ids one request decoding at the context holds
    prefill_extra_blocks: int  # more while it prefills a whole chunk
    sessions_while_decoding: float
    sessions_with_one_prefilling: float
    worst_case_sessions: float  # vLLM's reservation at the planned context
    pool_capacity_tokens: int  # context one decoding request could hold in the whole pool


class AgentFigures(BaseModel):
    model_config = ConfigDict(frozen=True)

    context: int
    blocks_per_session: int
    naive_sessions: float  # logged pool tokens ÷ context (the article's rule)
    window_aware_sessions: float  # pool blocks ÷ blocks per session (equals the dense formula for dense models)
    shared_prefix_sessions: float  # the same, with the agents' common system prompt stored once
    shared_prefix_tokens: int
    recommended_agents: int

    @property
    def estimate(self) -> float:
        return self.window_aware_sessions


class StepFigures(BaseModel):
    model_config = ConfigDict(frozen=True)

    decode_step_s_batch1: float
    decode_step_s_at_estimate: float
    prefill_s_at_context: float  # chunked, as the scheduler runs it


class OffloadFigures(BaseModel):
    model_config = ConfigDict(frozen=True)

    gib: float
    logical_blocks: int
    extra_sessions: float
    session_bytes: int  # what one session's full-attention KV occupies in the CPU tier
    load_gbps: float  # effective host->GPU bandwidth over all ranks
    reload_s: float
    recompute_s: float
    host_memory_gb: float  # what the GPUs' hosts offer (0 = not stated)


class ServeFlag(BaseModel):
    model_config = ConfigDict(frozen=True)

    flag: str
    value: str | None
    why: str


class ServeCommand(BaseModel):
    model_config = ConfigDict(frozen=True)

    model: str
    flags: tuple[ServeFlag, ...]
    notes: tuple[str, ...] = ()
    program: str = "vllm serve"

    def command_line(self) -> str:
        parts = [self.program, self.model]
        for f in self.flags:
            parts.append(f.flag if f.value is None else f"{f.flag} {f.value}")
        return " ".join(parts)


class SlotFigures(BaseModel):
    """llama.cpp's answer (``--slots``): N slots of a fixed context, KV allocated for all of them at start."""

    model_config = ConfigDict(frozen=True)

    slots: int
    slot_context: int  # tokens per slot (n_ctx of each slot in /slots and /props)
    total_context: int  # llama-server's -c = slots × slot_context
    kv_bytes_per_slot: float  # one slot's KV, allocated whether or not it is used
    kv_gb_all_slots: float
    memory_gb: float  # the GPUs' memory
    weights_gb: float
    slots_memory_allows: int  # slots of this context the memory holds beside the weights and activations
    fits_memory: bool
    agents_that_fit: int  # = slots: one running request per slot, whatever the memory
    past_slots: str  # what happens to agent N+1 and beyond
    startup_line: str  # what llama-server logs at start
    notes: tuple[str, ...] = ()


class CurvePoint(BaseModel):
    model_config = ConfigDict(frozen=True)

    agents: int
    output_tps: float
    prefill_tps: float
    prefix_hit_rate: float
    recomputed_tokens: int
    preemptions: int
    mean_kv_usage: float
    mean_running: float
    mean_waiting: float
    ttft_p50_s: float | None
    turns: int
    duration_s: float
    warmup_s: float
    refinement: bool = False  # added while bisecting the cliff


class ThroughputCurve(BaseModel):
    model_config = ConfigDict(frozen=True)

    points: tuple[CurvePoint, ...]
    knee: int | None  # the largest count before throughput falls; None when no fall was seen
    first_past_knee: int | None
    estimate: float  # what the knee is compared with: sessions the GPU pool holds, plus the offload tier's
    knee_rule: str
    capped_at: int | None = None  # the largest count simulated when MAX_SIMULATED_AGENTS cut the grid

    @property
    def knee_vs_estimate(self) -> float | None:
        """knee ÷ estimate − 1 (positive: the simulator carried more agents than the estimate)."""
        return None if self.knee is None else self.knee / self.estimate - 1.0


class Plan(BaseModel):
    """Everything ``agentload plan`` reports, computed once; renderers read only this."""

    model_config = ConfigDict(frozen=True)

    spec: PlanSpec
    model: ModelFigures
    memory: MemoryFigures
    kv: KVFigures
    pool: PoolFigures
    agents: AgentFigures
    step: StepFigures
    offload: OffloadFigures | None
    serve: ServeCommand
    derivations: tuple[Derivation, ...]
    curve: ThroughputCurve | None = None
    hybrid: HybridKVFigures | None = None  # DeepSeek-V4 only
    slots: SlotFigures | None = None  # llama.cpp (--slots) only

    @computed_field  # type: ignore[prop-decorator]
    @property
    def logged_pool_is_accounting(self) -> bool:
        """True when 'KV cache size: N tokens' ÷ context is not how many sessions the pool holds (> 2% off)."""
        a = self.agents
        return abs(a.naive_sessions - a.window_aware_sessions) > 0.02 * a.window_aware_sessions


# -- planning ---------------------------------------------------------------------------------------------------


def find_model(name_or_path: str) -> ModelFigures:
    """A catalogue model by name, or a Hugging Face config.json by path (never downloaded)."""
    if looks_like_config_path(name_or_path):
        loaded = load_hf_config(name_or_path)
        return ModelFigures(spec=loaded.spec, source=loaded.source, notes=loaded.notes)
    return ModelFigures(spec=catalog.get_model(name_or_path), source="catalogue")


def _profile_file(spec: PlanSpec, model: ModelSpec, max_model_len: int, max_num_seqs: int) -> ProfileFile:
    gpu = catalog.get_gpu(spec.gpu)
    batched = spec.max_num_batched_tokens or (8192 if gpu.memory_gb >= BIG_GPU_GB else 2048)
    try:
        return _build_profile_file(spec, model, gpu.name, max_model_len, max_num_seqs, batched)
    except ValidationError as exc:  # a figure a config.json states past a profile's bounds (max_model_len)
        raise ConfigError(f"{model.name} on {gpu.name}: {catalog.validation_message(exc)}") from exc


def _build_profile_file(
    spec: PlanSpec, model: ModelSpec, gpu: str, max_model_len: int, max_num_seqs: int, batched: int
) -> ProfileFile:
    return ProfileFile(
        name=f"plan-{model.name}-{spec.num_gpus}x{gpu}",
        description="built by agentload plan",
        model=model.model_dump(mode="json"),
        served_model_name=model.hf_id or model.name,
        gpu=gpu,
        num_gpus=spec.num_gpus,
        weight_dtype=spec.weight_dtype or model.checkpoint_dtype,
        kv_cache_dtype=spec.kv_cache_dtype,
        max_model_len=max_model_len,
        max_num_batched_tokens=batched,
        max_num_seqs=max_num_seqs,
        slots=spec.slots,
        kv_pool=KVPoolSpec(
            tokens=spec.pool_tokens,
            num_blocks=spec.num_gpu_blocks,
            available_gib=spec.kv_memory_gib,
            gpu_memory_utilization=spec.gpu_memory_utilization,
            activation_gib=spec.activation_gib,
        ),
        offload=OffloadSpec(gib=spec.offload_gib),
    )


def planned_profile(plan: Plan) -> ServingProfile:
    """The simulator profile that realises ``plan`` (resolved again: a ``Plan`` holds figures, not objects)."""
    pf = _profile_file(plan.spec, plan.model.spec, plan.pool.max_model_len, plan.agents.recommended_agents)
    return resolve(pf, "the plan")


def plan(spec: PlanSpec) -> Plan:
    """Compile the static figures of a plan (no simulation; see ``add_throughput_curve``)."""
    found = find_model(spec.model)
    model = found.spec
    gpu = catalog.get_gpu(spec.gpu)
    if spec.slots is not None:
        return _plan_slots(spec, found, gpu.name)
    max_model_len = spec.max_model_len or model.max_position_embeddings
    if max_model_len is None:
        raise ConfigError(f"model {model.name} states no max_position_embeddings; pass --max-model-len")
    context = spec.context_per_agent or max_model_len
    if context > max_model_len:
        raise ConfigError(f"context per agent {context:,} exceeds max-model-len {max_model_len:,}")
    if context <= spec.agent.per_turn_tokens:
        raise ConfigError(
            f"context per agent {context:,} must exceed one turn's tokens ({spec.agent.per_turn_tokens:,}: system "
            "prompt + tool result + reply)"
        )
    # First pass sizes the pool; the recommended max-num-seqs depends on it, so the profile is resolved again.
    first = resolve(_profile_file(spec, model, max_model_len, MAX_NUM_SEQS_CAP), f"{model.name} on {gpu.name}")
    layout = first.layout
    blocks_per_session = layout.blocks_per_request(context)
    window_aware = first.num_blocks / blocks_per_session
    recommended = max(1, min(MAX_NUM_SEQS_CAP, math.floor(window_aware)))
    profile = resolve(_profile_file(spec, model, max_model_len, recommended), f"{model.name} on {gpu.name}")

    weight_dtype = spec.weight_dtype or model.checkpoint_dtype
    memory = MemoryFigures(
        gpu=gpu.name,
        num_gpus=spec.num_gpus,
        gpu_memory_gb=gpu.memory_gb,
        weight_dtype=weight_dtype,
        weights_gb=profile.weights_bytes / 1e9,
        weights_gb_per_gpu=profile.weights_bytes / 1e9 / spec.num_gpus,
        activation_gib_per_gpu=spec.activation_gib,
        gpu_memory_utilization=spec.gpu_memory_utilization,
        kv_pool_gb=profile.num_blocks * layout.stored_page_bytes / 1e9,
    )
    kv = _kv_figures(layout, model)
    pool = PoolFigures(
        num_blocks=profile.num_blocks,
        tokens=profile.pool_tokens,
        source=_pool_source(spec, profile.pool_source),
        logged_differs=_logged_differs(spec, layout, profile.num_blocks, profile.pool_tokens),
        max_model_len=max_model_len,
        max_concurrency=profile.max_concurrency,
        startup_lines=tuple(profile.startup_lines()),
    )
    agents = AgentFigures(
        context=context,
        blocks_per_session=blocks_per_session,
        naive_sessions=layout.naive_sessions(profile.num_blocks, context),
        window_aware_sessions=window_aware,
        shared_prefix_sessions=layout.sessions_sharing_prefix(profile.num_blocks, context, spec.agent.system_tokens),
        shared_prefix_tokens=spec.agent.system_tokens,
        recommended_agents=recommended,
    )
    sm = profile.step_model
    step = StepFigures(
        decode_step_s_batch1=sm.decode_step_time(1, context),
        decode_step_s_at_estimate=sm.decode_step_time(recommended, context),
        prefill_s_at_context=sm.chunked_prefill_time(context, profile.max_num_batched_tokens),
    )
    offload = _offload_figures(spec, profile, context) if spec.offload_gib > 0 else None
    hybrid = _hybrid_figures(profile, context) if layout.v4 is not None else None
    return Plan(
        hybrid=hybrid,
        spec=spec,
        model=found,
        memory=memory,
        kv=kv,
        pool=pool,
        agents=agents,
        step=step,
        offload=offload,
        serve=_serve_command(spec, profile, model, weight_dtype),
        derivations=_derivations(spec, profile, found, offload),
    )


def _pool_source(spec: PlanSpec, resolved: str) -> str:
    """Where the pool came from, by the flag that gave it (the profile's own wording names a profile's fields)."""
    if spec.pool_tokens is not None:
        return f"from --pool-tokens {spec.pool_tokens:,}"
    if spec.num_gpu_blocks is not None:
        return f"from --num-gpu-blocks {spec.num_gpu_blocks:,} (exact)"
    if spec.kv_memory_gib is not None:
        return f"--kv-memory-gib: {resolved}"
    return resolved


def _logged_differs(spec: PlanSpec, layout: KVLayout, num_blocks: int, logged: int) -> str:
    """Why vLLM would log another token count than the --pool-tokens given: the pool is whole blocks."""
    stated = spec.pool_tokens
    if stated is None or stated == logged:
        return ""
    if layout.v4 is not None:
        return (
            f"--pool-tokens {stated:,} is no count this layout logs: {num_blocks:,} block ids is the smallest pool "
            f"logging at least that, as int(max concurrency × max-model-len) = {logged:,}"
        )
    bs = layout.block_size
    return (
        f"{stated - logged:,} under --pool-tokens {stated:,}: vLLM counts whole {bs}-token blocks "
        f"({stated // bs:,} × {bs})"
    )


def _kv_figures(layout: KVLayout, model: ModelSpec) -> KVFigures:
    """The KV cache's shape as the plan reports it (the same for a vLLM pool and llama.cpp's slots)."""
    return KVFigures(
        dtype=layout.dtype,
        attention=model.attention,
        bytes_per_token=layout.bytes_per_token,
        growing_bytes_per_token=layout.growing_bytes_per_token,
        fixed_bytes_per_session=layout.fixed_bytes_per_session,
        block_size=layout.block_size,
        page_bytes=layout.page_bytes,
        num_groups=layout.num_groups,
        replication=layout.replication,
    )


def _hybrid_figures(profile: ServingProfile, context: int) -> HybridKVFigures:
    v4 = profile.layout.v4
    assert v4 is not None
    big_l, n = profile.max_model_len, profile.num_blocks
    t = v4.max_num_batched_tokens
    decode = v4.decode_blocks(context)
    extra = v4.prefill_extra_blocks(context)
    sliding_decode = decode - v4.full.held_pages(context)
    return HybridKVFigures(
        formula=f"vLLM 0.22 (memory-weighted; matches 0.22.x logs); later: {ConcurrencyFormula.PER_GROUP.value}",
        slab_bytes=v4.slab_bytes,
        groups=tuple(
            V4GroupFigures(
                name=g.name,
                layers=g.layers,
                page_bytes=g.page_bytes,
                block_tokens=g.block_tokens,
                window=g.window,
                reserved_pages=g.reserved_pages(big_l, t),
                decode_pages=g.held_pages(context),
            )
            for g in v4.groups
        ),
        constant_reservation_bytes=v4.constant_reservation_bytes(big_l),
        reserved_blocks_per_request=v4.blocks_per_request(big_l),
        per_group_blocks_per_request=v4.blocks_per_request(big_l, ConcurrencyFormula.PER_GROUP),
        per_group_max_concurrency=v4.max_concurrency(n, big_l, ConcurrencyFormula.PER_GROUP),
        decode_blocks=decode,
        prefill_extra_blocks=extra,
        sessions_while_decoding=n / decode,
        sessions_with_one_prefilling=max(0.0, (n - extra) / decode),
        worst_case_sessions=v4.max_concurrency(n, context),
        pool_capacity_tokens=max(0, n - sliding_decode) * v4.full.block_tokens,
    )


def _offload_figures(spec: PlanSpec, profile: ServingProfile, context: int) -> OffloadFigures:
    layout = profile.layout
    # The CPU tier keeps full-attention blocks (sliding windows are cheap to recompute); one logical block is a
    # block of every full-attention group, as in the simulator's offload tier.
    logical = profile.offload_blocks // max(1, layout.full_groups)
    session_blocks = -(-context // layout.block_size)
    return OffloadFigures(
        gib=spec.offload_gib,
        logical_blocks=logical,
        extra_sessions=logical / session_blocks,
        session_bytes=session_blocks * layout.page_bytes * layout.full_groups,
        load_gbps=profile.offload_load_bytes_per_s / 1e9,
        reload_s=profile.offload_load_s(session_blocks),
        recompute_s=profile.step_model.chunked_prefill_time(context, profile.max_num_batched_tokens),
        host_memory_gb=profile.gpu.host_memory_gb * profile.num_gpus,
    )


def _serve_command(spec: PlanSpec, profile: ServingProfile, model: ModelSpec, weight_dtype: str) -> ServeCommand:
    kv_flag = "fp8" if profile.kv_dtype is KVDtype.FP8 else "auto"
    flags = [
        ServeFlag(flag="--tensor-parallel-size", value=str(profile.num_gpus), why="GPUs the weights and KV split over"),
        ServeFlag(flag="--max-model-len", value=str(profile.max_model_len), why="longest request the pool must fit"),
        ServeFlag(flag="--kv-cache-dtype", value=kv_flag, why=f"KV stored in {profile.kv_dtype.value}"),
        ServeFlag(
            flag="--gpu-memory-utilization",
            value=f"{profile.gpu_memory_utilization:g}",
            why="share of GPU memory for weights + KV + activations",
        ),
        ServeFlag(
            flag="--max-num-seqs",
            value=str(profile.max_num_seqs),
            why="no more running requests than sessions fit at the planned context, so none is preempted",
        ),
        ServeFlag(
            flag="--max-num-batched-tokens",
            value=str(profile.max_num_batched_tokens),
            why="prefill chunk per step (vLLM's default for this GPU class)",
        ),
    ]
    if spec.offload_gib > 0:
        flags.append(
            ServeFlag(flag="--kv-offloading-size", value=f"{spec.offload_gib:g}", why="CPU KV tier in GiB (all ranks)")
        )
    flags += [
        ServeFlag(flag="--enable-prefix-caching", value=None, why="agents re-send their whole conversation"),
        ServeFlag(
            flag="--enable-prompt-tokens-details",
            value=None,
            why="fills usage.prompt_tokens_details.cached_tokens, so agentload can measure prefix hits",
        ),
    ]
    notes: list[str] = []
    if weight_dtype != model.checkpoint_dtype:
        if weight_dtype == "fp8":
            flags.append(ServeFlag(flag="--quantization", value="fp8", why="quantise the weights to fp8 at load"))
        else:
            notes.append(
                f"{weight_dtype} weights need a checkpoint already quantised to {weight_dtype} (e.g. an NVFP4 build "
                "of the model): serve that instead of the model id shown"
            )
    return ServeCommand(model=model.hf_id or model.name, flags=tuple(flags), notes=tuple(notes))


def _derivations(
    spec: PlanSpec, profile: ServingProfile, found: ModelFigures, offload: OffloadFigures | None
) -> tuple[Derivation, ...]:
    layout = profile.layout
    model = found.spec
    out = [
        _kv_derivation(spec, layout, model),
        _weights_derivation(profile, found),
        _pool_derivation(spec, profile),
        _concurrency_derivation(layout),
        _agents_derivation(layout, model),
        Derivation(
            figure="step times",
            kind="estimate",
            how="datasheet bandwidth and FLOP/s at 45% MFU, plus fixed per-step and per-request costs",
        ),
    ]
    if offload is not None:
        out.append(
            Derivation(
                figure="offload reload / recompute",
                kind="estimate",
                how="session KV ÷ host-link bandwidth (datasheet) vs the chunked prefill of the context",
            )
        )
    out.append(
        Derivation(
            figure="throughput curve",
            kind="simulated",
            how="the simulator in virtual time on this profile: closed-loop agents holding the context, "
            f"{spec.agent.output_tokens}-token replies, {spec.agent.think_s:g} s think time",
        )
    )
    return tuple(out)


def _kv_derivation(spec: PlanSpec, layout: KVLayout, model: ModelSpec) -> Derivation:
    """How the KV bytes per token follow from the attention's shape."""
    if layout.v4 is not None:
        kv_how = (
            "vLLM's fp8_ds_mla pages per 256-token block (584-B main entries, 132-B indexer keys, padded to 576 B; "
            "sliding window and compressor state as sliding groups); the pool charges one slab per block id"
        )
    elif model.attention is AttentionKind.MLA:
        kv_how = "layers × (kv_lora_rank + qk_rope_head_dim) × dtype bytes (MLA latent)"
    else:
        kv_how = "2 × layers × kv_heads × head_dim × dtype bytes"
    if model.attention is AttentionKind.HYBRID:
        kv_how += "; sliding layers stop growing at their window (≈ ceil((W−1)/16)+1 blocks)"
    if layout.replication > 1:
        kv_how += f"; {layout.replication:g} copies across {spec.num_gpus} GPUs (heads cannot split further)"
    return Derivation(figure="KV bytes per token", kind="exact", how=kv_how)


def _weights_derivation(profile: ServingProfile, found: ModelFigures) -> Derivation:
    weight_source = "catalogue" if found.source == "catalogue" else "estimated from config.json shapes"
    return Derivation(
        figure="weights memory",
        kind="estimate",
        how=f"parameters ({weight_source}) × {profile.weight_bytes_per_param:g} bytes; quantisation scales "
        "and layers kept in higher precision not counted",
    )


def _pool_derivation(spec: PlanSpec, profile: ServingProfile) -> Derivation:
    """Where the pool came from: one of the three flags that state it, or the memory estimate."""
    if spec.pool_tokens is not None:
        return Derivation(figure="KV pool", kind="stated", how=f"--pool-tokens {spec.pool_tokens:,}")
    if spec.num_gpu_blocks is not None:
        return Derivation(figure="KV pool", kind="stated", how=f"--num-gpu-blocks {spec.num_gpu_blocks:,} (exact)")
    if spec.kv_memory_gib is not None:
        return Derivation(
            figure="KV pool",
            kind="stated",
            how=f"--kv-memory-gib {spec.kv_memory_gib:g} × {spec.num_gpus} GPU(s) ÷ bytes per block "
            "(vLLM logs the GiB to 0.01, so a few blocks either way)",
        )
    return Derivation(
        figure="KV pool",
        kind="estimate",
        how=f"{spec.num_gpus} × ({profile.gpu.memory_gb:g} GB × {spec.gpu_memory_utilization:g} − "
        f"{spec.activation_gib:g} GiB activations) − weights, in blocks; often 20-30% off: pass the "
        "server's logged pool with --pool-tokens",
    )


def _concurrency_derivation(layout: KVLayout) -> Derivation:
    return Derivation(
        figure="maximum concurrency",
        kind="vLLM formula",
        how="pool blocks ÷ blocks one max-model-len request holds"
        + (
            "; DeepSeek-V4 (vLLM 0.22): ⌈Σ_g pages_g × page_g ÷ full-group page⌉ with sliding groups sized "
            "⌈min(W−1+T, L)/block⌉+1, and the logged tokens = int(concurrency × L)"
            if layout.v4 is not None
            else ""
        ),
    )


def _agents_derivation(layout: KVLayout, model: ModelSpec) -> Derivation:
    agents_how = "pool blocks ÷ blocks one session at the context holds"
    if model.attention is AttentionKind.HYBRID:
        agents_how += "; the naive figure is logged pool tokens ÷ context, which ignores the windows"
    if layout.v4 is not None:
        agents_how += (
            " while decoding: ⌈context/256⌉ full pages + ⌈W/block⌉+1 per sliding group; vLLM's logged figure "
            "instead reserves a whole prefill chunk in every sliding group of every request"
        )
    return Derivation(figure="agents at the context", kind="estimate", how=agents_how + " (inherits the pool)")


# -- llama.cpp slots ----------------------------------------------------------------------------------------------


def _plan_slots(spec: PlanSpec, found: ModelFigures, gpu_name: str) -> Plan:
    """The plan for ``llama-server -np N -c N×slot_context``: N agents fit, each in its own slot."""
    assert spec.slots is not None
    model = found.spec
    n = spec.slots
    per_slot, context = _slot_sizes(spec, model, n)
    profile = resolve(_profile_file(spec, model, per_slot, n), f"{model.name} on {gpu_name}, {n} slots")
    layout = profile.layout
    weights = profile.weights_bytes
    kv_all = profile.num_blocks * layout.stored_page_bytes
    sm = profile.step_model
    prefill = sm.chunked_prefill_time(context, profile.max_num_batched_tokens)
    slots = _slot_figures(spec, profile, n, per_slot, context, prefill)
    weight_dtype = spec.weight_dtype or model.checkpoint_dtype
    return Plan(
        spec=spec,
        model=found,
        memory=MemoryFigures(
            gpu=profile.gpu.name,
            num_gpus=spec.num_gpus,
            gpu_memory_gb=profile.gpu.memory_gb,
            weight_dtype=weight_dtype,
            weights_gb=weights / 1e9,
            weights_gb_per_gpu=weights / 1e9 / spec.num_gpus,
            activation_gib_per_gpu=spec.activation_gib,
            gpu_memory_utilization=1.0,  # llama.cpp allocates what it needs; it has no utilisation target
            kv_pool_gb=kv_all / 1e9,
        ),
        kv=_kv_figures(layout, model),
        pool=PoolFigures(
            num_blocks=profile.num_blocks,
            tokens=n * per_slot,
            source=profile.pool_source,
            max_model_len=per_slot,
            max_concurrency=float(n),
            startup_lines=(slots.startup_line,),
        ),
        # No prefix is shared across slots, and a slot holds one conversation: every count is the slot count.
        agents=AgentFigures(
            context=context,
            blocks_per_session=layout.blocks_per_request(context),
            naive_sessions=float(n),
            window_aware_sessions=float(n),
            shared_prefix_sessions=float(n),
            shared_prefix_tokens=spec.agent.system_tokens,
            recommended_agents=n,
        ),
        step=StepFigures(
            decode_step_s_batch1=sm.decode_step_time(1, context),
            decode_step_s_at_estimate=sm.decode_step_time(n, context),
            prefill_s_at_context=prefill,
        ),
        offload=None,
        serve=_llamacpp_command(spec, profile, model, n, per_slot),
        derivations=_slot_derivations(spec, profile, n, per_slot),
        slots=slots,
    )


def _slot_sizes(spec: PlanSpec, model: ModelSpec, n: int) -> tuple[int, int]:
    """(tokens per slot, context per agent), checked: one GPU, an agent's conversation fits its slot."""
    if spec.num_gpus > 1:
        # The profile's KV arithmetic is vLLM's tensor parallelism (KV heads split or copied per GPU); llama.cpp's
        # default splits layers instead, each layer's KV whole on one GPU. Refused rather than sized wrong.
        raise ConfigError(
            f"--slots plans one GPU: llama.cpp splits a model's layers across {spec.num_gpus} GPUs, which this "
            "planner does not model yet (its KV arithmetic is vLLM's tensor parallelism); use --gpus 1"
        )
    per_slot = spec.slot_context or spec.max_model_len or model.max_position_embeddings
    if per_slot is None:
        raise ConfigError(f"model {model.name} states no max_position_embeddings; pass --slot-context")
    context = spec.context_per_agent or per_slot
    if context > per_slot:
        raise ConfigError(
            f"context per agent {context:,} exceeds the per-slot context {per_slot:,} (llama.cpp gives each of the "
            f"{n} slots -c ÷ -np tokens): one agent's conversation does not fit a slot; raise --slot-context"
        )
    if context <= spec.agent.per_turn_tokens:
        raise ConfigError(
            f"context per agent {context:,} must exceed one turn's tokens ({spec.agent.per_turn_tokens:,}: system "
            "prompt + tool result + reply)"
        )
    if n * per_slot > MAX_POOL_TOKENS:
        raise ConfigError(f"--slots {n} × --slot-context {per_slot:,} is more than {MAX_POOL_TOKENS:,} tokens of -c")
    return per_slot, context


def _slot_figures(
    spec: PlanSpec, profile: ServingProfile, n: int, per_slot: int, context: int, prefill: float
) -> SlotFigures:
    """What the slots hold and how many the memory allows, and what happens past the slot count."""
    weights = profile.weights_bytes
    kv_all = profile.num_blocks * profile.layout.stored_page_bytes
    per_slot_bytes = kv_all / n
    memory = profile.gpu.memory_gb * 1e9 * spec.num_gpus
    free = memory - weights - spec.activation_gib * 2**30 * spec.num_gpus
    allows = max(0, math.floor(free / per_slot_bytes)) if per_slot_bytes > 0 else 0
    past = (
        f"agent {n + 1} and beyond: every slot is busy, so a turn waits for one (llamacpp:requests_deferred; bench's "
        f"knee cause slots_full), then takes whichever slot is idle (pinned with id_slot: its own, once the agent "
        f"sharing it is done), whose cache holds another agent's prompt, and "
        f"re-prefills its whole context (≈ {prefill:.2f} s for {context:,} tokens); more memory does not help"
    )
    return SlotFigures(
        slots=n,
        slot_context=per_slot,
        total_context=n * per_slot,
        kv_bytes_per_slot=per_slot_bytes,
        kv_gb_all_slots=kv_all / 1e9,
        memory_gb=memory / 1e9,
        weights_gb=weights / 1e9,
        slots_memory_allows=allows,
        fits_memory=allows >= n,
        agents_that_fit=n,
        past_slots=past,
        startup_line=slot_startup_line(n, per_slot),
        notes=_shared_prompt_notes(spec),
    )


def _shared_prompt_notes(spec: PlanSpec) -> tuple[str, ...]:
    """A warning when a shared system prompt makes llama-server hand an agent another agent's slot."""
    first_prompt = spec.agent.system_tokens + spec.agent.turn_input_tokens
    share = spec.agent.system_tokens / first_prompt
    if share <= SLOT_PROMPT_SIMILARITY:
        return ()
    return (
        f"the agents share a {spec.agent.system_tokens:,}-token system prompt, {share:.0%} of a first turn's "
        f"prompt, above llama-server's --slot-prompt-similarity {SLOT_PROMPT_SIMILARITY:g}: a turn that finds no "
        "slot of its own takes the idle slot most like it (another agent's) over an empty one (llama.cpp skips "
        "empty slots in that test), so when agents' turns seldom overlap they can end up sharing one slot and "
        "re-prefilling every turn while other slots stay empty, a knee below the slot count; the simulated curve "
        "shows whether it happens here, for clients that let the server choose. A client can pin each agent to "
        "its own slot with llama.cpp's id_slot request field (agentload bench does: agent i → slot i mod N), so "
        "no agent takes another's slot below N and past N a turn waits for its own slot (queueing) and "
        "re-prefills only when the agent sharing that slot ran in between",
    )


def _llamacpp_command(spec: PlanSpec, profile: ServingProfile, model: ModelSpec, n: int, per_slot: int) -> ServeCommand:
    flags = [
        ServeFlag(flag="-np", value=str(n), why="parallel slots: at most this many requests run"),
        ServeFlag(flag="-c", value=str(n * per_slot), why=f"total context, split evenly: {per_slot:,} tokens per slot"),
        ServeFlag(flag="-ngl", value="999", why="every layer on the GPU"),
    ]
    notes: list[str] = []
    if profile.kv_dtype is KVDtype.FP8:
        flags += [
            ServeFlag(flag="-ctk", value="q8_0", why="8-bit K cache (llama.cpp has no fp8 KV)"),
            ServeFlag(flag="-ctv", value="q8_0", why="8-bit V cache (needs flash attention)"),
        ]
        notes.append("q8_0 stores 34 bytes per 32 values: its KV is about 6% larger than the fp8 figures shown")
    flags += [
        ServeFlag(flag="--metrics", value=None, why="llamacpp: counters, including prompt_tokens_cached_total"),
        ServeFlag(flag="--slots", value=None, why="the /slots endpoint agentload probe reads"),
    ]
    if spec.num_gpus > 1:
        notes.append(f"llama.cpp splits layers over the {spec.num_gpus} GPUs by default (--split-mode layer)")
    return ServeCommand(program="llama-server", model=f"-m {model.name}.gguf", flags=tuple(flags), notes=tuple(notes))


def _slot_derivations(spec: PlanSpec, profile: ServingProfile, n: int, per_slot: int) -> tuple[Derivation, ...]:
    return (
        Derivation(figure="KV bytes per token", kind="exact", how="2 × layers × kv_heads × head_dim × dtype bytes"),
        Derivation(
            figure="weights memory",
            kind="estimate",
            how=f"parameters × {profile.weight_bytes_per_param:g} bytes (a GGUF's quantisation mixes types)",
        ),
        Derivation(
            figure="KV of the slots",
            kind="stated",
            how=f"--slots {n} × --slot-context {per_slot:,}: llama.cpp allocates -c = {n * per_slot:,} tokens of KV "
            "at start, in use or not",
        ),
        Derivation(
            figure="agents that fit",
            kind="exact",
            how=f"one running request per slot: {n}, whatever the memory (a slot holds one conversation's cache)",
        ),
        Derivation(
            figure="step times",
            kind="estimate",
            how="datasheet bandwidth and FLOP/s at 45% MFU, plus fixed per-step and per-request costs",
        ),
        Derivation(
            figure="throughput curve",
            kind="simulated",
            how="the simulator's slot mode in virtual time: N slots each caching its own last prompt, closed-loop "
            f"agents holding the context, {spec.agent.output_tokens}-token replies, {spec.agent.think_s:g} s think "
            "time",
        ),
    )
