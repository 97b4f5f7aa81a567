"""A request's sampler: llama.cpp's chain for its settings, a lazy tool-call grammar swapped
in when a call opens (runtime/tools/sampler.py), and a reasoning budget's forced tokens.

Both decode loops (the engine's and the scheduler's) make it here, so every route samples
the same way."""

from __future__ import annotations

from typing import Any, Callable

from tallow.runtime.types import Request

Forced = Callable[[], "int | None"]  # the next token the answer must take, if any (OutputStream.forced_token)


def make_sampler(model, request: Request, forced: Forced | None = None, kept: dict | None = None):
    """The sampler for `request` (the caller closes it); `forced`: tokens that go in place of
    sampling when it gives one (a spent reasoning budget's closing marker); `kept`: where its
    chains record post-sampling probabilities by logit row, when the request asks for them."""
    from tallow.runtime.backend.sampler import Sampler
    from tallow.runtime.types import SamplerParams

    s = request.sampling
    banned = model.eog_tokens() if request.ignore_eos else ()
    seed = s.resolved_seed()

    def make(grammar: str | None):
        return Sampler(model, SamplerParams(s.temperature, s.top_k, s.top_p, s.min_p, s.repeat_penalty,
                                            s.repeat_last_n, seed, banned, grammar,
                                            s.frequency_penalty, s.presence_penalty, request.logit_bias,
                                            s.typical_p, (s.mirostat, s.mirostat_tau, s.mirostat_eta),
                                            keep_probs=(request.logprobs or 0) if request.post_probs else 0), kept)

    if request.lazy_grammar is not None:
        from tallow.runtime.tools.sampler import TriggeredSampler

        chain: Any = TriggeredSampler(make, model.piece, request.lazy_grammar)
    else:
        chain = make(request.grammar)
    if forced is None or request.reasoning_budget is None:
        return chain
    return BudgetSampler(chain, forced, accept=request.grammar is None)


class BudgetSampler:
    """A sampler that takes a forced token when there is one: the chain still sees it (its
    penalties count it), except under a grammar, whose state a forced token would break."""

    def __init__(self, chain, forced: Forced, accept: bool) -> None:
        self.chain, self.forced, self.accepts = chain, forced, accept

    def sample(self, ctx, idx: int = -1) -> int:
        token = self.forced()
        if token is None:
            return self.chain.sample(ctx, idx)
        if self.accepts:
            self.chain.accept(token)
        return token

    def accept(self, token: int) -> None:
        self.chain.accept(token)

    def close(self) -> None:
        self.chain.close()
