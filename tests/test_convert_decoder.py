"""Converting Hugging Face chat models to GGUF without torch (models/convert/decoder.py):
tiny random checkpoints of each family, written here with a real trained tokenizer, must
give llama.cpp the logits of a numpy forward pass with Hugging Face's semantics, and the
GGUF must tokenize as the `tokenizers` library does with the checkpoint's tokenizer.json."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers.decoder_reference import logits, write_tiny_decoder
from helpers.processes import run_tallow

from tallow.models.convert.common import ConversionError
from tallow.models.convert.source import import_source
from tallow.models.convert.vocab import read_vocabulary
from tallow.models.gguf_file import read_gguf, type_name

TEXT = ("The quick brown fox 12345 and 3.14159, café naïve Zürich 東京 🙂🚀\n"
        "def main(x):\n    return x * 2  # it's done\n\n\t tabs   and  spaces, we've; they'll")
SPECIAL = "<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\n"
CASES = {
    "llama": dict(family="llama"),
    "llama3-rope-tied-f16": dict(family="llama", tied=True, dtype="F16", rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16}),
    "smollm-f16": dict(family="smollm", dtype="F16"),
    "qwen2": dict(family="qwen2"),
    "qwen3-bf16-sharded": dict(family="qwen3", head_dim=32, dtype="BF16", shards=3),
    "qwen3moe": dict(family="qwen3moe"),
    "granite-tied": dict(family="granite", tied=True),
    "llama2-spm": dict(family="llama2"),
    "phi3-spm": dict(family="phi3"),
    "gemma3-spm-tied": dict(family="gemma3", layers=6, head_dim=32, tied=True),
    "gemma2-spm-tied": dict(family="gemma2", layers=3, head_dim=32, tied=True),
}


@pytest.fixture(scope="module", params=list(CASES))
def converted(request, tmp_path_factory):
    folder = write_tiny_decoder(tmp_path_factory.mktemp(request.param) / "model", **CASES[request.param])
    done = import_source(folder, folder.parent / "model.gguf", "f32")
    return request.param, folder, done


def hf_tokens(folder, text: str, special: bool = False) -> list[int]:
    """The tokenizers library's ids; `special`: with the post-processor's BOS, as llama.cpp adds it."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(folder / "tokenizer.json")).encode(text, add_special_tokens=special).ids


def test_llama_cpp_matches_the_reference_forward_pass(converted):
    from tallow.quantize.evaluate import logits_for
    from tallow.runtime.engine import Engine
    from tallow.runtime.types import LoadSettings

    case, folder, done = converted
    ids = hf_tokens(folder, TEXT * 2)
    assert len(ids) > 60  # past the scaled case's original 16 positions
    with Engine(done.path, LoadSettings(n_ctx=512, n_threads=2, flash_attn="off")) as engine:
        got = logits_for(engine, ids)
    want = logits(folder, ids)
    assert got.shape == want.shape
    err = np.abs(got - want).max()
    assert err < 0.01 * np.abs(want).max(), (case, err)
    # greedy picks agree, up to near-ties of a random model: where llama.cpp's pick differs, the
    # reference rates it within the measured error of its own best
    picked = want[np.arange(len(ids)), got.argmax(-1)]
    assert (want.max(-1) - picked <= 2 * err).all(), case
    assert (got.argmax(-1) == want.argmax(-1)).mean() > 0.9, case


def test_the_gguf_tokenizes_as_the_tokenizers_library_does(converted):
    from tallow.runtime.engine import Engine
    from tallow.runtime.types import LoadSettings

    case, folder, done = converted
    with Engine(done.path, LoadSettings(n_ctx=256, n_threads=2)) as engine:
        assert engine.tokenize(TEXT) == hf_tokens(folder, TEXT), case
        assert engine.tokenize(SPECIAL, special=True) == hf_tokens(folder, SPECIAL, special=True), case
        marks = set(hf_tokens(folder, "<|im_start|><|im_end|>"))
        assert len([t for t in engine.tokenize(SPECIAL, special=True) if t in marks]) == 3
        assert not marks & set(engine.tokenize(SPECIAL))  # as plain text, the markers are spelled out


