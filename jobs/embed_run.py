"""`tallow embed`'s pipeline: texts in (arguments, or one per line from a stream), vectors
out as JSONL, JSON or .npy, or into a vector index; resumable, in bounded memory.

Inputs are read, tokenized and embedded a few groups at a time, so 100,000 lines stream
through without being held. JSONL output is appended line by line and flushed: a rerun
after a kill starts after the last index written. JSON and .npy are written whole to a
temporary file and renamed over the target when done (a rerun starts again).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Callable, Iterable, Iterator

from tallow.common.errors import TallowError
from tallow.runtime.embedding.embed import Embedder, Shaping

FORMATS = ("jsonl", "json", "npy")


@dataclass
class EmbedStats:
    done: int = 0
    skipped: int = 0  # already in the output or the index
    tokens: int = 0
    started: float = field(default_factory=time.perf_counter)

    @property
    def per_s(self) -> float:
        elapsed = time.perf_counter() - self.started
        return self.done / elapsed if elapsed > 0 else 0.0


def numbered_lines(stream) -> Iterator[tuple[int, str]]:
    """(index, text) per line of a binary stream: index counts every line, so it names the
    line; an empty line is passed over (no record); a line that is not UTF-8 stops the run
    with its number (a replacement character would change the vector without a word)."""
    for i, raw in enumerate(stream):
        try:
            text = raw.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError as exc:
            raise TallowError(f"line {i + 1} of the input is not valid UTF-8 (byte {exc.start + 1})",
                              "convert the file to UTF-8 (iconv), or remove that line") from None
        if text.strip():
            yield i, text


def resume_after(out: Path) -> int:
    """The first index a JSONL output does not hold yet (a cut last line removed first)."""
    from tallow.common.files import trim_partial_line

    if not out.exists() or out.stat().st_size == 0:
        return 0
    trim_partial_line(out)
    with open(out, "rb") as f:
        f.seek(max(0, out.stat().st_size - (1 << 20)))
        tail = f.read().splitlines()
    try:
        last = json.loads(tail[-1]) if tail else None
    except ValueError:
        last = None
    if last is not None and not (isinstance(last, dict) and isinstance(last.get("index"), int)):
        raise TallowError(f"{out} is not a tallow embed output (its last line has no index)",
                          "give a new file, or remove this one to start over")
    return last["index"] + 1 if last else 0


class JsonlSink:
    def __init__(self, out, with_text: bool, owned: bool = False) -> None:
        self.out, self.with_text, self.owned = out, with_text, owned

    def add(self, index: int, text: str, vector) -> None:
        record = {"index": index, **({"text": text} if self.with_text else {}), "embedding": vector.tolist()}
        self.out.write(json.dumps(record, ensure_ascii=False) + "\n")

    def flush(self) -> None:
        self.out.flush()

    def finish(self) -> None:
        self.out.flush()

    def close(self) -> None:
        if self.owned:
            self.out.close()

    abandon = close  # every line written is whole: the file is the resume point


class WholeSink:
    """JSON (an array of records) or .npy (a float32 matrix, rows in input order), built in
    a temporary file and moved into place (or copied to stdout) when complete."""

    def __init__(self, fmt: str, target: Path | None, with_text: bool) -> None:
        self.fmt, self.target, self.with_text = fmt, target, with_text
        folder = target.parent if target is not None else None
        fd, name = tempfile.mkstemp(dir=folder, prefix=".tallow-embed-", suffix=".tmp")
        self.tmp = Path(name)
        self.f: BinaryIO = os.fdopen(fd, "wb")
        self.rows = 0
        self.dims: int | None = None
        if fmt == "json":
            self.f.write(b"[")

    def add(self, index: int, text: str, vector) -> None:
        if self.fmt == "npy":
            self.dims = len(vector)
            self.f.write(vector.astype("<f4").tobytes())
        else:
            record = {"index": index, **({"text": text} if self.with_text else {}), "embedding": vector.tolist()}
            self.f.write((b",\n" if self.rows else b"\n") + json.dumps(record, ensure_ascii=False).encode())
        self.rows += 1

    def flush(self) -> None:
        pass

    def finish(self) -> None:
        if self.fmt == "json":
            self.f.write(b"\n]\n")
            self.f.close()
            done = self.tmp
        else:
            self.f.close()
            done = self._npy()
        if self.target is None:
            with open(done, "rb") as src:
                while chunk := src.read(1 << 20):
                    sys.stdout.buffer.write(chunk)
            sys.stdout.buffer.flush()
            done.unlink()
        else:
            os.replace(done, self.target)

    def _npy(self) -> Path:
        import numpy as np

        fd, name = tempfile.mkstemp(dir=self.tmp.parent, prefix=".tallow-embed-", suffix=".npy")
        with os.fdopen(fd, "wb") as out, open(self.tmp, "rb") as rows:
            np.lib.format.write_array_header_1_0(out, {"descr": "<f4", "fortran_order": False,
                                                       "shape": (self.rows, self.dims or 0)})
            while chunk := rows.read(1 << 20):
                out.write(chunk)
        self.tmp.unlink()
        return Path(name)

    def abandon(self) -> None:
        self.f.close()
        self.tmp.unlink(missing_ok=True)

    def close(self) -> None:
        pass  # finish() moved the file into place


class IndexSink:
    def __init__(self, index) -> None:
        self.index, self.rows = index, list[tuple]()

    def add(self, index: int, text: str, vector) -> None:
        self.rows.append((text, vector))

    def flush(self) -> None:
        if self.rows:
            self.index.add(self.rows)
            self.rows = []

    def finish(self) -> None:
        self.flush()

    def close(self) -> None:
        self.index.close()

    abandon = close  # rows are committed a chunk at a time: what is there stays


def open_sink(fmt: str, output: Path | None, index: Path | None, meta: dict[str, str], with_text: bool):
    """(sink, skip) for a run: into the index (skipping texts it holds, after checking
    `meta` against it), appended to a JSONL file (skipping indexes it holds), to stdout,
    or a whole JSON / npy file. Every sink has add, flush, finish, close and abandon."""
    from tallow.jobs.vector_index import VectorIndex

    if index is not None:
        vi = VectorIndex(index, create=True)
        try:
            vi.bind(meta)
        except BaseException:
            vi.close()
            raise
        return IndexSink(vi), (lambda i, t: vi.has(t))
    if fmt != "jsonl":
        return WholeSink(fmt, output, with_text), (lambda i, t: False)
    if output is None:
        return JsonlSink(sys.stdout, with_text), (lambda i, t: False)
    start = resume_after(output)
    try:
        out = open(output, "a", encoding="utf-8", newline="\n")
    except OSError as exc:
        raise TallowError(f"cannot write {output}: {exc.strerror or exc}") from exc
    return JsonlSink(out, with_text, owned=True), (lambda i, t: i < start)


def run_embed(embedder: Embedder, inputs: Iterable[tuple[int, str]], sink, shaping: Shaping, truncate: bool,
              stats: EmbedStats, skip: Callable[[int, str], bool] = lambda i, t: False,
              on_progress: Callable[[EmbedStats], None] = lambda s: None) -> EmbedStats:
    """Embed `inputs` into `sink`, a chunk of groups at a time; what `skip` says is done is
    counted, not embedded. A bad input (too long without `truncate`, not UTF-8) stops the
    run once everything before it is written."""
    chunk_size = embedder.max_seqs * 4
    chunk: list[tuple[int, str, list[int]]] = []

    def drain() -> None:
        vectors = embedder.vectors([toks for _, _, toks in chunk], shaping)
        for (index, text, toks), vec in zip(chunk, vectors):
            sink.add(index, text, vec)
            stats.done += 1
            stats.tokens += len(toks)
        sink.flush()
        chunk.clear()
        on_progress(stats)

    try:
        for index, text in inputs:
            if skip(index, text):
                stats.skipped += 1
                continue
            chunk.append((index, text, embedder.fit(embedder.tokens(text), index, truncate)))
            if len(chunk) >= chunk_size:
                drain()
    except TallowError:  # a bad input: what came before it is written, so a rerun resumes there
        if chunk:
            drain()  # flushes JSONL and the index; a JSON or npy file is abandoned by the caller
        raise
    if chunk:
        drain()
    sink.finish()
    return stats
