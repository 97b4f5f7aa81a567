"""Fit before load: the memory estimate, its checks against llama.cpp, and the refusals."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers.processes import run_tallow

from tallow.common.errors import TallowError
from tallow.models.gguf_file import read_gguf
from tallow.models.memory import Shape, check_fit, estimate, largest_context, layers_for_vram

MiB = 2**20


def shape_of(path) -> Shape:
    return Shape.from_gguf([read_gguf(path)])


def test_estimate_matches_what_llama_cpp_allocates(default_model):
    # llama.cpp's own log for this model at n_ctx 4096, n_batch 512, flash attention on:
    # model buffer 92.10 MiB, KV buffer 90.00 MiB, compute buffer 98.25 MiB, output 0.19 MiB.
    est = estimate(shape_of(default_model), 4096)
    assert round(est.weights / MiB, 2) == 92.10
    assert est.kv_cache == 90 * MiB
    assert est.output == 49152 * 4
    assert abs(est.compute - 98.25 * MiB) / (98.25 * MiB) < 0.05
    # KV grows with the context and shrinks with a quantized cache type
    assert estimate(shape_of(default_model), 8192).kv_cache == 2 * est.kv_cache
    assert estimate(shape_of(default_model), 4096, type_k="q8_0", type_v="q8_0").kv_cache < est.kv_cache * 0.6


RSS_SCRIPT = """
import json, random, sys, psutil
from tallow.runtime import backend
backend.init()
from tallow.runtime.engine import Engine
from tallow.runtime.types import LoadSettings
path, ctx, fa = sys.argv[1], int(sys.argv[2]), sys.argv[3]
proc = psutil.Process()
before = proc.memory_info().rss
engine = Engine([path], LoadSettings(n_ctx=ctx, n_threads=2, flash_attn=fa))
rng = random.Random(1)
tokens = [rng.randrange(engine.model.n_vocab) for _ in range(engine.n_ctx)]
for i in range(0, len(tokens), engine.n_batch):  # every KV cell, every logits row: all of it in use
    engine.ctx.decode(tokens[i:i + engine.n_batch], i, 0, all_logits=True)
