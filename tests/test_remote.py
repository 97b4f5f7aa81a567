"""run and chat with --endpoint: a remote OpenAI-compatible server answers, the stats are the
client's, history stays local; figures a server does not report are said to be missing."""

from __future__ import annotations

import json
import re

import pytest
from helpers.processes import run_tallow
from helpers.server import Server
from helpers.standin import StandIn

pytestmark = pytest.mark.slow  # replicas and stand-in servers


def test_run_against_a_replica_has_client_stats(replica, tmp_path):
    args = ["run", "synthetic.gguf", "Tell me about a cat", "-n", "12", "--temperature", "0", "--endpoint", replica.url,
            "--json", "--stats", "--no-log"]
    first = run_tallow(args, home=tmp_path)
    assert first.returncode == 0, first.stderr.decode()
    out = json.loads(first.stdout)
    u, t = out["usage"], out["timings"]
    assert out["endpoint"] == replica.url and out["model"] == "synthetic.gguf"
    assert u["prompt_tokens"] > 5 and 0 < u["completion_tokens"] <= 12 and isinstance(u["cached_tokens"], int)
    assert 0 < t["ttft_ms"] <= t["total_ms"]
    if u["completion_tokens"] > 2:
        assert t["decode_tps"] > 0 and t["itl_p50_ms"] > 0 and t["itl_p95_ms"] >= t["itl_p50_ms"]
    err = first.stderr.decode()
    assert "TTFT" in err and f"via {replica.url}" in err and "not reported" not in err
    # The same prompt again: the replica's slot holds it, and says so in its usage.
    again = json.loads(run_tallow(args, home=tmp_path).stdout)
    assert again["usage"]["cached_tokens"] > 0
    assert again["text"] == out["text"]  # greedy: the same answer


def test_run_text_and_logprobs_through_the_endpoint(replica, tmp_path):
    got = run_tallow(["run", "synthetic.gguf", "Once upon", "-n", "6", "--temperature", "0", "--endpoint", replica.url,
                      "--json", "--logprobs", "2", "--no-log"], home=tmp_path)
    assert got.returncode == 0, got.stderr.decode()
    out = json.loads(got.stdout)
    entries = out["logprobs"]["content"]
    assert len(entries) == out["usage"]["completion_tokens"]
    assert all(e["logprob"] <= 0 and len(e["top_logprobs"]) == 2 for e in entries)
    plain = run_tallow(["run", "synthetic.gguf", "Once upon", "-n", "6", "--temperature", "0", "--endpoint", replica.url,
                        "--no-log"], home=tmp_path)
    assert plain.stdout.decode().rstrip("\n") == out["text"]


def test_chat_against_a_replica_has_sane_stats_per_turn(replica, tmp_path):
    script = b"Tell me about a cat\nAnd a dog\n/stats\n/bye\n"
    got = run_tallow(["chat", "synthetic.gguf", "--endpoint", replica.url, "--max-tokens", "6", "--temperature", "0",
                      "--stats", "--no-log"], home=tmp_path, input=script)
    assert got.returncode == 0, got.stderr.decode()
    lines = [ln for ln in got.stderr.decode().splitlines() if "TTFT" in ln and "turns" not in ln]
    assert len(lines) == 2 and all(f"via {replica.url}" in ln for ln in lines)
    turns = [re.search(r"prompt (\d+) tok \((\d+) cached\)", ln) for ln in lines]
    assert all(turns) and int(turns[1].group(1)) > int(turns[0].group(1))  # the history went along
    assert int(turns[1].group(2)) > 0  # ... and the replica's slot still held the first turn
    assert "turns 2" in got.stdout.decode() + got.stderr.decode()


def test_a_server_that_omits_usage_gives_not_reported(tmp_path):
    stand = StandIn(usage=False)
    try:
        got = run_tallow(["run", "m", "hi", "--endpoint", stand.url, "--json", "--stats", "--no-log"], home=tmp_path)
        assert got.returncode == 0, got.stderr.decode()
        out = json.loads(got.stdout)
        assert out["text"] == "Hello from the stand-in"
        assert out["usage"]["prompt_tokens"] is None and out["usage"]["cached_tokens"] is None
        assert out["usage"]["completion_tokens"] == 4  # counted from the stream
        err = got.stderr.decode()
        assert "prompt: not reported (cached: not reported)" in err and "prefill: not reported" in err
        assert "0 cached" not in err and "prompt 0" not in err
        body = stand.bodies[-1]
        assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
        assert body["model"] == "m" and body["messages"][-1] == {"role": "user", "content": "hi"}
        assert "top_k" not in body and "min_p" not in body  # left at tallow's defaults: the server's to choose
        set_k = run_tallow(["run", "m", "hi", "--endpoint", stand.url, "--top-k", "5", "--no-log"], home=tmp_path)
        assert set_k.returncode == 0 and stand.bodies[-1]["top_k"] == 5
    finally:
        stand.close()


