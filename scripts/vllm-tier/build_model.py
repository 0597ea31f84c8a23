"""Build the tier's small random-weight chat models fully offline (run with the tier venv's Python).

    build_model.py OUT_DIR [--seed N] [--variant tiny|realistic]

Writes a Qwen2-shaped model of ~40M parameters (a 2-layer toy streams unrealistically fast and has no prefill
cost worth measuring), a byte-level BPE tokenizer trained here on generated text, and a ChatML chat template that
renders tools. Nothing is downloaded: the tokenizer is trained locally and the weights are random.

Two choices make the default variant, ``tiny``, behave like a load generator wants:

* The training text is built from agentload's own word list (``agentload.workload.agentic`` draws its prompts
  from ~256 common English words), each word with its leading space, so each becomes one token: N words of an
  agentic prompt are about N tokens here, as on the simulator, and ``--context`` means what it says.
* A random model would sample an end-of-sequence token now and then (about 1 in the vocabulary size per token)
  and end replies early; agentload does not send ``ignore_eos`` by default, so replies would come out shorter
  than the workload's ``max_tokens``. One hidden dimension is made constant (its embedding column is a constant
  and no layer writes to it), and the output rows of the stop tokens point against it, so their logits sit far
  below every other token's and replies run to ``max_tokens``.
* A random model samples any token, and most of its replies do not come back as the same tokens when an agent
  sends them back: digits run together ("591" + "along" is "591along"), byte pieces decode to "\ufffd". A held
  session then finds its next prompt tens of tokens longer than the reply it carries and has to shorten the
  next reply to stay at its context, so the real server is asked for other reply lengths than the simulator
  (once, the calibrated simulator's output tok/s read 1.3-1.5x the real one's at the same turn rate). Every
  token but the whole words with their leading space (the ids that encode back to themselves) points against
  the constant dimension like the stop tokens, so a reply is a run of words that round-trips token for token.

That model is kind; real ones are not. The ``realistic`` variant, same layers and about the same size,
undoes both choices the way real models do:

* Its tokenizer is trained on text where only ``REALISTIC_SEEN`` of agentload's words (a seeded pick) occur, among
  generated pseudo-words. The words it saw are one token each; the others split into subword pieces, as rarer
  words do on a real tokenizer, so agentload's word count underestimates the server's token count: about 1.5
  tokens a word (``--variant realistic`` prints the figure it measured).
* ``<|im_end|>`` gets the constant dimension with a positive weight, sized from a forward pass of the built model
  so that at temperature 1 (vLLM's default; agentload sends none unless told) a reply ends after
  ``REALISTIC_MEAN_REPLY`` tokens on average, as the issue saw small real models stop after ~5 tokens where
  hundreds were asked. ``ignore_eos`` with ``min_tokens`` still yields exactly ``max_tokens``. Greedy decoding
  (temperature 0) stops at once here: the stop token is the single most likely one at every step.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported lazily below: --help should not wait for torch
    from transformers import PreTrainedTokenizerBase, Qwen2ForCausalLM

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"]
VOCAB_SIZE = 8192
VARIANTS = ("tiny", "realistic")
# The share of agentload's words the realistic tokenizer is trained on. Tokens per word on 2,000 random words,
# one seeded pick each: 0.5 gave 1.76, 0.6 gave 1.60, 0.7 gave 1.41 and 1.46 (two picks), 0.8 gave 1.26; the aim
# is 1.4-1.6 (real tokenizers: ~1.3 per English word, more on rarer words).
REALISTIC_SEEN = 0.7
REALISTIC_PSEUDO_WORDS = 3000
# Tokens per reply (the stop token included) when nothing stops it early: a geometric length with this mean.
REALISTIC_MEAN_REPLY = 7.0

# The same words agentload's agentic workload writes prompts from (kept in step by the tokenizer test in
# tests/integration, which counts tokens per word on the real server), plus code-ish and JSON-ish text so tool
# calls and schemas tokenize sensibly.
_WORD_TEXT = """
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
WORDS = _WORD_TEXT.split()

