"""LoRA adapters: a synthetic adapter (written with gguf) switches the script model from
"abab..." to "xyxy...", on every route: the engine, run and chat's --lora, a Modelfile's
ADAPTER, serve's --lora with llama-server's /lora-adapters and per-request `lora` field,
and concurrent requests with and without it, each getting its own answer. Adapters for
another architecture or width are refused naming both."""

from __future__ import annotations

import concurrent.futures as cf
import json
from dataclasses import replace
from pathlib import Path

import pytest
from helpers.adapter import switch_adapter, write_adapter
from helpers.processes import run_tallow
from helpers.server import Server
from helpers.synth import write_synthetic_gguf

from tallow.models.adapter import AdapterError, read_adapter
from tallow.models.store import Store

SCRIPT = {"\n": "a", "a": "b", "b": "a", "x": "y", "y": "x"}
PLAIN, ADAPTED = "ababab", "xyxyxy"


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("lora")
    model = write_synthetic_gguf(d / "script.gguf", script=SCRIPT)
    return {"model": model, "lora": switch_adapter(d / "xy.gguf", model, "\n", "x"),
            "narrow": switch_adapter(d / "narrow.gguf", model, "\n", "x", width=32),
            "qwen": switch_adapter(d / "qwen.gguf", model, "\n", "x", arch="qwen2"), "dir": d}