def test_chat_keeps_history_locally_and_logs_it(tmp_path):
    stand = StandIn()
    try:
        script = b"first question\nsecond question\n/stats\n/bye\n"
        got = run_tallow(["chat", "m", "--system", "Be brief.", "--endpoint", stand.url], home=tmp_path, input=script)
        assert got.returncode == 0, got.stderr.decode()
        assert got.stdout.decode().count("Hello from the stand-in") == 2
        second = stand.bodies[-1]["messages"]
        assert [m["role"] for m in second] == ["system", "user", "assistant", "user"]
        assert second[2]["content"] == "Hello from the stand-in" and second[3]["content"] == "second question"
        assert "turns 2" in got.stdout.decode() + got.stderr.decode()
        logged = json.loads(run_tallow(["logs", "--json", "-n", "0"], home=tmp_path).stdout)
        assert sorted(t["prompt"] for t in logged) == ["first question", "second question"]
        assert all(t["model"] == "m" and t["response"] == "Hello from the stand-in" for t in logged)
    finally:
        stand.close()


def test_offline_refuses_a_remote_host_and_local_flags_are_refused(tmp_path):
    got = run_tallow(["run", "m", "hi", "--endpoint", "http://192.0.2.7:8000/v1", "--offline"], home=tmp_path)
    assert got.returncode == 1 and "offline: refusing the endpoint 192.0.2.7" in got.stderr.decode()
    env_offline = run_tallow(["chat", "m"], home=tmp_path, env={"TALLOW_OFFLINE": "1",
                                                                 "TALLOW_ENDPOINT": "https://api.example.com/v1"})
    assert env_offline.returncode == 1 and "api.example.com" in env_offline.stderr.decode()
    for flag in (["--ctx", "512"], ["--threads", "1"], ["--draft", "lookup"], ["--gpu-layers", "0"]):
        refused = run_tallow(["run", "m", "hi", "--endpoint", "http://127.0.0.1:9/v1", *flag], home=tmp_path)
        assert refused.returncode == 2 and flag[0] in refused.stderr.decode()
    down = run_tallow(["run", "m", "hi", "--endpoint", "http://127.0.0.1:9/v1"], home=tmp_path)
    assert down.returncode == 1 and "cannot reach 127.0.0.1:9" in down.stderr.decode()


def test_embed_through_an_endpoint_equals_the_local_vectors_and_search_uses_it(minilm_model, default_home, tmp_path):
    import numpy as np

    texts = b"The cat sat on the mat.\nStocks fell sharply on Monday.\nA kitten naps in the sun.\n"
    local = run_tallow(["embed", "all-minilm:l6-v2"], home=default_home, input=texts)
    assert local.returncode == 0, local.stderr.decode()
    s = Server(minilm_model, tmp_path / "home")
    try:
        got = run_tallow(["embed", "tallow", "--endpoint", s.url], home=tmp_path, input=texts)
        assert got.returncode == 0, got.stderr.decode()
        mine = [json.loads(line) for line in local.stdout.splitlines()]
        theirs = [json.loads(line) for line in got.stdout.splitlines()]
        assert [r["text"] for r in theirs] == [r["text"] for r in mine]
        for a, b in zip(mine, theirs):
            assert float(np.dot(a["embedding"], b["embedding"])) > 0.9999
        assert "tokens at" in got.stderr.decode()  # the server's usage counted them
        short = run_tallow(["embed", "tallow", "--endpoint", s.url, "--dimensions", "64", "T"], home=tmp_path)
        vec = json.loads(short.stdout)["embedding"]
        assert len(vec) == 64 and abs(float(np.linalg.norm(vec)) - 1) < 1e-5
        db = tmp_path / "idx.sqlite"
        made = run_tallow(["embed", "tallow", "--endpoint", s.url, "--index", str(db)], home=tmp_path, input=texts)
        assert made.returncode == 0, made.stderr.decode()
        hits = json.loads(run_tallow(["search", str(db), "a sleepy kitten", "--json", "-n", "1"], home=tmp_path).stdout)
        assert hits[0]["text"] == "A kitten naps in the sun."
        refused = run_tallow(["embed", "tallow", "--endpoint", s.url, "--pooling", "cls", "x"], home=tmp_path)
        assert refused.returncode == 2 and "--pooling" in refused.stderr.decode()
    finally:
        s.close()