CHAT_TEMPLATE = (
    "{% if tools %}"
    "<|im_start|>system\n"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n\n{% endif %}"
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    "{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
    "{% elif messages[0]['role'] == 'system' %}"
    "<|im_start|>system\n{{ messages[0]['content'] }}<|im_end|>\n"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' and loop.first %}"
    "{% elif message['role'] == 'assistant' %}"
    "<|im_start|>assistant\n{{ message['content'] or '' }}"
    "{% for call in message.get('tool_calls') or [] %}"
    "{% set fn = call['function'] if call['function'] is defined else call %}"
    '\n<tool_call>\n{"name": "{{ fn["name"] }}", "arguments": '
    "{{ fn['arguments'] if fn['arguments'] is string else fn['arguments'] | tojson }}}\n</tool_call>"
    "{% endfor %}<|im_end|>\n"
    "{% elif message['role'] == 'tool' %}"
    "<|im_start|>user\n<tool_response>\n{{ message['content'] }}\n</tool_response><|im_end|>\n"
    "{% else %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def corpus(rng: random.Random, words: list[str], lines: int = 20000) -> list[str]:
    """Generated training text: word salad from ``words``, numbers, code and JSON fragments."""
    out: list[str] = []
    idents = ["def", "class", "return", "import", "self", "None", "True", "False", "args", "kwargs", "path"]
    for i in range(lines):
        kind = i % 4
        if kind == 0:
            out.append(" ".join(rng.choice(words) for _ in range(rng.randint(8, 40))))
        elif kind == 1:
            args = {rng.choice(words): rng.choice([rng.randint(0, 9999), rng.choice(words)]) for _ in range(3)}
            out.append(json.dumps({"name": rng.choice(words) + "_" + rng.choice(words), "arguments": args}))
        elif kind == 2:
            out.append(
                f"    {rng.choice(idents)} {rng.choice(words)}_{rng.choice(words)}({rng.choice(words)}="
                f"{rng.randint(0, 999)}): # {' '.join(rng.choice(words) for _ in range(5))}"
            )
        else:
            out.append(" ".join(str(rng.randint(0, 10 ** rng.randint(1, 6))) for _ in range(6)) + ".")
    return out


def pseudo_words(rng: random.Random, n: int) -> list[str]:
    """English-looking non-words (consonant-vowel syllables): text for the subword pieces unseen words split into."""
    consonants = [*"bcdfghjklmnprstvwyz", "ch", "sh", "th", "st", "tr", "pl", "br"]
    vowels = [*"aeiou", "ai", "ea", "ou", "ee", "oo"]
    out = []
    for _ in range(n):
        word = "".join(rng.choice(consonants) + rng.choice(vowels) for _ in range(rng.randint(1, 3)))
        out.append(word + (rng.choice(consonants) if rng.random() < 0.5 else ""))
    return out


def training_words(variant: str, seed: int) -> list[str]:
    """The words the tokenizer's training text is drawn from (see the module docstring)."""
    if variant == "tiny":
        return WORDS
    rng = random.Random(f"realistic-words-{seed}")
    unique = list(dict.fromkeys(WORDS))
    rng.shuffle(unique)
    return unique[: round(len(unique) * REALISTIC_SEEN)] + pseudo_words(rng, REALISTIC_PSEUDO_WORDS)


def tokens_per_word(out: Path, seed: int, n: int = 2000) -> float:
    """Tokens per agentload word on the saved tokenizer: n random words joined by single spaces."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(out)
    rng = random.Random(seed)
    unique = list(dict.fromkeys(WORDS))  # as agentload.workload.agentic.WORDS holds them
    text = " ".join(rng.choice(unique) for _ in range(n))
    return len(tok(text)["input_ids"]) / n


def build_tokenizer(out: Path, rng: random.Random, words: list[str]) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(rng, words), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
        additional_special_tokens=["<|im_start|>", "<tool_call>", "</tool_call>"],
        model_max_length=32768,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)


def calibrate_stop(model: Qwen2ForCausalLM, stop_id: int, d0: int, mean_reply: float, seed: int) -> tuple[float, float]:
    """Set the stop token's weight on the constant dimension so its probability per step is 1 / ``mean_reply``.

    A forward pass over random tokens gives the constant dimension's value after the final RMSNorm (n, the same at
    every position to within ~1 %, as the random layers add little next to it) and the log-sum-exp of the other
    logits (L, about log(vocab): the random logits are small). The stop logit is w·n, so w = (L + logit(p)) / n.
    Returns (w, the mean stop probability re-measured with w in place).
    """
    import math

    import torch

    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(len(SPECIAL), model.config.vocab_size, (2, 512), generator=gen)  # ordinary tokens only

    def measure() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per position: n, the other tokens' log-sum-exp, the stop token's logit."""
        hidden = model.model(input_ids=ids).last_hidden_state
        logits = model.lm_head(hidden).float()
        others = torch.cat([logits[..., :stop_id], logits[..., stop_id + 1 :]], dim=-1)
        return hidden[..., d0].float(), torch.logsumexp(others, dim=-1), logits[..., stop_id]

    p = 1.0 / mean_reply
    with torch.no_grad():
        n, lse, _ = measure()
        weight = float((lse.mean() + math.log(p / (1 - p))) / n.mean())
        model.lm_head.weight[stop_id, d0] = weight
        _, lse, stop = measure()
        return weight, float(torch.sigmoid(stop - lse).mean())


