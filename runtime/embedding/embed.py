"""Embeddings and rerank scores: many inputs packed into each llama_decode as separate
sequences, pooled by llama.cpp (docs/DESIGN.md, "Embeddings").

An Embedder wraps an Engine loaded with `LoadSettings.embeddings`. Inputs are token lists;
each must fit one sequence (the model's trained length, and the batch), or is cut to fit
only when the caller says so. Vectors come back as float32 numpy arrays.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator

from tallow.common.errors import TallowError
from tallow.models.convert.bert_import import POOLING
from tallow.models.convert.bert_import import POOLING_NAMES as NAMES


class InputTooLong(TallowError):
    def __init__(self, index: int, n_tokens: int, limit: int) -> None:
        super().__init__(f"input {index} is {n_tokens} tokens; this model takes at most {limit}",
                         "shorten it, or ask to truncate (--truncate; the API's truncate field)")
        self.index, self.n_tokens, self.limit = index, n_tokens, limit


@dataclass(frozen=True)
class Shaping:
    """What happens to a pooled vector before it is returned."""

    normalize: bool = True  # to unit length (L2)
    dimensions: int | None = None  # keep the first N (Matryoshka), then normalize again


def declared_pooling(paths) -> str | None:
    """The pooling a GGUF declares (an embedding model or a reranker), or None (a chat model)."""
    from tallow.models.convert.bert_import import pooling_name
    from tallow.models.gguf_file import read_gguf

    return pooling_name(read_gguf(paths[0] if isinstance(paths, list) else paths).metadata)


def open_embedder(path, settings, max_seqs: int = 64) -> "Embedder":
    """Load `path` for embeddings: a context of `settings.n_batch` tokens holding up to
    `max_seqs` inputs at once (llama.cpp needs a whole non-causal batch in one ubatch)."""
    from dataclasses import replace

    from tallow.runtime.engine import Engine

    engine = Engine(path, replace(settings, embeddings=True, n_seq_max=max_seqs, n_ctx=settings.n_batch,
                                  kv_unified=True))
    try:
        return Embedder(engine, max_seqs)
    except BaseException:
        engine.close()
        raise


class SideContext:
    """An embedding context on an engine's loaded weights, for a chat model's embeddings in
    serve: the Engine's interface as the Embedder uses it (model, ctx, n_batch, pace)."""

    def __init__(self, engine, n_batch: int, max_seqs: int, pooling: str = "mean") -> None:
        from tallow.runtime import backend
        from tallow.runtime.types import ContextParams

        self.engine, self.model, self.path = engine, engine.model, engine.path
        self.ctx = backend.Context(engine.model, ContextParams(
            n_ctx=n_batch, n_batch=n_batch, n_ubatch=n_batch, n_threads=engine.n_threads, flash_attn="on",
            n_seq_max=max_seqs, kv_unified=True, embeddings=True, pooling=POOLING[pooling]))
        self.n_batch, self.n_ctx = self.ctx.n_batch, self.ctx.n_ctx

    def pace(self) -> None:
        self.ctx.set_threads(self.engine.n_threads)  # as many as the generating context has now

    def close(self) -> None:
        self.ctx.close()  # the weights stay: they are the engine's


def side_embedder(engine, n_batch: int = 512, max_seqs: int = 16) -> "Embedder":
    return Embedder(SideContext(engine, n_batch, max_seqs), max_seqs)


