"""llama.cpp's native API on tallow serve, spoken as its clients speak it (plain HTTP, the
field names of llama.cpp's server README): /completion whole and streamed, with text, token
and mixed prompts, probabilities, grammars and stop words; /tokenize, /detokenize,
/apply-template, /props and /slots (behind the key); /infill on a model with FIM tokens;
and the context-overflow error's sizes. The same scheduler answers /v1/completions, so the
two give the same text."""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request

import pytest
from helpers.server import Server
from helpers.synth import write_synthetic_gguf

pytestmark = pytest.mark.default_model
KEY = "native-key"
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def server(default_model, tmp_path_factory):
    s = Server(default_model, tmp_path_factory.mktemp("native"), "--parallel", "2", "--ctx", "2048",
               "--api-key", KEY)
    yield s
    s.close()


def call(server, path: str, body: dict | None = None, key: str | None = KEY, method: str | None = None):
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    req = urllib.request.Request(server.url + path, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            raw = resp.read().decode()
            status = resp.status
    except urllib.error.HTTPError as err:
        raw, status = err.read().decode(), err.code
    if raw.startswith("data: "):
        return status, [json.loads(line[6:]) for line in raw.split("\n\n") if line.startswith("data: ")]
    return status, json.loads(raw)


def test_completion_whole_has_llama_cpps_fields_and_the_v1_answer(server):
    status, out = call(server, "/completion", {"prompt": PROMPT, "n_predict": 8, "temperature": 0})
    assert status == 200, out
    assert out["stop"] is True and out["stop_type"] == "limit" and out["tokens_predicted"] == 8
    assert out["tokens_evaluated"] > 0 and out["model"] and out["prompt"] == PROMPT
    t = out["timings"]
    assert t["prompt_n"] > 0 and t["predicted_n"] == 8 and t["predicted_per_second"] > 0
    assert out["generation_settings"]["n_predict"] == 8
    status, v1 = call(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 8, "temperature": 0})
    assert v1["choices"][0]["text"] == out["content"]
    _, again = call(server, "/completion", {"prompt": PROMPT, "n_predict": 8, "temperature": 0, "cache_prompt": True})
    assert again["tokens_cached"] > 0 and again["content"] == out["content"]


def test_completion_streamed_token_and_mixed_prompts(server):
    _, whole = call(server, "/completion", {"prompt": PROMPT, "n_predict": 6, "temperature": 0})
    status, chunks = call(server, "/completion", {"prompt": PROMPT, "n_predict": 6, "temperature": 0, "stream": True,
                                                   "n_probs": 3, "return_tokens": True, "timings_per_token": True})
    assert status == 200 and chunks[-1]["stop"] is True and all(c["stop"] is False for c in chunks[:-1])
    assert "".join(c["content"] for c in chunks) == whole["content"]
    probs = [p for c in chunks[:-1] for p in c.get("completion_probabilities", [])]
    assert len(probs) == 6 and all(len(p["top_logprobs"]) == 3 and isinstance(p["id"], int) for p in probs)
    assert all("timings" in c and "tokens" in c for c in chunks[:-1])
    _, ids = call(server, "/tokenize", {"content": PROMPT, "add_special": True})
    _, by_ids = call(server, "/completion", {"prompt": ids["tokens"], "n_predict": 6, "temperature": 0})
    assert by_ids["content"] == whole["content"]
    _, tail = call(server, "/tokenize", {"content": " is"})
    mixed = [PROMPT[:-3], *tail["tokens"]]
    _, by_mixed = call(server, "/completion", {"prompt": mixed, "n_predict": 6, "temperature": 0})
    assert by_mixed["content"] == whole["content"]


