"""KV-cache types (--cache-type-k/-v): what llama.cpp allocates equals the planner's figure,
every route takes them, a quantized V turns flash attention on (or is refused with it off),
the prompt cache never mixes types, and eval gives the quality of each."""

from __future__ import annotations

import json
import re

import pytest
from helpers.processes import run_tallow
from helpers.server import Server

from tallow.models.memory import KV_TYPES

SIZES = re.compile(r"K \((\w+)\): +([0-9.]+) MiB, V \((\w+)\): +([0-9.]+) MiB")


@pytest.mark.parametrize("type_k,type_v", [(t, t) for t in KV_TYPES] + [("q8_0", "q4_0"), ("bf16", "iq4_nl")])
def test_the_kv_buffer_is_the_planners_figure(default_model, type_k, type_v):
    from tallow.models.memory import Shape, kv_cache_bytes
    from tallow.runtime import backend
    from tallow.runtime.engine import Engine
    from tallow.runtime.loadplan import read_shape
    from tallow.runtime.types import LoadSettings

    backend.init()
    seen: list[tuple] = []

    def listen(level, line):
        seen.extend(SIZES.findall(line))

    backend.listen_to_logs(listen)
    try:
        with Engine(default_model, LoadSettings(n_ctx=1024, n_threads=2, type_k=type_k, type_v=type_v,
                                                flash_attn="on", check_memory=True)) as engine:
            planned = engine.estimate.kv_cache
            assert engine.load_facts()["type_k"] == type_k and engine.load_facts()["type_v"] == type_v
    finally:
        backend.stop_listening(listen)
    ((k_name, k_mib, v_name, v_mib),) = seen
    assert (k_name, v_name) == (type_k, type_v)
    shape: Shape = read_shape([default_model])
    assert planned == kv_cache_bytes(shape, 1024, type_k, type_v)
    assert abs(planned / 2**20 - (float(k_mib) + float(v_mib))) <= 0.011  # llama.cpp prints two decimals each


def run_json(home, model, *args, prompt: str = "Name a colour."):
    r = run_tallow(["run", str(model), prompt, "-n", "4", "--temperature", "0", "--json", *args], home=home,
                   env={"TALLOW_CACHE_MIN_TOKENS": "8"})
    return r, (json.loads(r.stdout) if r.returncode == 0 else None)


def test_run_takes_the_types_and_a_quantized_v_turns_flash_attention_on(default_home):
    r, out = run_json(default_home, "smollm2:135m", "--cache-type-k", "q8_0", "--cache-type-v", "q4_0", "--no-cache")
    assert r.returncode == 0, r.stderr
    assert out["load"]["type_k"] == "q8_0" and out["load"]["type_v"] == "q4_0" and out["load"]["flash_attn"] == "on"
    assert "note: flash attention on: a quantized V cache (q4_0) needs it" in r.stderr.decode()
    assert out["usage"]["completion_tokens"] == 4
    r, out = run_json(default_home, "smollm2:135m", "--ctk", "q8_0", "--flash-attn", "off", "--no-cache")
    assert r.returncode == 0 and out["load"]["flash_attn"] == "off"  # a quantized K alone needs nothing


@pytest.mark.parametrize("args,message", [
    (["--cache-type-v", "q8_0", "--flash-attn", "off"], "a quantized V cache (q8_0) needs flash attention"),
    (["--cache-type-k", "q9_9"], "unknown KV cache type 'q9_9': use one of f16, bf16, f32, q8_0"),
    (["--cache-type-v", "q4_k"], "unknown KV cache type 'q4_k'"),
])
def test_bad_types_are_refused_before_loading(synth_model, tmp_path, args, message):
    for command in (["run", str(synth_model), "hi"], ["chat", str(synth_model)]):
        r = run_tallow([*command, *args], home=tmp_path)
        assert r.returncode == 2 and message in r.stderr.decode(), r.stderr


def test_a_type_the_heads_cannot_hold_is_one_line(synth_model, tmp_path):
    r = run_tallow(["run", str(synth_model), "hi", "--cache-type-k", "q8_0"], home=tmp_path)
    err = r.stderr.decode()
    assert r.returncode == 1 and "the KV cache cannot be q8_0/f16: the model's K heads are 16 values wide" in err, err


def test_an_endpoint_refuses_them(tmp_path):
    r = run_tallow(["run", "m", "hi", "--endpoint", "http://127.0.0.1:9/v1", "--cache-type-k", "q8_0"], home=tmp_path)
    assert r.returncode == 2 and "--cache-type-k sets the local engine" in r.stderr.decode()


