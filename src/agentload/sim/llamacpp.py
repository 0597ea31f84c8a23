"""The simulator's llama.cpp face: what ``llama-server --metrics --slots -np N`` says about itself, for slot profiles.

A profile with ``slots = N`` is served the way llama-server serves (sim/slots.py); this module makes its HTTP
front say so the way llama-server does, so a llama.cpp client (``agentload probe``, a dashboard, a router that
reads ``/slots``) sees the same shapes: ``/props`` (``total_slots``, ``default_generation_settings.n_ctx`` per slot,
``model_path``, ``build_info``), ``/slots`` (per slot ``id``, ``n_ctx``, ``is_processing`` and the current or last
task's token counts), ``/v1/models`` with ``owned_by: llamacpp`` and ``meta.n_ctx``, ``/health`` as
``{"status": "ok"}``, and ``/metrics`` with the ``llamacpp:`` names, types and meanings of the real server.

The shapes were copied from a real llama-server (llama.cpp vendored in llama-cpp-python 0.3.36, ``build_info``
b1-0c1e570, ``tests/data/llamacpp/``) and its source (tools/server/server-task.cpp ``to_metrics``,
server-context.cpp ``server_slot::to_json``). What the counters mean there, and here:

* ``prompt_tokens_total``: prompt tokens *processed*, excluding those reused from the slot's cache (llama.cpp
  adds each decode batch's prompt tokens); here every prefill token the engine computed;
* ``prompt_tokens_cached_total``: prompt tokens reused from the slot (added when a task starts); here the slot hits;
* ``tokens_predicted_total`` and both ``*_seconds_total``: added when a task ends (its slot is reset), not per
  token — as llama.cpp does, so a scrape mid-request does not see that request's tokens yet;
* ``n_decode_total``, ``n_busy_slots_per_decode``: engine steps and the mean number of busy slots per step;
* ``n_tokens_max``: the longest sequence (prompt + generation) seen, typed ``counter`` with no ``_total`` (sic);
* ``requests_processing`` / ``requests_deferred``: running requests / requests waiting for a slot;
* ``prompt_tokens_seconds`` / ``predicted_tokens_seconds``: tokens/s over the tasks that ended since the previous
  scrape (llama.cpp's "bucket", reset by every /metrics call);
* the speculative-decoding counters are 0: the simulator does not draft.

The text is written by hand, like llama.cpp's: prometheus_client would append ``_total`` to ``n_tokens_max``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from agentload.capacity.profile import ServingProfile
from agentload.sim.engine import Engine, SimRequest, StepResult

# What llama-server answers on /health when ready, and (503) while it loads the model (server-http.cpp).
HEALTH_OK: dict[str, Any] = {"status": "ok"}
HEALTH_LOADING: dict[str, Any] = {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4"

# llama-server's default sampling parameters as /props and /slots list them (the recorded server's values; the
# simulator's replies do not depend on them).
DEFAULT_PARAMS: dict[str, Any] = {
    "seed": 4294967295,
    "temperature": 0.800000011920929,
    "dynatemp_range": 0.0,
    "dynatemp_exponent": 1.0,
    "top_k": 40,
    "top_p": 0.949999988079071,
    "min_p": 0.05000000074505806,
    "top_n_sigma": -1.0,
    "xtc_probability": 0.0,
    "xtc_threshold": 0.10000000149011612,
    "typical_p": 1.0,
    "repeat_last_n": 64,
    "repeat_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "dry_multiplier": 0.0,
    "dry_base": 1.75,
    "dry_allowed_length": 2,
    "dry_penalty_last_n": 64,
    "mirostat": 0,
    "mirostat_tau": 5.0,
    "mirostat_eta": 0.10000000149011612,
    "adaptive_target": -1.0,
    "adaptive_decay": 0.8999999761581421,
    "max_tokens": -1,
    "n_predict": -1,
    "n_keep": 0,
    "n_discard": 0,
    "ignore_eos": False,
    "stream": False,
    "n_probs": 0,
    "min_keep": 0,
    "chat_format": "Content-only",
    "reasoning_format": "none",
    "reasoning_in_content": False,
    "generation_prompt": "",
    "samplers": ["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"],
    "speculative.types": "none",
    "timings_per_token": False,
    "post_sampling_probs": False,
    "backend_sampling": False,
    "lora": [],
}
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
    "'\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


# llama-server's HELP text per metric (server-task.cpp), in its order: counters, then gauges.
HELP = {
    "prompt_tokens_total": "Number of prompt tokens processed, excluding cached tokens",
    "prompt_tokens_cached_total": "Number of prompt tokens reused from the cache",
    "prompt_seconds_total": "Total time spent processing prompts",
    "tokens_predicted_total": "Number of generation tokens processed",
    "tokens_predicted_seconds_total": "Total time spent generating tokens",
    "n_decode_total": "Total number of llama_decode() calls, excluding speculative decoding and multimodal decoding",
    "n_tokens_max": "Largest observed sequence length (prompt + generation)",
    "spec_decode_num_draft_tokens_total": "Speculative: Total draft tokens generated",
    "spec_decode_num_accepted_tokens_total": "Speculative: Total draft tokens accepted by the target model",
    "spec_decode_num_drafts_total": "Speculative: Total speculative decoding verification steps",
    "prompt_tokens_seconds": "Average prompt throughput in tokens/s",
    "predicted_tokens_seconds": "Average generation throughput in tokens/s",
    "requests_processing": "Number of requests processing",
    "requests_deferred": "Number of requests deferred",
    "n_busy_slots_per_decode": "Average number of busy slots per llama_decode() call",
}


@dataclass(frozen=True, slots=True)
class Asked:
    """What a request asked for, as /slots echoes it in ``params``."""

    n_predict: int  # -1: no limit given
    stream: bool
    ignore_eos: bool


def task_id(req: SimRequest) -> int:
    """llama.cpp's task id: the simulator numbers its requests ``req-N``."""
    tail = req.request_id.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def props(profile: ServingProfile, model_name: str, build_info: str) -> dict[str, Any]:
    """``GET /props`` (the fields of the recorded server, in its order; the chat template is ChatML)."""
    assert profile.slots is not None
    return {
        "default_generation_settings": {"params": DEFAULT_PARAMS, "n_ctx": profile.max_model_len},
        "total_slots": profile.slots,
        "model_alias": model_name,
        "model_ftype": profile.kv_dtype.value,
        "model_path": profile.served_model_name,
        "modalities": {"vision": False, "video": False, "audio": False},
        "endpoint_slots": True,
        "endpoint_props": False,
        "endpoint_metrics": True,
        "ui": False,
        "ui_settings": {},
        "chat_template": CHAT_TEMPLATE,
        "chat_template_caps": {
            "supports_object_arguments": False,
            "supports_parallel_tool_calls": False,
            "supports_preserve_reasoning": False,
            "supports_reasoning_effort": False,
            "supports_string_content": True,
            "supports_system_role": True,
            "supports_tool_calls": False,
            "supports_tools": False,
            "supports_typed_content": False,
        },
        "bos_token": "<s>",
        "eos_token": "<|im_end|>",
        "build_info": build_info,
        "is_sleeping": False,
        "cors_proxy_enabled": False,
    }


