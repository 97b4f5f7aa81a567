"""Quantization and evaluation on a real F16 model (the default model, dequantized)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from helpers.processes import run_tallow, shared_home

from tallow.models.resolve import locate
from tallow.models.store import Store
from tallow.quantize.errors import QuantizeError
from tallow.quantize.evaluate import score_window, shipped_text, text_tokens, windows

pytestmark = pytest.mark.slow  # quantizing and evaluating models


def dequantize_to_f16(src, dest):
    """The default model with every quantized tensor widened to F16, via the gguf package."""
    import gguf

    reader = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dest), reader.fields["general.architecture"].contents())
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name in ("general.architecture", "general.file_type"):
            continue
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(field.name, field.contents(), field.types[0], sub)
    w.add_file_type(int(gguf.LlamaFileType.MOSTLY_F16))
    for t in reader.tensors:
        data = gguf.quants.dequantize(t.data, t.tensor_type)
        w.add_tensor(t.name, data.astype(np.float32 if data.ndim == 1 else np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dest


@pytest.fixture(scope="session")
def f16_model(default_model):
    dest = shared_home() / "smollm2-135m-f16.gguf"
    if not dest.exists():
        tmp = dest.with_suffix(".partial")
        dequantize_to_f16(default_model, tmp)
        os.replace(tmp, dest)
    return dest


@pytest.fixture(scope="module")
def quantized(f16_model, tmp_path_factory):
    home = tmp_path_factory.mktemp("qhome")
    for t in ("Q8_0", "Q4_0", "Q4_K_M"):
        r = run_tallow(["quantize", str(f16_model), "--type", t, "--name", f"smol:{t.lower()}"], home=home, timeout=600)
        assert r.returncode == 0, r.stderr.decode()
    return home


def test_quantized_models_load_generate_and_shrink(quantized, f16_model):
    store = Store(quantized / "models")
    sizes = {t: store.get(f"smol:{t}").size for t in ("q8_0", "q4_0", "q4_k_m")}
    f16 = f16_model.stat().st_size
    assert f16 > sizes["q8_0"] > sizes["q4_k_m"] > sizes["q4_0"] * 0.9
    assert 0.5 < sizes["q8_0"] / f16 < 0.6  # 8.5 of 16 bits, plus unquantized norms
    m = store.get("smol:q4_k_m")
    assert m.gguf["file_type"] == "Q4_K_M" and m.source["type"] == "Q4_K_M" and m.source["from_digest"] is None
    for t in sizes:
        r = run_tallow(["run", f"smol:{t}", "Say hi", "-n", "8", "--json"], home=quantized)
        assert r.returncode == 0 and json.loads(r.stdout)["usage"]["completion_tokens"] >= 1


def test_perplexity_orders_as_expected(quantized, f16_model):
    r = run_tallow(["eval", str(f16_model), "smol:q8_0", "smol:q4_k_m", "smol:q4_0", "--json"], home=quantized, timeout=900)
    assert r.returncode == 0, r.stderr.decode()
    res = {x["model"]: x for x in json.loads(r.stdout)}
    f16, q8, q4km = res[f16_model.name], res["smol:q8_0"], res["smol:q4_k_m"]
    assert abs(q8["ppl"] / f16["ppl"] - 1) < 0.03  # Q8_0 within a few percent of F16
    assert q4km["ppl"] > q8["ppl"] * 0.99
    assert q8["kld"] < q4km["kld"] and q8["top1"] > 0.9
    assert res["smol:q4_0"]["bits_per_weight"] < q8["bits_per_weight"]


def independent_nlls(path, wins: list[list[int]], n_ctx: int) -> list:
    """Each window's negative log-likelihoods of its scored half, through llama-cpp-python's
    high-level API with logits for every position and a log-softmax of its own, without
    repacked weights (helpers/highlevel.py)."""
    from helpers.highlevel import high_level_llama

    llm = high_level_llama(path, n_ctx=n_ctx, n_batch=n_ctx, logits_all=True, n_threads=2)
    nll = []
    for w in wins:
        llm.reset()
        llm.eval(w)
        logits = np.asarray(llm.scores[: len(w)], dtype=np.float64)
        first = len(w) // 2
        lp = logits[first:-1] - np.log(np.exp(logits[first:-1] - logits[first:-1].max(1, keepdims=True)).sum(1, keepdims=True)) \
            - logits[first:-1].max(1, keepdims=True)
        nll.append(-lp[np.arange(len(w) - first - 1), w[first + 1:]])
    return nll


def test_perplexity_matches_an_independent_computation(default_model):
    """llama-cpp-python's high-level API, with logits for every position, scores the same
    windows; both must give the same perplexity."""
    from tallow.quantize.evaluate import evaluate
    from tallow.runtime.engine import Engine
    from tallow.runtime.types import LoadSettings

    text = shipped_text()
    with Engine(default_model, LoadSettings(n_ctx=256, n_threads=2, flash_attn="off")) as engine:
        ours = evaluate(engine, "m", text, 256, max_windows=3)
        wins = windows(text_tokens(engine, text), 256, 3, engine.model.bos if engine.model.add_bos else None)
    nll = independent_nlls(default_model, wins, 256)
    theirs = float(np.exp(np.concatenate(nll).mean()))
    assert ours.scored == sum(len(x) for x in nll) == 3 * 127
    assert ours.ppl == pytest.approx(theirs, rel=2e-3)
    # and our scoring helper agrees with itself on those logits
    assert score_window(np.zeros((8, 5), dtype=np.float32), [0, 1, 2, 3, 4, 0, 1, 2])[0] == pytest.approx([np.log(5)] * 3)


def test_perplexity_windows_are_llama_perplexity_s_on_a_model_that_adds_bos(tmp_path):
    """llama.cpp's perplexity tool tokenizes the whole text with BOS in front, cuts windows of
    n_ctx from that, and puts BOS in place of each window's first token. Windows cut from the
    text without BOS are shifted by one token: a different perplexity (1.2% on Gemma 3)."""
    from helpers.synth import write_synthetic_gguf

    from tallow.quantize.evaluate import evaluate
    from tallow.runtime.engine import Engine
    from tallow.runtime.types import LoadSettings

    path = write_synthetic_gguf(tmp_path / "bos.gguf", add_bos=True)
    text = shipped_text()[:6000]
    with Engine(path, LoadSettings(n_ctx=128, n_threads=2, flash_attn="off")) as engine:
        assert engine.model.add_bos
        bos = engine.model.bos
        ours = evaluate(engine, "m", text, 128, max_windows=4)
        plain = engine.tokenize(text)  # the text alone, no special tokens
    # the tool's windows, built here from its description: BOS + text, cut, first token -> BOS
    whole = [bos] + plain
    tool = [[bos] + whole[k * 128 + 1:(k + 1) * 128] for k in range(4)]
    assert tool != [[bos] + plain[k * 128 + 1:(k + 1) * 128] for k in range(4)]  # the shift matters
    nll = independent_nlls(path, tool, 128)
    theirs = float(np.exp(np.concatenate(nll).mean()))
    assert ours.scored == 4 * 63
    assert ours.ppl == pytest.approx(theirs, rel=1e-4)


def test_bad_inputs_are_clear_and_register_nothing(quantized, f16_model, tmp_path):
    home = tmp_path / "home"
    cases = [
        (["quantize", str(f16_model), "--type", "Q9_9"], "unknown quantization type"),
        (["quantize", "nothing:here", "--type", "Q8_0"], "not found"),
        (["quantize", str(tmp_path / "missing.gguf"), "--type", "Q8_0"], "no such file"),
    ]
    not_gguf = tmp_path / "text.gguf"
    not_gguf.write_text("hello")
    cases.append((["quantize", str(not_gguf), "--type", "Q8_0"], "not a GGUF file"))
    for args, message in cases:
        r = run_tallow(args, home=home)
        assert r.returncode == 1 and message in r.stderr.decode(), (args, r.stderr.decode())
    r = run_tallow(["quantize", "smol:q8_0", "--type", "Q4_0"], home=quantized)
    assert r.returncode == 1 and b"--allow-requantize" in r.stderr
    assert not (home / "models" / "manifests").exists()


def test_read_only_store_and_full_disk(f16_model, tmp_path):
    from tallow.quantize.run import QuantizeOptions, quantize_model

    source = locate(str(f16_model), Store(tmp_path / "unused"))
    store = Store(tmp_path / "models")
    with pytest.raises(Exception, match="not enough disk space"):
        quantize_model(source, store, QuantizeOptions("Q8_0", "x:q8", free_space=lambda p: 1000))
    # an output directory that cannot be written (root ignores permission bits, so a file
    # stands where the directory should be)
    store.root.mkdir(parents=True)
    store.tmp.write_text("not a directory")
    with pytest.raises(QuantizeError, match="cannot write"):
        quantize_model(source, store, QuantizeOptions("Q8_0", "x:q8"))
    assert store.get("x:q8") is None


def test_a_crashing_quantization_leaves_nothing(f16_model, tmp_path, monkeypatch):
    """A child that dies (here: killed by a signal, as llama.cpp's aborts do) is reported,
    and its partial output is removed."""
    from tallow.quantize import run as qrun
    from tallow.quantize.run import QuantizeOptions, quantize_model

    real = qrun.subprocess.Popen

    def dying(cmd, **kw):
        return real([qrun.sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGABRT)"], **kw)

    monkeypatch.setattr(qrun.subprocess, "Popen", dying)
    source = locate(str(f16_model), Store(tmp_path / "unused"))
    store = Store(tmp_path / "models")
    with pytest.raises(QuantizeError, match="signal 6"):
        quantize_model(source, store, QuantizeOptions("Q8_0", "x:q8"))
    assert [p for p in store.tmp.iterdir()] == [] and store.get("x:q8") is None


def _rows(text: str) -> dict[str, list[str]]:
    return {line.split()[0]: line.split() for line in text.splitlines()[1:] if line[:1].isupper() and " " in line}


def test_type_list_shows_the_mixes_not_only_the_block_format():
    out = run_tallow(["quantize", "--list"], home=shared_home()).stdout.decode()
    rows = _rows(out)
    bpw = {name: float(r[1]) for name, r in rows.items() if name in ("Q4_K_M", "Q4_K_S", "Q3_K_L", "Q3_K_M", "Q3_K_S", "IQ2_M")}
    assert bpw["Q4_K_M"] > bpw["Q4_K_S"] and bpw["Q3_K_L"] > bpw["Q3_K_M"] > bpw["Q3_K_S"]  # mixes differ
    assert bpw["IQ2_M"] == 2.7 and "2.7-bit" in " ".join(rows["IQ2_M"])  # the figure agrees with the words
    assert float(rows["Q4_K_M"][2]) == float(rows["Q4_K_S"][2]) == 4.5  # the shared block format, said apart
    assert "needs an imatrix" in " ".join(rows["IQ2_XS"]) and "(needs --imatrix)" not in " ".join(rows["IQ2_XS"])


def test_type_list_for_a_model_gives_the_sizes_it_would_have(f16_model, tmp_path):
    r = run_tallow(["quantize", str(f16_model), "--list"], home=tmp_path)
    assert r.returncode == 0, r.stderr.decode()
    rows = _rows(r.stdout.decode())
    assert not list(tmp_path.rglob("*.gguf*"))  # a dry run: nothing written
    # llama.cpp's own plan of every tensor; the real Q8_0 file made the same way weighs the same
    q8 = tmp_path / "q8"
    made = run_tallow(["quantize", str(f16_model), "--type", "Q8_0", "--name", "s:q8"], home=q8, timeout=600)
    assert made.returncode == 0, made.stderr.decode()
    size = Store(q8 / "models").get("s:q8").size
    shown = rows["Q8_0"][1] + " " + rows["Q8_0"][2]
    from tallow.models.memory import human

    assert abs(float(rows["Q8_0"][1]) - size / 1e6) < 0.2, (shown, size)  # to the tensors' rounding in MiB
    assert shown == human(size) or rows["Q8_0"][2] == "MB"
    assert float(rows["Q4_K_M"][3]) > float(rows["Q4_K_S"][3])  # bits per weight of the mixes, for this model


def test_imatrix_enables_the_types_that_need_one(f16_model, tmp_path):
    from tallow.quantize.imatrix import read_imatrix

    home = tmp_path / "home"
    out = tmp_path / "smol.imatrix.gguf"
    r = run_tallow(["imatrix", str(f16_model), "-o", str(out), "--chunks", "2"], home=home, timeout=600)
    assert r.returncode == 0, r.stderr.decode()
    data = read_imatrix(out)
    assert len(data) == 30 * 7 + 1  # seven matrices per layer, and the output
    assert all(len(v) in (576, 1536) and min(v) >= 0 for v in data.values())
    r = run_tallow(["quantize", str(f16_model), "--type", "IQ2_XS", "--name", "smol:iq2", "--imatrix", str(out)],
                   home=home, timeout=600)
    assert r.returncode == 0, r.stderr.decode()
    m = Store(home / "models").get("smol:iq2")
    assert m.gguf["file_type"] == "IQ2_XS" and m.source["imatrix_digest"]
    assert run_tallow(["run", "smol:iq2", "hi", "-n", "4"], home=home).returncode == 0
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + bytes(60))
    bad = run_tallow(["quantize", str(f16_model), "--type", "IQ2_XS", "--name", "smol:bad", "--imatrix", str(junk)],
                     home=home, timeout=600)
    assert bad.returncode == 1 and b"error:" in bad.stderr
    assert Store(home / "models").get("smol:bad") is None
