"""Files a finished agent hands to the agents that depend on it.

Each agent's workspace is private (``agent.workspace``), so a dependent wave could only read its dependencies'
final answers. Real pipelines hand over artefacts — a plan, a list of defects, a build — so before a dependent
agent starts, the regular files its dependencies wrote are copied into its own workspace under
``from/<agent id>/``: it reads them with its own ``read_file``, under its own sandbox, and nothing it does can
change what the dependency left. A dependency's own ``from/`` folder is not passed on (no transitive growth).

Copying is idempotent (the same files give the same copies), so a resumed agent sees what it saw the first time.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from agentload.agent.workspace import Workspace, WorkspaceError

HANDOFF_DIR = "from"
# Bounds on what one dependency hands over: agents' files are notes and reports, not datasets.
MAX_FILES_PER_DEPENDENCY = 50
MAX_HANDOFF_BYTES = 4 << 20


def hand_over(workspaces: Path, agent_id: str, dependencies: Iterable[str]) -> list[str]:
    """Copy each dependency's files into ``agent_id``'s workspace; the copied paths (relative to it), sorted."""
    target = Workspace(workspaces / agent_id)
    copied: list[str] = []
    budget = MAX_HANDOFF_BYTES
    for dep in dependencies:
        root = workspaces / dep
        if not root.is_dir():
            continue  # it wrote nothing
        source = Workspace(root)
        own = [p for p in source.list_files(".") if not p.startswith(HANDOFF_DIR + "/")]
        for path in own[:MAX_FILES_PER_DEPENDENCY]:
            try:
                text = source.read_text(path)
            except (WorkspaceError, UnicodeDecodeError):
                continue  # not the dependency's own regular text file: not handed over
            size = len(text.encode("utf-8"))
            if size > budget:
                break
            budget -= size
            dest = f"{HANDOFF_DIR}/{dep}/{path}"
            try:
                target.write_text(dest, text)
            except WorkspaceError:
                continue  # something in the dependent's own workspace is in the way (a link): left out
            copied.append(dest)
    return sorted(copied)