def round_trip_ids(tok: PreTrainedTokenizerBase) -> list[int]:
    """The token ids that come back as themselves when their text is sent again: a leading space, then a word."""
    kept = []
    for i in range(len(tok)):
        text = tok.decode([i])
        word = text[1:]
        if text[:1] == " " and word and not any(c.isspace() for c in word) and "\ufffd" not in word:
            if tok.encode(text, add_special_tokens=False) == [i]:
                kept.append(i)
    return kept


def build_model(out: Path, seed: int, max_positions: int, variant: str) -> int:
    import torch
    from transformers import AutoTokenizer, GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    tok = AutoTokenizer.from_pretrained(out)
    stop_ids = sorted({tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")})
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=10,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
        bos_token_id=None,
        eos_token_id=stop_ids[-1] if len(stop_ids) == 1 else stop_ids,
        pad_token_id=tok.pad_token_id,
        rope_theta=10000.0,
        use_sliding_window=False,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        d0 = config.hidden_size - 1  # the constant dimension (see the module docstring)
        model.model.embed_tokens.weight[:, d0] = 1.0
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[d0, :] = 0.0
            layer.mlp.down_proj.weight[d0, :] = 0.0
        # After the final RMSNorm the constant dimension is positive for every token; a large negative weight
        # there puts the stop tokens' logits tens of units below the rest.
        model.lm_head.weight[stop_ids, :] = 0.0
        model.lm_head.weight[stop_ids, d0] = -1000.0
        if variant == "tiny":
            # Replies only of whole words that round-trip (see the module docstring); the stop tokens are among
            # the blocked ones already. Judged on the tokenizer as the server loads it: with config.json beside it
            # transformers loads the Qwen2 tokenizer class, whose pre-tokenizer splits every digit apart ("4066" was
            # one token of the trained vocabulary and is four when re-encoded), not the one just trained.
            config.save_pretrained(out)
            kept = set(round_trip_ids(AutoTokenizer.from_pretrained(out)))
            blocked = [i for i in range(len(tok)) if i not in kept]
            model.lm_head.weight[blocked, :] = 0.0
            model.lm_head.weight[blocked, d0] = -1000.0
            print(f"replies drawn from {len(kept)} of {len(tok)} tokens (whole words that round-trip)")
    model = model.to(torch.bfloat16)
    if variant == "realistic":
        # Only <|im_end|> (the eos a chat reply ends with) is let back in; <|endoftext|> stays suppressed so the
        # stop probability is the one calibrated. Calibrated in bfloat16, the precision the server runs in.
        weight, p = calibrate_stop(model, tok.convert_tokens_to_ids("<|im_end|>"), d0, REALISTIC_MEAN_REPLY, seed)
        print(f"stop weight {weight:.3f}: stop probability {p:.4f} a step, mean reply {1 / p:.1f} tokens")
    model.save_pretrained(out, safe_serialization=True)
    GenerationConfig(eos_token_id=config.eos_token_id, pad_token_id=tok.pad_token_id).save_pretrained(out)
    return sum(p.numel() for p in model.parameters())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-positions", type=int, default=8192)
    parser.add_argument("--variant", choices=VARIANTS, default="tiny", help="see the module docstring")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    build_tokenizer(args.out, random.Random(args.seed), training_words(args.variant, args.seed))
    params = build_model(args.out, args.seed, args.max_positions, args.variant)
    print(f"built {args.out} ({args.variant}): {params / 1e6:.1f}M parameters, "
          f"{tokens_per_word(args.out, args.seed):.3f} tokens per agentload word")  # fmt: skip


if __name__ == "__main__":
    main()
