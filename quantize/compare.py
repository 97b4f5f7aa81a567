"""The trade-off table: each model's size, perplexity, divergence from the first, and speed."""

from __future__ import annotations

from typing import Callable

from tallow.models.gguf_file import read_gguf
from tallow.models.resolve import LocalModel
from tallow.quantize.evaluate import EvalResult, decode_speed, eval_settings, evaluate, shipped_text
from tallow.runtime.types import LoadSettings


def compare_models(models: list[LocalModel], load: LoadSettings, text: str | None, n_ctx: int, chunks: int | None,
                   with_base: bool, with_speed: bool,
                   on_progress: Callable[[str, int, int], None] | None = None,
                   kv: tuple[str, str] | None = None) -> list[EvalResult]:
    """Evaluate each model on the same windows; with_base: KL divergence from the first.
    `kv`: the KV cache types (K, V) to evaluate every model with, after the first model with
    `load`'s own (f16), which is then the base: a row per model at those types."""
    from dataclasses import replace

    load = eval_settings(load, n_ctx)
    entries = [(m, load, m.name) for m in models]
    if kv is not None:
        quantized = replace(load, type_k=kv[0], type_v=kv[1])
        entries = [(models[0], load, f"{models[0].name} (KV {load.type_k}/{load.type_v})")]
        entries += [(m, quantized, f"{m.name} (KV {kv[0]}/{kv[1]})") for m in models]
        with_base = True
    return _evaluate_all(entries, text, n_ctx, chunks, with_base, with_speed, on_progress)


def _evaluate_all(entries: list[tuple[LocalModel, LoadSettings, str]], text: str | None, n_ctx: int,
                  chunks: int | None, with_base: bool, with_speed: bool,
                  on_progress: Callable[[str, int, int], None] | None) -> list[EvalResult]:
    from tallow.runtime.engine import Engine

    body = text if text is not None else shipped_text()
    results = []
    base_engine = Engine(entries[0][0].paths, entries[0][1]) if with_base else None
    try:
        for i, (m, load, label) in enumerate(entries):
            progress = (lambda d, t, name=label: on_progress(name, d, t)) if on_progress else None
            engine = base_engine if (base_engine is not None and i == 0) else Engine(m.paths, load)
            try:
                r = evaluate(engine, label, body, n_ctx, chunks, base_engine if (with_base and i > 0) else None, progress)
                if with_base and i == 0:
                    r.kld, r.kld_se, r.top1 = 0.0, 0.0, 1.0
                infos = [read_gguf(p) for p in m.paths]
                r.size, r.params = sum(x.size for x in infos), sum(x.n_params for x in infos)
                r.type_k, r.type_v = load.type_k, load.type_v
                r.flash_attn, r.n_batch, r.repacked = engine.flash_attn, engine.n_batch, engine.extra_buffers
                r.gpu_layers = engine.offloaded_layers
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
