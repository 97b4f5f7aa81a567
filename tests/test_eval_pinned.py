"""tallow eval gives the same figure every time: every setting that moves it is pinned
(flash attention, KV types, windows per batch and call size, no repacked weights), shown in its output
and JSON, and not taken from this machine's calibration. (Agreement with llama-perplexity
at the same settings, to four decimals, is tests/benchmarks/perplexity.py: it builds the tool.)"""

from __future__ import annotations

import json

import pytest
from helpers.processes import run_tallow
from helpers.synth import write_synthetic_gguf


@pytest.fixture(scope="module")
def bos_model(tmp_path_factory):
    return write_synthetic_gguf(tmp_path_factory.mktemp("bos") / "bos.gguf", add_bos=True)


def evaluated(model, home, *args) -> dict:
    r = run_tallow(["eval", str(model), "--ctx", "128", "--chunks", "3", "--json", *args], home=home)
    assert r.returncode == 0, r.stderr
    (row,) = json.loads(r.stdout)
    return row


def test_the_settings_are_pinned_and_reported(bos_model, tmp_path):
    row = evaluated(bos_model, tmp_path)
    assert (row["flash_attn"], row["n_batch"], row["windows_per_batch"], row["repacked"], row["type_k"],
            row["type_v"]) == ("on", 512, 16, False, "f16", "f16")  # llama-perplexity's -b 2048 holds 16 windows
    text = run_tallow(["eval", str(bos_model), "--ctx", "128", "--chunks", "3"], home=tmp_path).stdout.decode()
    assert f"perplexity {row['ppl']:.4f}" in text
    assert ("(flash attention on, 16 windows a batch in calls of 512, repacked weights off, 0 layers on a GPU, "
            "KV cache f16/f16)") in text


def test_each_flash_attention_setting_gives_one_figure(bos_model, tmp_path):
    on = evaluated(bos_model, tmp_path / "a")
    assert evaluated(bos_model, tmp_path / "b", "--flash-attn", "on")["ppl"] == on["ppl"]  # a fresh home: the same
    off = evaluated(bos_model, tmp_path / "a", "--flash-attn", "off")
    assert off["flash_attn"] == "off" and off["ppl"] != on["ppl"]  # the setting moves the figure: hence pinned
    assert evaluated(bos_model, tmp_path / "d", "--flash-attn", "off")["ppl"] == off["ppl"]


def test_auto_is_refused(bos_model, tmp_path):
    r = run_tallow(["eval", str(bos_model), "--flash-attn", "auto"], home=tmp_path)
    assert r.returncode == 2 and "eval pins flash attention" in r.stderr.decode()