def models(profile: ServingProfile, model_name: str, created: int) -> dict[str, Any]:
    """``GET /v1/models``: llama-server lists its one model with ``owned_by: llamacpp`` and the per-slot n_ctx."""
    m = profile.model
    card = {
        "id": model_name,
        "aliases": [model_name],
        "tags": [],
        "object": "model",
        "created": created,
        "owned_by": "llamacpp",
        "meta": {
            "n_ctx": profile.max_model_len,
            "n_ctx_train": m.max_position_embeddings or profile.max_model_len,
            "n_embd": m.hidden_size,
            "n_params": int(m.total_params),
        },
    }
    # llama-server lists the model twice: Ollama's shape under "models", OpenAI's under "data".
    listed = {"name": model_name, "model": model_name, "modified_at": "", "size": "", "digest": "", "type": "model",
              "description": "", "tags": [""], "capabilities": ["completion"], "parameters": "",
              "details": {"parent_model": "", "format": "gguf", "family": "", "families": [""], "parameter_size": "",
                          "quantization_level": ""}}  # fmt: skip
    return {"models": [listed], "object": "list", "data": [card]}


def slots(engine: Engine, profile: ServingProfile, asked: dict[str, Asked]) -> list[dict[str, Any]]:
    """``GET /slots``: every slot, and for one that has served a task, that task's token counts.

    As llama.cpp's ``server_slot::to_json``: ``n_prompt_tokens`` is what the slot holds now (prompt and the tokens
    generated so far), ``n_prompt_tokens_cache`` what the task found cached, ``n_prompt_tokens_processed`` what it
    computed; a slot that finished has its counters reset (processed 0, decoded 0, ``n_remain`` -1).
    """
    assert engine.slots is not None
    engine.sync()
    out: list[dict[str, Any]] = []
    for view in engine.slots.view():
        entry: dict[str, Any] = {
            "id": view.index,
            "n_ctx": profile.max_model_len,
            "speculative": False,
            "is_processing": view.busy,
        }
        req = view.task
        if isinstance(req, SimRequest):
            ask = asked.get(req.request_id)
            params = dict(DEFAULT_PARAMS)
            if ask is not None:
                params.update(n_predict=ask.n_predict, max_tokens=ask.n_predict, stream=ask.stream,
                              ignore_eos=ask.ignore_eos)  # fmt: skip
            live = view.busy and req.finished_at is None
            cached = req.cached_tokens if req.cached_tokens is not None else view.cached
            n_predict = ask.n_predict if ask is not None else -1
            entry.update(
                id_task=task_id(req),
                n_prompt_tokens=req.num_computed if live else view.held_tokens,
                n_prompt_tokens_processed=max(0, min(req.num_computed, req.prompt_len) - cached) if live else 0,
                # What the task found cached (the engine recomputes at least the last prompt token); 0 once reset.
                n_prompt_tokens_cache=cached if live else 0,
                params=params,
                next_token=[
                    {
                        "has_next_token": live,
                        "has_new_line": False,
                        "n_remain": (n_predict - req.num_output if n_predict >= 0 else -1) if live else -1,
                        "n_decoded": req.num_output if live else 0,
                    }
                ],
            )
        out.append(entry)
    return out