def test_post_sampling_probs_are_what_the_sampler_chain_left(server):
    """llama.cpp's post_sampling_probs: `prob` and `top_probs` after the chain. Greedy cuts
    nothing, so they are the model's probabilities (exp of the log-probabilities); top_k 2
    leaves two candidates, whose probabilities sum to 1; a lookup draft reports every token."""
    ask = {"prompt": PROMPT, "n_predict": 6, "temperature": 0, "n_probs": 3}
    _, plain = call(server, "/completion", ask)
    _, post = call(server, "/completion", {**ask, "post_sampling_probs": True})
    assert post["content"] == plain["content"]
    for lp, p in zip(plain["completion_probabilities"], post["completion_probabilities"], strict=True):
        assert "logprob" not in p and p["id"] == lp["id"] == p["top_probs"][0]["id"]
        assert p["prob"] == pytest.approx(math.exp(lp["logprob"]), abs=1e-4)
        assert [t["id"] for t in p["top_probs"]] == [t["id"] for t in lp["top_logprobs"]]
    _, cut = call(server, "/completion", {**ask, "post_sampling_probs": True, "temperature": 1.0, "top_k": 2,
                                          "top_p": 1.0, "min_p": 0.0, "seed": 7, "stream": True})
    probs = [p for c in cut[:-1] for p in c.get("completion_probabilities", [])]
    assert len(probs) == 6
    for p in probs:
        assert len(p["top_probs"]) <= 2 and sum(t["prob"] for t in p["top_probs"]) == pytest.approx(1.0, abs=1e-5)
        assert p["prob"] == next(t["prob"] for t in p["top_probs"] if t["id"] == p["id"])
    _, drafted = call(server, "/completion", {**ask, "post_sampling_probs": True, "draft": "lookup",
                                              "prompt": "the quick brown fox jumps over the lazy dog, " * 3, "n_predict": 24})
    got = drafted["completion_probabilities"]
    assert len(got) == drafted["tokens_predicted"] == 24 and all(0 < p["prob"] <= 1 for p in got)
    assert drafted["timings"]["draft_n_accepted"] > 0  # tokens taken several to a step were reported


def test_completion_grammar_schema_and_stop_word(server):
    _, out = call(server, "/completion", {"prompt": "Answer yes or no: is the sky blue?", "n_predict": 4,
                                          "grammar": 'root ::= "yes" | "no"', "temperature": 0})
    assert out["content"] in ("yes", "no")
    _, out = call(server, "/completion", {"prompt": "A person as JSON:", "n_predict": 64, "temperature": 0,
                                          "json_schema": {"type": "object", "properties": {"age": {"type": "integer"}},
                                                          "required": ["age"]}})
    assert isinstance(json.loads(out["content"])["age"], int)
    _, out = call(server, "/completion", {"prompt": PROMPT, "n_predict": 16, "temperature": 0, "stop": ["."]})
    assert out["stop_type"] == "word" and out["stopping_word"] == "." and "." not in out["content"]


def test_fields_at_their_defaults_pass_and_others_are_refused_by_name(server):
    status, _ = call(server, "/completion", {"prompt": PROMPT, "n_predict": 2, "dry_multiplier": 0, "xtc_probability": 0,
                                             "n_keep": -1, "seed": -1, "typical_p": 1.0, "samplers": ["top_k", "min_p"]})
    assert status == 200
    for field, value in (("dry_multiplier", 0.8), ("image_data", [{"data": "x", "id": 1}]), ("nope", 1),
                         ("samplers", ["xtc"]), ("prompt", [["a"], ["b"]])):
        status, out = call(server, "/completion", {"prompt": PROMPT, "n_predict": 2, field: value})
        assert status == 400 and out["error"]["param"] == field, (field, out)


def test_tokenizer_template_props_and_slots(server):
    _, ids = call(server, "/tokenize", {"content": "Hello world", "with_pieces": True})
    assert [t["piece"] for t in ids["tokens"]] == ["Hello", " world"]
    _, text = call(server, "/detokenize", {"tokens": [t["id"] for t in ids["tokens"]]})
    assert text["content"] == "Hello world"
    _, out = call(server, "/apply-template", {"messages": [{"role": "user", "content": "hi there"}]})
    assert "hi there" in out["prompt"] and out["prompt"].endswith("<|im_start|>assistant\n")
    _, props = call(server, "/props")
    assert props["total_slots"] == 2 and props["default_generation_settings"]["n_ctx"] == 1024
    assert "im_start" in props["chat_template"] and props["modalities"] == {"vision": False, "audio": False}
    status, slots = call(server, "/slots")
    assert status == 200 and [s["id"] for s in slots] == [0, 1] and all("prompt" not in s for s in slots)
    for path in ("/slots", "/props", "/tokenize"):
        status, _ = call(server, path, {"content": "x"} if path == "/tokenize" else None, key=None)
        assert status == 401, path
    status, out = call(server, "/detokenize", {"tokens": [10**9]})
    assert status == 400 and out["error"]["param"] == "tokens"


def test_the_context_overflow_error_says_the_sizes(server):
    status, out = call(server, "/completion", {"prompt": "word " * 1500, "n_predict": 4})
    assert status == 400 and out["error"]["code"] == "context_length_exceeded"
    assert out["error"]["n_ctx"] == 1024 and out["error"]["n_prompt_tokens"] > 1024
    status, v1 = call(server, "/v1/completions", {"prompt": "word " * 1500, "max_tokens": 4})
    assert v1["error"]["n_prompt_tokens"] == out["error"]["n_prompt_tokens"]


