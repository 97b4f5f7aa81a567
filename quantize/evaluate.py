"""What a quantization cost: perplexity, KL divergence from a base model, top-1 agreement.

Perplexity follows llama.cpp's perplexity tool exactly: the whole text is tokenized as that
tool does (with BOS in front when the model adds one), cut into windows of the context size,
the first token of each window replaced by BOS (when the model adds one), and only each
window's second half scored, so every scored token has at least half a window of context;
the windows evaluated together in the tool's default batch (`windows_per_batch`).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, replace
from importlib.resources import files
from typing import Callable

from tallow.quantize.errors import QuantizeError
from tallow.runtime.errors import ContextOverflow

LLAMA_PERPLEXITY_BATCH = 2048  # llama-perplexity's default -b: the windows it evaluates together fill it


def shipped_text() -> str:
    """A few thousand tokens of public-domain prose that ship with tallow (works offline)."""
    return files("tallow.quantize").joinpath("data/eval.txt").read_text(encoding="utf-8")


@dataclass
class EvalResult:
    model: str
    n_ctx: int
    windows: int
    scored: int
    ppl: float
    ppl_se: float
    kld: float | None = None
    kld_se: float | None = None
    top1: float | None = None
    size: int = 0
    params: int = 0
    decode_tps: float | None = None
    type_k: str = "f16"  # the settings it was evaluated with: each moves the figure
    type_v: str = "f16"
    flash_attn: str = "on"
    n_batch: int = 512  # the micro-batch: the most rows one call evaluates
    windows_per_batch: int = 1  # evaluated together, an equal share of each per call (windows_per_batch)
    repacked: bool = False
    gpu_layers: int = 0

    @property
    def bits_per_weight(self) -> float:
        return self.size * 8 / self.params if self.params else 0.0

    def to_dict(self) -> dict:
        return {**asdict(self), "bits_per_weight": round(self.bits_per_weight, 3)}


def text_tokens(engine, text: str) -> list[int]:
    """The text's tokens as llama.cpp's perplexity tool takes them: with the model's special
    tokens (BOS first, when it adds one), special-token text read as text. Leaving BOS out
    would shift every window by a token against the tool's (1.2% on Gemma 3)."""
    return engine.model.tokenize(text, add_special=True, parse_special=False)


def windows(tokens: list[int], n_ctx: int, max_windows: int | None, bos: int | None) -> list[list[int]]:
    count = len(tokens) // n_ctx
    if max_windows:
        count = min(count, max_windows)
    if count == 0:
        raise QuantizeError(f"the text is {len(tokens)} tokens: too short for one window of {n_ctx}",
                            "use a longer text or a smaller --ctx")
    out = []
    for k in range(count):
        w = tokens[k * n_ctx:(k + 1) * n_ctx]
        if bos is not None:
            w = [bos] + w[1:]
        out.append(w)
    return out