def test_metadata_carries_the_template_special_tokens_and_defaults(converted):
    case, folder, done = converted
    info = read_gguf(done.path)
    md = info.metadata
    tok = json.loads((folder / "tokenizer.json").read_text())
    ids = {a["content"]: a["id"] for a in tok["added_tokens"]}
    arch = {"qwen2": "qwen2", "qwen3-bf16-sharded": "qwen3", "qwen3moe": "qwen3moe", "granite-tied": "granite",
            "phi3-spm": "phi3", "gemma3-spm-tied": "gemma3",
            "gemma2-spm-tied": "gemma2"}.get(case, "llama")
    assert info.architecture == done.architecture == arch
    assert md["tokenizer.ggml.pre"] == {"qwen2": "qwen2", "qwen3-bf16-sharded": "qwen2", "qwen3moe": "qwen2",
                                        "smollm-f16": "smollm", "granite-tied": "smollm"}.get(
        case, "default" if "spm" in case else "llama-bpe")
    assert md["tokenizer.ggml.model"] == ("llama" if "spm" in case else "gpt2")
    assert md["tokenizer.ggml.eos_token_id"] == ids["<|im_end|>"]
    if "spm" in case:  # SentencePiece-style: <s> first, byte tokens, scores
        assert md["tokenizer.ggml.bos_token_id"] == 1 and md["tokenizer.ggml.add_bos_token"] is True
        assert md["tokenizer.ggml.add_space_prefix"] is ("gemma" not in case)
    else:
        assert md["tokenizer.ggml.padding_token_id"] == ids["<|endoftext|>"]
    assert md["tokenizer.chat_template"].startswith("{% for m in messages %}")
    assert md["general.sampling.temp"] == pytest.approx(0.6) and md["general.sampling.top_k"] == 20
    assert done.sampling == {"temperature": 0.6, "top_p": pytest.approx(0.9), "top_k": 20.0}
    names = {t.name for t in info.tensors}
    assert ("output.weight" in names) != ("tied" in case)
    assert ("rope_freqs.weight" in names) == ("rope" in case)
    if case == "qwen3moe":
        assert (md["qwen3moe.expert_count"], md["qwen3moe.expert_used_count"]) == (4, 2)
        stacked = next(t for t in info.tensors if t.name == "blk.1.ffn_down_exps.weight")
        assert sorted(stacked.shape) == sorted((4, 64, 48))  # experts x embedding x expert FFN
    if case == "granite-tied":
        assert md["granite.logit_scale"] == 2.0 and md["granite.attention.scale"] == pytest.approx(0.05)


def test_f16_and_bf16_outputs_keep_vectors_in_f32(tmp_path):
    folder = write_tiny_decoder(tmp_path / "m", "qwen2")
    for dtype, want in (("f16", "F16"), ("bf16", "BF16")):
        info = read_gguf(import_source(folder, tmp_path / f"{dtype}.gguf", dtype).path)
        types = {t.name: type_name(t.type_id) for t in info.tensors}
        assert types["blk.0.attn_q.weight"] == want and types["blk.0.attn_q.bias"] == "F32"
        assert types["blk.0.attn_norm.weight"] == "F32" and info.file_type == want


def test_what_cannot_convert_is_refused_by_name(tmp_path):
    folder = write_tiny_decoder(tmp_path / "m", "llama")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "architectures": ["GemmaForCausalLM"]}))
    with pytest.raises(ConversionError) as err:
        import_source(folder, tmp_path / "x.gguf")
    assert "GemmaForCausalLM" in err.value.message and "Qwen3ForCausalLM" in err.value.hint
    (folder / "config.json").write_text(json.dumps(config))
    tok = json.loads((folder / "tokenizer.json").read_text())
    (folder / "tokenizer.json").write_text(json.dumps({**tok, "model": {**tok["model"], "type": "Unigram"}}))
    with pytest.raises(ConversionError, match="the tokenizer is 'Unigram', not BPE"):
        import_source(folder, tmp_path / "x.gguf")
    folder = write_tiny_decoder(tmp_path / "n", "qwen3")
    from safetensors.numpy import load_file, save_file

    weights = load_file(str(folder / "model.safetensors"))
    del weights["model.layers.1.self_attn.k_norm.weight"]
    save_file(weights, str(folder / "model.safetensors"))
    with pytest.raises(ConversionError, match=r"lack 1 tensors the qwen3 architecture needs \(blk\.1\.attn_k_norm"):
        import_source(folder, tmp_path / "x.gguf")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m", "n"]  # no partial file left


