"""Asking an engine for exactly the output length a workload wants.

Real models stop early — a small model asked for hundreds of tokens replied with five — and then output tok/s
measures the model's verbosity, not the deployment. Engines that can be told to ignore the end-of-sequence
token (docs/background.md §9) get the request's ``max_tokens`` as a floor too, so the reply is exactly that long:

* vLLM (and agentload's simulator, which mirrors it): ``ignore_eos`` + ``min_tokens`` (``min_tokens`` also holds
  back the model's other stop tokens, which ``ignore_eos`` alone does not);
* SGLang: ``ignore_eos``;
* llama.cpp's server: ``ignore_eos`` + ``n_predict``.

Ollama and unknown OpenAI-compatible servers have no such switch: the reply is the model's, and the level says so.

``EngineFields`` is what a bench level adds to each of its bodies for its engine: these fields, and a slot server's
pins (``endpoint.pinning``); the load's recording backend (``endpoint.backend.RecordingBackend``) applies it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentload.endpoint.pinning import SlotPins
from agentload.endpoint.records import RequestIds

# Engine (as ``endpoint.probe`` names it) → fields for a reply of exactly N tokens.
_EXACT: dict[str, Any] = {
    "vllm": lambda n: {"ignore_eos": True, "min_tokens": n},
    "agentload-sim": lambda n: {"ignore_eos": True, "min_tokens": n},
    "sglang": lambda n: {"ignore_eos": True},
    "llamacpp": lambda n: {"ignore_eos": True, "n_predict": n},
}


def can_force_length(engine: str | None) -> bool:
    return engine in _EXACT


def length_control(engine: str | None) -> str | None:
    """The request fields that make this engine's replies exactly max_tokens long, in words (None: no way)."""
    make = _EXACT.get(engine or "")
    if make is None:
        return None
    return " + ".join(k if v is True else f"{k}=max_tokens" for k, v in make(1).items())


def exact_output(engine: str | None, body: Mapping[str, Any]) -> Mapping[str, Any]:
    """``body`` asking for exactly its output cap, where the engine allows; unchanged otherwise."""
    make = _EXACT.get(engine or "")
    # A null max_completion_tokens (clients send one) leaves max_tokens as the cap, as the servers read it.
    asked = body.get("max_completion_tokens")
    if asked is None:
        asked = body.get("max_tokens")
    if make is None or not isinstance(asked, int) or isinstance(asked, bool) or asked < 1:
        return body
    return {**body, **make(asked)}


class EngineFields:
    """The fields a level adds to every body: exact output lengths for ``engine`` (None: the model decides) and,
    with ``pin_slots`` (a slot server's slot count), each agent's slot (None: the server chooses)."""

    def __init__(self, engine: str | None = None, pin_slots: int | None = None) -> None:
        self.engine = engine
        self.pins = SlotPins(pin_slots) if pin_slots else None  # agent i → slot i mod N (``endpoint.pinning``)

    def add(self, body: Mapping[str, Any], ids: RequestIds) -> Mapping[str, Any]:
        if self.engine is not None:
            body = exact_output(self.engine, body)
        if self.pins is not None:
            body = self.pins.pin(body, ids.agent)
        return body
