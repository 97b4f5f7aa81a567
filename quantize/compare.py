"""The trade-off table: each model's size, perplexity, divergence from the first, and speed."""

from __future__ import annotations

from typing import Callable

from tallow.models.gguf_file import read_gguf
from tallow.models.resolve import LocalModel
from tallow.quantize.evaluate import EvalResult, decode_speed, evaluate, shipped_text
from tallow.runtime.types import LoadSettings


def compare_models(models: list[LocalModel], load: LoadSettings, text: str | None, n_ctx: int, chunks: int | None,
                   with_base: bool, with_speed: bool,
                   on_progress: Callable[[str, int, int], None] | None = None) -> list[EvalResult]:
    """Evaluate each model on the same windows; with_base: KL divergence from the first."""
    from dataclasses import replace

    from tallow.runtime.engine import Engine

    body = text if text is not None else shipped_text()
    load = replace(load, n_ctx=n_ctx)
    results = []
    base_engine = Engine(models[0].paths, load) if with_base else None
    try:
        for i, m in enumerate(models):
            progress = (lambda d, t, name=m.name: on_progress(name, d, t)) if on_progress else None
            engine = base_engine if (base_engine is not None and i == 0) else Engine(m.paths, load)
            try:
                r = evaluate(engine, m.name, body, n_ctx, chunks, base_engine if (with_base and i > 0) else None, progress)
                if with_base and i == 0:
                    r.kld, r.kld_se, r.top1 = 0.0, 0.0, 1.0
                infos = [read_gguf(p) for p in m.paths]
                r.size, r.params = sum(x.size for x in infos), sum(x.n_params for x in infos)
                if with_speed:
                    r.decode_tps = decode_speed(engine)
            finally:
                if engine is not base_engine:
                    engine.close()
            results.append(r)
    finally:
        if base_engine is not None:
            base_engine.close()
    return results
