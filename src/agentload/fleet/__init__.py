"""Fleets of agents: a FLEET.toml (``config``), run at the width the server can carry (``limiter``), each agent's
turns checkpointed as they finish (``checkpoint``) so a killed run resumes with no turn lost or repeated
(``runner``), compiled into a result file at the end (``results``), with live progress (``progress``).
"""
