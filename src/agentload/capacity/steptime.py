"""The one step-time model: how long one engine step takes for the batch it runs.

A step's cost is a roofline of two linear parts plus fixed costs (docs/background.md §6):

* compute — prefill is compute-bound: ``prefill_s_per_token`` × new tokens (2 × active params FLOPs each) plus
  ``attention_s_per_pair`` × Σ new × (context read + new / 2) (4 × layers × q heads × head dim FLOPs each),
  at peak × MFU;
* memory — decode is memory-bound: the touched weights are read once per step (MoE: the distinct experts the
  step's tokens route to, E × (1 − (1 − k/E)^tokens)) plus ``kv_s_per_token`` × every scheduled request's KV
  read span;
* fixed — ``step_s`` per step, ``request_s`` per scheduled request, ``layer_s`` × layers.

The coefficients are derived from a GPU × model pair (``StepCoefficients.derive``) or fitted from a real server
by calibration and stored in a profile; the simulator and the planner only ever call ``StepTimeModel``.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from agentload.capacity.hardware import GpuSpec
from agentload.capacity.kv import KVLayout
from agentload.capacity.models import ModelSpec


class StepCoefficients(BaseModel):
    """The fitted or derived constants of the step-time model (seconds)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    prefill_s_per_token: float = Field(ge=0)
    attention_s_per_pair: float = Field(ge=0)
    weights_s: float = Field(ge=0, description="reading every weight once (dense: every step)")
    shared_weight_fraction: float = Field(default=1.0, ge=0, le=1, description="MoE: always-read share")
    num_experts: int = Field(default=0, ge=0)
    experts_per_token: int = Field(default=0, ge=0)
    kv_s_per_token: float = Field(ge=0, description="reading one token of KV across all layers")
    step_s: float = Field(default=1e-4, ge=0)
    request_s: float = Field(default=4e-6, ge=0)
    layer_s: float = Field(default=0.0, ge=0)
    num_layers: int = Field(default=1, gt=0)
    api_overhead_s: float = Field(default=0.015, ge=0, description="per request, before it reaches the engine")

    @classmethod
    def derive(
        cls,
        model: ModelSpec,
        gpu: GpuSpec,
        layout: KVLayout,
        *,
        num_gpus: int = 1,
        weight_bytes_per_param: float = 2.0,
        mfu: float = 0.45,
        bandwidth_efficiency: float = 1.0,
        step_s: float = 1e-4,
        request_s: float = 4e-6,
        layer_s: float = 0.0,
        api_overhead_s: float = 0.015,
    ) -> StepCoefficients:
        """Coefficients from datasheet figures; tensor parallelism is modelled as an ideal split.

        The split is ideal except for KV heads that ``layout`` replicates across ranks: every copy is read.
        """
        use_fp8 = weight_bytes_per_param <= 1.0 and gpu.tflops_fp8 is not None
        peak = (gpu.tflops_fp8 if use_fp8 and gpu.tflops_fp8 else gpu.tflops_bf16) * 1e12
        flops_per_s = peak * mfu * num_gpus
        bytes_per_s = gpu.bandwidth_gbps * 1e9 * bandwidth_efficiency * num_gpus
        shared, _ = model.expert_split()
        return cls(
            prefill_s_per_token=2.0 * model.active_params / flops_per_s,
            attention_s_per_pair=4.0 * model.num_layers * model.num_attention_heads * model.head_dim / flops_per_s,
            weights_s=model.total_params * weight_bytes_per_param / bytes_per_s,
            shared_weight_fraction=shared / model.total_params,
            num_experts=model.num_experts,
            experts_per_token=model.experts_per_token,
            kv_s_per_token=layout.bytes_per_token * layout.replication / bytes_per_s,
            step_s=step_s,
            request_s=request_s,
            layer_s=layer_s,
            num_layers=model.num_layers,
            api_overhead_s=api_overhead_s,
        )


@dataclass(frozen=True, slots=True)
class BatchShape:
    """What one step runs, in the aggregates the cost needs (the engine sums them as it schedules)."""

    num_requests: int
    new_tokens: int
    attention_pairs: float  # Σ new × (read span before + new / 2)
    kv_read_tokens: float  # Σ read span after the step, in all-layer token equivalents


class StepTimeModel:
    """Step time for a batch; ``read_span`` says how much context one layer reads on average."""

    def __init__(self, coefficients: StepCoefficients, model: ModelSpec) -> None:
        self.c = coefficients
        self._layers = model.num_layers
        self._full = model.num_full_layers
        self._sliding = model.num_sliding_layers
        self._window = model.sliding_window or 0
        self._sparse = model.sparse_read_tokens

    def read_span(self, context: int) -> float:
        """Tokens of KV one step reads for a request with ``context`` tokens, averaged over layers."""
        full_read = context if self._sparse is None else min(context, self._sparse)
        if not self._sliding:
            return float(full_read)
        return (self._full * full_read + self._sliding * min(context, self._window)) / self._layers

    def weight_read_s(self, tokens: int) -> float:
        c = self.c
        if c.num_experts == 0 or tokens <= 0:
            return c.weights_s if tokens > 0 else 0.0
        e, k = c.num_experts, c.experts_per_token
        touched = e * (1.0 - (1.0 - k / e) ** tokens)
        routed_fraction = (1.0 - c.shared_weight_fraction) * touched / e
        return c.weights_s * (c.shared_weight_fraction + routed_fraction)

    def step_time(self, batch: BatchShape) -> float:
        if batch.num_requests == 0:
            return 0.0
        c = self.c
        compute = c.prefill_s_per_token * batch.new_tokens + c.attention_s_per_pair * batch.attention_pairs
        memory = self.weight_read_s(batch.new_tokens) + c.kv_s_per_token * batch.kv_read_tokens
        fixed = c.step_s + c.request_s * batch.num_requests + c.layer_s * self._layers
        return max(compute, memory) + fixed

    def decode_step_time(self, batch_size: int, context: int) -> float:
        """One decode step of ``batch_size`` requests that each hold ``context`` tokens."""
        span = self.read_span(context)
        return self.step_time(BatchShape(batch_size, batch_size, batch_size * span, batch_size * span))

    def prefill_time(self, new_tokens: int, cached: int = 0) -> float:
        """An isolated prefill of ``new_tokens`` after ``cached`` tokens, in one step (no chunking)."""
        span = self.read_span(cached)
        pairs = new_tokens * (span + new_tokens / 2.0)
        return self.step_time(BatchShape(1, new_tokens, pairs, self.read_span(cached + new_tokens)))

    def chunked_prefill_time(self, tokens: int, chunk: int) -> float:
        """An isolated prefill of ``tokens`` run the way the scheduler runs it: ``chunk`` tokens per step."""
        done, total = 0, 0.0
        while done < tokens:
            n = min(chunk, tokens - done)
            total += self.prefill_time(n, cached=done)
            done += n
        return total
