"""llama.cpp's sampler chain for one request: built from SamplerParams, sampled and accepted
in C; with `keep`, sampled step by step so that the candidates the chain leaves, and their
probabilities, can be read (llama.cpp's post-sampling probabilities)."""

from __future__ import annotations

import ctypes

import llama_cpp.llama_cpp as C

from tallow.runtime.backend import Context, Model, last_log_error
from tallow.runtime.errors import BackendError
from tallow.runtime.types import SamplerParams

# What a kept step records: the sampled token's probability after the chain and the `keep`
# most probable candidates the chain left, as (token, probability), most probable first.
Kept = tuple[float, tuple[tuple[int, float], ...]]


class Sampler:
    """A llama.cpp sampler chain. `kept`: where a step's post-sampling probabilities go, by
    the logit row it sampled (one dict for all of a request's chains, read by its sequence)."""

    def __init__(self, model: Model, p: SamplerParams, kept: dict[int, Kept] | None = None) -> None:
        chain = C.llama_sampler_chain_init(C.llama_sampler_chain_default_params())
        add = lambda s: C.llama_sampler_chain_add(chain, s)  # noqa: E731
        if p.grammar:
            g = C.llama_sampler_init_grammar(model.vocab, p.grammar.encode("utf-8"), b"root")
            if not g:
                C.llama_sampler_free(chain)
                raise BackendError("llama.cpp refused the grammar" + (f": {last_log_error()}" if last_log_error() else ""))
            add(g)
        biases = [*p.bias, *((t, float("-inf")) for t in p.banned)]
        if biases:
            bias = (C.llama_logit_bias * len(biases))(*[C.llama_logit_bias(t, b) for t, b in biases])
            add(C.llama_sampler_init_logit_bias(model.n_vocab, len(biases), bias))
        if p.repeat_penalty != 1.0 or p.frequency_penalty or p.presence_penalty:
            add(C.llama_sampler_init_penalties(model.n_vocab, p.repeat_last_n, p.repeat_penalty,
                                               p.frequency_penalty, p.presence_penalty))
        version, tau, eta = p.mirostat
        if p.temperature <= 0:
            add(C.llama_sampler_init_greedy())
        elif version:  # llama.cpp's order: the temperature, then Mirostat draws (no top-k/p, min-p)
            add(C.llama_sampler_init_temp(p.temperature))
            add(C.llama_sampler_init_mirostat(model.n_vocab, p.seed & 0xFFFFFFFF, tau, eta, 100) if version == 1
                else C.llama_sampler_init_mirostat_v2(p.seed & 0xFFFFFFFF, tau, eta))
        else:
            if p.top_k > 0:
                add(C.llama_sampler_init_top_k(p.top_k))
            if p.typical_p < 1.0:
                add(C.llama_sampler_init_typical(p.typical_p, 1))
            if p.top_p < 1.0:
                add(C.llama_sampler_init_top_p(p.top_p, 1))
            if p.min_p > 0:
                add(C.llama_sampler_init_min_p(p.min_p, 1))
            add(C.llama_sampler_init_temp(p.temperature))
            add(C.llama_sampler_init_dist(p.seed & 0xFFFFFFFF))
        self.ptr = chain
        self.n_vocab, self.keep, self.kept = model.n_vocab, p.keep_probs, kept

    def accept(self, token: int) -> None:
        C.llama_sampler_accept(self.ptr, token)

    def sample(self, ctx: Context, idx: int = -1) -> int:
        if not self.keep or self.kept is None:
            return C.llama_sampler_sample(self.ptr, ctx.ptr, idx)
        return self._sample_kept(ctx, idx, self.kept)

    def _sample_kept(self, ctx: Context, idx: int, kept: dict[int, Kept]) -> int:
        """What llama_sampler_sample does (apply the chain to the row's candidates, take the
        selected one, accept it), with the candidates the chain left read before they go: their
        probabilities are the softmax of the logits the chain left them (after its penalties,
        biases, cuts and temperature; greedy leaves the whole vocabulary)."""
        import numpy as np

        row = C.llama_get_logits_ith(ctx.ptr, idx)
        if not row:
            raise BackendError(f"no logits for batch row {idx}")
        cells = np.empty(self.n_vocab, dtype=[("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])
        cells["id"] = np.arange(self.n_vocab, dtype=np.int32)
        cells["logit"] = np.ctypeslib.as_array(row, shape=(self.n_vocab,))
        cells["p"] = 0.0
        arr = C.llama_token_data_array(cells.ctypes.data_as(ctypes.POINTER(C.llama_token_data)), self.n_vocab, -1, False)
        C.llama_sampler_apply(self.ptr, ctypes.byref(arr))
        if not 0 <= arr.selected < arr.size:
            raise BackendError("llama.cpp's sampler chain selected no token")
        size = arr.size * ctypes.sizeof(C.llama_token_data)
        left = np.ctypeslib.as_array(ctypes.cast(arr.data, ctypes.POINTER(ctypes.c_byte)), shape=(size,))
        left = left.view(cells.dtype)
        token = int(left["id"][arr.selected])
        z = left["logit"].astype(np.float64)
        z = np.exp(z - z[np.isfinite(z)].max())  # the selected token's logit is finite
        probs = z / z.sum()
        best = np.argsort(-probs, kind="stable")[:self.keep]
        kept[idx] = (float(probs[arr.selected]), tuple((int(left["id"][i]), float(probs[i])) for i in best))
        C.llama_sampler_accept(self.ptr, token)
        return token

    def close(self) -> None:
        if self.ptr:
            C.llama_sampler_free(self.ptr)
            self.ptr = None
