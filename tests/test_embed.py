"""Embeddings in the engine and on the command line, on real models through llama.cpp:
all-MiniLM-L6-v2 converted from its wheel (against an independent numpy forward pass) and
tiny random BERTs converted by tallow import."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from helpers.bert_reference import hidden_states, load_weights, mean_embedding, rank_logit, tokenizer
from helpers.processes import run_tallow as run_bytes
from helpers.processes import tallow_env

pytestmark = pytest.mark.slow  # the embedding model, converted, against a numpy reference

pytest.importorskip("tokenizers")
pytest.importorskip("safetensors")

SENTENCES = [
    "The cat sat on the mat.", "A quick brown fox jumps over the lazy dog!", "Tallow runs models locally, offline.",
    "Don't panic: it's only 42.", "The central bank raised interest rates by half a point.",
    "How do I reset my password?", "Photosynthesis converts light into chemical energy.",
    "She sells sea-shells by the sea shore.", "Rain is expected tomorrow afternoon in Paris.",
    "The mitochondria is the powerhouse of the cell.", "Python 3.12 was released in October 2023.",
    "I'd like two coffees and a croissant, please.", "Quantum computers use qubits instead of bits.",
    "The museum opens at 9 a.m. on weekdays.", "Café au lait, naïve résumé, ÉCOLE.",
    "GPUs accelerate matrix multiplication.", "He scored the winning goal in extra time.",
    "Never gonna give you up, never gonna let you down.", "Water boils at 100 degrees Celsius at sea level.",
    "The treaty was signed in 1648, ending the war.",
]

TRIPLES = [  # query, a text that answers it, a text about something else
    ("How do I bake bread at home?", "A simple recipe for homemade bread with flour, yeast and water.",
     "The stock market closed lower on Friday."),
    ("What is the capital of France?", "Paris is the capital and largest city of France.",
     "Penguins live mostly in the Southern Hemisphere."),
    ("symptoms of the flu", "Influenza often causes fever, cough and muscle aches.",
     "The new phone has a larger screen."),
    ("How to change a flat tire", "Loosen the lug nuts, jack up the car and swap in the spare wheel.",
     "Mozart composed more than 600 works."),
    ("best way to learn a language", "Practising conversation daily helps you learn a new language faster.",
     "Volcanoes erupt when magma reaches the surface."),
    ("Why is the sky blue?", "Sunlight is scattered by air molecules, and blue light scatters most.",
     "The recipe needs two cups of sugar."),
    ("train tickets to Berlin", "Book rail tickets to Berlin online or at the station.",
     "Cats sleep for most of the day."),
    ("how do vaccines work", "Vaccines train the immune system to recognise a pathogen.",
     "The football season starts in August."),
    ("cheap flights to Tokyo", "Find low-cost airfare to Tokyo from major airports.",
     "Gardening improves mental health."),
    ("fix a leaking tap", "Replace the worn washer to stop a dripping faucet.",
     "The novel won a literary prize last year."),
]


def _embedder(path: Path, **kw):
    from tallow.runtime.embedding.embed import open_embedder
    from tallow.runtime.types import LoadSettings

    return open_embedder(path, LoadSettings(n_batch=512, n_threads=2, **kw))


@pytest.fixture(scope="module")
def minilm(minilm_model):
    e = _embedder(minilm_model)
    yield e
    e.close()


def test_converted_minilm_matches_a_numpy_forward_pass(minilm, minilm_source):
    """Tokens from llama.cpp equal Hugging Face's tokenizer's; each vector is at cosine >= 0.999
    to mean pooling over a float64 numpy BERT on the original safetensors."""
    from tallow.runtime.embedding.embed import Shaping

    config = json.loads((minilm_source / "config.json").read_text())
    weights, tok = load_weights(minilm_source), tokenizer(minilm_source)
    assert minilm.pooling == "mean" and minilm.width == 384
    inputs = [minilm.tokens(s) for s in SENTENCES]
    for s, ours in zip(SENTENCES, inputs):
        assert ours == tok.encode(s).ids, s
    vectors = list(minilm.vectors(inputs, Shaping()))  # all twenty in one decode
    for s, ids, v in zip(SENTENCES, inputs, vectors):
        ref = mean_embedding(weights, ids, config)
        assert float(v @ ref) >= 0.999, s
        assert abs(float(np.linalg.norm(v)) - 1.0) < 1e-5


def test_the_answer_is_nearer_than_the_distractor(minilm):
    from tallow.runtime.embedding.embed import Shaping

    for query, good, bad in TRIPLES:
        q, g, b = minilm.vectors([minilm.tokens(t) for t in (query, good, bad)], Shaping())
        assert float(q @ g) > float(q @ b) + 0.1, query


def test_batched_equals_alone_and_dimensions_renormalize(minilm):
    from tallow.runtime.embedding.embed import Shaping

    inputs = [minilm.tokens(s) for s in SENTENCES]
    together = list(minilm.vectors(inputs, Shaping()))
    alone = [next(minilm.vectors([t], Shaping())) for t in inputs[:4]]
    for a, b in zip(alone, together):
        assert float(a @ b) > 0.99999
    short = next(minilm.vectors([inputs[0]], Shaping(dimensions=64)))
    assert short.shape == (64,) and abs(float(np.linalg.norm(short)) - 1) < 1e-5
    raw = next(minilm.vectors([inputs[0]], Shaping(normalize=False)))
    assert float(np.linalg.norm(raw)) > 1.5  # MiniLM's pooled vectors are not unit length
    assert np.allclose(raw / np.linalg.norm(raw), together[0], atol=1e-4)


def test_an_input_too_long_is_refused_with_its_counts_or_cut_when_asked(minilm):
    from tallow.runtime.embedding.embed import InputTooLong

    long = minilm.tokens("word " * 700)
    with pytest.raises(InputTooLong) as err:
        minilm.fit(long, 3, truncate=False)
    assert err.value.index == 3 and err.value.n_tokens == len(long) and err.value.limit == 512
    cut = minilm.fit(long, 3, truncate=True)
    assert len(cut) == 512 and cut[-1] == long[-1] == minilm.engine.model.sep


def test_the_scheduler_packs_queued_requests_into_shared_decodes(minilm, minilm_model):
    """Eight one-sentence requests queued behind a large one share its last decodes instead of
    taking one each; every request gets its own vectors, in order."""
    import threading

    from tallow.runtime.embedding.embed import Shaping, shape
    from tallow.runtime.embedding.embed_scheduler import EmbedScheduler

    sched = EmbedScheduler(_embedder(minilm_model))
    try:
        results: dict[int, object] = {}
        done = threading.Event()

        def keep(i):
            def on_done(r):
                results[i] = r
                if len(results) == 9:
                    done.set()
            return on_done

        big = [minilm.tokens(SENTENCES[i % 20] + f" {i}") for i in range(600)]
        sched.submit(big, keep(0))
        small = [[minilm.tokens(SENTENCES[i])] for i in range(8)]
        for i, inp in enumerate(small, 1):
            sched.submit(inp, keep(i))
        assert done.wait(300)
        assert len(results[0]) == 600
        packed = len(list(minilm.groups(big + [t for inp in small for t in inp])))  # all as one stream
        assert sched.counters.decodes <= packed + 1  # not one more decode per small request
        for i in range(1, 9):
            v = shape(results[i][0], Shaping())
            ref = next(minilm.vectors(small[i - 1], Shaping()))
            assert float(v @ ref) > 0.99999
    finally:
        sched.close()


def test_tiny_reranker_scores_match_the_reference(tiny_berts):
    cfg = json.loads((tiny_berts["rerank"] / "config.json").read_text())
    weights, tok = load_weights(tiny_berts["rerank"]), tokenizer(tiny_berts["rerank"])
    e = _embedder(tiny_berts["rerank.gguf"])
    try:
        assert e.ranks and e.width == 1
        pairs = [("what is a cat", "cats sat on the mat"), ("bank rates", "the stock market fell"),
                 ("red bird", "a big tree by the river"), ("how to bake bread", "bake bread at home")]
        raw = e.raw([e.pair(q, d) for q, d in pairs])
        for (q, d), r in zip(pairs, raw):
            assert e.pair(q, d) == tok.encode(q, d).ids
            assert abs(float(r[0]) - rank_logit(weights, tok.encode(q, d).ids, cfg)) < 0.02
    finally:
        e.close()


def test_tiny_embedding_model_matches_the_reference(tiny_berts):
    from tallow.runtime.embedding.embed import Shaping

    cfg = json.loads((tiny_berts["embed"] / "config.json").read_text())
    weights, tok = load_weights(tiny_berts["embed"]), tokenizer(tiny_berts["embed"])
    e = _embedder(tiny_berts["embed.gguf"])
    try:
        for s in ("the cat sat on the mat", "Dogs ran in the park!", "qwxz unknown words 123"):
            ids = tok.encode(s).ids
            assert e.tokens(s) == ids
            v = next(e.vectors([ids], Shaping()))
            assert float(v @ mean_embedding(weights, ids, cfg)) > 0.9999
        assert hidden_states(weights, ids, cfg).shape == (len(ids), 32)
    finally:
        e.close()


# -- the command line ------------------------------------------------------------------


def run_tallow(args: list[str], home: Path, input: bytes = b"", timeout: float = 300):
    done = run_bytes(args, home=home, input=input, timeout=timeout)
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode(), done.stderr.decode())


@pytest.fixture(scope="module")
def home(tmp_path_factory, tiny_berts):
    h = tmp_path_factory.mktemp("embed-home")
    for kind in ("embed", "rerank"):
        done = run_tallow(["import", str(tiny_berts[kind]), "--name", f"tiny-{kind}", "--type", "f32"], home=h)
        assert done.returncode == 0, done.stderr
        assert "converted" in done.stderr
    return h


def test_import_refuses_what_it_cannot_convert(home, tmp_path, tiny_berts):
    other = tmp_path / "llama"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "gpt_neox", "architectures": ["GPTNeoXForCausalLM"]}))
    done = run_tallow(["import", str(other)], home=home)
    assert done.returncode == 1 and "GPTNeoXForCausalLM" in done.stderr and "BertModel" in done.stderr
    done = run_tallow(["import", str(tiny_berts["embed"]), "--link"], home=home)
    assert done.returncode == 1 and "--link" in done.stderr
    done = run_tallow(["import", str(tiny_berts["embed"]), "--type", "q4_0"], home=home)
    assert done.returncode == 1 and "f16, bf16 or f32" in done.stderr
    assert "llama" not in run_tallow(["list"], home=home).stdout  # nothing half-registered


def test_embed_formats_agree(home, tmp_path):
    texts = ["the cat sat on the mat", "dogs ran in the park", "the stock market fell"]
    jl = run_tallow(["embed", "tiny-embed", *texts], home=home)
    assert jl.returncode == 0, jl.stderr
    rows = [json.loads(line) for line in jl.stdout.splitlines()]
    assert [r["index"] for r in rows] == [0, 1, 2] and [r["text"] for r in rows] == texts
    whole = run_tallow(["embed", "tiny-embed", *texts, "--format", "json", "--no-text"], home=home)
    arr = json.loads(whole.stdout)
    assert "text" not in arr[0] and np.allclose([a["embedding"] for a in arr], [r["embedding"] for r in rows])
    npy = tmp_path / "v.npy"
    done = run_tallow(["embed", "tiny-embed", *texts, "--format", "npy", "-o", str(npy)], home=home)
    assert done.returncode == 0, done.stderr
    mat = np.load(npy)
    assert mat.shape == (3, 32) and mat.dtype == np.float32
    assert np.allclose(mat, [r["embedding"] for r in rows], atol=1e-6)
    short = run_tallow(["embed", "tiny-embed", texts[0], "--dimensions", "8", "--no-normalize"], home=home)
    assert len(json.loads(short.stdout)["embedding"]) == 8
    bad = run_tallow(["embed", "tiny-embed", "x", "--dimensions", "33"], home=home)
    assert bad.returncode == 1 and "between 1 and 32" in bad.stderr
    rr = run_tallow(["embed", "tiny-rerank", "x"], home=home)
    assert rr.returncode == 1 and "reranker" in rr.stderr


def test_embed_refuses_an_input_too_long_unless_truncate(home):
    long = " ".join(["cat"] * 300)
    done = run_tallow(["embed", "tiny-embed"], home=home, input=f"short one\n{long}\n".encode())
    assert done.returncode == 1
    assert "input 1 is 302 tokens; this model takes at most 128" in done.stderr
    assert [json.loads(x)["index"] for x in done.stdout.splitlines()] == [0]  # what came before is written
    done = run_tallow(["embed", "tiny-embed", "--truncate"], home=home, input=f"short one\n{long}\n".encode())
    assert done.returncode == 0 and len(done.stdout.splitlines()) == 2


def test_embed_refuses_bad_text_and_leaves_no_half_written_file(home, tmp_path):
    done = run_tallow(["embed", "tiny-embed"], home=home, input=b"fine words\n\xff\xfe here\n")
    assert done.returncode == 1 and "line 2 of the input is not valid UTF-8" in done.stderr
    assert [json.loads(x)["index"] for x in done.stdout.splitlines()] == [0]
    npy = tmp_path / "v.npy"
    done = run_tallow(["embed", "tiny-embed", "--format", "npy", "-o", str(npy)], home=home,
                      input=b"fine words\n\xff\xfe here\n")
    assert done.returncode == 1 and not npy.exists() and not list(tmp_path.iterdir())
    empty = run_tallow(["embed", "tiny-embed", "words", " "], home=home)
    assert empty.returncode == 1 and "text 1 is empty" in empty.stderr and not empty.stdout


def _lines_in(path: Path) -> int:
    if not path.exists():
        return 0
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def _run_piped(cmd: list[str], env: dict, lines: list[str], out: Path, gate: int | None = None,
               kill_at: int | None = None) -> tuple[int, int, bool]:
    """Run a tallow command fed `lines` through a pipe; (peak resident memory, exit code,
    whether records were written before stdin had given all its lines). With `gate`, the
    second half of the input is held back until the output holds `gate` records; with
    `kill_at`, SIGKILL once it holds that many."""
    import threading

    import psutil

    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    streamed = threading.Event()

    def feed() -> None:
        half = len(lines) // 2
        try:
            proc.stdin.write(("\n".join(lines[:half]) + "\n").encode())
            proc.stdin.flush()
            if gate is not None:
                deadline = time.monotonic() + 300
                while _lines_in(out) < gate and proc.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.05)
                if _lines_in(out) >= gate:
                    streamed.set()
            proc.stdin.write(("\n".join(lines[half:]) + "\n").encode())
            proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    ps, peak = psutil.Process(proc.pid), 0
    deadline = time.monotonic() + 600
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            peak = max(peak, ps.memory_info().rss)
        except psutil.NoSuchProcess:
            break
        if kill_at is not None and _lines_in(out) >= kill_at:
            proc.send_signal(signal.SIGKILL)
        time.sleep(0.05)
    proc.wait(timeout=60)
    feeder.join(timeout=60)
    return peak, proc.returncode, streamed.is_set()


def test_embed_streams_ten_thousand_lines_in_flat_memory_and_resumes(home, tmp_path):
    words = "the a cat dog bird fish runs sat on mat park tree river stock market bank bread home water red".split()
    rng = np.random.default_rng(3)
    lines = [" ".join(rng.choice(words, size=12)) + f" {i}" for i in range(10_000)]
    env = tallow_env(home)
    cmd = [sys.executable, "-m", "tallow.cli", "embed", "tiny-embed", "-t", "2", "-o"]
    small_out = tmp_path / "small.jsonl"
    peak_small, rc, _ = _run_piped(cmd + [str(small_out)], env, lines[:1000], small_out)
    assert rc == 0 and _lines_in(small_out) == 1000
    out = tmp_path / "big.jsonl"
    peak_big, rc, streamed = _run_piped(cmd + [str(out)], env, lines, out, gate=1000, kill_at=6000)
    # records came out while half the input was still unsent: the lines stream through
    assert streamed
    assert rc == -signal.SIGKILL
    # ten times the input, not ten times the memory: inputs go through in bounded chunks
    assert peak_big < peak_small + 40 * 2**20, (peak_small, peak_big)
    cut = _lines_in(out)
    assert 6000 <= cut < 10_000
    done = run_tallow(["embed", "tiny-embed", "-o", str(out)], home=home,
                      input=("\n".join(lines) + "\n").encode(), timeout=600)
    assert done.returncode == 0, done.stderr
    assert "already there" in done.stderr
    rows = [json.loads(line) for line in open(out, encoding="utf-8")]
    assert [r["index"] for r in rows] == list(range(10_000))
    assert [r["text"] for r in rows] == lines
    again = run_tallow(["embed", "tiny-embed", lines[4321]], home=home)
    assert float(np.dot(json.loads(again.stdout)["embedding"], rows[4321]["embedding"])) > 0.99999  # batched vs alone


def test_index_and_search(home, tmp_path):
    db = tmp_path / "notes.sqlite"
    texts = "the cat sat on the mat\ndogs ran in the park\nthe stock market fell\nbake bread at home\n"
    done = run_tallow(["embed", "tiny-embed", "--index", str(db)], home=home, input=texts.encode())
    assert done.returncode == 0 and "4 embedded" in done.stderr
    again = run_tallow(["embed", "tiny-embed", "--index", str(db)], home=home,
                       input=b"the cat sat on the mat\nred fish in the river\n")
    assert "1 embedded" in again.stderr and "1 already there" in again.stderr
    found = run_tallow(["search", str(db), "the cat sat on the mat", "-n", "3", "--json"], home=home)
    assert found.returncode == 0, found.stderr
    hits = json.loads(found.stdout)
    assert len(hits) == 3 and hits[0]["text"] == "the cat sat on the mat" and hits[0]["score"] > 0.999
    assert hits[0]["score"] >= hits[1]["score"] >= hits[2]["score"]
    text = run_tallow(["search", str(db), "bread", "-n", "1"], home=home)
    assert text.returncode == 0 and len(text.stdout.splitlines()) == 1
    other = run_tallow(["embed", "tiny-embed", "--index", str(db), "--dimensions", "8", "x"], home=home)
    assert other.returncode == 1 and "dimensions 32 (now 8)" in other.stderr
    missing = run_tallow(["search", str(tmp_path / "none.sqlite"), "x"], home=home)
    assert missing.returncode == 1 and "not an index" in missing.stderr


def test_a_terminal_sees_the_inputs_counted_as_they_go(home, tmp_path):
    import shutil

    from helpers.terminal import Terminal, plain

    lines = tmp_path / "lines.txt"
    lines.write_text("".join(f"the cat sat on the mat {i}\n" for i in range(20_000)))
    out = tmp_path / "out.jsonl"
    env = tallow_env(home, {"TERM": "xterm-256color"})
    env.pop("NO_COLOR")
    term = Terminal(["--noprofile", "--norc", "-c",
                     f"{sys.executable} -m tallow.cli embed tiny-embed -o {out} < {lines}"], env,
                    program=shutil.which("bash"))
    code = term.wait(600)
    screen = plain(term.buf.decode("utf-8", "replace"))
    assert code == 0, screen
    assert re.search(r"embed.*\d+ inputs \d+/s", screen), screen  # the count, while it ran
    assert "20000 embedded to" in screen
    assert _lines_in(out) == 20_000