print(json.dumps({"rss": proc.memory_info().rss - before}))
"""


@pytest.mark.parametrize("which, ctx, fa", [("default", 1024, "auto"), ("default", 4096, "auto"),
                                            ("synth", 8192, "off")])
@pytest.mark.slow
def test_estimate_within_15_percent_of_resident_memory(which, ctx, fa, default_model, synth_model):
    path = default_model if which == "default" else synth_model
    out = subprocess.run([sys.executable, "-c", RSS_SCRIPT, str(path), str(ctx), fa], capture_output=True,
                         text=True, check=True, timeout=300)
    rss = json.loads(out.stdout.strip().splitlines()[-1])["rss"]
    est = estimate(shape_of(path), ctx, flash_attn=fa != "off", all_logits=True).total
    assert abs(rss - est) / est < 0.15, f"resident {rss / MiB:.1f} MiB, estimated {est / MiB:.1f} MiB"


def test_refusal_says_needs_have_and_what_fits(default_model):
    shape = shape_of(default_model)
    est = estimate(shape, 4096)
    with pytest.raises(TallowError) as err:
        check_fit(shape, est, 200 * 10**6, None)
    assert "needs 298.4 MB of memory at context 4096" in err.value.message
    assert "have 200.0 MB" in err.value.message
    fits = largest_context(shape, 200 * 10**6, 4096)
    assert f"--ctx {fits}" in err.value.hint and 0 < fits < 4096
    assert estimate(shape, fits).ram <= 200 * 10**6 < estimate(shape, fits + 256).ram
    with pytest.raises(TallowError, match="have 50.0 MB") as err:
        check_fit(shape, est, 50 * 10**6, None)
    assert "a smaller model" in err.value.hint  # not even the weights fit


def test_gpu_layers_fit_given_vram(default_model):
    shape = shape_of(default_model)
    per_layer = shape.layer_bytes[0]
    # Nothing fits under the margin; everything with room to spare; in between, a part.
    assert layers_for_vram(shape, 100 * MiB, 4096) == 0
    assert layers_for_vram(shape, 8 * 2**30, 4096) == shape.n_layer + 1
    some = layers_for_vram(shape, 512 * MiB + 120 * MiB, 4096)
    assert 0 < some < shape.n_layer
    assert estimate(shape, 4096, gpu_layers=some).vram <= 120 * MiB < estimate(shape, 4096, gpu_layers=some + 1).vram
    assert per_layer > 0
    est = estimate(shape, 4096, gpu_layers=shape.n_layer + 1)
    with pytest.raises(TallowError, match=r"needs .* of GPU memory with 31 layers offloaded, have") as err:
        check_fit(shape, est, 10**12, 200 * MiB)
    assert "--gpu-layers" in err.value.hint


def test_engine_refuses_before_loading_and_shrinks_the_default_context(default_model):
    from tallow.runtime.engine import Engine
    from tallow.runtime.types import LoadSettings

    with pytest.raises(TallowError, match="needs .* have 150.0 MB"):
        Engine(default_model, LoadSettings(n_ctx=4096, n_threads=2, memory=150 * 10**6))
    with Engine(default_model, LoadSettings(n_threads=2, memory=250 * 10**6)) as engine:
        assert 256 <= engine.n_ctx < 4096
        assert engine.fit_note.startswith(f"context {engine.n_ctx} (of 4096)")
        assert engine.estimate.ram <= 250 * 10**6


def test_show_fit_and_run_refusal(default_home, tmp_path):
    r = run_tallow(["show", "smollm2:135m", "--fit", "--ctx", "8192", "--json"], home=default_home)
    data = json.loads(r.stdout)
    assert r.returncode == 0 and data["fits"] and data["n_ctx"] == 8192
    assert data["total"] == data["weights"] + data["kv_cache"] + data["compute"] + data["output"]
    r = run_tallow(["show", "smollm2:135m", "--fit", "--ctx", "100000000"], home=default_home)
    assert r.returncode == 0 and b"does not fit" in r.stdout
    r = run_tallow(["run", "smollm2:135m", "hi", "--ctx", "100000000", "--no-log"], home=default_home)
    lines = r.stderr.decode().splitlines()
    assert r.returncode == 1 and len(lines) == 2 and "needs" in lines[0] and ", have " in lines[0]
    assert lines[1].startswith("hint: try --ctx ")


def test_show_fit_honours_gpu_layers_with_a_given_vram(default_home):
    def fit(*args):
        r = run_tallow(["show", "smollm2:135m", "--fit", "--ctx", "4096", "--json", *args], home=default_home)
        assert r.returncode == 0, r.stderr.decode()
        return json.loads(r.stdout)

    cpu = fit()
    assert cpu["gpu_layers"] == 0 and cpu["vram"] == 0 and cpu["ram"] == cpu["total"]
    few, more = fit("--gpu-layers", "8", "--vram", "4GB"), fit("--gpu-layers", "24", "--vram", "4GB")
    assert few["gpu_layers"] == 8 and more["gpu_layers"] == 24
    assert 0 < few["vram"] < more["vram"] and few["ram"] > more["ram"]  # the split moves with N
    assert few["total"] == more["total"] and few["fits"] and more["fits"]
    # the same weights and cache; only the compute buffer may move, with flash attention,
    # which is llama.cpp's own choice ("auto") once layers go to a GPU
    assert few["weights"] == cpu["weights"] and few["kv_cache"] == cpu["kv_cache"]
    assert few["flash_attn"] == more["flash_attn"] == "auto"
    assert (few["compute"] == cpu["compute"]) == (cpu["flash_attn"] != "off"), (few, cpu)
    small = fit("--gpu-layers", "all", "--vram", "100MB")
    assert not small["fits"] and "GPU memory" in small["error"] and "--gpu-layers" in small["hint"]
    text = run_tallow(["show", "smollm2:135m", "--fit", "--gpu-layers", "8", "--vram", "4GB"], home=default_home)
    assert "8 layers on the GPU" in text.stdout.decode() and "on GPU" in text.stdout.decode()
    for args, words in ((["--vram", "lots"], "a size"), (["--vram", "4GB", "--no-such"], "No such option")):
        bad = run_tallow(["show", "smollm2:135m", "--fit", *args], home=default_home)
        assert bad.returncode == 2 and words in bad.stderr.decode(), bad.stderr.decode()
    nofit = run_tallow(["show", "smollm2:135m", "--vram", "4GB"], home=default_home)
    assert nofit.returncode == 2 and "add --fit" in nofit.stderr.decode()
