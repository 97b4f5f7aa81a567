"""KV states of prompt prefixes on disk, so a later process skips their prefill.

An entry is the KV state of one token prefix (`llama_state_seq_save_file`) plus a JSON
record: its tokens, the sha256 of the state file, sizes and times. Entries live under a
fingerprint of everything that shapes the KV contents (the model file's sha256, context
size, KV types, flash attention, rope settings, the llama.cpp build), so a state is never
loaded into a context it was not made for. Writes are atomic (temporary name, then
rename; the record last); an entry whose file is missing, truncated or altered is removed,
never loaded. Least-recently-used entries are evicted past a size cap.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

_CHUNK = 1 << 20


def fingerprint(parts: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


def tokens_key(tokens: list[int]) -> str:
    h = hashlib.sha256()
    h.update(len(tokens).to_bytes(8, "little"))
    for t in tokens:
        h.update(t.to_bytes(4, "little", signed=True))
    return h.hexdigest()[:32]


@dataclass
class Entry:
    fingerprint: str
    key: str
    tokens: list[int]
    size: int
    sha256: str
    created: float
    last_used: float
    dir: Path

    @property
    def state_path(self) -> Path:
        return self.dir / f"{self.key}.state"

    @property
    def record_path(self) -> Path:
        return self.dir / f"{self.key}.json"

    def record(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "size": self.size, "sha256": self.sha256,
                "created": self.created, "last_used": self.last_used}


class PromptCache:
    def __init__(self, root: Path, max_bytes: int, min_tokens: int = 256) -> None:
        self.root = Path(root)
        self.max_bytes = max_bytes
        self.min_tokens = min_tokens

    # -- reading -----------------------------------------------------------------------------
    def _read(self, record: Path) -> Entry | None:
        try:
            data = json.loads(record.read_text())
            tokens = data["tokens"]
            if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
                raise ValueError("tokens")
            entry = Entry(record.parent.name, record.stem, tokens, int(data["size"]), str(data["sha256"]),
                          float(data["created"]), float(data["last_used"]), record.parent)
        except (OSError, ValueError, KeyError, TypeError):
            self._remove_files(record.parent / f"{record.stem}.state", record)
            return None
        if entry.key != tokens_key(entry.tokens):
            self.remove(entry)
            return None
        return entry

    def entries(self, fp: str | None = None) -> list[Entry]:
        dirs = [self.root / fp] if fp else (sorted(p for p in self.root.iterdir() if p.is_dir()) if self.root.is_dir() else [])
        out = []
        for d in dirs:
            if d.is_dir():
                out += [e for e in (self._read(r) for r in sorted(d.glob("*.json"))) if e is not None]
        return out

    def lookup(self, fp: str, prompt: list[int]) -> list[Entry]:
        """Every saved prefix of `prompt`, longest first: when the best turns out damaged
        (removed by `verify`) or refused by llama.cpp, the caller tries the next."""
        found = [e for e in self.entries(fp) if len(e.tokens) <= len(prompt) and prompt[:len(e.tokens)] == e.tokens]
        return sorted(found, key=lambda e: len(e.tokens), reverse=True)

    def verify(self, entry: Entry) -> bool:
        """The state file is whole and unaltered; a bad entry is removed."""
        try:
            if entry.state_path.stat().st_size != entry.size:
                raise OSError("size")
            h = hashlib.sha256()
            with open(entry.state_path, "rb") as fh:
                while chunk := fh.read(_CHUNK):
                    h.update(chunk)
            if h.hexdigest() != entry.sha256:
                raise OSError("checksum")
        except OSError:
            self.remove(entry)
            return False
        return True

    def touch(self, entry: Entry) -> None:
        entry.last_used = time.time()
        self._write_record(entry)

    # -- writing -----------------------------------------------------------------------------
    def has(self, fp: str, tokens: list[int]) -> bool:
        return (self.root / fp / f"{tokens_key(tokens)}.json").exists()

    def put(self, fp: str, tokens: list[int], write_state: Callable[[Path], int]) -> Entry | None:
        """Save a prefix's state through `write_state(path) -> bytes written`; None if it fails."""
        d = self.root / fp
        d.mkdir(parents=True, exist_ok=True)
        key = tokens_key(tokens)
        tmp = d / f".{key}.{os.getpid()}.state.tmp"
        try:
            if write_state(tmp) <= 0:
                return None
            h = hashlib.sha256()
            with open(tmp, "rb") as fh:
                while chunk := fh.read(_CHUNK):
                    h.update(chunk)
                os.fsync(fh.fileno())
            now = time.time()
            entry = Entry(fp, key, list(tokens), tmp.stat().st_size, h.hexdigest(), now, now, d)
            os.replace(tmp, entry.state_path)
            self._write_record(entry)  # the record last: without it the state is never read
        finally:
            tmp.unlink(missing_ok=True)
        self.evict()
        return entry

    def _write_record(self, entry: Entry) -> None:
        from tallow.common.files import write_atomic

        write_atomic(entry.record_path, json.dumps(entry.record()).encode())

    def evict(self) -> list[Entry]:
        """Remove least-recently-used entries until the cache fits its cap."""
        entries = sorted(self.entries(), key=lambda e: e.last_used)
        total = sum(e.size for e in entries)
        gone = []
        while entries and total > self.max_bytes:
            e = entries.pop(0)
            self.remove(e)
            total -= e.size
            gone.append(e)
        return gone

    def remove(self, entry: Entry) -> None:
        self._remove_files(entry.state_path, entry.record_path)

    @staticmethod
    def _remove_files(*paths: Path) -> None:
        for p in paths:
            p.unlink(missing_ok=True)

    def clear(self) -> tuple[int, int]:
        entries = self.entries()
        for e in entries:
            self.remove(e)
        return len(entries), sum(e.size for e in entries)

    def stats(self) -> dict[str, Any]:
        entries = self.entries()
        return {"entries": len(entries), "bytes": sum(e.size for e in entries), "max_bytes": self.max_bytes,
                "min_tokens": self.min_tokens, "tokens": sum(len(e.tokens) for e in entries),
                "fingerprints": len({e.fingerprint for e in entries}), "path": str(self.root)}
