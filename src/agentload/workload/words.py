"""The vocabulary workloads write from: common English words, one token each on the simulator.

Text is drawn from it by ``sizing.words``, which every workload and the server-side sizing measurement use, so the
text that is measured is the text that is sent. The llama.cpp tier builds its test model's tokenizer from this
file's word list (``scripts/llamacpp-tier/build_model.py``), so the list stays here, apart from the code.
"""

from __future__ import annotations

import zlib

import numpy as np

# Common English words, each a single token with its leading space on the usual BPE vocabularies (Llama, Qwen,
# GPT) and exactly one token on the simulator. With ~256 of them, 16 random words repeat with odds ~256^-16,
# so two random texts never share a KV block by chance.
_WORD_LIST = """
    the of and to in is was for on that with as by at from his it an be this are or which had have not but
    were one their all they been has more also when who first two new its time would other only after into
    over most some there can may such than many these then any so made used between three while during well
    both each years under part where back same through work year state city later system world high known
    life family school based small group number area government early found game people since four form
    around began several music until long second film name member large season because against home line
    public played series general including water team became local end government another last without
    within main often show record death left house war set right five days along just power still point
    top court began among local major order great being best like around law however way make early few
    take field six type end seven eight nine ten data file test code build patch plan step task tool call
    read write list check run fix error value result output input model agent server request token cache
    block prefix context session turn reply prompt queue batch step memory speed load level count rate time
    stage phase table index field column row page note text word line path name key map set graph node edge
    tree root leaf branch merge split sort search match parse format print open close start stop wait send
    green blue red black white light dark heavy fast slow
"""
WORDS: tuple[str, ...] = tuple(dict.fromkeys(_WORD_LIST.split()))  # the list repeats a few; each counts once
VOCAB = np.asarray(WORDS, dtype=object)


def stable_int(text: str) -> int:
    """A process-independent integer for seeding from a string (``hash`` of a str is salted per process)."""
    return zlib.crc32(text.encode("utf-8"))
