"""A GPU this machine has that the installed llama.cpp cannot use, and the command that builds
llama-cpp-python for it (what `tallow doctor` says when the two disagree)."""

from __future__ import annotations

import platform
import shutil
import subprocess
import sys
from pathlib import Path

_PIP = "pip install --no-cache-dir --force-reinstall llama-cpp-python"
RECIPES = {
    "CUDA": f'CMAKE_ARGS="-DGGML_CUDA=on -DGGML_CUDA_NO_VMM=on" {_PIP}',
    "ROCm": f'CMAKE_ARGS="-DGGML_HIP=on" {_PIP}',
    "Metal": f'CMAKE_ARGS="-DGGML_METAL=on" {_PIP}',
}


def present_gpus() -> list[tuple[str, str]]:
    """(backend that would drive it, what it is) for each GPU family this machine shows."""
    found: list[tuple[str, str]] = []
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True,
                                 timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            out = ""
        found += [("CUDA", line.strip()) for line in out.splitlines() if line.strip()]
    if not found and Path("/proc/driver/nvidia/version").exists():
        found.append(("CUDA", "an NVIDIA GPU"))
    if Path("/dev/kfd").exists():
        found.append(("ROCm", "an AMD GPU"))
    if sys.platform == "darwin" and platform.machine() == "arm64":
        found.append(("Metal", "Apple silicon"))
    return found


def gpu_unused(devices: list[dict]) -> dict | None:
    """The first GPU found when llama.cpp has no GPU device at all, with the rebuild command."""
    if any(d.get("kind") in ("gpu", "igpu") for d in devices):
        return None
    for backend, name in present_gpus():
        return {"gpu": name, "backend": backend, "command": RECIPES[backend]}
    return None
