"""A team's server: `tallow keys`, `tallow serve --auth keys` with the official openai,
anthropic and ollama clients, metered usage (`tallow usage`, per-key /metrics), and the
per-key limits (429 with Retry-After)."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from helpers.processes import run_tallow
from helpers.synth import write_synthetic_gguf

from tallow.serve.http.usage import cost, load_prices

pytestmark = pytest.mark.slow  # servers with several models

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")
ollama = pytest.importorskip("ollama")

from helpers.server import Server  # noqa: E402 - after the skips

USER = [{"role": "user", "content": "hello"}]


def tallow(home, *args: str) -> str:
    r = run_tallow(list(args), home=home)
    assert r.returncode == 0, r.stderr.decode()
    return r.stdout.decode()


def make_key(home, name: str, *options: str) -> str:
    key = tallow(home, "keys", "create", name, *options).strip()
    assert key.startswith("tallow-") and len(key) > 40
    return key


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("keymodels")
    return {"alpha": write_synthetic_gguf(d / "alpha.gguf"),
            "beta": write_synthetic_gguf(d / "beta.gguf", seed=7),
            "loop": write_synthetic_gguf(d / "loop.gguf", script={"\n": "a", "a": "b", "b": "a"}, ctx_train=32768)}


def serve(models, home) -> Server:
    return Server(models["alpha"], home, str(models["beta"]), str(models["loop"]), "--auth", "keys", "--max-models",
                  "3", "--model-option", "loop.gguf ctx=32768 parallel=1", env={"TALLOW_NO_LOG": "1"})


@pytest.fixture(scope="module")
def team(models, tmp_path_factory):
    home = tmp_path_factory.mktemp("teamhome")
    keys = {"alice": make_key(home, "alice", "--models", "alpha*", "--models", "loop*"),
            "bob": make_key(home, "bob"),
            "admin": make_key(home, "admin", "--routes", "generate,embed,admin"),
            "old": make_key(home, "old", "--expires", "2020-01-01")}
    s = serve(models, home)
    yield s, home, keys
    s.close()


def test_the_key_is_shown_once_and_only_its_digest_is_stored(team):
    _, home, keys = team
    raw = (home / "history.db").read_bytes()
    assert keys["alice"].encode() not in raw
    listed = json.loads(tallow(home, "keys", "list", "--json"))
    assert [k["name"] for k in listed] == ["alice", "bob", "admin", "old"]
    assert listed[0]["models"] == ["alpha*", "loop*"] and listed[0]["prefix"] == keys["alice"][:11]
    assert all(keys[k["name"]] not in json.dumps(listed) for k in listed)


def test_each_client_with_a_key(team):
    s, _, keys = team
    c = openai.OpenAI(base_url=s.url + "/v1", api_key=keys["alice"], max_retries=0)
    # the answers' lengths are exact: the random model may end one early (a CI run saw 3 of 4),
    # so the OpenAI call never ends at end-of-text and the others take a seed whose answer does not
    r = c.chat.completions.create(model="alpha.gguf", messages=USER, max_tokens=4, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 4
    a = anthropic.Anthropic(base_url=s.url, api_key=keys["bob"], max_retries=0)
    m = a.messages.create(model="beta.gguf", max_tokens=3, messages=USER, extra_body={"seed": 1})
    assert m.usage.output_tokens == 3
    o = ollama.Client(host=s.url, headers={"Authorization": f"Bearer {keys['bob']}"})
    assert o.chat(model="alpha.gguf", messages=USER, options={"num_predict": 2, "seed": 1}).eval_count == 2
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=s.url + "/v1", api_key="tallow-made-up", max_retries=0).models.list()
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=s.url, api_key="tallow-wrong", max_retries=0).messages.create(
            model="beta.gguf", max_tokens=3, messages=USER)


def test_scopes_models_routes_and_expiry(team):
    s, _, keys = team
    alice = openai.OpenAI(base_url=s.url + "/v1", api_key=keys["alice"], max_retries=0)
    with pytest.raises(openai.PermissionDeniedError, match="may not use the model 'beta.gguf'"):
        alice.chat.completions.create(model="beta.gguf", messages=USER, max_tokens=2)
    bob = ollama.Client(host=s.url, headers={"Authorization": f"Bearer {keys['bob']}"})
    for admin_call in (lambda: bob.delete("alpha.gguf"), lambda: bob.copy("alpha.gguf", "gamma"),
                       lambda: bob.generate(model="alpha.gguf", keep_alive=0)):
        with pytest.raises(ollama.ResponseError) as err:
            admin_call()
        assert err.value.status_code == 403
    assert s.raw("/metrics", headers={"Authorization": f"Bearer {keys['bob']}"})[0] == 403
    assert s.raw("/metrics", headers={"Authorization": f"Bearer {keys['admin']}"})[0] == 200
    with pytest.raises(openai.AuthenticationError, match="expired on 2020-01-01"):
        openai.OpenAI(base_url=s.url + "/v1", api_key=keys["old"], max_retries=0).chat.completions.create(
            model="alpha.gguf", messages=USER, max_tokens=2)
    assert s.raw("/", headers={"Accept": "text/html"})[0] == 200  # the chat page's files need no key


def test_a_key_revoked_mid_stream_ends_the_stream(team, models):
    s, home, _ = team
    key = make_key(home, "carol")
    c = openai.OpenAI(base_url=s.url + "/v1", api_key=key, max_retries=0, timeout=120)
    stream = c.chat.completions.create(model="loop.gguf", messages=USER, max_tokens=30000, stream=True)
    got = 0
    with pytest.raises(openai.APIError, match="'carol' was revoked"):
        for _chunk in stream:
            got += 1
            if got == 5:
                tallow(home, "keys", "revoke", "carol")
    assert got < 30000
    with pytest.raises(openai.AuthenticationError):
        c.models.list()
    page = metrics_once(s, team[2]["admin"], 'tallow_requests_total{finish_reason="cancelled",model="loop.gguf"}')
    assert 'tallow_requests_total{finish_reason="cancelled",model="loop.gguf"} 1' in page


def metrics_once(s, admin: str, needle: str) -> str:
    """/metrics (read with an admin key) once it shows `needle`, or after 10 s as it is then."""
    page = ""
    for _ in range(100):
        page = s.raw("/metrics", headers={"Authorization": f"Bearer {admin}"})[2]
        if needle in page:
            break
        time.sleep(0.1)
    return page


def usage_of(home, *args: str) -> list[dict]:
    return json.loads(tallow(home, "usage", "--json", *args))


def test_usage_equals_the_sum_of_the_answers_across_a_restart(models, tmp_path):
    keys = {"dan": make_key(tmp_path, "dan"), "eve": make_key(tmp_path, "eve")}
    sent: dict[tuple[str, str], dict[str, int]] = {}

    def add(who, model, prompt, cached, completion):
        t = sent.setdefault((who, model), {"requests": 0, "prompt_tokens": 0, "cached_tokens": 0,
                                           "completion_tokens": 0})
        for k, v in (("requests", 1), ("prompt_tokens", prompt), ("cached_tokens", cached),
                     ("completion_tokens", completion)):
            t[k] += v

    for round_ in range(2):  # the second server reads and adds to the same database
        s = serve(models, tmp_path)
        try:
            for who in keys:
                c = openai.OpenAI(base_url=s.url + "/v1", api_key=keys[who], max_retries=0)
                for model in ("alpha.gguf", "beta.gguf"):
                    r = c.chat.completions.create(model=model, messages=USER, max_tokens=3 + round_)
                    add(who, model, r.usage.prompt_tokens, r.usage.prompt_tokens_details.cached_tokens,
                        r.usage.completion_tokens)
                    chunks = list(c.chat.completions.create(model=model, messages=USER, max_tokens=5, stream=True,
                                                            stream_options={"include_usage": True}))
                    u = chunks[-1].usage
                    add(who, model, u.prompt_tokens, u.prompt_tokens_details.cached_tokens, u.completion_tokens)
            m = anthropic.Anthropic(base_url=s.url, api_key=keys["eve"], max_retries=0).messages.create(
                model="beta.gguf", max_tokens=2, messages=USER)
            add("eve", "beta.gguf", m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0),
                m.usage.cache_read_input_tokens or 0, m.usage.output_tokens)
            for _ in range(50):  # rows are written as each request ends, on the runners' writer threads
                if sum(r["requests"] for r in usage_of(tmp_path)) == sum(t["requests"] for t in sent.values()):
                    break
                time.sleep(0.1)
        finally:
            s.close()
    for who in keys:
        (row,) = usage_of(tmp_path, "--key", who)
        for model in ("alpha.gguf", "beta.gguf"):
            mine = sent[(who, model)]
            assert {k: row["models"][model][k] for k in mine} == mine, (who, model)
    by_model = {r["model"]: r for r in usage_of(tmp_path, "--by", "model")}
    assert by_model["beta.gguf"]["requests"] == sent[("dan", "beta.gguf")]["requests"] + sent[("eve", "beta.gguf")]["requests"]
    (day,) = usage_of(tmp_path, "--by", "day", "--since", "1h")
    assert day["requests"] == sum(t["requests"] for t in sent.values())
    assert usage_of(tmp_path, "--since", "2099-01-01") == []
    assert [r["key"] for r in usage_of(tmp_path, "--model", "alpha*")] == ["dan", "eve"]


def test_prices_arithmetic(tmp_path):
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"alpha*": {"input": 2.5, "cached_input": 1.25, "output": 10},
                                  "*": {"input": 0.15, "cached_input": 0.075, "output": 0.6}}))
    table = load_prices(prices)
    counts = {"prompt_tokens": 1_000_000, "cached_tokens": 400_000, "completion_tokens": 200_000}
    # 600k fresh input at 2.5, 400k cached at 1.25, 200k output at 10 per million
    assert cost(counts, "alpha.gguf", table) == pytest.approx(1.5 + 0.5 + 2.0)
    assert cost(counts, "beta.gguf", table) == pytest.approx(0.09 + 0.03 + 0.12)
    assert cost(counts, "beta.gguf", table[:1]) is None
    bad = tmp_path / "bad.json"
    for text in ('{"x": {"input": 1}}', '[]', '{"x": {"input": -1, "cached_input": 0, "output": 0}}', "{nope"):
        bad.write_text(text)
        r = run_tallow(["usage", "--prices", str(bad)], home=tmp_path)
        assert r.returncode == 1 and r.stderr.decode().startswith("error:"), text


def test_usage_json_prices_each_key(models, tmp_path):
    key = make_key(tmp_path, "fay")
    s = serve(models, tmp_path)
    try:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key=key, max_retries=0)
        r = c.chat.completions.create(model="alpha.gguf", messages=USER, max_tokens=7)
        for _ in range(50):
            if usage_of(tmp_path):
                break
            time.sleep(0.1)
    finally:
        s.close()
    prices = tmp_path / "p.json"
    prices.write_text(json.dumps({"*": {"input": 3, "cached_input": 1, "output": 15}}))
    (row,) = usage_of(tmp_path, "--prices", str(prices))
    u = r.usage
    expected = ((u.prompt_tokens - u.prompt_tokens_details.cached_tokens) * 3 + u.prompt_tokens_details.cached_tokens
                + u.completion_tokens * 15) / 1e6
    assert row["cost"] == pytest.approx(expected, abs=1e-6)
    text = tallow(tmp_path, "usage", "--prices", str(prices))
    assert text.startswith("fay  1 requests") and f"cost {expected:.4f}" in text


def test_limits_answer_429_with_retry_after(models, tmp_path):
    keys = {"rpm": make_key(tmp_path, "rpm", "--requests-per-minute", "2"),
            "tpm": make_key(tmp_path, "tpm", "--tokens-per-minute", "40"),
            "one": make_key(tmp_path, "one", "--concurrency", "1"),
            "cap": make_key(tmp_path, "cap", "--max-tokens", "3")}
    s = serve(models, tmp_path)
    try:
        def ask(who, **kw):
            c = openai.OpenAI(base_url=s.url + "/v1", api_key=keys[who], max_retries=0, timeout=120)
            return c.chat.completions.create(model=kw.pop("model", "alpha.gguf"), messages=USER,
                                             **{"max_tokens": 2, **kw})

        ask("rpm"), ask("rpm")
        with pytest.raises(openai.RateLimitError) as err:
            ask("rpm")
        assert int(err.value.response.headers["retry-after"]) >= 1 and "2 requests a minute" in str(err.value)
        # admitted with tokens left; charged after (all 30 tokens: the random model may end early)
        first = ask("tpm", max_tokens=30, extra_body={"ignore_eos": True})
        assert first.usage.prompt_tokens + first.usage.completion_tokens > 40
        for _ in range(50):
            try:
                ask("tpm")
            except openai.RateLimitError as exc:
                assert "40 tokens a minute" in str(exc) and int(exc.response.headers["retry-after"]) >= 1
                break
            time.sleep(0.05)  # until the front has read the first request's usage row
        else:
            raise AssertionError("the token limit was never enforced")
        assert ask("cap", max_tokens=50).usage.completion_tokens == 3  # the key's cap on an answer
        c = openai.OpenAI(base_url=s.url + "/v1", api_key=keys["one"], max_retries=0, timeout=120)
        with c.chat.completions.create(model="loop.gguf", messages=USER, max_tokens=20000, stream=True) as stream:
            next(iter(stream))  # one request of "one" in flight
            with pytest.raises(openai.RateLimitError, match="in flight"):
                ask("one")
        # Anthropic's and Ollama's shapes for the same refusal
        status, headers, body = s.raw("/v1/messages", json.dumps({"model": "alpha.gguf", "max_tokens": 2,
                                                                   "messages": USER}).encode(),
                                      {"x-api-key": keys["rpm"], "Content-Type": "application/json"})
        assert status == 429 and body["error"]["type"] == "rate_limit_error" and headers["Retry-After"]
        status, _, body = s.raw("/api/chat", json.dumps({"model": "alpha.gguf", "messages": USER}).encode(),
                                {"Authorization": f"Bearer {keys['rpm']}"})
        assert status == 429 and "requests a minute" in body["error"]
    finally:
        s.close()


def test_per_key_metrics_name_the_key_never_the_key_itself(team):
    s, _, keys = team
    openai.OpenAI(base_url=s.url + "/v1", api_key=keys["bob"], max_retries=0).chat.completions.create(
        model="beta.gguf", messages=USER, max_tokens=2)
    page = metrics_once(s, keys["admin"], 'tallow_key_requests_total{key="bob",model="beta.gguf"}')
    assert 'tallow_key_requests_total{key="bob",model="beta.gguf"}' in page
    assert 'tallow_key_completion_tokens_total{key="bob",model="beta.gguf"}' in page
    assert all(k not in page for k in keys.values())


def test_concurrent_keys_are_metered_apart(team):
    s, home, keys = team
    before = {r["key"]: r["requests"] for r in usage_of(home)}

    def one(who):
        return openai.OpenAI(base_url=s.url + "/v1", api_key=keys[who], max_retries=0).chat.completions.create(
            model="alpha.gguf", messages=USER, max_tokens=2)

    with ThreadPoolExecutor(6) as pool:
        list(pool.map(one, ["alice", "bob"] * 3))
    for _ in range(50):
        after = {r["key"]: r["requests"] for r in usage_of(home)}
        if after.get("alice", 0) - before.get("alice", 0) == 3 and after.get("bob", 0) - before.get("bob", 0) == 3:
            break
        time.sleep(0.1)
    assert after["alice"] - before.get("alice", 0) == 3 and after["bob"] - before.get("bob", 0) == 3


def test_embeddings_are_metered_and_an_embed_key_cannot_generate(team):
    s, home, keys = team
    before = {r["key"]: r for r in usage_of(home, "--model", "alpha.gguf")}.get("bob", {"requests": 0, "prompt_tokens": 0})
    c = openai.OpenAI(base_url=s.url + "/v1", api_key=keys["bob"], max_retries=0)
    e = c.embeddings.create(model="alpha.gguf", input=["hello there", "general kenobi"])
    assert e.usage.prompt_tokens > 0
    after = before
    for _ in range(50):
        after = {r["key"]: r for r in usage_of(home, "--model", "alpha.gguf")}.get("bob", before)
        if after["requests"] == before["requests"] + 1:
            break
        time.sleep(0.1)
    assert after["requests"] == before["requests"] + 1
    assert after["prompt_tokens"] - before["prompt_tokens"] == e.usage.prompt_tokens
    embed_only = make_key(home, "indexer", "--routes", "embed")
    c = openai.OpenAI(base_url=s.url + "/v1", api_key=embed_only, max_retries=0)
    assert len(c.embeddings.create(model="beta.gguf", input="x").data) == 1
    with pytest.raises(openai.PermissionDeniedError, match="may not use generate routes"):
        c.chat.completions.create(model="beta.gguf", messages=USER, max_tokens=2)
