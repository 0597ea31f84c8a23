"""Accelerators as the step-time model sees them: memory, bandwidth and dense peak FLOP/s."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class GpuSpec(BaseModel):
    """One accelerator (or a CPU standing in for one). Figures are per device."""

    # Finite and bounded: a [gpu] table in a profile is user input. The bounds are ~100x today's parts.
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    name: str
    memory_gb: float = Field(
        gt=0, le=100_000, description="device memory for weights + KV, GB (1e9 bytes), as datasheets state it"
    )
    bandwidth_gbps: float = Field(gt=0, le=1e6, description="memory bandwidth, GB/s (1e9 bytes/s)")
    tflops_bf16: float = Field(gt=0, le=1e6, description="dense bf16 peak, TFLOP/s")
    tflops_fp8: float | None = Field(default=None, gt=0, le=1e6, description="dense fp8 peak, TFLOP/s")
    host_memory_gb: float = Field(
        default=0.0, ge=0, le=1e6, description="host memory reachable for a KV offload tier, GB"
    )
    host_link_gbps: float = Field(default=50.0, gt=0, le=1e6, description="device<->host copy bandwidth, GB/s")
    notes: str = ""