@pytest.mark.slow
def test_import_converts_and_quantizes_in_one_command(tmp_path):
    folder = write_tiny_decoder(tmp_path / "Tiny-Qwen3", "qwen3")
    home = tmp_path / "home"
    r = run_tallow(["import", str(folder), "--name", "tiny:q8", "--quant", "Q8_0"], home=home)
    assert r.returncode == 0, r.stderr.decode()
    assert "converted and quantized to Q8_0" in r.stderr.decode()
    shown = json.loads(run_tallow(["show", "tiny:q8", "--json"], home=home).stdout)
    assert shown["architecture"] == "qwen3" and shown["file_type"] == "Q8_0"
    source = shown["source"]
    assert source["kind"] == "quantize" and source["type"] == "Q8_0"
    assert source["converted"] == {"path": str(folder), "type": "f16", "architecture": "qwen3"}
    params = {p["name"]: p for p in json.loads(run_tallow(["show", "tiny:q8", "--parameters", "--json"], home=home).stdout)}
    assert params["temperature"]["value"] == pytest.approx(0.6) and params["temperature"]["source"] == "model"
    assert params["top_k"]["value"] == 20
    ran = run_tallow(["run", "tiny:q8", "hello", "-n", "4", "--json"], home=home)
    assert ran.returncode == 0 and json.loads(ran.stdout)["usage"]["completion_tokens"] == 4
    blobs = list((home / "models" / "blobs").iterdir()) if (home / "models" / "blobs").exists() else []
    assert len([b for b in blobs if b.is_file()]) == 1  # the f16 step is not kept
    bad = run_tallow(["import", str(folder), "--quant", "Q9_Z"], home=home)
    assert bad.returncode == 1 and "Q9_Z" in bad.stderr.decode()
    plain = run_tallow(["import", str(folder), "--name", "tiny:bf16", "--type", "bf16"], home=home)
    assert plain.returncode == 0, plain.stderr.decode()
    assert json.loads(run_tallow(["show", "tiny:bf16", "--json"], home=home).stdout)["file_type"] == "BF16"


@pytest.mark.slow
def test_import_from_a_hub_repository(fake_hub, synth_model, tmp_path):
    folder = write_tiny_decoder(tmp_path / "Tiny-Qwen3", "qwen3", shards=2)
    repo = "org/Tiny-Qwen3"
    for file in folder.iterdir():
        fake_hub.add(repo, file.name, file)
    home = tmp_path / "home"
    env = {"HF_ENDPOINT": fake_hub.url}
    r = run_tallow(["import", repo, "--quant", "Q8_0"], home=home, env=env)
    assert r.returncode == 0, r.stderr.decode()
    shown = json.loads(run_tallow(["show", "Tiny-Qwen3", "--json"], home=home).stdout)
    assert shown["file_type"] == "Q8_0"
    assert shown["source"]["converted"] == {"repo": repo, "revision": "main", "type": "f16", "architecture": "qwen3"}
    assert not [p for p in (home / "models" / "tmp").iterdir() if not p.name.endswith(".lock")]
    # an architecture no converter takes: refused after config.json, before any weights
    config = json.loads((folder / "config.json").read_text())
    odd = tmp_path / "odd-config.json"
    odd.write_text(json.dumps({**config, "architectures": ["Phi4FlashForCausalLM"]}))
    fake_hub.add("org/Odd", "config.json", odd)
    fake_hub.add("org/Odd", "model-00001-of-00002.safetensors", folder / "model-00001-of-00002.safetensors")
    bad = run_tallow(["import", "org/Odd"], home=home, env=env)
    assert bad.returncode == 1 and "org/Odd is a Phi4FlashForCausalLM" in bad.stderr.decode()
    assert fake_hub.downloads("model-00001-of-00002.safetensors") == 1  # the first import's only
    fake_hub.add("org/No-Tokenizer", "config.json", folder / "config.json")
    fake_hub.add("org/No-Tokenizer", "model-00001-of-00002.safetensors", folder / "model-00001-of-00002.safetensors")
    bare = run_tallow(["import", "org/No-Tokenizer"], home=home, env=env)
    assert bare.returncode == 1 and "org/No-Tokenizer has no tokenizer.json" in bare.stderr.decode()
    fake_hub.add("org/Only-GGUF", "m-Q8_0.gguf", synth_model)
    gguf = run_tallow(["import", "org/Only-GGUF"], home=home, env=env)
    assert gguf.returncode == 1 and "tallow pull org/Only-GGUF" in gguf.stderr.decode()
    off = run_tallow(["import", repo], home=home, env={**env, "TALLOW_OFFLINE": "1"})
    assert off.returncode == 1 and "offline mode is on" in off.stderr.decode()


def test_bos_is_read_as_llama_3_declares_it(tmp_path):
    """Llama 3's tokenizer_config has no add_bos_token: its post-processor, a Sequence of a
    ByteLevel step and a template, puts <|begin_of_text|> first."""
    folder = write_tiny_decoder(tmp_path / "m", "llama")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    del config["add_bos_token"]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    tok = json.loads((folder / "tokenizer.json").read_text())
    template = {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
                                                         {"Sequence": {"id": "A", "type_id": 0}}], "pair": [],
                "special_tokens": {}}
    for post, adds in (({"type": "Sequence", "processors": [{"type": "ByteLevel"}, template]}, True),
                       ({"type": "ByteLevel"}, False), (None, False)):
        (folder / "tokenizer.json").write_text(json.dumps({**tok, "post_processor": post}))
        assert read_vocabulary(folder, 10).add_bos is adds
