"""Text helpers for scoring what a model said."""

from __future__ import annotations

import re

_THINK = re.compile(r"<think>.*?(?:</think>|$)", re.S)


def strip_think(text: str) -> str:
    """Remove ``<think>…</think>`` reasoning blocks (an unclosed one runs to the end) before scoring."""
    return _THINK.sub("", text).strip()
