"""A remote server's /v1/embeddings in the place of a local Embedder (runtime/embedding/embed.py), for
`tallow embed --endpoint` and `tallow search` of an index it made.

It has the part of the Embedder that jobs/embed_run.py uses: inputs go to the server as
texts, `max_seqs * 4` to a request (the run's chunk), and the vectors come back shaped as
local ones are (cut to `dimensions`, normalized here, so --no-normalize and --dimensions
mean the same). The server decides what too long means; tokens are counted from its usage.
"""

from __future__ import annotations

import base64
from typing import Iterable, Iterator

from tallow.client.endpoint import Endpoint, RemoteError
from tallow.common.errors import TallowError
from tallow.runtime.embedding.embed import Shaping, shape

PER_REQUEST = 64


class RemoteEmbedder:
    ranks = False
    pooling = "remote"  # the server's own

    def __init__(self, endpoint: Endpoint, model: str, timeout: float = 600.0) -> None:
        self.endpoint, self.model, self.timeout = endpoint, model, timeout
        self.max_seqs = PER_REQUEST // 4  # run_embed sends four groups' worth at a time
        self.prompt_tokens: int | None = 0  # None once an answer did not report them
        self.width = len(self.raw(["tallow"])[0])  # one small request says how wide the vectors are

    def tokens(self, text: str) -> str:
        return text  # the server tokenizes

    def fit(self, text: str, index: int, truncate: bool) -> str:
        return text

    def check_dimensions(self, dimensions: int | None) -> None:
        if dimensions is not None and not 1 <= dimensions <= self.width:
            raise TallowError(f"dimensions must be between 1 and {self.width} for this model, not {dimensions}")

    def raw(self, texts: list[str]) -> list:
        import numpy as np

        resp = self.endpoint.open("/embeddings", {"model": self.model, "input": texts, "encoding_format": "base64"},
                                  self.timeout)
        try:
            import json

            body = json.loads(resp.read())
        except (OSError, ValueError) as exc:
            raise RemoteError(f"{self.endpoint.label}: the embeddings answer is not JSON ({exc})") from None
        finally:
            resp.conn_to_close.close()
        data = sorted(body.get("data") or [], key=lambda d: d.get("index", 0))
        if len(data) != len(texts):
            raise RemoteError(f"{self.endpoint.label} sent {len(data)} embeddings for {len(texts)} inputs")
        usage = body.get("usage") or {}
        if self.prompt_tokens is not None and isinstance(usage.get("prompt_tokens"), int):
            self.prompt_tokens += usage["prompt_tokens"]
        else:
            self.prompt_tokens = None
        out = []
        for d in data:
            emb = d.get("embedding")
            out.append(np.frombuffer(base64.b64decode(emb), dtype="<f4") if isinstance(emb, str)
                       else np.asarray(emb, dtype=np.float32))
        return out

    def vectors(self, inputs: Iterable[str], shaping: Shaping) -> Iterator:
        pending: list[str] = []
        for text in inputs:
            pending.append(text)
            if len(pending) >= PER_REQUEST:
                yield from (shape(v, shaping) for v in self.raw(pending))
                pending = []
        if pending:
            yield from (shape(v, shaping) for v in self.raw(pending))

    def close(self) -> None:
        return None
