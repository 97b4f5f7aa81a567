"""tallow serve, live on loopback, through the official openai client and raw HTTP."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

pytestmark = pytest.mark.slow  # 32 concurrent streams and servers per test

openai = pytest.importorskip("openai")

from helpers.server import Server  # noqa: E402 - after the skip: the helper needs openai

SCHEMA = {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}, "size": {"type": "integer"}},
          "required": ["color", "size"], "additionalProperties": False}


@pytest.fixture(scope="module")
def server(synth_model, tmp_path_factory):
    s = Server(synth_model, tmp_path_factory.mktemp("home"), "--parallel", "8", "--deterministic", "--ctx", "32768")
    yield s
    s.close()


def chat(client, text, **kw):
    return client.chat.completions.create(model="synthetic.gguf", messages=[{"role": "user", "content": text}], **kw)


def test_chat_completion_and_models(server):
    c = server.client()
    r = chat(c, "hello there", max_tokens=12, temperature=0)
    assert r.object == "chat.completion" and r.choices[0].finish_reason == "length"
    assert isinstance(r.choices[0].message.content, str) and r.choices[0].message.role == "assistant"
    assert r.usage.completion_tokens == 12 and r.usage.prompt_tokens > 5
    again = chat(c, "hello there", max_tokens=12, temperature=0)
    assert again.choices[0].message.content == r.choices[0].message.content
    assert again.usage.prompt_tokens_details.cached_tokens == r.usage.prompt_tokens - 1
    assert [m.id for m in c.models.list().data] == ["synthetic.gguf"]


def test_text_completion_and_streaming_match(server):
    c = server.client()
    whole = c.completions.create(model="synthetic.gguf", prompt="Once upon", max_tokens=20, temperature=0)
    assert whole.object == "text_completion" and whole.usage.completion_tokens == 20
    parts = list(c.completions.create(model="synthetic.gguf", prompt="Once upon", max_tokens=20, temperature=0,
                                      stream=True))
    assert "".join(p.choices[0].text for p in parts if p.choices) == whole.choices[0].text
    stream = chat(c, "hello there", max_tokens=10, temperature=0, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == chat(c, "hello there", max_tokens=10, temperature=0).choices[0].message.content
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 10 and chunks[-1].choices == []


def test_json_schema_answer_follows_the_schema(server):
    import jsonschema

    r = chat(server.client(), "a shape", max_tokens=200, temperature=1.0, seed=5,
             response_format={"type": "json_schema", "json_schema": {"name": "shape", "schema": SCHEMA}})
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)
    r = chat(server.client(), "anything", max_tokens=300, temperature=0, response_format={"type": "json_object"})
    if r.choices[0].finish_reason == "stop":
        json.loads(r.choices[0].message.content)


def test_32_concurrent_streams_equal_their_answers_alone(server):
    c = server.client()
    prompts = [f"question number {i} " + "about this " * (i % 7) for i in range(32)]

    def ask(text):
        chunks = list(chat(c, text, max_tokens=24, temperature=0, stream=True, logprobs=True))
        content = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        lps = [e.logprob for ch in chunks if ch.choices and ch.choices[0].logprobs
               for e in ch.choices[0].logprobs.content]
        return content, lps

    alone = [ask(p) for p in prompts]
    with ThreadPoolExecutor(32) as pool:
        together = list(pool.map(ask, prompts))
    assert sum(len(lps) for _, lps in together) > 32 * 12  # most answers run to max_tokens
    assert together == alone  # text and every log-probability, bit for bit
    assert server.health()["slots_busy"] == 0


def test_memory_does_not_grow_across_rounds(server):
    import psutil

    proc = psutil.Process(server.proc.pid)
    c = server.client()

    def round_():
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda i: chat(c, f"round prompt {i}", max_tokens=32, temperature=0.7), range(16)))

    for _ in range(3):
        round_()
    before = proc.memory_info().rss
    for _ in range(5):
        round_()
    grown = proc.memory_info().rss - before
    assert grown < 16 * 2**20, f"RSS grew by {grown / 2**20:.1f} MiB over 5 rounds of 16 requests"


def test_bad_requests_get_clear_errors(server):
    post = lambda body, **h: server.raw("/v1/chat/completions", body, {"Content-Type": "application/json", **h})  # noqa: E731
    msg = [{"role": "user", "content": "hi"}]
    cases = [
        (b"not json", 400, "not valid JSON"),
        (b"[1, 2]", 400, "JSON object"),
        (json.dumps({"messages": msg, "max_tokens": -5}).encode(), 400, "'max_tokens' must be between"),
        (b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}', 400, "NaN"),
        (json.dumps({"messages": msg, "temperature": 1e308}).encode(), 400, "'temperature'"),
        (json.dumps({"messages": msg, "max_tokens": "ten"}).encode(), 400, "must be an integer"),
        (json.dumps({"messages": msg, "top_p": True}).encode(), 400, "'top_p' must be a number"),
        (json.dumps({"messages": msg, "n": 0}).encode(), 400, "'n'"),
        (json.dumps({"messages": msg, "presence_penalty": 3}).encode(), 400, "'presence_penalty' must be between -2 and 2"),
        (json.dumps({"messages": "hi"}).encode(), 400, "'messages'"),
        (json.dumps({"messages": [{"role": "wizard", "content": "x"}]}).encode(), 400, "role"),
        (json.dumps({"messages": msg, "stop": [1]}).encode(), 400, "'stop'"),
        (json.dumps({"messages": msg, "model": "gpt-4o"}).encode(), 404, "not served here"),
        (json.dumps({"messages": [{"role": "user", "content": "x " * 40000}]}).encode(), 400, "sequence holds"),
        (json.dumps({"messages": msg, "response_format": {"type": "json_schema",
                                                          "json_schema": {"schema": {"type": 5}}}}).encode(),
         400, "invalid JSON schema"),
    ]
    for body, status, words in cases:
        got, _, data = post(body)
        assert got == status, (body[:80], data)
        assert words in data["error"]["message"], (body[:80], data)
    # A huge body is refused from its Content-Length, before it is read; and also when sent
    # chunked, without a length, once the bytes read pass the limit.
    import http.client

    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    for chunked in (False, True):
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        conn.putrequest("POST", "/v1/chat/completions")
        if chunked:
            conn.putheader("Transfer-Encoding", "chunked")
            conn.endheaders()
            piece = b" " * 2**20
            try:
                for _ in range(6):
                    conn.send(b"%x\r\n%s\r\n" % (len(piece), piece))
            except OSError:
                pass  # the server may answer and close before the last chunk
        else:
            conn.putheader("Content-Length", str(5 * 2**20))
            conn.endheaders()
        r = conn.getresponse()
        assert r.status == 413 and "larger than" in json.loads(r.read())["error"]["message"]
        conn.close()
    got, _, data = server.raw("/v1/completions", json.dumps({"prompt": "hi", "max_tokens": 10**12}).encode())
    assert got == 400
    huge_ok = server.raw("/v1/completions", json.dumps({"prompt": "hi", "max_tokens": 5000, "temperature": 0}).encode())
    assert huge_ok[0] == 200 and huge_ok[2]["usage"]["completion_tokens"] <= 4096  # clamped to --max-tokens
    assert server.raw("/v1/nothing")[0] == 404
    assert server.raw("/v1/chat/completions", method="GET")[0] == 405
    got, _, data = server.raw("/health", headers={"Host": "attacker.example:8080"})
    assert got == 403 and data["error"]["code"] == "host_not_allowed"
    assert server.raw("/health", headers={"Host": "localhost:1234"})[0] == 200
    assert "Access-Control-Allow-Origin" not in server.raw("/health", headers={"Origin": "http://x.example"})[1]


def test_metrics_are_prometheus_text(server):
    chat(server.client(), "count me", max_tokens=3, temperature=0)
    status, headers, text = server.raw("/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    values = dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    assert float(values['tallow_requests_total{finish_reason="length",model="synthetic.gguf"}']) >= 1
    assert float(values['tallow_completion_tokens_total{model="synthetic.gguf"}']) >= 3
    assert float(values['tallow_time_to_first_token_seconds_bucket{le="+Inf",model="synthetic.gguf"}']) >= 1
    assert float(values['tallow_inter_token_latency_seconds_count{model="synthetic.gguf"}']) >= 2
    m = '{model="synthetic.gguf"}'
    assert values["tallow_slots_total" + m] == "8" and "tallow_kv_cells_used" + m in values
    assert "tallow_queue_depth" + m in values and values["tallow_models_loaded"] == "1"


def test_api_key_required_and_refused(synth_model, tmp_path):
    s = Server(synth_model, tmp_path, "--api-key", "s3cret", "--cors", "http://app.example", "--kv-unified")
    try:
        assert "context 4096 shared" in s.log[-1]  # the default context: 1024 per slot, 4 slots
        with pytest.raises(openai.AuthenticationError):
            chat(s.client("wrong"), "hi", max_tokens=2)
        assert s.raw("/v1/models")[2]["error"]["code"] == "invalid_api_key"  # no key at all
        assert chat(s.client("s3cret"), "hi", max_tokens=2, temperature=0).usage.completion_tokens == 2
        # /health answers without the key (load balancers and probes cannot send one); nothing else does
        assert s.raw("/health")[0] == 200
        assert s.raw("/metrics")[0] == 401 and s.raw("/models")[0] == 401
        assert s.raw("/v1/models", headers={"x-api-key": "s3cret"})[0] == 200  # Anthropic's clients send this
        assert s.raw("/v1/models", headers={"x-api-key": "nope"})[0] == 401
        _, headers, _ = s.raw("/v1/models", headers={"Authorization": "Bearer s3cret", "Origin": "http://app.example"})
        assert headers["Access-Control-Allow-Origin"] == "http://app.example"
        # a browser's preflight for the OpenAI JavaScript SDK, which sends its own x-stainless-* headers
        asked = "authorization, content-type, x-stainless-os, x-stainless-retry-count"
        pre = {"Origin": "http://app.example", "Access-Control-Request-Method": "POST",
               "Access-Control-Request-Headers": asked}
        status, headers, _ = s.raw("/v1/chat/completions", headers=pre, method="OPTIONS")
        assert status == 200 and "x-stainless-retry-count" in headers["Access-Control-Allow-Headers"].lower()
        status, _, _ = s.raw("/v1/chat/completions", headers={**pre, "Origin": "http://elsewhere.example"},
                             method="OPTIONS")
        assert status == 400  # another origin is not allowed, whatever it asks for
    finally:
        s.close()


def test_non_loopback_bind_needs_a_key(synth_model, tmp_path):
    r = subprocess.run([sys.executable, "-m", "tallow.cli", "serve", str(synth_model), "--host", "0.0.0.0", "--port", "0"],
                       capture_output=True, text=True, env={**os.environ, "TALLOW_HOME": str(tmp_path)}, timeout=60)
    assert r.returncode == 2 and "--api-key" in r.stderr and "Traceback" not in r.stderr


def test_full_queue_503_and_disconnect_frees_the_slot(synth_model, tmp_path):
    # One slot, one place in the queue; a long answer keeps the slot busy.
    s = Server(synth_model, tmp_path, "--parallel", "1", "--max-queue", "1", "--ctx", "65536", "--max-tokens", "65000")
    try:
        body = json.dumps({"prompt": "go", "max_tokens": 65000, "stream": True, "ignore_eos": True}).encode()
        long = urllib.request.urlopen(urllib.request.Request(s.url + "/v1/completions", data=body), timeout=120)
        long.readline()  # the first event: the request holds the slot
        assert s.health()["slots_busy"] == 1
        waiting = ThreadPoolExecutor(1).submit(
            s.raw, "/v1/completions", json.dumps({"prompt": "next", "max_tokens": 3}).encode())
        deadline = time.monotonic() + 60
        while s.health()["queue_depth"] != 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        status, headers, data = s.raw("/v1/completions", json.dumps({"prompt": "more", "max_tokens": 3}).encode())
        assert status == 503 and headers["Retry-After"] == "1" and "busy" in data["error"]["message"]
        long.close()  # the client goes away mid-stream: its generation stops, the waiting request runs
        status, _, data = waiting.result(timeout=60)
        assert status == 200 and data["usage"]["completion_tokens"] == 3
        metrics = s.raw("/metrics")[2]
        assert 'tallow_requests_total{finish_reason="cancelled",model="synthetic.gguf"} 1' in metrics
        assert s.health()["slots_busy"] == 0
    finally:
        s.close()


def test_time_limit_finish_reason(synth_model, tmp_path):
    s = Server(synth_model, tmp_path, "--parallel", "1", "--ctx", "65536", "--max-tokens", "65000", "--timeout", "0.05")
    try:
        r = s.client().completions.create(model="synthetic.gguf", prompt="go", max_tokens=65000,
                                          extra_body={"ignore_eos": True})
        assert r.choices[0].finish_reason == "time_limit" and 0 < r.usage.completion_tokens < 65000
    finally:
        s.close()


def test_disconnect_cancels_a_whole_answer_too(synth_model, tmp_path):
    import http.client

    s = Server(synth_model, tmp_path, "--parallel", "1", "--ctx", "65536", "--max-tokens", "65000")
    try:
        host, port = s.url.removeprefix("http://").rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        conn.request("POST", "/v1/completions", json.dumps({"prompt": "go", "max_tokens": 65000, "ignore_eos": True}),
                     {"Content-Type": "application/json"})
        deadline = time.monotonic() + 60
        while s.health()["slots_busy"] != 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        conn.close()  # gone before the answer: nobody will read it
        while s.health()["slots_busy"] != 0:
            assert time.monotonic() < deadline, "the abandoned request kept its slot"
            time.sleep(0.05)
        metrics = s.raw("/metrics")[2]
        assert 'tallow_requests_total{finish_reason="cancelled",model="synthetic.gguf"} 1' in metrics
        assert "tallow_completion_tokens_total" in metrics
    finally:
        s.close()
