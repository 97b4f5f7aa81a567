"""Log-probabilities of sampled tokens, the same on every route (run, chat, serve, batch)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tallow.runtime.types import TokenEvent


def with_logprobs(event: TokenEvent, logits, top: int) -> TokenEvent:
    """The event with the model's log-probability of its token and the `top` most likely
    tokens, from the raw logits of the row it was sampled from (before any sampler change)."""
    import numpy as np

    z = logits.astype(np.float64)
    z -= z.max()
    logz = np.log(np.exp(z).sum())
    best: tuple[tuple[int, float], ...] = ()
    if top > 0:
        idx = np.argpartition(-z, top - 1)[:top]
        idx = idx[np.argsort(-z[idx], kind="stable")]
        best = tuple((int(i), float(z[i] - logz)) for i in idx)
    return replace(event, logprob=float(z[event.token] - logz), top_logprobs=best)


def with_post_probs(event: TokenEvent, kept) -> TokenEvent:
    """The event with its token's probability after the sampler chain and the chain's likeliest
    candidates, as its sampler recorded them (runtime/backend/sampler.py). A token forced in
    place of sampling (a spent reasoning budget's closing marker) had no other candidate."""
    prob, top = kept if kept is not None else (1.0, ((event.token, 1.0),))
    return replace(event, prob=prob, top_probs=top)


def token_logprob(ev: TokenEvent, piece) -> dict[str, Any]:
    """One entry of a chat `logprobs.content` list; `piece(token)` gives the token's bytes."""
    def entry(token: int, lp: float | None) -> dict[str, Any]:
        raw = piece(token)
        return {"token": raw.decode("utf-8", "replace"), "logprob": lp, "bytes": list(raw)}

    out = entry(ev.token, ev.logprob)
    out["top_logprobs"] = [entry(t, lp) for t, lp in ev.top_logprobs]
    return out
