"""Write the llama.cpp tier's model: a small random-weight llama-architecture GGUF with its own SPM vocabulary.

    python build_model.py OUT.gguf

Nothing is downloaded. The vocabulary is built here from agentload's word list (``agentload.workload.words``
is read as text, so this script needs only the ``gguf`` package and numpy): every word is one ``▁word`` token, so
an agentload prompt of N words is N tokens, as on the simulator and the vLLM tier's tiny model. llama.cpp's SPM
tokenizer reaches a word by merging adjacent pieces that are in the vocabulary, highest score first, so every
prefix ``▁w``, ``▁wo``, ... is in it too (scored below the whole word). Single characters and the 256 byte tokens
make any other text encodable (llama.cpp falls back to ``<0xNN>`` for a character it has no piece for).

The weights are random but shaped so the model only ever writes words: embedding dimension 0 is a large constant
that dominates the residual stream (the layers' weights are small), so after the final RMS norm it is ~+sqrt(d)
for every position, and the output rows of the control, byte and single-character tokens carry a large negative
weight there. A reply is then a stream of words that never stops early (like the vLLM tier's tiny model), and
never invalid UTF-8.

Deterministic: the same seed gives the same file.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import gguf
import numpy as np

WORDS_PY = Path(__file__).resolve().parents[2] / "src" / "agentload" / "workload" / "words.py"

# Shape: ~3.4M parameters in the layers. Big enough that a turn's prefill costs real time on two cores (a
# re-prefilled 2k-token context is what a slot lost to another agent costs), small enough to load in a second.
N_EMBD = 256
N_LAYER = 4
N_HEAD = 4
N_FF = 768
CONTEXT_LENGTH = 32768  # what the model allows; the server's -c sets what it actually holds
SEED = 17

CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>'"
    " + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def agentload_words() -> list[str]:
    text = WORDS_PY.read_text()
    match = re.search(r'_WORD_LIST = """(.*?)"""', text, re.S)
    if match is None:
        raise SystemExit(f"no _WORD_LIST in {WORDS_PY}")
    return list(dict.fromkeys(match.group(1).split()))


def vocabulary() -> tuple[list[str], list[float], list[int], set[int]]:
    """Tokens, scores, types, and the ids a reply may use (the whole words)."""
    tokens: list[str] = []
    scores: list[float] = []
    types: list[int] = []
    seen: set[str] = set()

    def add(piece: str, score: float, kind: gguf.TokenType) -> int:
        if piece in seen:
            return tokens.index(piece)
        seen.add(piece)
        tokens.append(piece)
        scores.append(score)
        types.append(int(kind))
        return len(tokens) - 1

    add("<unk>", 0.0, gguf.TokenType.UNKNOWN)
    add("<s>", 0.0, gguf.TokenType.CONTROL)
    add("</s>", 0.0, gguf.TokenType.CONTROL)
    add("<|im_start|>", 0.0, gguf.TokenType.CONTROL)
    add("<|im_end|>", 0.0, gguf.TokenType.CONTROL)
    for byte in range(256):
        add(f"<0x{byte:02X}>", 0.0, gguf.TokenType.BYTE)
    for code in range(32, 127):
        char = chr(code)
        if char != " ":
            add(char, -1000.0, gguf.TokenType.NORMAL)
            add("▁" + char, -900.0, gguf.TokenType.NORMAL)
    add("▁", -1000.0, gguf.TokenType.NORMAL)
    replies: set[int] = set()
    for word in agentload_words():
        piece = "▁" + word
        # Longer pieces score higher, so the merge ends at the whole word; prefixes exist only to get there.
        for end in range(3, len(piece)):
            add(piece[:end], -100.0 + end, gguf.TokenType.NORMAL)
        replies.add(add(piece, 0.0, gguf.TokenType.NORMAL))
    return tokens, scores, types, replies


def build(out: Path) -> None:
    tokens, scores, types, replies = vocabulary()
    n_vocab = len(tokens)
    rng = np.random.default_rng(SEED)

    def rand(*shape: int, scale: float = 0.02) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    writer = gguf.GGUFWriter(str(out), "llama")
    writer.add_name("agentload-llamacpp-tiny")
    writer.add_context_length(CONTEXT_LENGTH)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_LAYER)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD)
    writer.add_rope_dimension_count(N_EMBD // N_HEAD)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)

    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(4)  # <|im_end|>: the chat template's end of turn
    writer.add_add_bos_token(False)
    writer.add_add_space_prefix(True)
    writer.add_chat_template(CHAT_TEMPLATE)

    embd = rand(n_vocab, N_EMBD, scale=0.5)
    embd[:, 0] = 20.0  # the constant direction (see the module docstring)
    writer.add_tensor("token_embd.weight", embd)
    for layer in range(N_LAYER):
        prefix = f"blk.{layer}"
        writer.add_tensor(f"{prefix}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(f"{prefix}.{name}.weight", rand(N_EMBD, N_EMBD))
        writer.add_tensor(f"{prefix}.ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        writer.add_tensor(f"{prefix}.ffn_gate.weight", rand(N_FF, N_EMBD))
        writer.add_tensor(f"{prefix}.ffn_up.weight", rand(N_FF, N_EMBD))
        writer.add_tensor(f"{prefix}.ffn_down.weight", rand(N_EMBD, N_FF))
    writer.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    output = rand(n_vocab, N_EMBD, scale=0.5)
    output[:, 0] = 0.0
    banned = np.array([i for i in range(n_vocab) if i not in replies])
    output[banned, 0] = -10.0  # ~ -160 in logit against O(1) for words: never sampled
    writer.add_tensor("output.weight", output)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"{out}: {n_vocab} tokens ({len(replies)} words), {N_LAYER} layers × {N_EMBD}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: build_model.py OUT.gguf")
    build(Path(sys.argv[1]))
