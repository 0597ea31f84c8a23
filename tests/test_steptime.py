"""The step-time model against the sanity figures of docs/background.md §6, and the shapes it must have."""

from __future__ import annotations

import pytest

from agentload.capacity.catalog import get_gpu, get_model
from agentload.capacity.kv import KVDtype, kv_layout
from agentload.capacity.steptime import StepCoefficients, StepTimeModel


def _model(model: str, gpu: str, *, dtype: KVDtype = KVDtype.BF16, tp: int = 1, wbytes: float = 2.0) -> StepTimeModel:
    spec = get_model(model)
    layout = kv_layout(spec, dtype, tensor_parallel=tp)
    coefficients = StepCoefficients.derive(spec, get_gpu(gpu), layout, num_gpus=tp, weight_bytes_per_param=wbytes)
    return StepTimeModel(coefficients, spec)


@pytest.fixture
def llama_h100() -> StepTimeModel:
    return _model("llama-3.1-8b", "h100")


def test_llama_8b_decode_batch_1_is_about_4_8_ms(llama_h100: StepTimeModel) -> None:
    assert llama_h100.decode_step_time(1, 1) == pytest.approx(4.8e-3, rel=0.10)


def test_llama_8b_decode_batch_64_at_4k_is_about_15_ms(llama_h100: StepTimeModel) -> None:
    assert llama_h100.decode_step_time(64, 4096) == pytest.approx(15e-3, rel=0.10)


def test_llama_8b_8k_prefill_is_about_0_34_s(llama_h100: StepTimeModel) -> None:
    assert llama_h100.prefill_time(8192) == pytest.approx(0.34, rel=0.10)


def test_chunked_prefill_costs_more_than_one_step_because_later_chunks_read_earlier_ones(
    llama_h100: StepTimeModel,
) -> None:
    # Within one chunk the two agree; past it, each chunk pays the fixed step cost and attends to what came before.
    assert llama_h100.chunked_prefill_time(8192, 8192) == llama_h100.prefill_time(8192)
    assert llama_h100.chunked_prefill_time(32_768, 8192) > llama_h100.prefill_time(32_768)
    assert llama_h100.chunked_prefill_time(32_768, 8192) == pytest.approx(llama_h100.prefill_time(32_768), rel=0.02)


def test_moe_decode_reads_more_experts_as_the_batch_grows() -> None:
    sm = _model("qwen3-235b-a22b", "gb300", dtype=KVDtype.FP8, wbytes=0.5)
    one, eight, many = sm.weight_read_s(1), sm.weight_read_s(8), sm.weight_read_s(4096)
    assert one < eight < many
    # 8 of 128 experts per token: one token touches about a tenth of the routed weights; thousands touch all.
    assert one < 0.15 * sm.c.weights_s
    assert many == pytest.approx(sm.c.weights_s, rel=1e-6)


def test_sparse_read_attention_caps_what_a_decode_step_reads() -> None:
    dense = _model("deepseek-v3", "b200", tp=8, wbytes=1.0)
    sparse = _model("deepseek-v3.2", "b200", tp=8, wbytes=1.0)
    assert sparse.read_span(100_000) == 2048
    assert dense.read_span(100_000) == 100_000
    assert sparse.decode_step_time(64, 100_000) < dense.decode_step_time(64, 100_000)


def test_sliding_layers_read_only_their_window() -> None:
    sm = _model("gpt-oss-120b", "h100")
    # Half the layers read the whole context, half at most 128 tokens.
    assert sm.read_span(10_000) == pytest.approx((10_000 + 128) / 2)


def test_gpus_beyond_the_kv_heads_do_not_speed_up_kv_reads() -> None:
    # Qwen3-235B has 4 KV heads: on 8 GPUs each head is stored twice and both copies are read.
    four = _model("qwen3-235b-a22b", "h200", tp=4, wbytes=1.0)
    eight = _model("qwen3-235b-a22b", "h200", tp=8, wbytes=1.0)
    assert eight.c.kv_s_per_token == pytest.approx(four.c.kv_s_per_token)
    assert eight.c.weights_s == pytest.approx(four.c.weights_s / 2)
