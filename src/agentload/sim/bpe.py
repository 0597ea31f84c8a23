"""The simulator's default tokenizer: a calibrated model of a byte-level BPE tokenizer's counts, with no vocabulary.

A real server counts JSON, code and numbers at three or four characters a token or less, not a token a word: a
tool result of 235,000 characters that a word count puts at 33,000 tokens is 60,000 or more on a 49k-152k token BPE
vocabulary, past a 40,960-token context. This module cuts text the way GPT-2-style pre-tokenizers do (Qwen2's,
SmolLM2's) and gives each pre-token the number of tokens such a vocabulary makes of it, on average:

* a run of letters is one token when it is short or a common word, else by its length and case (a capitalised
  or upper-case word splits sooner than a lower-case one), camelCase hump by hump;
* each digit is a token (Qwen2 and SmolLM2 split digits one by one), and the space before a digit is one more;
* a run of punctuation costs by its length (``":"``, ``},`` are one token; ``"}],"`` three), a run of white space
  (a line break and the next line's indentation) one token;
* a chat template's special tokens (``<|im_start|>``, ``<|im_end|>``, ``<|pad|>``, ``<tool_call>``) one each,
  with the white space after them; a header's role is part of its token (``<|im_start|>user\\n``) and a message's
  end marker part of the message's last token (``done<|im_end|>\\n``): ChatML costs what the simulator's template
  always has, one token a header (``workload.sizing.SIMULATOR_SIZING`` counts on it), where a real vocabulary
  spends about three a header and two an end marker.

The costs were fitted to SmolLM2's tokenizer (49,152 tokens; the same pre-tokenizer as Qwen2's) over English prose,
Python code and JSON; tests/data/tokens_reference.json holds texts of each kind with that tokenizer's counts.

A pre-token takes the single space after it (GPT-2 puts it before the next word: the same count), so a word and
its space, ``"word "``, is one token, as the simulator generates filler. A pre-token of ``k`` tokens is cut into
``k`` runs of its characters, each one token whose id is the CRC-32 of its text folded into the vocabulary: a
text's tokens are its token texts' ids in order, any split of a text at a special token or at white space followed
by one gives the same tokens piece by piece, and generated text re-tokenises to the ids it was generated as.
Where a count is fractional on average (a long word is one token or two), the word's own hash decides, so a word
costs the same wherever it appears.
"""

from __future__ import annotations

import math
import re
import zlib
from functools import lru_cache
from itertools import chain, pairwise

VOCAB_SIZE = 151_936  # Qwen2's vocabulary size; any fixed size works


def token_id(text: str) -> int:
    """The id of the token whose text is ``text``."""
    return zlib.crc32(text.encode("utf-8")) % VOCAB_SIZE


# Special tokens: a chat template's <|...|> markers and Qwen's tool-call tags, one token each on those vocabularies.
_SPECIAL = r"<\|[^\s|<>]{1,64}\|>|</?tool_(?:call|response)>"
# The single space a pre-token takes: before a letter, a punctuation mark or the end of the text (GPT-2 joins a
# space to the word or punctuation after it, never to a digit: a space before a digit is a token of its own).
_SPACE = r" (?=[^\s\d]|\Z)"
# A message's end marker and the white space after it, folded into the message's last token where it follows that
# token's text directly; else the single space a pre-token takes.
_END = rf"(?:<\|im_end\|>\s*|{_SPACE})?"
_PRE_RE = re.compile(
    rf"(?:{_SPECIAL})(?:[a-z]+(?=\s))?\s*"  # with a header's role and the white space after it
    rf"|'(?:s|t|re|ve|m|ll|d){_END}"  # English contractions, as GPT-2's pattern takes them first
    rf"|[^\W\d_]+{_END}"  # letters
    rf"|\d{_END}"  # one digit
    rf"|(?:[^\s\w<]|_|<(?!{_SPECIAL}))+{_END}"  # punctuation (anything else but white space)
    r"|\s+"
)
_SPECIAL_RE = re.compile(_SPECIAL)
_HUMPS_RE = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|[^\W\d_]+")

