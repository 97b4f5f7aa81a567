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
    import numpy as np

    from tallow.runtime.engine import Engine
    from tallow.runtime.types import LoadSettings, LoraSpec

    for name, words in (("qwen", "the adapter qwen.gguf is for qwen2, but the model (tallow-synthetic) is llama"),
                        ("narrow", "the adapter narrow.gguf changes output.weight as [32, 275], but the model "
                                   "(tallow-synthetic) has it as [64, 275] (width 64)")):
        with pytest.raises(AdapterError, match=words.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
            Engine([files["model"]], LoadSettings(n_ctx=256, n_threads=1, loras=(LoraSpec(files[name]),)))
    with pytest.raises(AdapterError, match="is not a LoRA adapter"):
        read_adapter(files["model"])
    alora = write_adapter(files["dir"] / "alora.gguf", "llama", {"output.weight": (np.zeros((1, 64)), np.zeros((275, 1)))},
                          invocation=(5, 6))
    with pytest.raises(AdapterError, match="is an activated LoRA"):
        read_adapter(alora)
    missing = write_adapter(files["dir"] / "other.gguf", "llama", {"blk.9.attn_q.weight": (np.zeros((1, 64)),
                                                                                          np.zeros((64, 1)))})
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
    listed = json.loads(run_tallow(["show", "xy", "--json"], home=home).stdout)["adapters"]
    assert listed == [str(store.file_path(manifest.adapters[0]))]
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


def peft_folder(folder: Path, pairs: dict[str, tuple], r: int, alpha: float) -> Path:
    """A PEFT adapter as Hugging Face writes one: Hugging Face module names, A (r, in) and B (out, r)."""
    from safetensors.numpy import save_file

    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": r, "lora_alpha": alpha, "target_modules": ["q_proj", "k_proj", "v_proj", "lm_head"],
         "bias": "none", "fan_in_fan_out": False, "base_model_name_or_path": "synthetic"}))
    tensors = {}
    for module, (a, b) in pairs.items():
        tensors[f"base_model.model.{module}.lora_A.weight"] = a
        tensors[f"base_model.model.{module}.lora_B.weight"] = b
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    return folder