def id_slot(value: object) -> int:
    """A body's ``id_slot`` as llama.cpp reads it (``json_value(data, "id_slot", -1)``, nlohmann's ``get<int>``).

    A number is taken (a fraction truncated toward zero, a bool as 0 / 1); a missing, null or non-number value is
    -1, any slot (llama.cpp logs "Wrong type supplied" and uses the default). What the id then means (wrap past
    the last slot, a busy slot defers the task) is ``sim.slots``'s.
    """
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return int(value)
    return -1


def slot_of(engine: Engine, req: SimRequest) -> int:
    """The slot serving (or last serving) ``req``, -1 when none has."""
    if engine.slots is not None:
        for view in engine.slots.view():
            if view.task is req:
                return view.index
    return -1


class LlamaCppMetrics:
    """llama-server's ``/metrics`` for a slot-profile engine (see the module docstring for what each means)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.tokens_predicted = 0
        self.prompt_seconds = 0.0
        self.predicted_seconds = 0.0
        self.n_decode = 0
        self.n_busy_slots = 0
        self.n_tokens_max = 0
        # The bucket since the last scrape: (prompt tokens, seconds), (predicted tokens, seconds).
        self._bucket = [0, 0.0, 0, 0.0]

    def on_step(self, result: StepResult) -> None:
        n = result.batch.num_requests
        if n:
            self.n_decode += 1
            self.n_busy_slots += n

    def on_finished(self, req: SimRequest) -> None:
        """A task ended (finished or aborted): llama.cpp flushes its generation figures when its slot resets."""
        self.n_tokens_max = max(self.n_tokens_max, req.total_tokens)
        if req.first_token is None:
            return
        prompt_s = req.first_token - (req.first_scheduled if req.first_scheduled is not None else req.arrival)
        end = req.finished_at if req.finished_at is not None else req.first_token
        gen_s = max(0.0, end - req.first_token)
        self.tokens_predicted += req.num_output
        self.prompt_seconds += prompt_s
        self.predicted_seconds += gen_s
        b = self._bucket
        b[0] += max(0, req.prompt_len - (req.cached_tokens or 0))
        b[1] += prompt_s
        b[2] += req.num_output
        b[3] += gen_s

    def _families(self) -> list[tuple[str, str, float]]:
        e, s = self.engine, self.engine.stats
        b, self._bucket = self._bucket, [0, 0.0, 0, 0.0]
        return [
            ("prompt_tokens_total", "counter", s.prefill_tokens_computed),
            ("prompt_tokens_cached_total", "counter", s.prefix_hits),
            ("prompt_seconds_total", "counter", self.prompt_seconds),
            ("tokens_predicted_total", "counter", self.tokens_predicted),
            ("tokens_predicted_seconds_total", "counter", self.predicted_seconds),
            ("n_decode_total", "counter", self.n_decode),
            ("n_tokens_max", "counter", self.n_tokens_max),
            ("spec_decode_num_draft_tokens_total", "counter", 0),
            ("spec_decode_num_accepted_tokens_total", "counter", 0),
            ("spec_decode_num_drafts_total", "counter", 0),
            ("prompt_tokens_seconds", "gauge", b[0] / b[1] if b[1] > 0 else 0.0),
            ("predicted_tokens_seconds", "gauge", b[2] / b[3] if b[3] > 0 else 0.0),
            ("requests_processing", "gauge", e.num_running),
            ("requests_deferred", "gauge", e.num_waiting),
            ("n_busy_slots_per_decode", "gauge", self.n_busy_slots / max(self.n_decode, 1)),
        ]

    def exposition(self) -> bytes:
        lines: list[str] = []
        for name, kind, value in self._families():
            doc = HELP[name]
            shown = str(value) if isinstance(value, int) else f"{value:.6g}"
            lines += [f"# HELP llamacpp:{name} {doc}", f"# TYPE llamacpp:{name} {kind}", f"llamacpp:{name} {shown}"]
        return ("\n".join(lines) + "\n").encode()