# Lower-case words of seven letters or more that BPE vocabularies hold whole (shorter words almost always are):
# frequent in English prose and code, and every long word of agentload's filler and workload vocabularies.
_COMMON_WORDS = """
    ability absolute accepted access accessed according account actions activate actually adapter addition
    additional address advance against agreement algorithm allocated allowed already although another
    anything appropriate arbitrary argument arguments arrange associated attempt attribute attributes authors
    automatically available average because becomes before behavior behaviour believe benefit between binary
    boolean boundary browser buffers builder building builtin calculate called callback cannot capacity
    careful catalog certain changed changes channel character characters charge checked checking claims
    client clients closing collect collection command commands comment comments commercial common compare
    compatibility compile compiled complete completed component components compute computer concurrent
    condition conditions config configuration connect connection considered console constant constants
    construct consumer contain contained container containing contains content contents context continue
    contract contribution control convert conversion copies copyright correct corresponding counter country
    created creating current cursor customer damages default defaults defined define defines definition
    delete deleted delimiter dependency deprecated derived describe described description designed details
    determine developer development dictionary different directly directory disable disabled display
    distribute distributed distribution document documentation documents domain download during dynamic
    effective element elements enabled encode encoded encoding endpoint entries environment equivalent
    especially evaluate example examples exception exceptions execute executed execution existing expected
    explicit express expression extension external factory failing failure feature features filename
    filter filters finally following foreign format formatted forward function functions general generate
    generated generator getattr global government granted handle handler header headers history however
    identifier ignore implement implementation implemented implied import important include included
    includes including increase independent indicate individual information initial initialize inline
    install instance instances instead integer interface internal interpret interpreted interval invalid
    iterator itself keyword keywords language library license licensed licenses limitation limited listen
    literal loader locale location logging lookup machine manager manner maximum measure message messages
    metadata method methods minimum missing modified modify module modules multiple namespace necessary
    network nothing notice number numbers object objects obtain offset operation operations operator option
    optional options ordinary original otherwise output outside overflow package packages parameter
    parameters parent parser particular passed pattern patterns perform permission permitted person pointer
    policy position possible practice prefix present previous primary print private problem process
    processing produce product program programs project property protocol provide provided provides
    providing public purpose python question quoted raised random reason receive received record recursive
    reference register registry regular related release remove removed replace report represent request
    requests require required requires reserved resolve resource response result results return returned
    returns running runtime section security select separate sequence server service session setting
    settings several should signal similar simple single socket software source special specific specified
    standard started statement states static status stream string strings structure subject subprocess
    success support supported system target template terminal terms thread through timeout together
    traceback transfer transform tuple typically unicode unless update useful username validate variable
    variables verified version warning warranty whether window within without worker wrapper writer
    writing written
"""
_COMMON = frozenset(_COMMON_WORDS.split())

# Tokens a longer lower-case word not in _COMMON makes, by its length (the last entry and a slope for longer ones),
# fitted on SmolLM2: an English word with an English ending (an inflection of a word the vocabulary holds, mostly)
# splits less than a word without one (an identifier run together, ``isinstance``), as in prose against code.
_SUFFIXED = (1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.2, 1.2, 1.2, 1.3, 1.3, 1.6)
_UNSUFFIXED = (1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.55, 1.55, 1.6, 1.8, 1.9, 2.4)
_SUFFIX_RE = re.compile(r"(?:ing|ed|ions?|ly|e?s|ers?|ments?|ness|able|ity|ive|al|ous|ty|ure|[ae]nce|[ae]nt)$")
_CAPITALISED = (1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.2, 2.1, 2.1, 2.1, 2.1, 2.1, 2.1, 2.3, 2.5)
_UPPER = (1.0, 1.0, 1.0, 1.0, 1.7, 2.25, 2.7)
# Tokens a run of punctuation makes, by its length: the common pairs and triples (``":``, ``","``) are one token.
_PUNCT = (1.0, 1.0, 1.0, 1.1, 1.95, 2.45)
_INDENT = 64  # a run of white space is one token up to this long (indentation, blank lines), then a token more
_SALT = 0xB9E5_A17C  # of the hash that rounds a fractional count, apart from the id's own hash
_CACHE_SIZE = 1 << 18  # pre-tokens whose ids are remembered (a cap on memory; text repeats a few thousand of them)


