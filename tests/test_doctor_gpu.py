"""tallow doctor and GPUs: the backends the installed llama.cpp registers, and, when the
machine has a GPU the build cannot use, the command that rebuilds it. No GPU is here, so a
stand-in nvidia-smi on PATH plays the NVIDIA driver's tool."""

from __future__ import annotations

import json
import os
from pathlib import Path

from helpers.processes import run_tallow


def _doctor(tmp_path, path: str | None = None) -> dict:
    env = {"PATH": path} if path else None
    r = run_tallow(["doctor", "--json", "--no-live"], home=tmp_path / "home", env=env)
    return json.loads(r.stdout)


def test_a_gpu_the_cpu_build_cannot_use_gets_the_rebuild_command(tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text('#!/bin/sh\necho "NVIDIA H200"\n')
    (fake / "nvidia-smi").chmod(0o755)
    data = _doctor(tmp_path, f"{fake}{os.pathsep}{os.environ['PATH']}")
    assert "CPU" in data["backends"]
    if any(d["kind"] in ("gpu", "igpu") for d in data["devices"]):
        assert data["gpu_unused"] is None  # a GPU build: nothing to rebuild
        return
    assert data["gpu_unused"]["gpu"] == "NVIDIA H200" and data["gpu_unused"]["backend"] == "CUDA"
    command = data["gpu_unused"]["command"]
    assert "-DGGML_CUDA=on" in command and "--no-cache-dir --force-reinstall" in command
    text = run_tallow(["doctor", "--no-live"], home=tmp_path / "home",
                      env={"PATH": f"{fake}{os.pathsep}{os.environ['PATH']}"}).stdout.decode()
    assert "NVIDIA H200 found, but this llama.cpp cannot use it; rebuild: CMAKE_ARGS=" in text


def test_without_a_gpu_nothing_is_suggested(tmp_path):
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if not (Path(p) / "nvidia-smi").exists())
    data = _doctor(tmp_path, path)
    if not Path("/proc/driver/nvidia/version").exists() and not Path("/dev/kfd").exists():
        assert data["gpu_unused"] is None
    assert data["backends"] and data["devices"]
    # which rule decides, where the layers run
    assert data["decisions"]["cpu"]["threads"] == "the free physical cores, followed while decoding"
    if not any(d["kind"] in ("gpu", "igpu") for d in data["devices"]):
        assert data["decisions"]["gpu"] is None
        text = run_tallow(["doctor", "--no-live"], home=tmp_path / "home", env={"PATH": path}).stdout.decode()
        assert "no GPU device here: every layer runs on the CPU" in text


def test_the_thread_rule_follows_where_the_layers_run():
    from tallow.runtime.host.threads import physical_cores, thread_rule

    assert thread_rule(3, True, True) == (3, "pinned (--threads)")
    assert thread_rule(None, True, True)[0] == physical_cores()  # llama.cpp's default, not adapted
    assert thread_rule(None, True, False)[0] is None  # the CPU's layers: follow the free cores
    assert thread_rule(None, False, False)[0] == physical_cores()
