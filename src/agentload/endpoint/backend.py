"""Adapters from the chat client to the agent loop's ``ChatBackend`` (one attempt; retries live in retry.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentload.endpoint.client import ChatClient
from agentload.endpoint.records import RequestIds, RequestRecord


class SingleAttemptBackend:
    """Each turn is one request, whatever happens to it."""

    def __init__(self, client: ChatClient) -> None:
        self.client = client

    async def complete(self, body: Mapping[str, Any], ids: RequestIds) -> list[RequestRecord]:
        return [await self.client.chat(body, ids=ids)]
