"""Crafted projector (mmproj) and vocabulary files, the 2025-26 classes: tensor offsets past the
end, absurd dimensions, per-token arrays shorter than the vocabulary, byte tokens naming more
than one byte (llama.cpp PR #25969's class). Each is refused by tallow's own reader, before
libmtmd or llama.cpp is handed the file: the error is the reader's, and the run never loads."""

from __future__ import annotations

import struct

import gguf
import numpy as np
import pytest
from helpers.processes import run_tallow
from helpers.projector import solid_png, write_colour_projector

from tallow.models.errors import GGUFError
from tallow.models.gguf_file import read_gguf


def _spm_vocabulary(path, tokens: list[str], types: list[int], scores: list[float] | None = None):
    """A SentencePiece-style ("llama") vocabulary and one tensor: what the checks read."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_scores(scores if scores is not None else [0.0] * len(tokens))
    w.add_tensor("token_embd.weight", np.zeros((len(tokens), 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


BYTES = [f"<0x{b:02X}>" for b in range(256)]
NORMAL, BYTE = 1, 6


def test_a_well_formed_sentencepiece_vocabulary_passes(tmp_path):
    info = read_gguf(_spm_vocabulary(tmp_path / "ok.gguf", ["<unk>", *BYTES, "▁a"], [2, *[BYTE] * 256, NORMAL]))
    assert info.metadata["tokenizer.ggml.model"] == "llama"


@pytest.mark.parametrize("tokens,types,scores,said", [
    (["<unk>", *BYTES[:-1], "<0x1FF>"], [2, *[BYTE] * 256], None, "byte token 256"),
    (["<unk>", "<0xZZ>", *BYTES[2:]], [2, *[BYTE] * 255], None, "byte token 1"),
    (["<unk>", *BYTES, "<0x41>junk"], [2, *[BYTE] * 257], None, "byte token 257"),
    (["<unk>", *BYTES, "▁a"], [2, *[BYTE] * 256], None, "token_type has 257 entries for 258 tokens"),
    (["<unk>", *BYTES, "▁a"], [2, *[BYTE] * 256, NORMAL], [0.0] * 100, "scores has 100 entries"),
], ids=["a byte past 0xFF", "not hex", "trailing text", "types short", "scores short"])
def test_a_crafted_vocabulary_is_refused_by_the_reader(tmp_path, tokens, types, scores, said):
    bad = _spm_vocabulary(tmp_path / "bad.gguf", tokens, types, scores)
    with pytest.raises(GGUFError, match=said):
        read_gguf(bad)
    ran = run_tallow(["run", str(bad), "hi", "--offline"], home=tmp_path)
    err = ran.stderr.decode()
    assert ran.returncode == 1 and said in err and "llama.cpp could not load" not in err, err


def _patched_tensor(path, out, name: str, field: str, value: int):
    """A copy of GGUF `path` with one tensor's `field` ('offset' or 'dim0') set to `value`."""
    info = read_gguf(path)
    data = bytearray(path.read_bytes())
    needle = struct.pack("<Q", len(name)) + name.encode()
    at = data.index(needle) + len(needle)
    n_dims = struct.unpack_from("<I", data, at)[0]
    if field == "dim0":
        struct.pack_into("<Q", data, at + 4, value)
    else:
        struct.pack_into("<Q", data, at + 4 + 8 * n_dims + 4, value)
    out.write_bytes(bytes(data))
    assert any(t.name == name for t in info.tensors)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("field,value,said", [("offset", 1 << 40, "past the end of the file"),
                                              ("dim0", 1 << 60, "past the end of the file")],
                         ids=["offset past the end", "absurd dimensions"])
def test_a_crafted_projector_is_refused_before_libmtmd_reads_it(default_home, default_model, tmp_path, field, value,
                                                               said):
    good = write_colour_projector(tmp_path / "good-mmproj.gguf", default_model)
    bad = _patched_tensor(good, tmp_path / "bad-mmproj.gguf", "mm.2.weight", field, value)
    with pytest.raises(GGUFError, match=said):
        read_gguf(bad)
    picture = solid_png(tmp_path / "red.png", (255, 0, 0))
    ran = run_tallow(["run", "smollm2:135m", "What colour?", "--image", str(picture), "--mmproj", str(bad),
                      "--offline"], home=default_home)
    err = ran.stderr.decode()
    assert ran.returncode == 1 and said in err and "libmtmd could not load" not in err, err
