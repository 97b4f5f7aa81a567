"""Embeddings per second: tallow's embedder against a minimal llama.cpp embedding loop, on
all-MiniLM-L6-v2 (converted from its wheel), 1,000 sentences of about 20 tokens, the same
batch size, sequences per decode, threads and weight layout (extra buffers as tallow chose), in one run, in paired, alternating rounds
(tests/benchmarks/paired.py).

    python tests/benchmarks/embed.py [--model PATH] [--reps 7] [--batch 512] [--threads 2]

The minimal loop is what llama.cpp's embedding example does, written straight on the
bindings: fill a batch with as many whole sentences as fit (each its own sequence, every
token an output), llama_decode, read each sequence's pooled vector, normalize. tallow's side
is runtime/embedding/embed.py's Embedder (tokenizing, fitting, packing, pacing threads, shaping).
Target: tallow >= 0.95x the loop's embeddings/s, and the two sides' vectors alike (cosine >
0.9999). Exits 1 when missed, 3 when the machine was too noisy to say.
Also reported, when sentence-transformers (and torch) can be imported: its encode() rate
on the same sentences with the same model (information only).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TARGET = 0.95
WORDS = ("the a river city market bank model token cat dog bird ran sat fell rose quickly slowly under over near "
         "small large green blue old new morning evening train station bread water music report").split()


def sentences(n: int = 1000) -> list[str]:
    rng = np.random.default_rng(11)
    return [" ".join(rng.choice(WORDS, size=17)).capitalize() + "." for _ in range(n)]


def minilm() -> Path:
    from helpers.processes import shared_home

    from tallow.cli.pipconfig import index_urls
    from tallow.models.catalog import ALL_MINILM_L6_V2
    from tallow.models.pull import PullOptions
    from tallow.models.resolve import find_or_pull
    from tallow.models.store import Store

    return find_or_pull(ALL_MINILM_L6_V2.name, Store(shared_home() / "models"), PullOptions(index_urls=index_urls)).path


class BareLoop:
    """llama.cpp's embedding loop on the low-level bindings, nothing else."""

    def __init__(self, path: Path, n_batch: int, n_seq: int, threads: int, extra_buffers: bool) -> None:
        import llama_cpp.llama_cpp as C

        from tallow.runtime import backend

        self.C = C
        backend.init()  # the same library, initialised once; its log callback keeps llama.cpp quiet
        mp = C.llama_model_default_params()
        mp.use_extra_bufts = extra_buffers  # the weights' layout tallow chose: the same kernels on both sides
        self.model = C.llama_model_load_from_file(str(path).encode(), mp)
        p = C.llama_context_default_params()
        p.n_ctx = p.n_batch = p.n_ubatch = n_batch
        p.n_seq_max, p.n_threads, p.n_threads_batch = n_seq, threads, threads
        p.embeddings = True
        p.kv_unified = True
        self.ctx = C.llama_init_from_model(self.model, p)
        self.vocab = C.llama_model_get_vocab(self.model)
        self.n_embd = C.llama_model_n_embd(self.model)
        self.batch = C.llama_batch_init(n_batch, 0, n_seq)
        self.n_batch, self.n_seq = n_batch, n_seq

    def tokenize(self, text: str) -> list[int]:
        data = text.encode()
        arr = (self.C.llama_token * (len(data) + 8))()
        n = self.C.llama_tokenize(self.vocab, data, len(data), arr, len(arr), True, False)
        return list(arr[:n])

    def run(self, texts: list[str]) -> np.ndarray:
        C, b = self.C, self.batch
        out, group, used = [], [], 0

        def flush() -> None:
            b.n_tokens = 0
            for s, toks in enumerate(group):
                for pos, t in enumerate(toks):
                    i = b.n_tokens
                    b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = t, pos, 1, True
                    b.seq_id[i][0] = s
                    b.n_tokens += 1
            C.llama_memory_clear(C.llama_get_memory(self.ctx), True)
            assert C.llama_decode(self.ctx, b) == 0
            for s in range(len(group)):
                v = np.ctypeslib.as_array(C.llama_get_embeddings_seq(self.ctx, s), shape=(self.n_embd,)).copy()
                out.append(v / np.linalg.norm(v))

        for text in texts:
            toks = self.tokenize(text)
            if group and (used + len(toks) > self.n_batch or len(group) == self.n_seq):
                flush()
                group, used = [], 0
            group.append(toks)
            used += len(toks)
        if group:
            flush()
        return np.stack(out)

    def close(self) -> None:
        self.C.llama_batch_free(self.batch)
        self.C.llama_free(self.ctx)
        self.C.llama_model_free(self.model)


def tallow_embedder(path: Path, n_batch: int, n_seq: int, threads: int):
    from tallow.runtime.embedding.embed import Shaping, open_embedder
    from tallow.runtime.types import LoadSettings

    e = open_embedder(path, LoadSettings(n_batch=n_batch, n_threads=threads), max_seqs=n_seq)

    def run(texts: list[str]) -> np.ndarray:
        return np.stack(list(e.vectors([e.fit(e.tokens(t), i, False) for i, t in enumerate(texts)], Shaping())))

    return e, run


def rate(fn, texts: list[str]) -> tuple[float, np.ndarray]:
    started = time.perf_counter()
    vectors = fn(texts)
    return len(texts) / (time.perf_counter() - started), vectors


def sentence_transformers_rate(folder: Path | None, texts: list[str], threads: int) -> str:
    try:
        import torch
        from sentence_transformers import SentenceTransformer
    except ImportError:
        return "not installed (optional)"
    if folder is None:
        return "no model folder given (--st-folder)"
    torch.set_num_threads(threads)
    model = SentenceTransformer(str(folder), device="cpu")
    model.encode(texts[:32])
    started = time.perf_counter()
    model.encode(texts, batch_size=64, normalize_embeddings=True)
    return f"{len(texts) / (time.perf_counter() - started):.1f} embeddings/s"


def main() -> int:
    from benchmarks.paired import Comparison, compare, exit_code

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, help="a BERT GGUF [default: all-minilm:l6-v2 in the test home]")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--seqs", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--st-folder", type=Path, help="the Hugging Face folder, for sentence-transformers' figure")
    args = ap.parse_args()
    path = args.model or minilm()
    texts = sentences()
    embedder, ours = tallow_embedder(path, args.batch, args.seqs, args.threads)
    bare = BareLoop(path, args.batch, args.seqs, args.threads, embedder.engine.extra_buffers)
    n_tokens = sum(len(bare.tokenize(t)) for t in texts)
    print(f"{path.name}: {len(texts)} sentences, {n_tokens / len(texts):.1f} tokens each, batch {args.batch}, "
          f"{args.seqs} sequences per decode, {args.threads} threads")
    vectors = {}

    def measure(arm: str) -> float:
        r, vectors[arm] = rate(ours if arm == "subject" else bare.run, texts)
        return r

    verdict = compare(Comparison("embeddings/s, tallow / minimal loop", measure, TARGET, False, args.reps,
                                 unit=" embeddings/s"))
    agree = float(np.min(np.sum(vectors["reference"] * vectors["subject"], axis=1)))
    bare.close()
    embedder.close()
    print(f"lowest cosine between the two sides' vectors: {agree:.6f}")
    print(f"sentence-transformers   {sentence_transformers_rate(args.st_folder, texts, args.threads)}")
    return exit_code([verdict]) or (0 if agree > 0.9999 else 1)

if __name__ == "__main__":
    sys.exit(main())
