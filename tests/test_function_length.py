"""No function in the package is longer than ``MAX_LINES``, but the few hot paths that stay whole for speed.

A function's length is its ``def`` through its last line (``end_lineno - lineno + 1`` of the node, decorators not
counted), nested functions and methods each counted on their own. A long function is split where its steps are,
into functions named for them; the allow-list holds only what is kept long on purpose, and an entry that no longer
needs it fails too, so the list only shrinks.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "agentload"
MAX_LINES = 80

# (module under src/agentload, qualified name): kept long on purpose.
ALLOWED = {
    # The simulator's scheduler step, run once per simulated engine step: one frame, its locals hot.
    ("sim/engine.py", "Engine.step"),
    # The KV pool's two per-request loops (``sim/poolkernel.c`` holds their many-block twins, which must agree).
    ("sim/kvcache.py", "KVCacheManager.allocate"),
    ("sim/kvcache.py", "KVCacheManager.lookup"),
}


def long_functions(root: Path, limit: int = MAX_LINES) -> dict[tuple[str, str], int]:
    """Every function under ``root`` longer than ``limit`` lines: (module, qualified name) → its lines."""
    found: dict[tuple[str, str], int] = {}

    def visit(node: ast.AST, module: str, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    lines = (child.end_lineno or child.lineno) - child.lineno + 1
                    if lines > limit:
                        found[(module, name)] = lines
                visit(child, module, name + ".")
            else:
                visit(child, module, prefix)

    for path in sorted(root.rglob("*.py")):
        visit(ast.parse(path.read_text(encoding="utf-8"), str(path)), path.relative_to(root).as_posix(), "")
    return found


def test_no_function_is_longer_than_the_limit() -> None:
    found = long_functions(PACKAGE)
    over = {key: lines for key, lines in found.items() if key not in ALLOWED}
    assert not over, "split these into functions named for their steps (≤ 80 lines each): " + ", ".join(
        f"{module} {name} ({lines} lines)" for (module, name), lines in sorted(over.items())
    )


def test_every_allowed_function_is_still_long() -> None:
    found = long_functions(PACKAGE)
    stale = sorted(key for key in ALLOWED if key not in found)
    assert not stale, f"no longer over {MAX_LINES} lines (or gone): take them off ALLOWED: {stale}"


def _function(name: str, lines: int, *, decorators: int = 0, indent: str = "") -> str:
    """Source of a function exactly ``lines`` long from its ``def``, decorators not counted."""
    body = ["    x = 0"] + ["    x += 1"] * (lines - 3) + ["    return x"]
    source = ["@staticmethod"] * decorators + [f"def {name}() -> int:", *body]
    return textwrap.indent("\n".join(source), indent) + "\n"


@pytest.mark.parametrize(("lines", "flagged"), [(MAX_LINES, False), (MAX_LINES + 1, True)])
def test_a_planted_long_function_is_found(tmp_path: Path, lines: int, flagged: bool) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text(_function("planted", lines), encoding="utf-8")
    assert long_functions(tmp_path) == ({("pkg/mod.py", "planted"): lines} if flagged else {})


def test_methods_and_nested_functions_count_on_their_own_without_decorators(tmp_path: Path) -> None:
    method = _function("long_method", MAX_LINES + 5, indent="    ")
    decorated = _function("decorated", MAX_LINES, decorators=3, indent="    ")
    nested = "def outer() -> None:\n" + _function("inner", MAX_LINES + 2, indent="    ") + "    inner()\n"
    (tmp_path / "mod.py").write_text("class Box:\n" + method + decorated + "\n" + nested, encoding="utf-8")
    found = long_functions(tmp_path)
    # ``outer`` holds ``inner`` and so is longer still: both are named, each by its own length.
    assert found == {
        ("mod.py", "Box.long_method"): MAX_LINES + 5,
        ("mod.py", "outer.inner"): MAX_LINES + 2,
        ("mod.py", "outer"): MAX_LINES + 4,
    }
