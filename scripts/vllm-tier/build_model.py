"""Build the tier's small random-weight chat model fully offline (run with the tier venv's Python).

    build_model.py OUT_DIR [--seed N]

Writes a Qwen2-shaped model of ~40M parameters (a 2-layer toy streams unrealistically fast and has no prefill
cost worth measuring), a byte-level BPE tokenizer trained here on generated text, and a ChatML chat template that
renders tools. Nothing is downloaded: the tokenizer is trained locally and the weights are random.

Two choices make the random model behave like a load generator wants:

* The training text is built from agentload's own word list (``agentload.workload.agentic`` draws its prompts
  from ~256 common English words), each word with its leading space, so each becomes one token: N words of an
  agentic prompt are about N tokens here, as on the simulator, and ``--context`` means what it says.
* A random model would sample an end-of-sequence token now and then (about 1 in the vocabulary size per token)
  and end replies early; agentload does not send ``ignore_eos`` by default, so replies would come out shorter
  than the workload's ``max_tokens``. One hidden dimension is made constant (its embedding column is a constant
  and no layer writes to it), and the output rows of the stop tokens point against it, so their logits sit far
  below every other token's and replies run to ``max_tokens``.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"]
VOCAB_SIZE = 8192

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


def corpus(rng: random.Random, lines: int = 20000) -> list[str]:
    """Generated training text: word salad from agentload's words, numbers, code and JSON fragments."""
    out: list[str] = []
    idents = ["def", "class", "return", "import", "self", "None", "True", "False", "args", "kwargs", "path"]
    for i in range(lines):
        kind = i % 4
        if kind == 0:
            out.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 40))))
        elif kind == 1:
            args = {rng.choice(WORDS): rng.choice([rng.randint(0, 9999), rng.choice(WORDS)]) for _ in range(3)}
            out.append(json.dumps({"name": rng.choice(WORDS) + "_" + rng.choice(WORDS), "arguments": args}))
        elif kind == 2:
            out.append(
                f"    {rng.choice(idents)} {rng.choice(WORDS)}_{rng.choice(WORDS)}({rng.choice(WORDS)}="
                f"{rng.randint(0, 999)}): # {' '.join(rng.choice(WORDS) for _ in range(5))}"
            )
        else:
            out.append(" ".join(str(rng.randint(0, 10 ** rng.randint(1, 6))) for _ in range(6)) + ".")
    return out


def build_tokenizer(out: Path, rng: random.Random) -> None:
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
    tok.train_from_iterator(corpus(rng), trainer=trainer)
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


def build_model(out: Path, seed: int, max_positions: int) -> int:
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
    model = model.to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    GenerationConfig(eos_token_id=config.eos_token_id, pad_token_id=tok.pad_token_id).save_pretrained(out)
    return sum(p.numel() for p in model.parameters())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-positions", type=int, default=8192)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    build_tokenizer(args.out, random.Random(args.seed))
    params = build_model(args.out, args.seed, args.max_positions)
    print(f"built {args.out}: {params / 1e6:.1f}M parameters")


if __name__ == "__main__":
    main()
