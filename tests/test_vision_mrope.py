"""M-RoPE projectors (the Qwen2-VL family): positions as libmtmd places them, not one per cell.

The pair of tests/helpers/mrope.py is the default model as a `qwen2vl` text model and a
designed `qwen2vl_merger` projector: a 64x64 picture becomes 3x3 tokens on 3 positions, so a
driver that counted cells would put the question six positions too far on.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest
from helpers.mrope import write_mrope_colour_projector, write_mrope_model
from helpers.projector import solid_png

from tallow.runtime.media import decode_image, with_markers

pytestmark = pytest.mark.slow
QUESTION = "What colour is this image? Answer with one word."


@pytest.fixture(scope="module")
def mrope_pair(default_model, tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("mrope")
    model = write_mrope_model(default_model, folder / "qwen2vl.gguf")
    return model, write_mrope_colour_projector(folder / "mmproj-qwen2vl.gguf", model)


@pytest.fixture(scope="module")
def mrope_engine(mrope_pair):
    from tallow.runtime.engine import Engine
    from tallow.runtime.types import LoadSettings

    model, proj = mrope_pair
    with Engine(model, LoadSettings(n_ctx=1024, n_threads=2, mmproj=proj)) as engine:
        yield engine


def _picture(tmp_path, rgb):
    return decode_image(solid_png(tmp_path / "c.png", rgb).read_bytes())


def _turn(media, text=QUESTION):
    return {"role": "user", "content": with_markers(text, media), "media": media}


def _ask(engine, messages, max_tokens=12):
    from tallow.runtime.types import Sampling

    request = engine.request(messages, sampling=Sampling(temperature=0.0), max_tokens=max_tokens)
    *_, final = engine.stream(request)
    return request, final


def _libmtmd_logits(engine, text: str, picture) -> tuple[int, np.ndarray]:
    """libmtmd's own evaluation of the prompt (mtmd_tokenize, mtmd_helper_eval_chunks) into
    the engine's emptied context: the position after it and the last token's logits."""
    import llama_cpp.mtmd_cpp as M

    engine.reset()
    chunks = M.mtmd_input_chunks_init()
    pixels = (ctypes.c_uint8 * len(picture.data)).from_buffer_copy(picture.data)
    bitmap = M.mtmd_bitmap_init(picture.width, picture.height, pixels)
    try:
        data = text.encode()
        inp = M.mtmd_input_text(data, len(data), False, True)
        assert M.mtmd_tokenize(engine.projector.ptr, chunks, ctypes.byref(inp),
                               (M.mtmd_bitmap_p_ctypes * 1)(bitmap), 1) == 0
        n_past = ctypes.c_int32(0)
        assert M.mtmd_helper_eval_chunks(engine.projector.ptr, engine.ctx.ptr, chunks, 0, 0, engine.n_batch, True,
                                         ctypes.byref(n_past)) == 0
        logits = np.array(engine.ctx.logits(1, engine.model.n_vocab), dtype=np.float32).reshape(-1)
    finally:
        M.mtmd_bitmap_free(bitmap)
        M.mtmd_input_chunks_free(chunks)
        engine.reset()
    return n_past.value, logits


def test_the_projector_is_stored_with_its_width(mrope_pair, tmp_path):
    from helpers.processes import run_tallow

    model, proj = mrope_pair
    home = tmp_path / "home"
    r = run_tallow(["import", str(model), "--name", "qvl", "--link", "--mmproj", str(proj)], home=home)
    assert r.returncode == 0, r.stderr.decode()
    shown = run_tallow(["show", "qvl"], home=home).stdout.decode()
    assert "qwen2vl_merger" in shown and "vision" in shown


def test_positions_after_a_picture_are_libmtmds(mrope_engine, tmp_path):
    engine = mrope_engine
    picture = _picture(tmp_path, (255, 0, 0))
    messages = [_turn([picture])]
    request, final = _ask(engine, messages, max_tokens=1)
    (span,) = request.media
    assert (span.n, span.n_pos) == (9, 3)  # 3x3 tokens, 3 positions
    ours = np.array(engine.ctx.logits(1, engine.model.n_vocab), dtype=np.float32).reshape(-1)
    cells, position = len(engine.kv), engine.sequence.next_pos
    assert cells == len(request.prompt_tokens) and position == cells - 6
    assert engine.ctx.seq_pos_max(0) == position - 1  # what llama.cpp's cache holds

    text = engine.chat_template().render([{"role": "user", "content": messages[0]["content"]}],
                                         add_generation_prompt=True)
    n_past, reference = _libmtmd_logits(engine, text, picture)
    assert n_past == position
    np.testing.assert_allclose(ours, reference, rtol=0, atol=1e-3)
    assert int(np.argmax(ours)) == int(np.argmax(reference))


@pytest.mark.parametrize("colour,rgb,other", [("red", (255, 0, 0), "blue"), ("blue", (0, 0, 255), "red")])
def test_the_model_names_the_colour(mrope_engine, tmp_path, colour, rgb, other):
    _, final = _ask(mrope_engine, [_turn([_picture(tmp_path, rgb)])])
    assert colour in final.text.lower() and other not in final.text.lower()


def test_a_second_question_reuses_the_picture_as_a_fresh_prefill_would_answer(mrope_engine, tmp_path):
    engine = mrope_engine
    engine.reset()
    picture = _picture(tmp_path, (0, 0, 255))
    _, first = _ask(engine, [_turn([picture])])
    follow = [_turn([picture]), {"role": "assistant", "content": first.text},
              {"role": "user", "content": "Name a thing of that colour."}]
    request, reused = _ask(engine, follow)
    (span,) = request.media
    assert reused.usage.cached_tokens >= span.end and not reused.timings.media_ms
    after = engine.sequence.next_pos
    engine.reset()
    _, fresh = _ask(engine, follow)
    assert fresh.usage.cached_tokens == 0 and fresh.timings.media_ms > 0
    assert reused.text == fresh.text
    assert engine.sequence.next_pos == after


def test_the_scheduler_places_the_picture_as_the_engine_does(mrope_pair, mrope_engine, tmp_path):
    from tallow.runtime.scheduling.scheduler import Scheduler
    from tallow.runtime.types import LoadSettings, Sampling, SchedulerSettings

    picture = _picture(tmp_path, (255, 0, 0))
    first = [_turn([picture])]
    mrope_engine.reset()
    _, by_engine = _ask(mrope_engine, first)
    follow = first + [{"role": "assistant", "content": by_engine.text}, {"role": "user", "content": "Why?"}]
    _, follow_by_engine = _ask(mrope_engine, follow)
    model, proj = mrope_pair
    scheduler = Scheduler.load([model], LoadSettings(n_ctx=1024, n_threads=2, mmproj=proj),
                               SchedulerSettings(parallel=1))
    try:
        greedy = Sampling(temperature=0.0)
        one = scheduler.submit(scheduler.engine.request(first, sampling=greedy, max_tokens=12)).result()
        two = scheduler.submit(scheduler.engine.request(follow, sampling=greedy, max_tokens=12)).result()
    finally:
        scheduler.close()
    assert one.text == by_engine.text
    assert two.text == follow_by_engine.text and two.usage.cached_tokens > 9 and not two.timings.media_ms