def rope_rows(b, n_head: int):
    """Hugging Face's Q/K rows in llama.cpp's order, written out index by index: within head h
    of size d, row h*d + 2*i + k comes from row h*d + k*d/2 + i (the rotary halves interleaved)."""
    import numpy as np

    d = b.shape[0] // n_head
    order = [h * d + k * (d // 2) + i for h in range(n_head) for i in range(d // 2) for k in range(2)]
    return np.stack([b[j] for j in order])


def test_a_peft_adapter_converts_to_the_same_gguf_adapter(files, home, tmp_path):
    import gguf
    import numpy as np
    from helpers.synth import N_HEAD, N_HEAD_KV

    rng = np.random.default_rng(7)
    r = 2

    def pair(n_in: int, n_out: int):
        return (rng.standard_normal((r, n_in)).astype(np.float32), rng.standard_normal((n_out, r)).astype(np.float32))

    hf = {"model.layers.0.self_attn.q_proj": pair(64, 64), "model.layers.1.self_attn.k_proj": pair(64, 32),
          "model.layers.0.self_attn.v_proj": pair(64, 32), "lm_head": pair(64, 275)}
    folder = peft_folder(tmp_path / "my-lora", hf, r, 4.0)
    (a_q, b_q), (a_k, b_k), (a_v, b_v), (a_o, b_o) = hf.values()
    direct = write_adapter(tmp_path / "direct.gguf", "llama", {
        "blk.0.attn_q.weight": (a_q, rope_rows(b_q, N_HEAD)), "blk.1.attn_k.weight": (a_k, rope_rows(b_k, N_HEAD_KV)),
        "blk.0.attn_v.weight": (a_v, b_v), "output.weight": (a_o, b_o)}, alpha=4.0)

    made = run_tallow(["import", str(folder), "--base", "script", "--name", "tuned"], home=home)
    assert made.returncode == 0, made.stderr
    assert "imported tuned:latest: script:latest with the adapter my-lora" in made.stderr.decode()
    store = Store(home / "models")
    converted = store.file_path(store.get("tuned").adapters[0])

    def contents(path: Path) -> dict:
        reader = gguf.GGUFReader(str(path))
        fields = {k: reader.fields[k].contents() for k in ("general.type", "general.architecture", "adapter.type",
                                                             "adapter.lora.alpha")}
        return {**fields, **{t.name: (tuple(t.shape), np.array(t.data).tobytes()) for t in reader.tensors}}

    assert contents(converted) == contents(direct)
    assert run_tallow(["run", "tuned", "go", "-n", "2", "--no-cache"], home=home).returncode == 0  # llama.cpp loads it

    wide = peft_folder(tmp_path / "wide", {"model.layers.0.self_attn.q_proj": pair(96, 64)}, r, 4.0)
    bad = run_tallow(["import", str(wide), "--base", "script"], home=home)
    assert bad.returncode == 1 and "the adapter wide changes blk.0.attn_q.weight as [96, 64], but script:latest has it as [64, 64]" \
        in bad.stderr.decode()
    assert store.get("wide") is None
    dora = peft_folder(tmp_path / "dora", {"lm_head": pair(64, 275)}, r, 4.0)
    (dora / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": r, "lora_alpha": 4, "use_dora": True}))
    bad = run_tallow(["import", str(dora), "--base", "script"], home=home)
    assert bad.returncode == 1 and "use_dora = True: DoRA" in bad.stderr.decode()


def test_batch_takes_lora_and_each_line_its_own(files, home, tmp_path):
    lines = tmp_path / "in.jsonl"
    go = [{"role": "user", "content": "go"}]
    lines.write_text("".join(json.dumps({"id": i, "messages": go, "max_tokens": 6, "temperature": 0,
                                         **({"lora": lora} if lora is not None else {})}) + "\n"
                             for i, lora in enumerate([None, [{"id": 0, "scale": 0}], None, []])))
    out = tmp_path / "out.jsonl"
    r = run_tallow(["batch", str(lines), "-o", str(out), "--model", "script", "--lora", str(files["lora"]),
                    "--parallel", "4", "--no-cache"], home=home)
    assert r.returncode == 0, r.stderr
    texts = {rec["id"]: rec["text"] for rec in map(json.loads, out.read_text().splitlines())}
    assert texts == {0: ADAPTED, 1: PLAIN, 2: ADAPTED, 3: PLAIN}


def test_the_scheduler_keeps_each_set_side_by_side_and_takes_turns(files):
    """Requests of two sets, submitted interleaved, get slots side by side per set (a batch
    splits into runs of consecutive sequence ids), and the sets take turns of up to 8 steps."""
    import threading
    from types import SimpleNamespace

    from tallow.runtime.adapters import Turns
    from tallow.runtime.scheduling.scheduler import Scheduler
    from tallow.runtime.types import LoadSettings, LoraSpec, Request, Sampling, SchedulerSettings

    sched = Scheduler.load([files["model"]], LoadSettings(n_ctx=1024, n_threads=1, loras=(LoraSpec(files["lora"]),)),
                           SchedulerSettings(parallel=4))
    try:
        prompt = sched.engine.request([{"role": "user", "content": "go"}]).prompt_tokens
        gate, done, texts = threading.Event(), threading.Semaphore(0), {}
        seen: dict[int, tuple] = {}

        def on_event(i):
            def record(ev):
                if type(ev).__name__ == "TokenEvent":
                    gate.wait(10)  # hold the engine thread until the slots are read
                else:
                    texts[i] = ev.text
                    done.release()
            return record

        for i, lora in enumerate([(1.0,), (0.0,), (1.0,), (0.0,)]):
            sched.submit(Request(prompt, 6, sampling=Sampling(temperature=0), lora=lora), on_event=on_event(i))
        import time

        deadline = time.monotonic() + 30
        # a slot's job is set a moment before its set is claimed (the engine thread is between
        # the two), so read until all four hold a claimed set
        while (len(seen) < 4 or () in seen.values()) and time.monotonic() < deadline:
            seen = {s.seq: s.job.lora for s in sched.slots if s.job is not None}
        gate.set()
        for _ in range(4):
            done.acquire()
        assert [seen[s] for s in range(4)] in ([(1.0,), (1.0,), (0.0,), (0.0,)], [(0.0,), (0.0,), (1.0,), (1.0,)])
        assert texts == {0: ADAPTED, 1: PLAIN, 2: ADAPTED, 3: PLAIN}
    finally:
        sched.close()
    turns = Turns()
    jobs = [SimpleNamespace(lora=k) for k in ((1.0,), (0.0,), (1.0,))]
    picked = [turns.next(jobs)[0] for _ in range(20)]
    assert picked == [(1.0,)] * 8 + [(0.0,)] * 8 + [(1.0,)] * 4
    assert turns.next(jobs[:1]) == ((1.0,), jobs[:1])  # one set: every job, every step