def test_infill_on_a_model_with_fim_tokens_and_not_without(server, tmp_path):
    status, out = call(server, "/infill", {"input_prefix": "def f(", "input_suffix": "):"})
    assert status == 400 and "fill-in-the-middle" in out["error"]["message"]
    model = write_synthetic_gguf(tmp_path / "fim.gguf", extra_tokens=("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
                                 script={"<fim_middle>": "x", "x": "y", "y": "x"})
    fim = Server(model, tmp_path / "home")
    try:
        status, out = call(fim, "/infill", {"input_prefix": "def f(", "input_suffix": "):", "n_predict": 4,
                                            "temperature": 0}, key=None)
        assert status == 200 and out["content"] == "xyxy", out
        _, with_start = call(fim, "/infill", {"input_prefix": "a", "input_suffix": "b", "prompt": "y", "n_predict": 2,
                                              "temperature": 0}, key=None)
        assert with_start["content"] == "xy"
    finally:
        fim.close()


def test_llama_server_clients_the_rest_of_the_way(server):
    """What llama-server answers and its clients read: bare /completions is the native API,
    cache_prompt false evaluates the whole prompt, the answer always has `tokens` and its
    timings `cache_n`, and the /v1 answers carry llama.cpp's timing names too."""
    body = {"prompt": PROMPT, "n_predict": 4, "temperature": 0}
    _, first = call(server, "/completion", body)
    status, bare = call(server, "/completions", body)
    assert status == 200 and bare["content"] == first["content"] and "choices" not in bare
    assert bare["tokens"] == [] and bare["timings"]["cache_n"] == bare["tokens_cached"] > 0
    _, fresh = call(server, "/completion", {**body, "cache_prompt": False})
    assert fresh["tokens_cached"] == 0 and fresh["timings"]["cache_n"] == 0 and fresh["content"] == first["content"]
    assert fresh["timings"]["prompt_n"] == fresh["tokens_evaluated"]
    _, v1 = call(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
    t = v1["timings"]
    assert t["predicted_n"] == v1["usage"]["completion_tokens"] and t["predicted_per_second"] > 0 and "cache_n" in t
    assert t["ttft_ms"] > 0  # tallow's own names stay


def test_several_prompts_objects_text_bias_fields_and_progress(server):
    """llama.cpp's array of prompts (each answered, in order), its prompt object, logit_bias
    keyed by text, response_fields, and return_progress's reports before the first token."""
    base = {"n_predict": 3, "temperature": 0}
    _, one = call(server, "/completion", {**base, "prompt": PROMPT})
    _, other = call(server, "/completion", {**base, "prompt": "Water is"})
    status, both = call(server, "/completion", {**base, "prompt": [PROMPT, "Water is"]})
    assert status == 200 and [b["content"] for b in both] == [one["content"], other["content"]]
    assert [b["index"] for b in both] == [0, 1]
    status, err = call(server, "/completion", {**base, "prompt": [PROMPT, "x"], "stream": True})
    assert status == 400 and err["error"]["param"] == "stream"
    _, obj = call(server, "/completion", {**base, "prompt": {"prompt_string": PROMPT}})
    assert obj["content"] == one["content"]
    # the greedy answer's first word, banned by its text: another answer
    word = one["content"].split()[0]
    _, banned = call(server, "/completion", {**base, "prompt": PROMPT, "logit_bias": [[word, False]]})
    assert word not in banned["content"].split()[:1]
    _, cut = call(server, "/completion", {**base, "prompt": PROMPT,
                                          "response_fields": ["content", "generation_settings/n_predict"]})
    assert cut == {"content": one["content"], "generation_settings/n_predict": 3}
    status, chunks = call(server, "/completion", {**base, "prompt": PROMPT, "stream": True, "return_progress": True})
    progress = [c["prompt_progress"] for c in chunks if "prompt_progress" in c]
    assert status == 200 and len(progress) == 1 and chunks[0].get("prompt_progress") == progress[0]
    assert progress[0]["processed"] == progress[0]["total"] == one["tokens_evaluated"] and progress[0]["time_ms"] > 0
    # a prompt longer than a batch: a report after each chunk, before the first token
    status, chunks = call(server, "/completion", {**base, "prompt": "word " * 700, "stream": True, "return_progress": True})
    reports = [i for i, c in enumerate(chunks) if "prompt_progress" in c]
    progress = [chunks[i]["prompt_progress"] for i in reports]
    assert status == 200 and len(progress) >= 2 and reports == list(range(len(reports))), progress
    done = [p["processed"] for p in progress]
    assert done == sorted(set(done)) and done[-1] == progress[-1]["total"] > 700 and progress[0]["cache"] == 0