class Embedder:
    def __init__(self, engine, max_seqs: int) -> None:
        self.engine = engine
        ctx, model = engine.ctx, engine.model
        if ctx.pooling is None or ctx.pooling not in NAMES or NAMES[ctx.pooling] == "none":
            raise TallowError(f"{engine.path.name} has no pooling to make one vector per input",
                              "choose one with --pooling mean|cls|last")
        self.pooling = NAMES[ctx.pooling]
        self.ranks = self.pooling == "rank"
        self.width = model.n_cls_out if self.ranks else model.n_embd
        self.max_tokens = min(model.n_ctx_train or ctx.n_batch, ctx.n_batch)  # one input
        self.max_seqs = max_seqs

    # -- tokens -------------------------------------------------------------------------
    def tokens(self, text: str) -> list[int]:
        return self.engine.model.tokenize(text, add_special=True, parse_special=False)

    def pair(self, query: str, document: str) -> list[int]:
        """A query and a document as one input, the way a cross-encoder was trained on them:
        [CLS] query [SEP] document [SEP] for BERT."""
        model = self.engine.model
        doc = model.tokenize(document, add_special=True, parse_special=False)
        if model.add_bos and doc and doc[0] == model.bos:
            doc = doc[1:]
        return self.tokens(query) + doc

    def fit(self, tokens: list[int], index: int, truncate: bool) -> list[int]:
        """`tokens` if they fit one sequence; cut to fit (keeping a closing separator) when
        `truncate`; else InputTooLong naming the counts."""
        if not tokens:
            raise TallowError(f"input {index} is empty", "every input needs at least one token")
        if len(tokens) <= self.max_tokens:
            return tokens
        if not truncate:
            raise InputTooLong(index, len(tokens), self.max_tokens)
        sep = self.engine.model.sep
        if sep >= 0 and tokens[-1] == sep:
            return tokens[: self.max_tokens - 1] + [sep]
        return tokens[: self.max_tokens]

    # -- decoding -----------------------------------------------------------------------
    def groups(self, inputs: list[list[int]]) -> Iterator[list[list[int]]]:
        """Consecutive inputs, as many per decode as the batch and the sequences allow."""
        group: list[list[int]] = []
        used = 0
        for toks in inputs:
            if group and (used + len(toks) > self.engine.n_batch or len(group) == self.max_seqs):
                yield group
                group, used = [], 0
            group.append(toks)
            used += len(toks)
        if group:
            yield group

    def decode(self, group: list[list[int]]) -> list:
        """One llama_decode for a group of inputs; their pooled vectors (or scores), raw."""
        ctx = self.engine.ctx
        ctx.clear()  # a causal model keeps KV cells; an encoder has none
        self.engine.pace()
        ctx.decode_batch([(t, p, s, True) for s, toks in enumerate(group) for p, t in enumerate(toks)])
        return [ctx.pooled(s, self.width) for s in range(len(group))]

    def raw(self, inputs: list[list[int]]) -> list:
        out: list = []
        for group in self.groups(inputs):
            out += self.decode(group)
        return out

    def vectors(self, inputs: Iterable[list[int]], shaping: Shaping) -> Iterator:
        """Shaped vectors of `inputs` (already fitted), in order; streams group by group."""
        pending: list[list[int]] = []
        for toks in inputs:
            pending.append(toks)
            if len(pending) >= self.max_seqs:
                yield from (shape(v, shaping) for v in self.raw(pending))
                pending = []
        if pending:
            yield from (shape(v, shaping) for v in self.raw(pending))

    def close(self) -> None:
        self.engine.close()

    def check_dimensions(self, dimensions: int | None) -> None:
        if dimensions is not None and not 1 <= dimensions <= self.width:
            raise TallowError(f"dimensions must be between 1 and {self.width} for this model, not {dimensions}")
        if dimensions is not None and self.ranks:
            raise TallowError("dimensions apply to embeddings; this model scores pairs (pooling rank)")


def shape(vector, shaping: Shaping):
    """Truncate (Matryoshka) and normalize one vector; float32."""
    import numpy as np

    v = np.asarray(vector, dtype=np.float32)
    if shaping.dimensions is not None:
        v = v[: shaping.dimensions]
    if shaping.normalize:
        norm = float(np.linalg.norm(v))
        if norm > 0:
            v = v / norm
    return v


def relevance(score: float) -> float:
    """A cross-encoder's logit as a relevance in (0, 1): the logistic function, as
    sentence-transformers' CrossEncoder applies to a one-label model."""
    import math

    return 1.0 / (1.0 + math.exp(-score)) if score > -700 else 0.0


def cosine(a, b) -> float:
    import numpy as np

    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    return float(np.dot(a, b) / (na * nb)) if na and nb else 0.0
