"""Ollama's API on tallow serve, through the official `ollama` Python client and raw HTTP."""

from __future__ import annotations

import json

import pytest
from helpers.server import Server
from helpers.synth import write_synthetic_gguf

pytestmark = pytest.mark.slow  # servers through the ollama client

ollama = pytest.importorskip("ollama")

SCHEMA = {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"],
          "additionalProperties": False}
USER = [{"role": "user", "content": "Say something"}]


@pytest.fixture(scope="module")
def home(tmp_path_factory, synth_model):
    """A TALLOW_HOME with one stored model (imported, as users do with their own files)."""
    from helpers.processes import run_tallow

    home = tmp_path_factory.mktemp("ollama-home")
    done = run_tallow(["import", str(synth_model), "--name", "synth:tiny"], home=home)
    assert done.returncode == 0, done.stderr
    return home


@pytest.fixture(scope="module")
def server(home):
    s = Server(None, home, "--parallel", "2", "--seed", "5")
    yield s
    s.close()


def client(server):
    return ollama.Client(host=server.url, timeout=120)


def test_list_show_version_and_liveness(server):
    c = client(server)
    models = c.list().models
    assert [m.model for m in models] == ["synth:tiny"]
    assert models[0].size > 0 and models[0].details.format == "gguf" and models[0].details.family == "llama"
    shown = c.show("synth:tiny")
    assert "completion" in shown.capabilities and shown.modelinfo["general.architecture"] == "llama"
    assert shown.details.quantization_level
    assert server.raw("/")[2] == "tallow is running"
    assert server.raw("/", method="HEAD")[0] == 200
    assert server.raw("/api/version")[2]["version"]
    with pytest.raises(ollama.ResponseError) as missing:
        c.show("nothing:here")
    assert missing.value.status_code == 404 and "not served here" in missing.value.error


def test_chat_streamed_and_whole_with_real_timings(server):
    c = client(server)
    whole = c.chat("synth:tiny", USER, options={"num_predict": 6, "temperature": 0})
    assert whole.done and whole.done_reason == "length" and whole.eval_count == 6
    assert whole.prompt_eval_count > 0 and whole.eval_duration > 0 and whole.prompt_eval_duration > 0
    assert whole.total_duration >= whole.eval_duration + whole.prompt_eval_duration
    parts = list(c.chat("synth:tiny", USER, stream=True, options={"num_predict": 6, "temperature": 0}))
    assert parts[-1].done and parts[-1].eval_count == 6 and not any(p.done for p in parts[:-1])
    assert "".join(p.message.content for p in parts) == whole.message.content  # the same greedy answer
    # a first request to a model not loaded says how long the load took
    c.generate("synth:tiny", keep_alive=0)
    cold = c.chat("synth:tiny", USER, options={"num_predict": 2})
    assert cold.load_duration > 1_000_000  # more than a millisecond: the runner started


def test_generate_raw_system_and_options(server):
    c = client(server)
    r = c.generate("synth:tiny", "Once upon", options={"num_predict": 4, "seed": 9, "top_k": 5, "repeat_last_n": 16,
                                                        "repeat_penalty": 1.1, "stop": ["zzz"]})
    assert r.done and r.eval_count == 4 and r.response
    again = c.generate("synth:tiny", "Once upon", options={"num_predict": 4, "seed": 9, "top_k": 5,
                                                            "repeat_last_n": 16, "repeat_penalty": 1.1,
                                                            "stop": ["zzz"]})
    assert again.response == r.response  # a seed fixes the answer
    raw = c.generate("synth:tiny", "Once upon", raw=True, options={"num_predict": 3})
    assert raw.prompt_eval_count < r.prompt_eval_count  # no chat template around it
    parts = list(c.generate("synth:tiny", "Hi", system="Be brief.", stream=True, options={"num_predict": 3}))
    assert parts[-1].done and parts[-1].eval_count == 3
    lp = c.generate("synth:tiny", "Hi", logprobs=True, top_logprobs=2, options={"num_predict": 3})
    assert len(lp.logprobs) == 3 and all(len(e.top_logprobs) == 2 for e in lp.logprobs)


def test_format_schema_and_json(server):
    c = client(server)
    r = c.chat("synth:tiny", USER, format=SCHEMA, options={"num_predict": 40})
    assert json.loads(r.message.content)["color"] in ("red", "green", "blue")
    r = c.generate("synth:tiny", "json please", format="json", options={"num_predict": 30})
    assert r.done_reason == "length" or isinstance(json.loads(r.response), (dict, list))