def test_the_disk_cache_never_mixes_types(synth_model, tmp_path):
    def usage(*args):
        return run_json(tmp_path, synth_model, "--raw", *args, prompt="abcd " * 12)[1]["usage"]

    assert usage()["cache_source"] is None
    assert usage()["cache_source"] == "disk"  # the same load: the saved prompt is reused
    other = usage("--cache-type-k", "bf16")
    assert other["cache_source"] is None and other["cached_tokens"] == 0
    assert usage("--cache-type-k", "bf16")["cache_source"] == "disk"


def test_batch_takes_the_types(synth_model, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": str(i), "prompt": f"ab {i}", "max_tokens": 3}) + "\n" for i in range(3)))
    out = tmp_path / "out.jsonl"
    r = run_tallow(["batch", str(src), "-o", str(out), "--model", str(synth_model), "--cache-type-k", "f32",
                    "--cache-type-v", "bf16"], home=tmp_path)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(row["id"] for row in rows) == ["0", "1", "2"] and all(row["usage"]["completion_tokens"] for row in rows)
    bad = run_tallow(["batch", str(src), "-o", str(tmp_path / "x.jsonl"), "--model", str(synth_model),
                      "--cache-type-v", "q8_0", "--flash-attn", "off"], home=tmp_path)
    assert bad.returncode == 2 and not (tmp_path / "x.jsonl").exists()  # refused before the output is opened


def test_serve_takes_them_per_model_and_ps_shows_them(default_model, tmp_path):
    s = Server(default_model, tmp_path, "--cache-type-k", "q8_0", "--model-option",
               f"{default_model.name} cache_type_v=q8_0")
    try:
        answer = s.client().chat.completions.create(model=default_model.name, max_tokens=3,
                                                    messages=[{"role": "user", "content": "hi"}])
        assert answer.usage.completion_tokens == 3
        (entry,) = s.raw("/api/ps")[2]["models"]
        assert entry["kv_cache"] == {"type_k": "q8_0", "type_v": "q8_0"}
        shown = run_tallow(["ps"], home=tmp_path, env={"TALLOW_HOST": s.url.removeprefix("http://")}).stdout.decode()
        assert "KV CACHE" in shown and "q8_0" in shown and "q8_0/q8_0" not in shown  # one name when both agree
    finally:
        s.close()
    assert "flash attention on for" in "".join(s.log)  # the served model's quantized V turned it on
    bad = run_tallow(["serve", str(default_model), "--port", "0", "--flash-attn", "off", "--model-option",
                      f"{default_model.name} cache_type_v=q4_0"], home=tmp_path)
    assert bad.returncode == 2 and f"a quantized V cache (q4_0 for {default_model.name}) needs flash attention" in \
        bad.stderr.decode()


def test_eval_has_a_row_per_kv_type(default_home):
    r = run_tallow(["eval", "smollm2:135m", "--ctx", "128", "--chunks", "2", "--cache-type-k", "q8_0",
                    "--cache-type-v", "q4_0", "--json"], home=default_home)
    assert r.returncode == 0, r.stderr
    base, quantized = json.loads(r.stdout)
    assert base["model"] == "smollm2:135m (KV f16/f16)" and base["kld"] == 0.0 and base["top1"] == 1.0
    assert quantized["model"] == "smollm2:135m (KV q8_0/q4_0)"
    assert (quantized["type_k"], quantized["type_v"]) == ("q8_0", "q4_0")
    assert quantized["kld"] > 0 and 0.5 < quantized["top1"] < 1.0 and quantized["ppl"] != base["ppl"]
    table = run_tallow(["eval", "smollm2:135m", "--ctx", "128", "--chunks", "1", "--ctk", "q8_0"], home=default_home)
    assert "smollm2:135m (KV q8_0/f16)" in table.stdout.decode() and "KLD" in table.stdout.decode()


def test_show_fit_plans_with_the_types(default_home, default_model):
    from tallow.models.memory import kv_cache_bytes
    from tallow.runtime.loadplan import read_shape

    def fit(*args):
        r = run_tallow(["show", "smollm2:135m", "--fit", "--ctx", "8192", "--json", *args], home=default_home)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    plain, quantized = fit(), fit("--cache-type-k", "q8_0", "--cache-type-v", "q4_0")
    assert (quantized["type_k"], quantized["type_v"], quantized["flash_attn"]) == ("q8_0", "q4_0", "on")
    assert quantized["kv_cache"] == kv_cache_bytes(read_shape([default_model]), 8192, "q8_0", "q4_0")
    assert quantized["kv_cache"] < plain["kv_cache"] * 0.45 and plain["type_k"] == "f16"
    without = run_tallow(["show", "smollm2:135m", "--cache-type-k", "q8_0"], home=default_home)
    assert without.returncode == 2 and "add --fit" in without.stderr.decode()