@pytest.fixture(scope="module")
def home(files, tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("lora-home")
    assert run_tallow(["import", str(files["model"]), "--name", "script"], home=home).returncode == 0
    return home


def answer(engine, lora=None) -> str:
    from tallow.runtime.types import Sampling

    request = engine.request([{"role": "user", "content": "go"}], max_tokens=6, sampling=Sampling(temperature=0))
    return list(engine.stream(replace(request, lora=lora)))[-1].text


def test_the_adapter_switches_the_answer_and_its_scale_decides(files):
    from tallow.runtime.engine import Engine
    from tallow.runtime.types import LoadSettings, LoraSpec

    load = LoadSettings(n_ctx=256, n_threads=1)
    with Engine([files["model"]], load) as plain:
        assert answer(plain) == PLAIN
    with Engine([files["model"]], replace(load, loras=(LoraSpec(files["lora"]),))) as engine:
        assert answer(engine) == ADAPTED
        # a request's own scales: the cells the other set computed are not reused
        assert [answer(engine, (0.0,)), answer(engine), answer(engine, (0.0,))] == [PLAIN, ADAPTED, PLAIN]
    with Engine([files["model"]], replace(load, loras=(LoraSpec(files["lora"], 0.0),))) as engine:
        assert answer(engine) == PLAIN and answer(engine, (1.0,)) == ADAPTED


def test_an_adapter_for_another_model_is_refused_naming_both(files):
    from tallow.runtime.engine import Engine
    from tallow.runtime.types import LoadSettings, LoraSpec

    for name, words in (("qwen", "the adapter qwen.gguf is for qwen2, but the model (tallow-synthetic) is llama"),
                        ("narrow", "the adapter narrow.gguf changes output.weight as [32, 275], but the model "
                                   "(tallow-synthetic) has it as [64, 275] (width 64)")):
        with pytest.raises(AdapterError, match=words.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
            Engine([files["model"]], LoadSettings(n_ctx=256, n_threads=1, loras=(LoraSpec(files[name]),)))
    with pytest.raises(AdapterError, match="is not a LoRA adapter"):
        read_adapter(files["model"])
    missing = write_adapter(files["dir"] / "other.gguf", "llama", {"blk.9.attn_q.weight": (
        __import__("numpy").zeros((1, 64)), __import__("numpy").zeros((64, 1)))})
    with pytest.raises(AdapterError, match="changes blk.9.attn_q.weight, which the model"):
        Engine([files["model"]], LoadSettings(n_ctx=256, n_threads=1, loras=(LoraSpec(missing),)))


def test_run_and_chat_take_lora_and_a_modelfile_stores_it(files, home):
    def run(*args: str) -> str:
        r = run_tallow(["run", *args, "go", "-n", "6", "--temperature", "0", "--no-cache"], home=home)
        assert r.returncode == 0, r.stderr.decode()
        return r.stdout.decode().strip()

    assert run("script") == PLAIN
    assert run("script", "--lora", str(files["lora"])) == ADAPTED
    assert run("script", "--lora", f"{files['lora']}:0") == PLAIN
    bad = run_tallow(["run", "script", "go", "--lora", str(files["qwen"])], home=home)
    assert bad.returncode == 1 and "is for qwen2, but the model (tallow-synthetic) is llama" in bad.stderr.decode()
    bad = run_tallow(["run", "script", "go", "--lora", str(files["dir"] / "none.gguf")], home=home)
    assert bad.returncode == 2 and "no adapter file" in bad.stderr.decode()
    chat = run_tallow(["chat", "script", "--lora", str(files["lora"]), "--temperature", "0", "-n", "6"], home=home,
                      input=b"go\n")
    assert chat.returncode == 0 and ADAPTED in chat.stdout.decode(), chat.stderr

    modelfile = files["dir"] / "Modelfile"
    modelfile.write_text("FROM script\nADAPTER ./xy.gguf\n")  # relative to the Modelfile
    made = run_tallow(["create", "xy", "-f", str(modelfile)], home=home)
    assert made.returncode == 0, made.stderr
    store = Store(home / "models")
    manifest = store.get("xy")
    assert manifest.files == store.get("script").files and len(manifest.adapters) == 1
    assert run("xy") == ADAPTED and run("xy", "--lora", f"{files['lora']}:-1") == PLAIN  # ids add up: 1 - 1 = 0
    shown = run_tallow(["show", "xy", "--modelfile"], home=home).stdout.decode()
    assert shown == f"FROM script:latest\nADAPTER {store.file_path(manifest.adapters[0])}\n"
    again = run_tallow(["create", "xy2", "-f", "-"], home=home, input=shown.encode())
    assert again.returncode == 0 and [f.digest for f in store.get("xy2").adapters] == [manifest.adapters[0].digest]
    bad = run_tallow(["create", "wrong", "-f", "-"], home=home, input=f"FROM script\nADAPTER {files['narrow']}\n".encode())
    assert bad.returncode == 1 and "stdin line 2: ADAPTER narrow.gguf: the adapter narrow.gguf changes" in bad.stderr.decode()
    assert store.get("wrong") is None


def test_served_requests_pick_their_adapters_and_run_side_by_side(files, home):
    server = Server("script", home, "--offline", "--parallel", "4", "--lora", f"{files['lora']}:0")
    try:
        client = server.client()

        def ask(lora) -> str:
            extra = {"lora": lora} if lora is not None else {}
            r = client.chat.completions.create(model="script", messages=[{"role": "user", "content": "go"}],
                                               max_tokens=6, temperature=0, extra_body=extra)
            return r.choices[0].message.content

        assert [ask(None), ask([{"id": 0, "scale": 1.0}]), ask([])] == [PLAIN, ADAPTED, PLAIN]
        with cf.ThreadPoolExecutor(8) as pool:  # both sets in flight at once: grouped, each its own answer
            wants = [None, [{"id": 0, "scale": 1}]] * 8
            assert list(pool.map(ask, wants)) == [PLAIN, ADAPTED] * 8
        status, _, listed = server.raw("/lora-adapters")
        assert status == 200 and listed == [{"id": 0, "path": str(files["lora"]), "scale": 0.0, "task_name": "",
                                             "prompt_prefix": ""}]
        status, _, out = server.raw("/lora-adapters", json.dumps([{"id": 0, "scale": 1}]).encode(),
                                    {"Content-Type": "application/json"})
        assert status == 200 and out == {"success": True}
        assert ask(None) == ADAPTED and server.raw("/lora-adapters")[2][0]["scale"] == 1.0
        for bad, words in (([{"id": 1, "scale": 1}], "must name a loaded adapter once (this model has 1"),
                           ({"id": 0}, "must be a list of"), ([{"id": 0, "scale": "high"}], "'scale' must be a number"),
                           ([{"id": 0}, {"id": 0}], "once")):
            status, _, err = server.raw("/v1/chat/completions", json.dumps(
                {"messages": [{"role": "user", "content": "go"}], "lora": bad}).encode(), {"Content-Type": "application/json"})
            assert status == 400 and words in err["error"]["message"], err
    finally:
        server.close()