def test_refusals_name_the_field(server):
    c = client(server)
    cases = [({"options": {"tfs_z": 2}}, "tfs_z"), ({"options": {"num_ctx": 10**6}}, "num_ctx"),
             ({"options": {"num_thread": 977}}, "num_thread"), ({"think": "extreme"}, "think"),
             ({"keep_alive": "soon"}, "keep_alive"), ({"frobnicate": 1}, "frobnicate")]
    for extra, word in cases:
        body = {"model": "synth:tiny", "messages": USER, "stream": False, **extra}
        status, _, data = server.raw("/api/chat", json.dumps(body).encode())
        assert status == 400 and word in data["error"], (extra, data)
    for extra, word in (({"template": "{{ .Prompt }}"}, "template"), ({"suffix": "x"}, "suffix"),
                        ({"context": [1, 2]}, "context"), ({"images": ["aGk="]}, "images")):
        body = {"model": "synth:tiny", "prompt": "hi", "stream": False, **extra}
        status, _, data = server.raw("/api/generate", json.dumps(body).encode())
        assert status == 400 and word in data["error"], (extra, data)
    with pytest.raises(ollama.ResponseError) as e:
        c.chat("gpt-4o", USER)
    assert e.value.status_code == 404
    assert c.chat("synth:tiny", USER, options={"num_ctx": 512, "num_predict": 2}).eval_count == 2


def test_ps_keep_alive_zero_copy_and_delete(server, home):
    c = client(server)
    c.generate("synth:tiny", "hi", options={"num_predict": 1}, keep_alive="1h")
    (entry,) = c.ps().models
    assert entry.model == "synth:tiny" and entry.size > 0 and entry.size_vram == 0 and entry.context_length > 0
    assert entry.expires_at is not None
    assert c.generate("synth:tiny", keep_alive=0).done_reason == "unload"
    assert c.ps().models == []
    c.copy("synth:tiny", "synth:copy")
    assert {m.model for m in c.list().models} == {"synth:tiny", "synth:copy"}
    assert c.chat("synth:copy", USER, options={"num_predict": 2}).eval_count == 2
    c.delete("synth:copy")
    assert [m.model for m in c.list().models] == ["synth:tiny"]
    assert c.ps().models == [] or all(m.model != "synth:copy" for m in c.ps().models)
    with pytest.raises(ollama.ResponseError):
        c.delete("synth:copy")


def test_pull_from_the_hub_emulator_streams_progress(fake_hub, synth_model, tmp_path):
    other = write_synthetic_gguf(tmp_path / "other.gguf", seed=77)
    fake_hub.add("tallow-test/Pulled-GGUF", "pulled-Q8_0.gguf", other)
    s = Server(None, tmp_path / "home", env={"HF_ENDPOINT": fake_hub.url})
    try:
        c = client(s)
        steps = list(c.pull("tallow-test/Pulled-GGUF:Q8_0", stream=True))
        assert steps[0].status == "pulling manifest" and steps[-1].status == "success"
        assert any(p.total and p.completed == p.total for p in steps)
        assert [m.model for m in c.list().models] == ["tallow-test/Pulled-GGUF:Q8_0"]
        assert c.generate("tallow-test/Pulled-GGUF:Q8_0", "hi", options={"num_predict": 2}).eval_count == 2
        with pytest.raises(ollama.ResponseError) as e:
            c.pull("tallow-test/Missing-GGUF:Q8_0")
        assert "Missing" in e.value.error
    finally:
        s.close()


def test_tool_calls_through_ollama(tmp_path):
    from helpers.synth import HERMES
    from test_agents import CALL  # the call the scripted model makes

    model = write_synthetic_gguf(tmp_path / "agent.gguf", template=HERMES,
                                 script={"\n": "<tool_call>", "<tool_call>": CALL, CALL: "</tool_call>",
                                         "</tool_call>": "<|im_end|>"},
                                 extra_tokens=("<tool_call>", "</tool_call>", CALL))
    s = Server(model, tmp_path / "home")
    try:
        tool = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                                 "parameters": {"type": "object", "properties":
                                                                {"city": {"type": "string"}}, "required": ["city"]}}}
        r = client(s).chat("agent.gguf", [{"role": "user", "content": "Weather in Paris?"}], tools=[tool])
        (call,) = r.message.tool_calls
        assert call.function.name == "get_weather" and isinstance(call.function.arguments, dict)
        follow = [{"role": "user", "content": "Weather in Paris?"}, r.message,
                  {"role": "tool", "content": "sunny", "tool_name": "get_weather"}]
        assert client(s).chat("agent.gguf", follow, tools=[tool], options={"num_predict": 3}).done
    finally:
        s.close()


def test_think_splits_the_reasoning(tmp_path):
    from test_chat import THINK_SCRIPT, THINK_TEMPLATE

    path = write_synthetic_gguf(tmp_path / "think.gguf", script=THINK_SCRIPT, template=THINK_TEMPLATE)
    s = Server(path, tmp_path / "home")
    try:
        c = client(s)
        r = c.chat("think.gguf", [{"role": "user", "content": "hi"}], think=True, options={"temperature": 0})
        assert r.message.thinking == "hm" and r.message.content == "OK"
        parts = list(c.chat("think.gguf", [{"role": "user", "content": "hi"}], think=True, stream=True,
                            options={"temperature": 0}))
        assert "".join(p.message.thinking or "" for p in parts) == "hm"
        assert "".join(p.message.content for p in parts) == "OK"
        quiet = c.generate("think.gguf", "hi", think=False, options={"temperature": 0})
        assert quiet.thinking is None and quiet.response == "OK"
        status, _, data = s.raw("/api/embed", json.dumps({"model": "think.gguf", "input": "hi"}).encode())
        assert status == 200 and len(data["embeddings"][0]) > 0  # a chat model embeds too (mean pooling)
    finally:
        s.close()
