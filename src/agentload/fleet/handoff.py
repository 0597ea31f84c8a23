"""Files a finished agent hands to the agents that depend on it.

Each agent's workspace is private (``agent.workspace``), so a dependent wave could only read its dependencies'
final answers. Real pipelines hand over artefacts — a plan, a list of defects, a build — so before a dependent
agent starts, the regular files its dependencies wrote are copied into its own workspace under
``from/<agent id>/``: it reads them with its own ``read_file``, under its own sandbox, and nothing it does can
change what the dependency left. A dependency's own ``from/`` folder is not passed on (no transitive growth).

Copying is idempotent (the same files give the same copies), so a resumed agent sees what it saw the first time.

A dependency's tree is whatever its model made of it (or whatever an older version let it make): too deep, too
many entries, unreadable in parts. The walk is bounded (``Workspace.scan``), what it cannot take is skipped, and
the rest is still handed over: one bad tree must not stop the dependent agent, the fleet or a resume. What was
skipped is logged and returned as ``HandOver.skipped``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

from agentload.agent.workspace import Workspace

HANDOFF_DIR = "from"
# Bounds on what one dependency hands over: agents' files are notes and reports, not datasets.
MAX_FILES_PER_DEPENDENCY = 50
MAX_HANDOFF_BYTES = 4 << 20
# Paths named in one note: enough to find the tree, not a second copy of a huge listing.
_NAMED = 3

log = logging.getLogger(__name__)


class HandOver(list[str]):
    """The copied paths (relative to the dependent's workspace), sorted — a plain list to callers that only want
    those — and ``skipped``: one line for each part of a dependency's files that was not handed over, and why."""

    def __init__(self, copied: Iterable[str] = (), skipped: Iterable[str] = ()) -> None:
        super().__init__(sorted(copied))
        self.skipped = list(skipped)


def _some(paths: list[str]) -> str:
    named = ", ".join(paths[:_NAMED])
    return named + (f" and {len(paths) - _NAMED} more" if len(paths) > _NAMED else "")


def _handed_to_it(path: str) -> bool:
    """Whether the directory ``path`` is the dependency's own ``from/`` or below it: not passed on, so not missed."""
    return path == HANDOFF_DIR or path.startswith(HANDOFF_DIR + "/")


def hand_over(workspaces: Path, agent_id: str, dependencies: Iterable[str]) -> HandOver:
    """Copy each dependency's files into ``agent_id``'s workspace; the copied paths (relative to it), sorted, and
    notes of what was skipped."""
    target = Workspace(workspaces / agent_id)
    copied: list[str] = []
    skipped: list[str] = []
    budget = MAX_HANDOFF_BYTES
    for dep in dependencies:
        root = workspaces / dep
        if not root.is_dir():
            continue  # it wrote nothing
        try:
            source = Workspace(root)
            scan = source.scan(".")
        except OSError as exc:  # WorkspaceError included: the root itself replaced or unreadable
            skipped.append(f"{dep}: its workspace could not be read ({exc})")
            continue
        too_deep = [p for p in scan.too_deep if not _handed_to_it(p)]
        if too_deep:
            skipped.append(f"{dep}: not followed below the depth limit: {_some(too_deep)}")
        unreadable = [p for p in scan.unreadable if not _handed_to_it(p)]
        if unreadable:
            skipped.append(f"{dep}: unreadable: {_some(unreadable)}")
        if scan.too_many:
            skipped.append(f"{dep}: over {scan.entries} files and directories; the rest were not looked at")
        own = [p for p, _ in scan.files if not p.startswith(HANDOFF_DIR + "/")]
        if len(own) > MAX_FILES_PER_DEPENDENCY:
            skipped.append(f"{dep}: {len(own) - MAX_FILES_PER_DEPENDENCY} files over the {MAX_FILES_PER_DEPENDENCY}")
        for path in own[:MAX_FILES_PER_DEPENDENCY]:
            try:
                text = source.read_text(path)
            except (OSError, UnicodeDecodeError):
                continue  # not the dependency's own regular text file (a link, a FIFO, binary): not handed over
            size = len(text.encode("utf-8"))
            if size > budget:
                skipped.append(f"{dep}: {path} and what follows: over the {MAX_HANDOFF_BYTES}-byte hand-over")
                break
            budget -= size
            dest = f"{HANDOFF_DIR}/{dep}/{path}"
            try:
                target.write_text(dest, text)
            except OSError as exc:  # a link in the way, a bound of the dependent's workspace, a full disk
                skipped.append(f"{dep}: {path}: {exc}")
                continue
            copied.append(dest)
    if skipped:
        log.warning("hand-over to %s skipped: %s", agent_id, "; ".join(skipped))
    return HandOver(copied, skipped)
