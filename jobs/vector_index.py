"""A vector index in one SQLite file: texts and their embeddings, searched by cosine.

Brute force with numpy, in chunks (memory stays bounded whatever the size): exact, and at
this scale fast enough (docs/DESIGN.md, "Embeddings", gives the measured rate and the size
past which an approximate index such as HNSW would be needed). The file records which model,
pooling, dimensions and normalization made its vectors, and refuses vectors made otherwise.
"""

from __future__ import annotations

import hashlib
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from tallow.common.errors import TallowError

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS items (
    id INTEGER PRIMARY KEY,
    digest BLOB NOT NULL UNIQUE,  -- sha256 of the text: a text is stored once
    text TEXT NOT NULL,
    vector BLOB NOT NULL          -- float32, little-endian
);
"""
_CHUNK = 8192  # rows scored at a time


@dataclass(frozen=True)
class Hit:
    id: int
    score: float
    text: str


def digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8")).digest()


class VectorIndex:
    def __init__(self, path: Path, create: bool = False) -> None:
        self.path = Path(path)
        if not create and not self.path.is_file():
            raise TallowError(f"{path} is not an index", "make one with: tallow embed MODEL --index FILE")
        try:
            self.db = sqlite3.connect(str(self.path), check_same_thread=False)
            self.db.executescript(_SCHEMA)
            self.meta = dict(self.db.execute("SELECT key, value FROM meta"))
        except sqlite3.DatabaseError as exc:
            raise TallowError(f"{path} is not a tallow index: {exc}") from exc
        if not create and not self.meta:
            raise TallowError(f"{path} holds no vectors yet", "add some with: tallow embed MODEL --index FILE")

    def bind(self, meta: dict[str, str]) -> None:
        """Record what makes the vectors (model, pooling, dimensions, normalized), or check
        that it is what made the ones already there."""
        if not self.meta:
            with self.db:
                self.db.executemany("INSERT INTO meta VALUES (?, ?)", sorted(meta.items()))
            self.meta = dict(meta)
            return
        differ = [f"{k} {self.meta.get(k)} (now {v})" for k, v in meta.items() if self.meta.get(k) != v]
        if differ:
            raise TallowError(f"{self.path} holds vectors made with " + ", ".join(differ),
                              "use the same model and options, or a new index file")

    def has(self, text: str) -> bool:
        return self.db.execute("SELECT 1 FROM items WHERE digest = ?", (digest(text),)).fetchone() is not None

    def add(self, rows: list[tuple[str, object]]) -> None:
        """Store (text, vector) rows in one transaction."""
        import numpy as np

        with self.db:
            self.db.executemany("INSERT OR IGNORE INTO items (digest, text, vector) VALUES (?, ?, ?)",
                                [(digest(t), t, np.asarray(v, dtype="<f4").tobytes()) for t, v in rows])

    def count(self) -> int:
        return self.db.execute("SELECT COUNT(*) FROM items").fetchone()[0]

    def _chunks(self) -> Iterator[tuple[list[int], Any]]:
        import numpy as np

        dims = int(self.meta["dimensions"])
        last = 0
        while True:
            rows = self.db.execute("SELECT id, vector FROM items WHERE id > ? ORDER BY id LIMIT ?",
                                   (last, _CHUNK)).fetchall()
            if not rows:
                return
            last = rows[-1][0]
            yield [r[0] for r in rows], np.frombuffer(b"".join(r[1] for r in rows), dtype="<f4").reshape(len(rows), dims)

    def search(self, query, n: int) -> list[Hit]:
        """The `n` stored texts nearest to `query` by cosine, best first."""
        import numpy as np

        q = np.asarray(query, dtype=np.float32)
        q = q / (np.linalg.norm(q) or 1.0)
        best_ids: list[int] = []
        best: np.ndarray = np.empty(0, dtype=np.float32)
        for ids, mat in self._chunks():
            norms = np.linalg.norm(mat, axis=1)
            scores = mat @ q / np.where(norms > 0, norms, 1.0)
            best = np.concatenate([best, scores])
            best_ids += ids
            if len(best) > n:
                keep = np.argpartition(-best, n - 1)[:n]
                best, best_ids = best[keep], [best_ids[i] for i in keep]
        order = np.argsort(-best, kind="stable")
        hits = []
        for i in order[:n]:
            text = self.db.execute("SELECT text FROM items WHERE id = ?", (best_ids[i],)).fetchone()[0]
            hits.append(Hit(best_ids[i], float(best[i]), text))
        return hits

    def close(self) -> None:
        self.db.close()
