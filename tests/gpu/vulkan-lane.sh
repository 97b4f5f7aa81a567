#!/usr/bin/env bash
# The GPU lane on a machine without a GPU: llama-cpp-python built for Vulkan, run on Mesa's
# lavapipe (a Vulkan device on the CPU), so every layer tallow offloads goes to a real ggml
# device with its own buffers and memory report, only slowly. Then the GPU tests.
#
#     tests/gpu/vulkan-lane.sh [VENV]      # default .gpu-venv; needs root for apt-get
#
# Debian 12's libvulkan-dev (1.3.239) lacks what ggml-vulkan needs (VK_HEADER_VERSION >= 301),
# so the headers come from Debian 13's libvulkan-dev, unpacked beside the system (its
# libraries need a newer glibc and are not used). glslc, SPIR-V headers, the loader and
# lavapipe come from the system. The build takes 20-40 minutes on 2 cores; it is kept in
# VENV, and a second run only reinstalls tallow and tests.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${1:-.gpu-venv}
CACHE=${TALLOW_VULKAN_CACHE:-$HOME/.cache/tallow-vulkan}
HEADERS=$CACHE/headers/usr/include

need_packages() {
  local missing=()
  command -v glslc >/dev/null || missing+=(glslc)
  [ -d /usr/include/spirv ] || missing+=(spirv-headers)
  [ -e /usr/share/vulkan/icd.d/lvp_icd.x86_64.json ] || missing+=(mesa-vulkan-drivers)
  [ -e /usr/lib/x86_64-linux-gnu/libvulkan.so ] || missing+=(libvulkan-dev)
  if [ "${#missing[@]}" -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
  fi
}

header_version() {
  sed -n 's/^#define VK_HEADER_VERSION \([0-9]*\)$/\1/p' "$1/vulkan/vulkan_core.h" 2>/dev/null || true
}

newer_headers() {
  if [ "$(header_version /usr/include)" -ge 301 ] 2>/dev/null; then
    HEADERS=/usr/include
    return
  fi
  if [ "$(header_version "$HEADERS")" -ge 301 ] 2>/dev/null; then
    return
  fi
  local apt_dir
  apt_dir=$(mktemp -d)
  mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main" \
    >"$apt_dir/sources.list"
  local opts=(-o "Dir::Etc::SourceList=$apt_dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
              -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache" -o Debug::NoLocking=1)
  apt-get "${opts[@]}" update -qq
  (cd "$apt_dir" && apt-get "${opts[@]}" download libvulkan-dev)
  mkdir -p "$CACHE/headers"
  dpkg-deb -x "$apt_dir"/libvulkan-dev_*.deb "$CACHE/headers"
  rm -rf "$apt_dir"
}

build() {
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  local spec  # the same requirement as a CPU install resolves: pyproject.toml's
  spec=$("$VENV/bin/python" -c 'import tomllib; d = tomllib.load(open("pyproject.toml", "rb"))
print(next(s for s in d["project"]["dependencies"] if s.startswith("llama-cpp-python")))')
  if "$VENV/bin/python" -c 'import sys; from tallow.runtime.backend import supports_gpu_offload; sys.exit(not supports_gpu_offload())' 2>/dev/null; then
    echo "llama-cpp-python in $VENV already offloads: not rebuilt"
  else
    echo "building $spec for Vulkan into $VENV (20-40 minutes on 2 cores)"
    CMAKE_ARGS="-DGGML_VULKAN=on -DVulkan_INCLUDE_DIR=$HEADERS" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
      "$VENV/bin/pip" install -q --no-cache-dir --force-reinstall "$spec"
  fi
  "$VENV/bin/pip" install -q -e ".[test]"
}

need_packages
newer_headers
build
# ggml skips CPU-type Vulkan devices unless one is named; lavapipe has no usable fp16 or
# cooperative matrices (llama.cpp's own llvmpipe CI lane sets the same)
export GGML_VK_VISIBLE_DEVICES=0 GGML_VK_DISABLE_F16=1 GGML_VK_DISABLE_COOPMAT=1
"$VENV/bin/python" -m pytest -m gpu -v -p no:cacheprovider tests/gpu
