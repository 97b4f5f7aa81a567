"""The bounded GGUF reader on real files and on a generator of malformed ones."""

from __future__ import annotations

import tracemalloc

import pytest
from helpers.gguf_corpus import malformed
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tallow.models.errors import GGUFError
from tallow.models.gguf_file import read_gguf


def test_reads_the_real_models(synth_model, default_model):
    synth = read_gguf(synth_model)
    assert synth.architecture == "llama" and synth.context_length == 1024 and synth.file_type == "F32"
    real = read_gguf(default_model)
    assert (real.architecture, real.n_params, real.file_type, real.context_length) == ("llama", 134515008, "Q4_1", 8192)
    assert real.type_histogram()["Q4_1"][0] == 210
    assert isinstance(real.metadata["tokenizer.chat_template"], str)


def test_every_malformed_file_is_refused_with_bounded_memory(synth_model, tmp_path):
    cases = malformed(synth_model)
    assert len(cases) > 25
    for label, data, fragment in cases:
        path = tmp_path / "bad.gguf"
        path.write_bytes(data)
        tracemalloc.start()
        with pytest.raises(GGUFError) as err:
            read_gguf(path)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert fragment in err.value.message, (label, err.value.message)
        assert peak < 8 * 2**20, (label, peak)  # no allocation sized by a lying count


@pytest.fixture(scope="module")
def seeds(synth_model, default_model, tmp_path_factory) -> list[bytes]:
    from helpers.fuzz_gguf import write_seeds

    folder = tmp_path_factory.mktemp("seeds")
    write_seeds(folder, synth_model, default_model)
    return [p.read_bytes() for p in sorted(folder.iterdir())]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_mutated_files_raise_only_tallows_error_with_bounded_memory(seeds, tmp_path, data):
    raw = bytearray(data.draw(st.sampled_from(seeds)))
    for _ in range(data.draw(st.integers(1, 8))):
        kind = data.draw(st.sampled_from(["set", "insert", "delete", "int"]))
        at = data.draw(st.integers(0, max(0, min(len(raw), 1 << 16) - 1)))
        if kind == "set" and raw:
            raw[at] = data.draw(st.integers(0, 255))
        elif kind == "insert":
            raw[at:at] = data.draw(st.binary(min_size=1, max_size=16))
        elif kind == "delete":
            del raw[at:at + data.draw(st.integers(1, 16))]
        else:  # a length or count field made huge, tiny or negative
            raw[at:at + 8] = data.draw(st.sampled_from([2**63 - 1, 2**32, 0, 1, 2**64 - 1])).to_bytes(8, "little")
    cut = data.draw(st.one_of(st.none(), st.integers(0, len(raw))))
    path = tmp_path / "fuzz.gguf"
    path.write_bytes(bytes(raw[:cut]))
    tracemalloc.start()
    try:
        read_gguf(path)
    except GGUFError:
        pass
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert peak < 64 * 2**20  # the real model's tokenizer tables are the largest thing kept


def test_atheris_finds_no_crash(synth_model, default_model, tmp_path):
    pytest.importorskip("atheris")
    import subprocess
    import sys
    from pathlib import Path

    from helpers.fuzz_gguf import write_seeds

    corpus = tmp_path / "corpus"
    write_seeds(corpus, synth_model, default_model)
    script = Path(__file__).resolve().parent / "helpers" / "fuzz_gguf.py"
    r = subprocess.run([sys.executable, str(script), str(corpus), "-runs=4000", "-seed=1", "-max_len=65536"],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    import re

    done = re.search(r"Done (\d+) runs", r.stderr)  # libFuzzer may finish a few runs past -runs
    assert done and int(done.group(1)) >= 4000, r.stderr[-1000:]
