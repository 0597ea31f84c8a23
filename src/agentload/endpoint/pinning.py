"""Pinning each agent to one llama.cpp slot (``id_slot``), so past the slot count a turn queues for its slot.

llama-server picks an idle slot for a request by prompt similarity (> 10 % of the prompt cached there) before an
empty one. Agents share their system prompt, so on its own it puts a new conversation into another agent's idle
slot, and agents evict each other below the slot count. A body's ``id_slot`` names the slot instead
(``get_available_slot``: that slot or nothing; while it is busy the task is deferred, ``llamacpp:requests_deferred``,
until it frees; an id past the last slot wraps around). bench sends agent i's turns to slot i mod N: up to N agents
each keep a slot to themselves, and past N two agents share one — a turn waits for its slot (queueing) and
re-prefills what the other agent left there.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class SlotPins:
    """Agent → slot, in the order agents first send (agent i → slot i mod ``slots``), for one level."""

    def __init__(self, slots: int) -> None:
        self.slots = max(1, slots)
        self._agents: dict[str, int] = {}

    def slot_for(self, agent: str) -> int:
        # A workload names an agent's sessions and jobs "agent/…": they are one agent's conversation, one slot.
        key = agent.split("/", 1)[0]
        index = self._agents.setdefault(key, len(self._agents))
        return index % self.slots

    def pin(self, body: Mapping[str, Any], agent: str) -> Mapping[str, Any]:
        """``body`` sent to the agent's slot."""
        return {**body, "id_slot": self.slot_for(agent)}
