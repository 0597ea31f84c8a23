"""A serving profile: one model on some hardware with one engine configuration — what the simulator runs.

Profiles are TOML files (the built-ins live in ``agentload/data/profiles``; ``agentload calibrate`` writes new
ones). A profile names a catalogue model or embeds a ``[model]`` table, names a catalogue GPU (or embeds a
``[gpu]`` table), and states the KV pool either directly (``[kv_pool] tokens``, as vLLM logs it) or as the
memory to derive it from (``gpu_memory_utilization``). Step-time coefficients are derived from the GPU × model
pair; any of them can be pinned in ``[step]`` (calibration pins all of them).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agentload.capacity import catalog
from agentload.capacity.hardware import GpuSpec
from agentload.capacity.kv import DEFAULT_BLOCK_SIZE, KVDtype, KVLayout, kv_layout, parse_kv_dtype
from agentload.capacity.models import WEIGHT_BYTES, ModelSpec
from agentload.capacity.steptime import StepCoefficients, StepTimeModel
from agentload.errors import ConfigError, UnknownNameError
from agentload.inputs import read_text

__all__ = [
    "WEIGHT_BYTES",
    "KVPoolSpec",
    "OffloadSpec",
    "ProfileFile",
    "ServingProfile",
    "StepSpec",
    "TokenizerSpec",
    "builtin_profiles",
    "load_profile",
    "parse_profile",
    "resolve",
    "weights_bytes",
]


# Upper bounds on a profile's numbers (user input), each far past real deployments and low enough that the simulator
# can allocate what they ask for: a pool of 1e17 blocks asked numpy for 355 PiB. The simulator keeps ~40 bytes
# per pool block; the largest pool in the source articles is 11M tokens (≈ 700k blocks of 16).
MAX_POOL_BLOCKS = 4_000_000
MAX_POOL_TOKENS = 2**31 - 1
MAX_MODEL_LEN = 2**24  # 16.7M tokens (the longest context windows published are 10M)
MAX_BLOCK_SIZE = 1024
MAX_GPUS = 1024
MAX_BATCHED_TOKENS = 2**24
MAX_NUM_SEQS = 1_000_000
MAX_OFFLOAD_GIB = 2.0**20  # 1 PiB of host memory
MAX_GIB = 2.0**20
MAX_GBPS = 1e6
MAX_STEP_S = 60.0  # a fixed per-step or per-request cost of a minute


class KVPoolSpec(BaseModel):
    # NaN passes no bound and inf passes a lower one: a profile's numbers must be finite.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    tokens: int | None = Field(
        default=None, gt=0, le=MAX_POOL_TOKENS, description="pool as vLLM logs it ('KV cache size: N tokens')"
    )
    num_blocks: int | None = Field(
        default=None, gt=0, le=MAX_POOL_BLOCKS, description="pool in blocks (as cache_config_info states)"
    )
    available_gib: float | None = Field(
        default=None,
        gt=0,
        le=MAX_GIB,
        description="vLLM's 'Available KV cache memory: X GiB' (per GPU, logged rounded to 0.01 GiB)",
    )
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    activation_gib: float = Field(
        default=2.0, ge=0, le=MAX_GIB, description="activation peak + runtime overhead per GPU"
    )

    @model_validator(mode="after")
    def _one_pool(self) -> KVPoolSpec:
        stated = [n for n in ("tokens", "num_blocks", "available_gib") if getattr(self, n) is not None]
        if len(stated) > 1:
            raise ValueError(f"state the pool one way, not {' and '.join(stated)}")
        return self


class OffloadSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    gib: float = Field(default=0.0, ge=0, le=MAX_OFFLOAD_GIB, description="CPU tier size (vLLM --kv-offloading-size)")
    load_gbps: float | None = Field(
        default=None, gt=0, le=MAX_GBPS, description="host->device load bandwidth; GPU's if unset"
    )


class StepSpec(BaseModel):
    """Knobs for deriving coefficients, and optional pinned coefficients."""

    model_config = ConfigDict(extra="forbid")

    # Finite per field rather than for the model: ``pinned`` is validated on its own.
    mfu: float = Field(default=0.45, gt=0, le=1, allow_inf_nan=False)
    bandwidth_efficiency: float = Field(default=1.0, gt=0, le=1, allow_inf_nan=False)
    step_s: float = Field(default=1e-4, ge=0, le=MAX_STEP_S, allow_inf_nan=False)
    request_s: float = Field(default=4e-6, ge=0, le=MAX_STEP_S, allow_inf_nan=False)
    layer_s: float = Field(default=0.0, ge=0, le=MAX_STEP_S, allow_inf_nan=False)
    api_overhead_s: float = Field(default=0.015, ge=0, le=MAX_STEP_S, allow_inf_nan=False)
    pinned: dict[str, float] = Field(default_factory=dict, description="coefficients fitted by calibration")


MAX_WORD_PIECES = 16  # a word of plain English split into more tokens than this is not text
MAX_TEMPLATE_TOKENS = 4096  # a chat template that adds more than this around two messages is not a template


def mean_word_tokens(word_pieces: Sequence[float]) -> float:
    """Tokens a word on average, from the shares of words made 1, 2, 3… tokens (normalised here)."""
    total = sum(word_pieces)
    return sum((k + 1) * share for k, share in enumerate(word_pieces)) / total


class TokenizerSpec(BaseModel):
    """How the server's tokenizer splits agentload's words, as ``agentload calibrate`` measured it."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    word_pieces: list[float] = Field(
        default_factory=lambda: [1.0],
        min_length=1,
        max_length=MAX_WORD_PIECES,
        description="shares of words made 1, 2, 3… tokens (the simulator's own tokenizer: [1.0], one per word)",
    )
    word_tokens: dict[str, int] = Field(
        default_factory=dict,
        description="tokens the server makes of each of agentload's words, counted by /tokenize (other words: "
        "word_pieces)",
    )
    template_opening: int | None = Field(
        default=None,
        ge=0,
        le=MAX_TEMPLATE_TOKENS,
        description="tokens the server's chat template adds to an opening (a system and a user message and the "
        "generation prompt) beyond its words, counted by /tokenize; none: the simulator's own ChatML",
    )
    template_exchange: int | None = Field(
        default=None,
        ge=0,
        le=MAX_TEMPLATE_TOKENS,
        description="tokens the template adds for one more exchange (an assistant and a user message) beyond its words",
    )
    source: str = ""

    @model_validator(mode="after")
    def _shares(self) -> TokenizerSpec:
        if any(w < 0 for w in self.word_pieces) or sum(self.word_pieces) <= 0:
            raise ValueError("word_pieces are shares: none negative, and not all zero")
        if (self.template_opening is None) != (self.template_exchange is None):
            raise ValueError("template_opening and template_exchange are measured together: give both or neither")
        bad = sorted(w for w, n in self.word_tokens.items() if not 1 <= n <= MAX_WORD_PIECES)
        if bad:
            raise ValueError(f"word_tokens counts from 1 to {MAX_WORD_PIECES} tokens a word; not {', '.join(bad[:5])}")
        return self


