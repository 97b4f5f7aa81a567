"""Every feature on every route: run, chat, serve and batch decode through one sequence core.

For each route, on a synthetic model whose weights make greedy decoding spell "abcabc...":
the disk prompt cache hit in a second process, lookup drafts (the same text as without),
log-probabilities, a JSON schema, stop strings, cancellation; and the same request gives
the same text on every route at temperature 0.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from dataclasses import asdict

import pytest
from helpers.processes import default_sigint, run_tallow, tallow_env
from helpers.server import Server

pytestmark = pytest.mark.slow  # each feature on every route

openai = pytest.importorskip("openai")

SYSTEM = "You spell letters. " + "abc " * 80  # past the 256 tokens a disk entry needs by default
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False}
ENV = {"TALLOW_NO_LOG": "1"}
N = 24


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from helpers.synth import write_synthetic_gguf

    return write_synthetic_gguf(tmp_path_factory.mktemp("routes") / "abc.gguf",
                                script={"\n": "a", "a": "b", "b": "c", "c": "a"})


# -- one request through each route: (text, usage, logprob entries or None) -------------------

def via_run(model, home, user, *, stop=None, schema=None, draft=False, logprobs=None):
    args = ["run", str(model), user, "--system", SYSTEM, "--json", "--temperature", "0", "-n", str(N), "--ctx", "1024"]
    args += ["--stop", stop] if stop else []
    args += ["--json-schema", json.dumps(schema)] if schema else []
    args += ["--draft", "lookup"] if draft else []
    args += ["--logprobs", str(logprobs)] if logprobs is not None else []
    r = run_tallow(args, home=home, env=ENV)
    assert r.returncode == 0, r.stderr.decode()
    out = json.loads(r.stdout)
    return out["text"], out["usage"], out.get("logprobs", {}).get("content")


def via_chat(model, home, user, *, stop=None, schema=None, draft=False, logprobs=None):
    """The chat command's service, in a fresh engine: as far as caches go, another process."""
    from tallow.runtime.chat import ChatSettings, Conversation
    from tallow.runtime.engine import Engine
    from tallow.runtime.grammar import grammar_for
    from tallow.runtime.logprobs import token_logprob
    from tallow.runtime.prompt_cache import PromptCache
    from tallow.runtime.types import FinalEvent, LoadSettings, Sampling, TokenEvent

    with Engine(model, LoadSettings(n_ctx=1024, n_threads=2, flash_attn="on" if draft else "auto")) as engine:
        engine.use_prompt_cache(PromptCache(home / "cache", 1 << 30, 256), "abc-digest")
        settings = ChatSettings(Sampling(temperature=0), N, stop=(stop,) if stop else (),
                                draft="lookup" if draft else None, logprobs=logprobs,
                                grammar=grammar_for(True, schema) if schema else None)
        events = list(Conversation(engine, settings, SYSTEM).ask(user))
        entries = [token_logprob(e, engine.model.piece) for e in events if isinstance(e, TokenEvent) and e.logprob is not None]
    final = next(e for e in events if isinstance(e, FinalEvent))
    return final.text, asdict(final.usage), entries or None


def body_for(user, stop=None, schema=None, draft=False, logprobs=None):
    body = {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}],
            "temperature": 0, "max_tokens": N}
    if stop:
        body["stop"] = [stop]
    if schema:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
    if draft:
        body["draft"] = "lookup"
    if logprobs is not None:
        body.update(logprobs=True, top_logprobs=logprobs)
    return body


def via_serve(model, home, user, **kw):
    server = Server(model, home, "--parallel", "2", "--ctx", "2048", *(["--draft", "lookup"] if kw.get("draft") else []))
    try:
        body = body_for(user, **kw)
        extra = {k: body.pop(k) for k in ("draft",) if k in body}
        resp = server.client().chat.completions.create(model="tallow", extra_body=extra or None, **body).model_dump()
    finally:
        server.close()
    choice = resp["choices"][0]
    entries = choice["logprobs"]["content"] if choice.get("logprobs") else None
    return choice["message"]["content"], resp["usage"], entries


def via_batch(model, home, user, **kw):
    src, out = home / f"in-{time.monotonic_ns()}.jsonl", home / f"out-{time.monotonic_ns()}.jsonl"
    src.write_text(json.dumps({"id": 1, **body_for(user, **kw)}) + "\n")
    r = run_tallow(["batch", str(src), "-o", str(out), "-m", str(model), "--parallel", "2", "--ctx", "2048"],
                   home=home, env=ENV)
    assert r.returncode == 0, r.stderr.decode()
    record = json.loads(out.read_text())
    entries = record["logprobs"]["content"] if "logprobs" in record else None
    return record["text"], record["usage"], entries


ROUTES = {"run": via_run, "chat": via_chat, "serve": via_serve, "batch": via_batch}


def cached(usage) -> int:
    return usage.get("cached_tokens", usage.get("prompt_tokens_details", {}).get("cached_tokens", 0))


