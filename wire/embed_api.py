"""Embedding and rerank routes: OpenAI's /v1/embeddings, Ollama's /api/embed (and the older
/api/embeddings), and /v1/rerank (llama.cpp's and Jina's shape), over the embedding
scheduler (runtime/embedding/embed_scheduler.py). A runner whose model pools (an encoder, a
reranker) serves these; a chat model's runner answers them with a 400 that says why
(docs/DESIGN.md, "Embeddings").
"""

from __future__ import annotations

import base64
import time
from typing import Any

from tallow.runtime.embedding.embed import Shaping, cosine, relevance, shape
from tallow.runtime.embedding.intake import EmbedAsk, EmbedRequest
from tallow.wire.fields import APIError, check_fields, flag, number

MAX_INPUTS = 2048  # per request (OpenAI's limit)


def _texts_or_tokens(value: Any, name: str) -> tuple[list[str] | None, list[list[int]] | None]:
    """OpenAI's `input`: a string, strings, a token array, or token arrays."""
    if isinstance(value, str):
        return [value], None
    if not isinstance(value, list) or not value:
        raise APIError(f"'{name}' must be a string, an array of strings, or token arrays, and not empty", param=name)
    if len(value) > MAX_INPUTS:
        raise APIError(f"'{name}' has {len(value)} items; at most {MAX_INPUTS} per request", param=name)
    if all(isinstance(v, str) for v in value):
        return list(value), None
    if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        value = [value]
    if not all(isinstance(v, list) and v for v in value):
        raise APIError(f"'{name}' mixes kinds: give strings, or arrays of token ids", param=name)
    for i, arr in enumerate(value):
        for t in arr:
            if isinstance(t, bool) or not isinstance(t, int) or t < 0:
                raise APIError(f"'{name}[{i}]' holds {t!r}, not a token id", param=name)
    return None, [list(v) for v in value]  # each id below the vocabulary's size: runtime/embedding/intake.py


def _texts(texts: list[str], name: str) -> list[str]:
    for i, t in enumerate(texts):
        if not t.strip():
            raise APIError(f"'{name}[{i}]' is empty: every input needs some text", param=name)
    return texts


def parse_openai(body: dict) -> EmbedAsk:
    check_fields(body, {"model", "input", "encoding_format", "dimensions", "truncate"}, "/v1/embeddings")
    fmt = body.get("encoding_format") or "float"
    if fmt not in ("float", "base64"):
        raise APIError(f"'encoding_format' must be float or base64, not {fmt!r}", param="encoding_format")
    if "input" not in body:
        raise APIError("'input' is required", param="input")
    texts, tokens = _texts_or_tokens(body["input"], "input")
    dims = number(body, "dimensions", 1, 1 << 20, None, integer=True)
    return EmbedAsk("input", _texts(texts, "input") if texts is not None else None, tokens, flag(body, "truncate"),
                    Shaping(True, dims), base64=fmt == "base64")


def parse_ollama(body: dict, legacy: bool) -> EmbedAsk:
    """/api/embed: `input` text or texts, `truncate` (default true, as Ollama); the older
    /api/embeddings: one `prompt`, its vector not normalized (as Ollama returns it)."""
    key = "prompt" if legacy else "input"
    check_fields(body, {"model", key, "truncate", "dimensions", "keep_alive", "options"},
                 "/api/embeddings" if legacy else "/api/embed")
    opts = body.get("options") or {}
    if not isinstance(opts, dict):
        raise APIError("'options' must be an object", param="options")
    if opts:
        raise APIError(f"the option '{sorted(opts)[0]}' is not supported for embeddings (a model's embedding "
                       "settings are fixed when it loads)", param=f"options.{sorted(opts)[0]}")
    value = body.get(key)
    if legacy and not isinstance(value, str):
        raise APIError("'prompt' must be a string", param="prompt")
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise APIError(f"'{key}' must be a string or a non-empty array of strings", param=key)
    if len(texts) > MAX_INPUTS:
        raise APIError(f"'{key}' has {len(texts)} items; at most {MAX_INPUTS} per request", param=key)
    truncate = body.get("truncate", True)
    if not isinstance(truncate, bool):
        raise APIError("'truncate' must be true or false", param="truncate")
    dims = number(body, "dimensions", 1, 1 << 20, None, integer=True)
    return EmbedAsk(key, _texts(texts, key), None, truncate, Shaping(not legacy, dims))


def parse_rerank(body: dict) -> tuple[EmbedAsk, int, bool]:
    """(the query and documents, how many results, whether they carry their documents)."""
    check_fields(body, {"model", "query", "documents", "top_n", "return_documents", "truncate"}, "/v1/rerank")
    query = body.get("query")
    if not isinstance(query, str) or not query.strip():
        raise APIError("'query' must be a non-empty string", param="query")
    docs = body.get("documents")
    if not isinstance(docs, list) or not docs:
        raise APIError("'documents' must be a non-empty array", param="documents")
    if len(docs) > MAX_INPUTS:
        raise APIError(f"'documents' has {len(docs)} items; at most {MAX_INPUTS} per request", param="documents")
    texts = []
    for i, d in enumerate(docs):
        text = d.get("text") if isinstance(d, dict) else d
        if not isinstance(text, str):
            raise APIError(f"'documents[{i}]' must be a string or an object with a 'text' string", param="documents")
        texts.append(text)
    top_n = number(body, "top_n", 1, 1 << 20, len(texts), integer=True)
    ask = EmbedAsk("documents", _texts(texts, "documents"), None, flag(body, "truncate"), Shaping(True, None),
                   query=query)
    return ask, top_n, flag(body, "return_documents")


def openai_answer(model: str, req: EmbedRequest, vectors: list) -> dict[str, Any]:
    import numpy as np

    data = []
    for i, raw in enumerate(vectors):
        v = shape(raw, req.shaping)
        emb: Any = base64.b64encode(np.asarray(v, dtype="<f4").tobytes()).decode() if req.base64 else v.tolist()
        data.append({"object": "embedding", "index": i, "embedding": emb})
    n = sum(len(t) for t in req.inputs)
    return {"object": "list", "data": data, "model": model, "usage": {"prompt_tokens": n, "total_tokens": n}}


def ollama_answer(model: str, req: EmbedRequest, vectors: list, legacy: bool, started: float,
                  load_ms: float) -> dict[str, Any]:
    vecs = [shape(v, req.shaping).tolist() for v in vectors]
    if legacy:
        return {"embedding": vecs[0]}
    return {"model": model, "embeddings": vecs, "total_duration": int((time.perf_counter() - started) * 1e9),
            "load_duration": int(load_ms * 1e6), "prompt_eval_count": sum(len(t) for t in req.inputs)}


def rerank_answer(model: str, ranks: bool, texts: list[str], req: EmbedRequest, vectors: list, top_n: int,
                  with_docs: bool) -> dict[str, Any]:
    """Results best first: a reranker's score through the logistic function, or with an
    embedding model the cosine of query and document (`scoring` says which)."""
    if ranks:
        scores = [relevance(float(v[0])) for v in vectors]
    else:
        q = vectors[0]
        scores = [cosine(q, d) for d in vectors[1:]]
    order = sorted(range(len(texts)), key=lambda i: -scores[i])[:top_n]
    results = [{"index": i, "relevance_score": scores[i], **({"document": {"text": texts[i]}} if with_docs else {})}
               for i in order]
    n = sum(len(t) for t in req.inputs)
    return {"object": "list", "model": model, "scoring": "cross-encoder" if ranks else "cosine",
            "results": results, "usage": {"prompt_tokens": n, "total_tokens": n}}