class ProfileFile(BaseModel):
    """The TOML schema of a profile."""

    model_config = ConfigDict(extra="forbid")

    name: str
    description: str = ""
    model: str | dict[str, Any]
    served_model_name: str | None = None
    gpu: str | dict[str, Any]
    num_gpus: int = Field(default=1, gt=0, le=MAX_GPUS)
    weight_dtype: str = "bf16"
    kv_cache_dtype: str = "auto"
    block_size: int = Field(default=DEFAULT_BLOCK_SIZE, gt=0, le=MAX_BLOCK_SIZE)
    max_model_len: int = Field(gt=0, le=MAX_MODEL_LEN)
    max_num_batched_tokens: int = Field(default=8192, gt=0, le=MAX_BATCHED_TOKENS)
    max_num_seqs: int = Field(default=1024, gt=0, le=MAX_NUM_SEQS)
    enable_prefix_caching: bool = True
    slots: int | None = Field(
        default=None,
        gt=0,
        le=MAX_NUM_SEQS,
        description="slot-based serving (llama.cpp -np N): N slots of max_model_len tokens each, each caching only "
        "its own last prompt (sim/slots.py); the pool is slots × max_model_len and at most N requests run",
    )
    kv_pool: KVPoolSpec = Field(default_factory=KVPoolSpec)
    offload: OffloadSpec = Field(default_factory=OffloadSpec)
    step: StepSpec = Field(default_factory=StepSpec)
    tokenizer: TokenizerSpec = Field(default_factory=TokenizerSpec)

    @model_validator(mode="after")
    def _check(self) -> ProfileFile:
        if self.weight_dtype not in WEIGHT_BYTES:
            raise ValueError(f"weight_dtype must be one of {', '.join(WEIGHT_BYTES)}")
        parse_kv_dtype(self.kv_cache_dtype)
        return self