@pytest.mark.parametrize("route", ROUTES)
def test_disk_prompt_cache_hit_in_a_second_process(route, model, tmp_path):
    via = ROUTES[route]
    text1, usage1, _ = via(model, tmp_path, "first question")
    assert cached(usage1) == 0
    text2, usage2, _ = via(model, tmp_path, "second question")  # a new process: nothing in memory
    assert cached(usage2) >= 256 and usage2["cache_source"] == "disk", usage2
    assert text1 == text2 == ("abc" * N)[:N]


@pytest.mark.parametrize("route", ROUTES)
def test_lookup_drafts_same_text_and_log_probabilities(route, model, tmp_path):
    via = ROUTES[route]
    plain, _, entries = via(model, tmp_path, "spell", logprobs=2)
    drafted, usage, drafted_entries = via(model, tmp_path, "spell", draft=True, logprobs=2)
    assert drafted == plain == ("abc" * N)[:N]
    assert usage["draft_tokens"] >= usage["accepted_tokens"] > 0, usage
    assert len(entries) == len(drafted_entries) == N
    for a, b in zip(entries, drafted_entries):
        assert a["token"] == b["token"] and len(a["top_logprobs"]) == len(b["top_logprobs"]) == 2
        assert -0.05 < a["logprob"] <= 0 and abs(a["logprob"] - b["logprob"]) < 1e-3


@pytest.mark.parametrize("route", ROUTES)
def test_json_schema_and_stop_strings(route, model, tmp_path):
    import jsonschema

    via = ROUTES[route]
    text, _, _ = via(model, tmp_path, "json please", schema=SCHEMA)
    jsonschema.validate(json.loads(text), SCHEMA)
    stopped, _, _ = via(model, tmp_path, "spell", stop="ca")
    assert stopped == "ab"  # "abca...": cut where the stop string starts, which is not shown


@pytest.mark.parametrize("which", ["scripted", "random"])
def test_the_same_request_gives_the_same_text_on_every_route(which, model, synth_model, tmp_path):
    # the random weights make the answer depend on every prompt token and on the rounding
    texts = {}
    for route, via in ROUTES.items():
        (tmp_path / route).mkdir()
        texts[route] = via(model if which == "scripted" else synth_model, tmp_path / route, "same question")[0]
    assert len(set(texts.values())) == 1 and len(texts["run"]) > 5, texts


# -- cancellation ------------------------------------------------------------------------------

def test_cancellation_run_chat(model, tmp_path):
    from tallow.runtime.chat import ChatSettings, Conversation
    from tallow.runtime.engine import Engine
    from tallow.runtime.types import FinalEvent, LoadSettings, Sampling

    proc = subprocess.Popen([sys.executable, "-m", "tallow.cli", "run", str(model), "go", "-n", "100000", "--ctx",
                             "60000", "--temperature", "0"], env=tallow_env(tmp_path, ENV),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=default_sigint)
    assert proc.stdout.read(6) == b"abcabc"  # it is answering
    proc.send_signal(signal.SIGINT)
    assert proc.wait(60) == 130
    with Engine(model, LoadSettings(n_ctx=4096, n_threads=2)) as engine:
        conv = Conversation(engine, ChatSettings(Sampling(temperature=0), 3000))
        events = conv.ask("go")
        next(events)
        final = events.throw(KeyboardInterrupt)
        assert isinstance(final, FinalEvent) and final.finish_reason == "interrupted"
        assert conv.messages[-1]["cut"] is True
        again = [e for e in conv.ask("more") if isinstance(e, FinalEvent)][0]  # the engine is usable after
        assert again.finish_reason == "length"


def test_cancellation_serve_and_batch(model, tmp_path):
    server = Server(model, tmp_path, "--parallel", "1", "--ctx", "8192")
    try:
        client = server.client()
        stream = client.chat.completions.create(model="tallow", messages=[{"role": "user", "content": "go"}],
                                                max_tokens=8000, temperature=0, stream=True)
        next(iter(stream))
        stream.close()  # the client goes away: the one slot must be freed for the next request
        quick = client.chat.completions.create(model="tallow", messages=[{"role": "user", "content": "go"}],
                                               max_tokens=3, temperature=0)
        assert quick.choices[0].message.content == "abc"
        metrics = server.raw("/metrics")[2]
        assert 'finish_reason="cancelled"' in metrics
    finally:
        server.close()
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps({"id": i, "prompt": "go", "max_tokens": 6000, "ignore_eos": True}) + "\n"
                           for i in range(4)))
    args = [sys.executable, "-m", "tallow.cli", "batch", str(src), "-o", str(out), "-m", str(model), "--parallel", "2",
            "--ctx", "16384"]
    proc = subprocess.Popen(args, env=tallow_env(tmp_path, ENV), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=default_sigint)
    time.sleep(1.5)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(60) == 130
    before = [json.loads(line)["id"] for line in out.read_text().splitlines()]  # whole records only
    assert len(before) < 4
    done = subprocess.run(args, env=tallow_env(tmp_path, ENV), capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()
    ids = [json.loads(line)["id"] for line in out.read_text().splitlines()]
    assert sorted(ids) == [0, 1, 2, 3]
