"""The behaviour suite: deterministic tests of what agents do with tools, scored by rules.

``cases`` defines the tests (the seed suite's six categories, docs/background.md §2: T1–T17 and the H1 multi-hop relay),
``scoring`` the rule helpers, ``runner`` runs N agents through the suite against any ``ChatBackend``, ``results`` holds
the immutable, re-scorable results, and ``oracle`` plays every test in the simulator (correct and known-bad).
"""

from agentload.suite.model import SUITE_VERSION

__all__ = ["SUITE_VERSION"]