@dataclass(frozen=True)
class ServingProfile:
    """A resolved profile: everything the engine and the planner need, with the pool in blocks."""

    name: str
    description: str
    model: ModelSpec
    served_model_name: str
    gpu: GpuSpec
    num_gpus: int
    weight_bytes_per_param: float
    layout: KVLayout
    num_blocks: int
    max_model_len: int
    max_num_batched_tokens: int
    max_num_seqs: int
    enable_prefix_caching: bool
    offload_blocks: int
    offload_load_bytes_per_s: float
    coefficients: StepCoefficients
    gpu_memory_utilization: float
    pool_source: str  # how the pool was obtained, for honest reporting
    slots: int | None = None  # slot-based serving (llama.cpp): this many slots, each its own prompt cache
    word_pieces: tuple[float, ...] = (1.0,)  # shares of words the tokenizer makes 1, 2, 3… tokens (sim.tokens)
    word_tokens: tuple[tuple[str, int], ...] = ()  # tokens of each of agentload's words, as the server counted
    # The server's chat template beyond the words: (an opening's, one more exchange's) tokens; None: the simulator's.
    chat_template: tuple[int, int] | None = None

    @property
    def block_size(self) -> int:
        return self.layout.block_size

    @property
    def kv_dtype(self) -> KVDtype:
        return self.layout.dtype

    @cached_property
    def step_model(self) -> StepTimeModel:
        return StepTimeModel(self.coefficients, self.model)

    @property
    def weights_bytes(self) -> float:
        """All weights, summed over the GPUs (tensor parallelism splits them evenly)."""
        return weights_bytes(self.model, self.weight_bytes_per_param)

    @property
    def pool_tokens(self) -> int:
        """The pool as vLLM logs it."""
        return self.layout.logged_pool_tokens(self.num_blocks)

    @property
    def max_concurrency(self) -> float:
        return self.layout.max_concurrency(self.num_blocks, self.max_model_len)

    def offload_load_s(self, logical_blocks: int) -> float:
        """Seconds to load ``logical_blocks`` from the CPU tier (each is one block of every full-attention group).

        The engine charges the same per block when a prefix hit comes from the offload tier.
        """
        return logical_blocks * self.layout.page_bytes * self.layout.full_groups / self.offload_load_bytes_per_s

    def startup_lines(self, device: str = "GPU") -> list[str]:
        """The server's capacity lines as it logs them: vLLM's two, or llama-server's slot line for a slot profile."""
        if self.slots is not None:
            return [slot_startup_line(self.slots, self.max_model_len)]
        return [
            f"{device} KV cache size: {self.pool_tokens:,} tokens",
            f"Maximum concurrency for {self.max_model_len:,} tokens per request: {self.max_concurrency:.2f}x",
        ]


def slot_startup_line(slots: int, per_slot: int) -> str:
    """What llama-server logs when it sizes its slots (``-np`` slots of ``-c ÷ -np`` tokens each)."""
    return f"load_model: initializing, n_slots = {slots}, n_ctx_slot = {per_slot}, kv_unified = 'false'"


def weights_bytes(model: ModelSpec, weight_bytes_per_param: float) -> float:
    return model.total_params * weight_bytes_per_param