def _by_length(table: tuple[float, ...], n: int, slope: float) -> float:
    if n < len(table):
        return table[n]
    return table[-1] + slope * (n - len(table) + 1)


def _dither(expected: float, key: str) -> int:
    """``expected`` rounded up or down by the key's hash, so that many keys average ``expected``."""
    whole = math.floor(expected)
    frac = expected - whole
    if frac <= 0.0:
        return whole
    return whole + (zlib.crc32(key.encode("utf-8"), _SALT) < frac * 2**32)


def _word_cost(word: str) -> int:
    if word.isascii():
        n = len(word)
        if n <= 2:
            return 1
        if word.islower():
            if n <= 6 or word in _COMMON:
                return 1  # short words are whole in any BPE vocabulary; a frequent word must not split by chance
            if _SUFFIX_RE.search(word):
                return _dither(_by_length(_SUFFIXED, n, 0.2), word)
            return _dither(_by_length(_UNSUFFIXED, n, 0.3), word)
        if word.istitle():
            if n <= 5 or word.lower() in _COMMON:
                return 1
            return _dither(_by_length(_CAPITALISED, n, 0.2), word)
        if word.isupper():
            return _dither(_by_length(_UPPER, n, 0.45), word)
        humps = _HUMPS_RE.findall(word)  # camelCase and the like: each hump as a word of its own
        if len(humps) > 1:
            return sum(_word_cost(h) for h in humps)
        return _dither(_by_length(_UNSUFFIXED, n, 0.3), word)
    # Letters outside ASCII: an English-centred byte-level vocabulary holds few of them whole (a CJK character is
    # one to three tokens, an accented word two or three).
    return max(1, _dither(0.55 * len(word.encode("utf-8")), word))


def cost(pre: str) -> int:
    """How many tokens the pre-token ``pre`` (one match of the pre-tokenizer, with its space) makes."""
    end = pre.find("<|im_end|>", 1)
    if end > 0:
        pre = pre[:end]
    core = pre[:-1] if len(pre) > 1 and pre[-1] == " " else pre
    first = core[0]
    if first.isspace():
        return 1 + len(core) // _INDENT
    if first.isdigit() or (first == "'" and len(core) <= 3 and core[1:].isalpha()):
        return 1
    if first.isalpha():
        return _word_cost(core)
    if first == "<" and _SPECIAL_RE.match(core):
        return 1  # a special token, with a header's role and the white space after it
    return _dither(_by_length(_PUNCT, len(core), 0.55), core)


@lru_cache(maxsize=65_536)
def _cut(pre: str) -> tuple[str, ...]:
    """The token texts of a pre-token: ``cost(pre)`` runs of its characters, as even as they can be."""
    k = min(cost(pre), len(pre))
    if k <= 1:
        return (pre,)
    bounds = [round(i * len(pre) / k) for i in range(k + 1)]
    return tuple(pre[a:b] for a, b in pairwise(bounds))


class _Ids(dict[str, tuple[int, ...]]):
    """Pre-token → its token ids, filled on first sight."""

    def __missing__(self, pre: str) -> tuple[int, ...]:
        ids = tuple(token_id(t) for t in _cut(pre))
        if len(self) >= _CACHE_SIZE:
            self.clear()
        self[pre] = ids
        return ids


class BpeTokenizer:
    """The default tokenizer of the simulator (see the module docstring); stateless but for its cache."""

    plain = False  # a template's end marker is a token of its own (sim.chat.TemplatePads)

    def __init__(self) -> None:
        self._ids = _Ids()

    def tokenize(self, text: str) -> list[int]:
        return list(chain.from_iterable(map(self._ids.__getitem__, _PRE_RE.findall(text))))

    def count(self, text: str) -> int:
        return sum(map(len, map(self._ids.__getitem__, _PRE_RE.findall(text))))

    def tokenize_pieces(self, text: str) -> list[tuple[int, str]]:
        """Each token's id and text."""
        return [(token_id(t), t) for t in split(text)]


def split(text: str) -> list[str]:
    """The texts of ``text``'s tokens, in order; they join back into ``text``."""
    return [t for pre in _PRE_RE.findall(text) for t in _cut(pre)]
