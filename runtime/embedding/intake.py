"""An embedding or rerank request as the APIs' parsers check it (`EmbedAsk`: texts or token
ids, how to shape the vectors), and the one place it meets the model (`embed_request`):
the texts tokenized, the ids checked against the vocabulary, each input fitted to the
context (or cut, when asked), the dimensions checked against the model's width. The
parsers (wire/embed_api.py) only translate bodies, as runtime/intake.py does for answers."""

from __future__ import annotations

from dataclasses import dataclass

from tallow.common.errors import APIError, TallowError
from tallow.runtime.embedding.embed import Shaping


@dataclass(frozen=True)
class EmbedAsk:
    name: str  # the body field the inputs came in (a refusal names it)
    texts: list[str] | None  # given as text
    tokens: list[list[int]] | None  # given as token ids
    truncate: bool  # cut an input too long for the context, rather than refuse it
    shaping: Shaping
    base64: bool = False
    query: str | None = None  # a rerank's query: `texts` are the documents scored against it


@dataclass(frozen=True)
class EmbedRequest:
    inputs: list[list[int]]  # the token ids the scheduler embeds, each fitted to the context
    texts: list[str] | None  # when given as text (rerank returns documents)
    shaping: Shaping
    base64: bool = False


def embed_request(embedder, ask: EmbedAsk) -> EmbedRequest:
    """The scheduler's request for a checked one (runtime/embedding/embed.Embedder)."""
    try:
        embedder.check_dimensions(ask.shaping.dimensions)
    except TallowError as exc:
        raise APIError(exc.message, param="dimensions") from exc
    texts = ask.texts or []
    if ask.query is not None and embedder.ranks:  # a reranker scores each query-document pair
        inputs = _fitted(embedder, [embedder.pair(ask.query, t) for t in texts], ask.truncate, ask.name)
    elif ask.query is not None:  # an embedding model: the query's vector, then each document's
        inputs = _fitted(embedder, [embedder.tokens(ask.query)], ask.truncate, "query") + _fitted(
            embedder, [embedder.tokens(t) for t in texts], ask.truncate, ask.name)
    elif ask.tokens is not None:
        vocab = embedder.engine.model.n_vocab
        for i, ids in enumerate(ask.tokens):
            bad = next((t for t in ids if t >= vocab), None)
            if bad is not None:
                raise APIError(f"'{ask.name}[{i}]' holds {bad!r}, not a token id between 0 and {vocab - 1}",
                               param=ask.name)
        inputs = _fitted(embedder, ask.tokens, ask.truncate, ask.name)
    else:
        inputs = _fitted(embedder, [embedder.tokens(t) for t in texts], ask.truncate, ask.name)
    return EmbedRequest(inputs, ask.texts, ask.shaping, ask.base64)


def _fitted(embedder, tokens: list[list[int]], truncate: bool, name: str) -> list[list[int]]:
    try:
        return [embedder.fit(t, i, truncate) for i, t in enumerate(tokens)]
    except TallowError as exc:
        raise APIError(exc.message, param=name, code="context_length_exceeded"
                       if "at most" in exc.message else None) from exc
