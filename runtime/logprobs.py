"""Log-probabilities of sampled tokens, the same on every route (run, chat, serve, batch)."""

from __future__ import annotations

from dataclasses import replace

from .types import TokenEvent


def with_logprobs(event: TokenEvent, logits, top: int) -> TokenEvent:
    """The event with the model's log-probability of its token and the `top` most likely
    tokens, from the raw logits of the row it was sampled from (before any sampler change)."""
    import numpy as np

    z = logits.astype(np.float64)
    z -= z.max()
    logz = np.log(np.exp(z).sum())
    best = ()
    if top > 0:
        idx = np.argpartition(-z, top - 1)[:top]
        idx = idx[np.argsort(-z[idx], kind="stable")]
        best = tuple((int(i), float(z[i] - logz)) for i in idx)
    return replace(event, logprob=float(z[event.token] - logz), top_logprobs=best)
