"""The bounded GGUF reader on real files and on a generator of malformed ones."""

from __future__ import annotations

import time
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gguf_corpus import malformed
from tallow.models.errors import GGUFError
from tallow.models.gguf_file import read_gguf


def test_reads_the_real_models(synth_model, default_model):
    synth = read_gguf(synth_model)
    assert synth.architecture == "llama" and synth.context_length == 1024 and synth.file_type == "F32"
    real = read_gguf(default_model)
    assert (real.architecture, real.n_params, real.file_type, real.context_length) == ("llama", 134515008, "Q4_1", 8192)
    assert real.type_histogram()["Q4_1"][0] == 210
    assert isinstance(real.metadata["tokenizer.chat_template"], str)


def test_every_malformed_file_is_refused_quickly_with_bounded_memory(synth_model, tmp_path):
    cases = malformed(synth_model)
    assert len(cases) > 25
    for label, data, fragment in cases:
        path = tmp_path / "bad.gguf"
        path.write_bytes(data)
        tracemalloc.start()
        started = time.perf_counter()
        with pytest.raises(GGUFError) as err:
            read_gguf(path)
        elapsed = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert fragment in err.value.message, (label, err.value.message)
        assert peak < 8 * 2**20, (label, peak)  # no allocation sized by a lying count
        assert elapsed < 1.0, (label, elapsed)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_random_corruption_raises_only_tallows_error(synth_model, tmp_path, data):
    raw = bytearray(synth_model.read_bytes())
    for _ in range(data.draw(st.integers(1, 8))):
        at = data.draw(st.integers(0, 4096))
        raw[at] = data.draw(st.integers(0, 255))
    cut = data.draw(st.one_of(st.none(), st.integers(0, len(raw))))
    path = tmp_path / "fuzz.gguf"
    path.write_bytes(bytes(raw[:cut]))
    try:
        read_gguf(path)
    except GGUFError:
        pass