def windows_per_batch(n_ctx: int) -> int:
    """How many windows are evaluated together: as many as fill llama-perplexity's default
    batch (-b 2048), each in a sequence with a KV stream of its own. Its flash-attention
    kernels see an equal share of each window per call, and round a little differently from
    one window at a time (0.01-0.02% of perplexity), so tallow takes the same shape."""
    return max(1, LLAMA_PERPLEXITY_BATCH // n_ctx)


def eval_settings(load, n_ctx: int):
    """The context `evaluate` needs for windows of n_ctx: a sequence and a stream per window of a batch."""
    group = windows_per_batch(n_ctx)
    return replace(load, n_ctx=n_ctx * group, n_seq_max=group, kv_unified=False)


def _log_softmax(logits):
    import numpy as np

    m = logits.max(axis=1, keepdims=True)
    return logits - m - np.log(np.exp(logits - m).sum(axis=1, keepdims=True))


def score_window(logits, window: list[int]):
    """Negative log-likelihoods of the scored half, and the log-probabilities behind them."""
    import numpy as np

    first = len(window) // 2
    logp = _log_softmax(logits[first:len(window) - 1].astype(np.float64))
    targets = np.asarray(window[first + 1:])
    return -logp[np.arange(len(targets)), targets], logp


def _mean_se(values) -> tuple[float, float]:
    import numpy as np

    arr = np.asarray(values, dtype=np.float64)
    se = float(arr.std(ddof=1) / math.sqrt(len(arr))) if len(arr) > 1 else 0.0
    return float(arr.mean()), se


def evaluate(engine, name: str, text: str, n_ctx: int, max_windows: int | None = None, base=None,
             on_progress: Callable[[int, int], None] | None = None) -> EvalResult:
    """Perplexity of `engine` on `text`; with `base` (another engine on the same vocabulary),
    also the KL divergence of engine's distributions from base's, and top-1 agreement."""
    import numpy as np

    if base is not None and base.model.n_vocab != engine.model.n_vocab:
        raise QuantizeError("the base model has a different vocabulary: KL divergence needs the same one")
    tokens = text_tokens(engine, text)
    bos = engine.model.bos if engine.model.add_bos else None
    wins = windows(tokens, n_ctx, max_windows, bos)
    nlls, klds, agree = [], [], []
    group = min(windows_per_batch(n_ctx), engine.n_seq_max, base.n_seq_max if base is not None else engine.n_seq_max)
    for first in range(0, len(wins), group):
        batch = wins[first:first + group]
        theirs = window_logits(base, batch) if base is not None else [None] * len(batch)
        for w, logits, base_logits in zip(batch, window_logits(engine, batch), theirs):
            nll, logp = score_window(logits, w)
            nlls.append(nll)
            if base_logits is not None:
                _, base_logp = score_window(base_logits, w)
                p = np.exp(base_logp)
                klds.append((p * (base_logp - logp)).sum(axis=1))
                agree.append(base_logp.argmax(axis=1) == logp.argmax(axis=1))
        if on_progress:
            on_progress(first + len(batch), len(wins))
    mean, se = _mean_se(np.concatenate(nlls))
    result = EvalResult(name, n_ctx, len(wins), sum(len(n) for n in nlls), math.exp(mean), math.exp(mean) * se,
                        windows_per_batch=group)
    if base is not None:
        result.kld, result.kld_se = _mean_se(np.concatenate(klds))
        result.top1 = float(np.concatenate(agree).mean())
    return result


def decode_speed(engine, n: int = 64) -> float:
    """Greedy decode tok/s for a short answer (a rough figure for the comparison table)."""
    from tallow.runtime.types import FinalEvent, Request, Sampling

    engine.reset()
    prompt = engine.tokenize("The lighthouse keeper climbed the tower and")
    started = time.perf_counter()
    final = [e for e in engine.stream(Request(prompt, n, (), Sampling(temperature=0), ignore_eos=True))
             if isinstance(e, FinalEvent)][0]
    engine.reset()
    return final.timings.decode_tps or n / (time.perf_counter() - started)


def logits_for(engine, tokens: list[int]):
    """Logits at every position of `tokens`, evaluated from an empty cache: a
    (len(tokens), n_vocab) float32 array."""
    return window_logits(engine, [tokens])[0]


def window_logits(engine, windows: list[list[int]]) -> list:
    """Each window's logits at every position, the windows evaluated together from an empty
    cache, one sequence each (a context for that many), as llama-perplexity does: each call
    takes an equal share of the batch from every window, as llama.cpp splits a batch of
    several sequences with a KV stream each."""
    import numpy as np

    seqs = engine.n_seq_max
    if len(windows) > seqs or max(map(len, windows)) > engine.n_ctx // seqs:
        raise ContextOverflow(f"{len(windows)} windows of {max(map(len, windows))} tokens do not fit in a "
                              f"context of {engine.n_ctx} for {seqs} sequences")
    engine.reset()
    rows: list[list] = [[] for _ in windows]
    share = max(1, engine.n_batch // len(windows))
    for start in range(0, max(map(len, windows)), share):
        entries = [(w[p], p, j, True) for j, w in enumerate(windows) for p in range(start, min(len(w), start + share))]
        engine.ctx.decode_batch(entries)
        for (_, _, j, _), row in zip(entries, engine.ctx.logits(len(entries), engine.model.n_vocab)):
            rows[j].append(row)
    engine.reset()
    return [np.stack(r) for r in rows]
