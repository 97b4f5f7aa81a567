"""GPU offload on a real ggml GPU backend: tests/gpu/vulkan-lane.sh runs them on Mesa's lavapipe
(Vulkan on the CPU), tests/gpu/cuda-check.sh on an NVIDIA GPU. Skipped, with the reason,
where the installed llama.cpp cannot offload (the CPU build the main suite uses).

Offloaded layers run another backend's kernels, which round differently from the CPU's: a
greedy answer may part from the CPU's where two tokens are nearly tied. So answers must be
equal, or part only at a token whose two best log-probabilities are within TIE of each
other on the CPU side (a near-tie that any rounding could flip: tests/helpers/agree.py)."""

from __future__ import annotations

import json

import pytest
from helpers.agree import agree_or_tie
from helpers.processes import run_tallow
from helpers.server import Server

from tallow.runtime.backend import supports_gpu_offload

pytestmark = [pytest.mark.gpu, pytest.mark.slow,
              pytest.mark.skipif(not supports_gpu_offload(), reason="this llama.cpp build cannot offload to a GPU "
                                                                    "(run tests/gpu/vulkan-lane.sh)")]
PROMPT = "List three facts about the Moon."


def _answer(home, layers: str) -> dict:
    r = run_tallow(["run", "smollm2:135m", PROMPT, "--gpu-layers", layers, "--temperature", "0", "-n", "24",
                    "--json", "--logprobs", "2", "--no-cache"], home=home, timeout=600)
    assert r.returncode == 0, r.stderr.decode()
    return json.loads(r.stdout)


def test_greedy_answers_agree_with_every_layer_count(default_home):
    cpu = _answer(default_home, "0")
    assert cpu["load"]["gpu_layers"] == 0 and cpu["load"]["flash_attn"] in ("on", "off")  # the CPU's calibration
    assert "followed while decoding" in cpu["load"]["threads_rule"]
    for layers, on_gpu in (("all", 30), ("15", 15)):
        answer = _answer(default_home, layers)
        assert answer["load"]["gpu_layers"] == on_gpu and answer["load"]["flash_attn"] == "auto"  # llama.cpp's choice
        # every layer on the GPU: llama.cpp's default threads; partly: the CPU's rule
        assert ("every layer runs on a GPU" in answer["load"]["threads_rule"]) == (layers == "all"), answer["load"]
        agree_or_tie(cpu, answer)


def test_the_planners_device_figure_is_what_llama_cpp_allocates(default_model):
    """Within 10%: weights, KV cache and compute buffer on the device, from llama.cpp's own log."""
    from helpers.device_buffers import load_and_read_buffers

    estimate, seen = load_and_read_buffers(default_model, n_ctx=4096, n_threads=2, gpu_layers="all")
    allocated = sum(mib for _, _, mib in seen) * 2**20
    print(f"device buffers {seen}; planned {estimate.vram / 2**20:.1f} MiB, allocated {allocated / 2**20:.1f} MiB")
    assert estimate.gpu_layers != 0 and {kind for _, kind, _ in seen} >= {"model", "KV"}
    assert abs(estimate.vram - allocated) <= 0.10 * allocated


def test_serve_with_two_models_one_on_the_gpu(default_home, synth_model):
    server = Server("smollm2:135m", default_home, str(synth_model), "--parallel", "1",
                    "--model-option", f"{synth_model} gpu_layers=0")
    try:
        client = server.client()
        for name in ("smollm2:135m", str(synth_model)):
            client.chat.completions.create(model=name, max_tokens=4, messages=[{"role": "user", "content": "hi"}])
        loaded = {m["name"]: m for m in server.raw("/api/ps")[2]["models"]}
    finally:
        server.close()
    smol = next(m for n, m in loaded.items() if "smollm2" in n)
    synth = next(m for n, m in loaded.items() if "smollm2" not in n)
    assert smol["size_vram"] > 0.8 * smol["size"] and synth["size_vram"] == 0


def test_doctor_lists_the_gpu_device(default_home):
    data = json.loads(run_tallow(["doctor", "--json", "--no-live"], home=default_home).stdout)
    kinds = {d["kind"] for d in data["devices"]}
    assert kinds & {"gpu", "igpu"} or any(d["backend"] != "CPU" for d in data["devices"]), data["devices"]
    gpu = data["decisions"]["gpu"]
    assert gpu is not None and gpu["flash_attn"] == "llama.cpp's auto" and "every layer runs on a GPU" in gpu["threads"]


def test_bench_rows_at_no_and_all_layers(default_home):
    r = run_tallow(["bench", "smollm2:135m", "-p", "64", "-n", "16", "-r", "1", "-ngl", "0,99", "-o", "json"],
                   home=default_home, timeout=600)
    assert r.returncode == 0, r.stderr.decode()
    rows = json.loads(r.stdout)
    assert sorted({row["n_gpu_layers"] for row in rows}) == [0, 30]


def test_a_named_device_takes_the_layers(default_home):
    from tallow.runtime.host.devices import devices

    gpu = next(d.name for d in devices() if d.kind in ("gpu", "igpu"))
    r = run_tallow(["run", "smollm2:135m", PROMPT, "-n", "4", "--json", "--device", gpu, "--split-mode", "none",
                    "--main-gpu", "0"], home=default_home, timeout=600)
    assert r.returncode == 0, r.stderr.decode()
    assert json.loads(r.stdout)["load"]["gpu_layers"] == 30
