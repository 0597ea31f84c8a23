"""The example budget of the property-based fuzzers.

CI runs each fuzzer's small default (derandomised, see conftest.py); ``AGENTLOAD_FUZZ_EXAMPLES=10000 pytest -k fuzz``
is the full run whose figures the closing notes quote.
"""

from __future__ import annotations

import os


def fuzz_examples(default: int = 200) -> int:
    """``AGENTLOAD_FUZZ_EXAMPLES`` if set, else ``default``."""
    return int(os.environ.get("AGENTLOAD_FUZZ_EXAMPLES", default))
