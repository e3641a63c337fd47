"""scripts/install.sh's choice of llama.cpp backend (--print-backend builds nothing),
on a PATH of fake tools."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ("bash", "sed", "grep", "dirname", "uname", "tr")
"""What the script runs before it decides; everything else on the fake PATH is a fake."""


def choose(tmp_path: Path, *fakes: str, args: tuple[str, ...] = (), **env: str) -> dict[str, str]:
    """install.sh --print-backend with only `fakes` (name or name=script) as extra tools."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for fake in fakes:
        name, _, body = fake.partition("=")
        (bin_dir / name).unlink(missing_ok=True)  # never write through a link to the real tool
        (bin_dir / name).write_text(f"#!/bin/sh\n{body or 'exit 0'}\n")
        (bin_dir / name).chmod(0o755)
    for tool in TOOLS:
        if not (bin_dir / tool).exists():
            (bin_dir / tool).symlink_to(shutil.which(tool))
    environ = {"PATH": str(bin_dir), "HOME": str(tmp_path), **env}
    done = subprocess.run([str(bin_dir / "bash"), str(ROOT / "scripts/install.sh"), "--print-backend", *args],
                          env=environ, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    return {"backend": lines[0].removeprefix("backend="), "cmake_args": lines[1].removeprefix("cmake_args="),
            "rpc": lines[2].removeprefix("rpc="), "sentence": lines[3], "venv": lines[4].removeprefix("venv=")}


NVIDIA_SMI = "nvidia-smi=echo 'GPU 0: NVIDIA H200 (UUID: GPU-1234)'"


@pytest.mark.skipif(os.path.exists("/dev/nvidia0"), reason="this machine has an NVIDIA GPU")
def test_a_cuda_toolkit_without_a_gpu_builds_for_the_cpu(tmp_path):
    choice = choose(tmp_path, "nvcc", "nvidia-smi=echo 'No devices were found'; exit 6")
    assert choice["backend"] == "cpu"
    assert "-DGGML_CUDA" not in choice["cmake_args"] and choice["cmake_args"].endswith("-DGGML_RPC=ON")
    assert "no NVIDIA GPU" in choice["sentence"]


def test_a_cuda_toolkit_and_a_gpu_build_for_cuda(tmp_path):
    choice = choose(tmp_path, "nvcc", NVIDIA_SMI)
    assert choice["backend"] == "cuda"
    assert choice["cmake_args"].split()[0] == "-DGGML_CUDA=ON" and "-DGGML_RPC=ON" in choice["cmake_args"]
    assert "scripts/install.sh --cpu" in choice["sentence"]


def test_vulkan_headers_and_glslc_build_for_vulkan(tmp_path):
    sdk = tmp_path / "sdk"
    (sdk / "include/vulkan").mkdir(parents=True)
    (sdk / "include/vulkan/vulkan.h").write_text('#include "vulkan_core.h"\n')
    (sdk / "include/vulkan/vulkan_core.h").write_text("typedef struct VkLayerSettingEXT { int type; } VkLayerSettingEXT;\n")
    assert choose(tmp_path, "glslc", VULKAN_SDK=str(sdk))["backend"] == "vulkan"
    assert choose(tmp_path / "no-glslc", VULKAN_SDK=str(sdk))["backend"] == "cpu"  # headers alone


def test_vulkan_headers_too_old_for_this_llama_cpp_build_for_the_cpu_and_say_why(tmp_path):
    """Debian 12's headers (1.3.239) lack VK_EXT_layer_settings: a Vulkan build would fail."""
    sdk = tmp_path / "sdk"
    (sdk / "include/vulkan").mkdir(parents=True)
    (sdk / "include/vulkan/vulkan.h").write_text('#include "vulkan_core.h"\n')
    (sdk / "include/vulkan/vulkan_core.h").write_text("typedef struct VkLayerProperties { int x; } VkLayerProperties;\n")
    choice = choose(tmp_path, "glslc", VULKAN_SDK=str(sdk))
    assert choice["backend"] == "cpu" and "older than this llama.cpp needs" in choice["sentence"]


def test_rocm_builds_for_hip(tmp_path):
    assert choose(tmp_path, "hipcc")["cmake_args"].startswith("-DGGML_HIP=ON")


def test_apple_silicon_builds_for_metal(tmp_path):
    assert choose(tmp_path, "uname=[ \"$1\" = -s ] && echo Darwin || echo arm64")["backend"] == "metal"


def test_cpu_and_cmake_args_win(tmp_path):
    assert choose(tmp_path, "nvcc", NVIDIA_SMI, args=("--cpu", "--test"))["backend"] == "cpu"
    choice = choose(tmp_path, "nvcc", NVIDIA_SMI, CMAKE_ARGS="-DGGML_VULKAN=ON -DGGML_NATIVE=OFF")
    assert choice["backend"] == "vulkan" and choice["cmake_args"] == "-DGGML_VULKAN=ON -DGGML_NATIVE=OFF -DGGML_RPC=ON"
    assert choose(tmp_path, CMAKE_ARGS="-DGGML_RPC=OFF")["cmake_args"] == "-DGGML_RPC=OFF"
    done = subprocess.run(["bash", str(ROOT / "scripts/install.sh"), "--cpu"], capture_output=True, text=True,
                          env={**os.environ, "CMAKE_ARGS": "-DGGML_CUDA=ON"}, timeout=60)
    assert done.returncode == 2 and "unset CMAKE_ARGS" in done.stderr


def test_help_prints_the_usage_and_builds_nothing(tmp_path):
    for flag in ("--help", "-h"):
        done = subprocess.run(["bash", str(ROOT / "scripts/install.sh"), flag], capture_output=True, text=True,
                              env={**os.environ, "HOME": str(tmp_path)}, timeout=60)
        assert done.returncode == 0, done.stderr
        assert "--print-backend" in done.stdout and "--cpu" in done.stdout and done.stderr == ""
        assert "Building" not in done.stdout


@pytest.mark.parametrize("value", ["1", "on", "ON", "On", "true", "YES"])
@pytest.mark.parametrize("backend", ["cuda", "hip", "vulkan"])
def test_cmake_args_name_their_backend_whatever_the_spelling_of_on(tmp_path, backend, value):
    choice = choose(tmp_path, CMAKE_ARGS=f"-DGGML_NATIVE=OFF -DGGML_{backend.upper()}={value}")
    assert choice["backend"] == backend and "the CPU" not in choice["sentence"]


@pytest.mark.parametrize("value", ["0", "off", "OFF"])
def test_cmake_args_that_turn_a_backend_off_build_for_the_cpu(tmp_path, value):
    assert choose(tmp_path, CMAKE_ARGS=f"-DGGML_CUDA={value}")["backend"] == "cpu"


@pytest.mark.parametrize("cmake_args, rpc", [
    ("", "yes"), ("-DGGML_RPC=OFF", "no"), ("-DGGML_RPC=0", "no"), ("-DGGML_RPC=off -DGGML_CUDA=ON", "no"),
    ("-DGGML_RPC=ON", "yes"), ("-DGGML_NATIVE=OFF", "yes"),
])
def test_the_installed_build_needs_rpc_only_where_cmake_args_leave_it_on(tmp_path, cmake_args, rpc):
    """A build made with -DGGML_RPC=OFF is kept by later runs (has_build reads the same answer)."""
    assert choose(tmp_path, **({"CMAKE_ARGS": cmake_args} if cmake_args else {}))["rpc"] == rpc


def test_venv_chooses_where_it_installs_relative_to_where_the_caller_stands(tmp_path):
    assert choose(tmp_path)["venv"] == ".venv"
    assert choose(tmp_path, args=("--venv", "/opt/edgespec"))["venv"] == "/opt/edgespec"
    assert choose(tmp_path, args=("--venv=/opt/e2",))["venv"] == "/opt/e2"
    done = subprocess.run(["bash", str(ROOT / "scripts/install.sh"), "--venv", "mine", "--print-backend"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert done.stdout.splitlines()[-1] == f"venv={tmp_path}/mine"
    done = subprocess.run(["bash", str(ROOT / "scripts/install.sh"), "--venv"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and done.stdout == ""