def resolve(spec: ProfileFile, source: str) -> ServingProfile:
    """Turn a parsed profile into numbers: look up names, size the pool, derive the step coefficients."""
    model = _resolve_model(spec, source)
    gpu = _resolve_gpu(spec, source)
    wbytes = WEIGHT_BYTES[spec.weight_dtype]
    layout = kv_layout(
        model,
        parse_kv_dtype(spec.kv_cache_dtype),
        spec.block_size,
        spec.num_gpus,
        max_model_len=spec.max_model_len,
        max_num_batched_tokens=spec.max_num_batched_tokens,
    )
    num_blocks, pool_source = _pool_blocks(spec, model, gpu, layout, source)
    _check_pool(spec, layout, num_blocks, pool_source, source)
    coefficients = _step_coefficients(spec, model, gpu, layout, source)
    load_gbps = spec.offload.load_gbps or gpu.host_link_gbps
    return ServingProfile(
        name=spec.name,
        description=spec.description,
        model=model,
        served_model_name=spec.served_model_name or model.name,
        gpu=gpu,
        num_gpus=spec.num_gpus,
        weight_bytes_per_param=wbytes,
        layout=layout,
        num_blocks=num_blocks,
        max_model_len=spec.max_model_len,
        max_num_batched_tokens=spec.max_num_batched_tokens,
        max_num_seqs=spec.slots or spec.max_num_seqs,
        enable_prefix_caching=spec.enable_prefix_caching,
        # vLLM's --kv-offloading-size is the total over all ranks; each rank loads its share over its own link.
        offload_blocks=int(spec.offload.gib * 2**30 // layout.stored_page_bytes),
        offload_load_bytes_per_s=load_gbps * 1e9 * spec.num_gpus / layout.replication,
        coefficients=coefficients,
        gpu_memory_utilization=spec.kv_pool.gpu_memory_utilization,
        pool_source=pool_source,
        slots=spec.slots,
        word_pieces=tuple(w / sum(spec.tokenizer.word_pieces) for w in spec.tokenizer.word_pieces),
        word_tokens=tuple(sorted(spec.tokenizer.word_tokens.items())),
        chat_template=None
        if spec.tokenizer.template_opening is None or spec.tokenizer.template_exchange is None
        else (spec.tokenizer.template_opening, spec.tokenizer.template_exchange),
    )


def _resolve_model(spec: ProfileFile, source: str) -> ModelSpec:
    """The catalogue's model by name, or the profile's own ``[model]`` table."""
    if isinstance(spec.model, str):
        return catalog.get_model(spec.model)
    return catalog.model_from_mapping(str(spec.model.get("name", spec.name)), _without_name(spec.model), source)


def _resolve_gpu(spec: ProfileFile, source: str) -> GpuSpec:
    """The catalogue's GPU by name, or the profile's own ``[gpu]`` table."""
    if isinstance(spec.gpu, str):
        return catalog.get_gpu(spec.gpu)
    try:
        return GpuSpec(**{"name": spec.name, **spec.gpu})
    except ValidationError as exc:
        raise ConfigError(f"{source} [gpu]: {catalog.validation_message(exc)}") from exc


def _pool_blocks(spec: ProfileFile, model: ModelSpec, gpu: GpuSpec, layout: KVLayout, source: str) -> tuple[int, str]:
    """The pool in blocks and where that figure came from: the slots, the profile's statement, or GPU memory."""
    pool = spec.kv_pool
    if spec.slots is not None:
        # llama.cpp allocates -c tokens of KV up front and splits them evenly over the slots; no memory estimate.
        num_blocks = spec.slots * layout.blocks_per_request(spec.max_model_len)
        return num_blocks, f"{spec.slots} slots × {spec.max_model_len:,} tokens (llama.cpp -np × per-slot context)"
    if pool.num_blocks is not None:
        return pool.num_blocks, "stated in blocks by the profile"
    if pool.tokens is not None:
        return layout.num_blocks_for_logged_tokens(pool.tokens), f"stated by the profile as {pool.tokens:,} tokens"
    if pool.available_gib is not None:
        num_blocks = layout.num_blocks_for_bytes(spec.num_gpus * pool.available_gib * 2**30)
        return num_blocks, (
            f"from {pool.available_gib:g} GiB of available KV memory per GPU (logged to 0.01 GiB: "
            f"±{layout.num_blocks_for_bytes(spec.num_gpus * 0.005 * 2**30):,} blocks)"
        )
    wbytes = WEIGHT_BYTES[spec.weight_dtype]
    free = spec.num_gpus * (
        gpu.memory_gb * 1e9 * pool.gpu_memory_utilization - pool.activation_gib * 2**30
    ) - weights_bytes(model, wbytes)
    if free <= 0:
        raise ConfigError(
            f"{source}: the weights ({weights_bytes(model, wbytes) / 1e9:.1f} GB in {spec.weight_dtype}) do not "
            f"fit in {spec.num_gpus} × {gpu.memory_gb:g} GB at gpu_memory_utilization "
            f"{pool.gpu_memory_utilization} with {pool.activation_gib:g} GiB per GPU for activations; use more "
            "GPUs or a smaller weight dtype"
        )
    return layout.num_blocks_for_bytes(free), "estimated from GPU memory (often 20-30% off; calibrate from the server)"


def _check_pool(spec: ProfileFile, layout: KVLayout, num_blocks: int, pool_source: str, source: str) -> None:
    """Refuse a pool the simulator cannot hold, or one that cannot hold a single request of max_model_len."""
    if num_blocks > MAX_POOL_BLOCKS:
        raise ConfigError(
            f"{source}: a KV pool of {num_blocks:,} blocks ({pool_source}) is more than the {MAX_POOL_BLOCKS:,} "
            "the simulator holds; state a smaller pool or a larger block_size"
        )
    blocks_for_one = layout.blocks_per_request(spec.max_model_len)
    if num_blocks < blocks_for_one:
        raise ConfigError(
            f"{source}: the KV pool ({num_blocks} blocks) cannot hold one request of max_model_len "
            f"{spec.max_model_len} ({blocks_for_one} blocks); lower max_model_len"
        )


def _step_coefficients(
    spec: ProfileFile, model: ModelSpec, gpu: GpuSpec, layout: KVLayout, source: str
) -> StepCoefficients:
    """The step-time coefficients derived from the hardware, then any the profile pins (validated as a whole)."""
    st = spec.step
    coefficients = StepCoefficients.derive(
        model,
        gpu,
        layout,
        num_gpus=spec.num_gpus,
        weight_bytes_per_param=WEIGHT_BYTES[spec.weight_dtype],
        mfu=st.mfu,
        bandwidth_efficiency=st.bandwidth_efficiency,
        step_s=st.step_s,
        request_s=st.request_s,
        layer_s=st.layer_s,
        api_overhead_s=st.api_overhead_s,
    )
    if not st.pinned:
        return coefficients
    unknown = set(st.pinned) - set(StepCoefficients.model_fields)
    if unknown:
        raise ConfigError(f"{source} [step.pinned]: unknown coefficients {', '.join(sorted(unknown))}")
    bad = sorted(k for k, v in st.pinned.items() if not math.isfinite(v))
    if bad:
        raise ConfigError(f"{source} [step.pinned]: {', '.join(bad)} must be finite numbers")
    # model_copy(update=...) skips validation, which let negative step times through: validate the result.
    try:
        return StepCoefficients.model_validate({**coefficients.model_dump(), **st.pinned})
    except ValidationError as exc:
        raise ConfigError(f"{source} [step.pinned]: {catalog.validation_message(exc)}") from exc


def _without_name(fields: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if k != "name"}


def parse_profile(text: str, source: str) -> ServingProfile:
    raw = catalog.read_toml_text(text, source)
    try:
        spec = ProfileFile(**raw)
    except ValidationError as exc:
        raise ConfigError(f"{source}: {catalog.validation_message(exc)}") from exc
    return resolve(spec, source)


def builtin_profiles() -> list[str]:
    folder = resources.files("agentload.data").joinpath("profiles")
    return sorted(p.name.removesuffix(".toml") for p in folder.iterdir() if p.name.endswith(".toml"))


def with_offload(profile: ServingProfile, gib: float) -> ServingProfile:
    """The profile with a CPU offload tier of ``gib`` GiB in place of its own (vLLM ``--kv-offloading-size``;
    0 removes it); blocks load over the same host link."""
    if not 0 <= gib <= MAX_OFFLOAD_GIB:
        raise ConfigError(f"--offload-gib {gib:g}: give 0 to {MAX_OFFLOAD_GIB:,} GiB")
    blocks = int(gib * 2**30 // profile.layout.stored_page_bytes)
    return dataclasses.replace(profile, offload_blocks=blocks)


def load_profile(name_or_path: str) -> ServingProfile:
    """A built-in profile by name, or a TOML file by path."""
    if name_or_path.endswith(".toml") or "/" in name_or_path:
        path = Path(name_or_path)
        text = read_text(path, "profile")
        return parse_profile(text, str(path))
    known = builtin_profiles()
    if name_or_path not in known:
        raise UnknownNameError("profile", name_or_path, known)
    text = resources.files("agentload.data").joinpath("profiles", f"{name_or_path}.toml").read_text("utf-8")
    return parse_profile(text, f"profile {name_or_path}")
