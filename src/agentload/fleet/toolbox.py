"""The built-in tools a fleet file can name, and one fresh registry per agent.

Workspace tools (``read_file``, ``write_file``, ``list_files``) come from ``agent.tools`` and are confined to the
agent's own directory. Mock tools stand in for the network and compute a real agent calls: ``search`` returns
``tool_result_tokens`` words of deterministic text (so the context grows every turn by a known amount — the
load shape of docs/background.md §1), ``calculator`` evaluates arithmetic, ``echo`` returns its text. Nothing is shared
between agents: each gets its own registry, closures and directory.
"""

from __future__ import annotations

import ast
import operator
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentload.agent.tools import Tool, ToolRegistry, workspace_tools

_WORKSPACE = ("read_file", "write_file", "list_files")
BUILTIN_TOOLS = frozenset({*_WORKSPACE, "search", "calculator", "echo"})

_RESULT_TEXT = (
    "found documented behaviour in the handler that retries the request after a timeout and logs the error "
    "while the cache keeps the previous value so the caller sees stale data until the next refresh completes "
    "which explains the failing test reported in the issue tracker last week by the release team"
)
_RESULT_WORDS = _RESULT_TEXT.split()


@dataclass(frozen=True)
class ToolSettings:
    """What one agent's tools need to know: who it is, where its files live, how big and slow results are."""

    agent_id: str
    workspace: Path
    result_tokens: int
    latency_s: float
    calls_before: int = 0  # search calls already committed (resume), so results continue the same sequence


def _search(settings: ToolSettings) -> Callable[[Mapping[str, Any]], str]:
    calls = [settings.calls_before]

    def search(args: Mapping[str, Any]) -> str:
        query = str(args.get("query", ""))
        calls[0] += 1
        rng = random.Random(f"{settings.agent_id}|{query}|{calls[0]}")
        words = rng.choices(_RESULT_WORDS, k=settings.result_tokens)
        return f"Result {calls[0]} for {query!r}: " + " ".join(words)

    return search


_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}


def _evaluate(node: ast.AST) -> float:
    """Arithmetic only — numbers, + − × ÷ // % ** and unary minus; never eval()."""
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        return float(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 64:
            raise ValueError("exponent too large")
        return float(_BINARY[type(node.op)](left, right))
    raise ValueError("only numbers and + - * / // % ** are allowed")


# Longer than any arithmetic an agent asks for; parsing a megabyte of "1+1+…" would stall the agent's event loop.
MAX_EXPRESSION_CHARS = 1_000


def calculator(args: Mapping[str, Any]) -> str:
    expression = str(args.get("expression", ""))
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression longer than {MAX_EXPRESSION_CHARS:,} characters")
    value = _evaluate(ast.parse(expression, mode="eval"))
    return f"{value:g}"


def echo(args: Mapping[str, Any]) -> str:
    return str(args.get("text", ""))


def _string_param(name: str) -> dict[str, Any]:
    return {"type": "object", "properties": {name: {"type": "string"}}, "required": [name]}


def build_registry(names: tuple[str, ...] | list[str], settings: ToolSettings) -> ToolRegistry:
    """A registry holding exactly ``names`` (checked against BUILTIN_TOOLS when the fleet was loaded)."""
    tools: dict[str, Tool] = {}
    if any(n in _WORKSPACE for n in names):
        for t in workspace_tools(settings.workspace, settings.latency_s):
            tools[t.name] = t
    lat = settings.latency_s
    tools["search"] = Tool("search", "Search the project's documents.", _string_param("query"), _search(settings), lat)
    tools["calculator"] = Tool(
        "calculator", "Evaluate an arithmetic expression.", _string_param("expression"), calculator, lat
    )
    tools["echo"] = Tool("echo", "Return the text unchanged.", _string_param("text"), echo, lat)
    return ToolRegistry.of(tools[n] for n in names)
