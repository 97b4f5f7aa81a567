"""The memory planner's projector figures (models/projector.projector_memory) against what
libmtmd itself reserves: a warmup makes clip reserve its compute buffer for its largest
input, and logs the size. The estimate must not fall short of it, and for a fixed-size
encoder not be wildly above it either."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers.audio_projector import write_tone_projector
from helpers.mrope import write_mrope_colour_projector, write_mrope_model
from helpers.projector import write_bench_projector, write_colour_projector

pytestmark = pytest.mark.slow


def _reserved(model: Path, proj: Path) -> float:
    """MiB of compute buffer libmtmd reserves for the projector on a warmup."""
    from tallow.runtime import backend
    from tallow.runtime.backend import Model
    from tallow.runtime.backend.media import Projector
    from tallow.runtime.media import MARKER

    backend.init()
    seen: list[float] = []

    def listen(level, line):
        seen.extend(float(m) for m in re.findall(r"CPU compute buffer size = +([0-9.]+) MiB", line))

    backend.listen_to_logs(listen)
    text = Model([model], 0)
    try:
        Projector(text, proj, 2, MARKER, warmup=True).close()
    finally:
        text.close()
        backend.stop_listening(listen)
    assert seen, "libmtmd logged no compute buffer"
    return max(seen)


def _estimate(proj: Path) -> float:
    from tallow.models.gguf_file import read_gguf
    from tallow.models.projector import projector_memory

    return projector_memory(read_gguf(proj))[1] / 2**20


@pytest.mark.parametrize("kind", ["llava-vit-b", "llava-colour", "qwen2vl", "voxtral"])
def test_the_estimate_bounds_what_libmtmd_reserves(kind, default_model, tmp_path):
    model, fixed = default_model, True
    if kind == "llava-vit-b":  # a ViT-B/14 at 224 pixels, two of its layers
        proj = write_bench_projector(tmp_path / "p.gguf", model, layers=2)
    elif kind == "llava-colour":
        proj = write_colour_projector(tmp_path / "p.gguf", model)
    elif kind == "qwen2vl":  # dynamic resolution: the warmup picture is not its largest
        model = write_mrope_model(default_model, tmp_path / "qwen2vl.gguf")
        proj, fixed = write_mrope_colour_projector(tmp_path / "p.gguf", model), False
    else:
        proj = write_tone_projector(tmp_path / "p.gguf", model)
    reserved, estimate = _reserved(model, proj), _estimate(proj)
    print(f"{kind}: libmtmd reserves {reserved:.2f} MiB, the estimate is {estimate:.2f} MiB")
    assert estimate >= reserved
    if fixed and reserved > 1:
        assert estimate <= 3 * reserved
