"""Images through a projector (runtime/media/__init__.py, runtime/media/spans.py, runtime/backend/media.py).

The designed projector of tests/helpers/projector.py turns a pure colour into its word's input
embedding, so the default model naming the colour proves the pixels reached it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.processes import run_tallow
from helpers.projector import solid_png, write_colour_projector

from tallow.runtime.media import MARKER, MediaError, with_markers

pytestmark = pytest.mark.slow
QUESTION = "What colour is this image? Answer with one word."


@pytest.fixture(scope="module")
def colour_projector(default_model, tmp_path_factory) -> Path:
    return write_colour_projector(tmp_path_factory.mktemp("mmproj") / "colour-mmproj.gguf", default_model)


@pytest.fixture(scope="module")
def vision_engine(default_model, colour_projector):
    from tallow.runtime.engine import Engine
    from tallow.runtime.types import LoadSettings

    with Engine(default_model, LoadSettings(n_ctx=1024, mmproj=colour_projector)) as engine:
        yield engine


def _ask(engine, messages, **kw):
    from tallow.runtime.types import Sampling

    request = engine.request(messages, sampling=Sampling(temperature=0.0), max_tokens=12, **kw)
    *_, final = engine.stream(request)
    return request, final


def _image_message(media, text=QUESTION):
    return {"role": "user", "content": with_markers(text, media), "media": media}


def _image(tmp_path, rgb, name="c.png"):
    from tallow.runtime.media import decode_image

    return decode_image(solid_png(tmp_path / name, rgb).read_bytes())


@pytest.mark.parametrize("colour,rgb,other", [("red", (255, 0, 0), "blue"), ("blue", (0, 0, 255), "red")])
def test_run_names_the_colour_of_the_image(default_home, colour_projector, tmp_path, colour, rgb, other):
    picture = solid_png(tmp_path / f"{colour}.png", rgb)
    out = run_tallow(["run", "smollm2:135m", QUESTION, "--image", str(picture), "--mmproj", str(colour_projector),
                      "--temperature", "0", "--max-tokens", "12", "--json"], home=default_home)
    assert out.returncode == 0, out.stderr.decode()
    data = json.loads(out.stdout)
    assert colour in data["text"].lower() and other not in data["text"].lower()
    assert data["usage"]["media_tokens"] == 4  # 28x28 pixels, 14x14 patches
    assert data["usage"]["prompt_tokens"] > 4


def test_an_image_read_from_stdin(default_home, colour_projector, tmp_path):
    raw = solid_png(tmp_path / "red.png", (255, 0, 0)).read_bytes()
    out = run_tallow(["run", "smollm2:135m", QUESTION, "-i", "-", "--mmproj", str(colour_projector),
                      "--temperature", "0", "--max-tokens", "12"], home=default_home, input=raw)
    assert out.returncode == 0, out.stderr.decode()
    assert "red" in out.stdout.decode().lower()


def test_an_image_for_a_model_without_a_projector_is_refused_before_loading(default_home, tmp_path):
    picture = solid_png(tmp_path / "red.png", (255, 0, 0))
    out = run_tallow(["run", "smollm2:135m", QUESTION, "--image", str(picture)], home=default_home)
    assert out.returncode == 1
    err = out.stderr.decode()
    assert "smollm2:135m has no projector: it cannot take images" in err and "Traceback" not in err


def test_a_damaged_image_is_one_line_error(default_home, colour_projector, tmp_path):
    bad = tmp_path / "bad.png"
    bad.write_bytes(solid_png(tmp_path / "ok.png", (1, 2, 3)).read_bytes()[:40])
    out = run_tallow(["run", "smollm2:135m", QUESTION, "--image", str(bad), "--mmproj", str(colour_projector)],
                     home=default_home)
    assert out.returncode == 1
    err = out.stderr.decode()
    assert err.startswith(f"error: the image {bad} ") and "Traceback" not in err


def test_a_second_question_about_the_same_image_reuses_its_cells(vision_engine, tmp_path):
    red = _image(tmp_path, (255, 0, 0))
    first_req, first = _ask(vision_engine, [_image_message([red])])
    assert first.timings.media_ms > 0 and first.usage.media_tokens == 4
    span = first_req.media[0]
    history = [_image_message([red]), {"role": "assistant", "content": first.text},
               {"role": "user", "content": "Say it again."}]
    second_req, second = _ask(vision_engine, history)
    assert second_req.prompt_tokens[span.start:span.end] == first_req.prompt_tokens[span.start:span.end]
    assert second.usage.cached_tokens >= span.end  # the image's cells were reused ...
    assert second.timings.media_ms == 0  # ... so nothing was encoded again


def test_a_different_image_in_the_same_place_is_evaluated_again(vision_engine, tmp_path):
    _, red = _ask(vision_engine, [_image_message([_image(tmp_path, (255, 0, 0), "r.png")])])
    blue_req, blue = _ask(vision_engine, [_image_message([_image(tmp_path, (0, 0, 255), "b.png")])])
    assert blue.usage.cached_tokens <= blue_req.media[0].start
    assert "blue" in blue.text.lower() and "red" in red.text.lower()


def test_the_same_pixels_in_another_encoding_are_the_same_media(tmp_path):
    from PIL import Image

    from tallow.runtime.media import decode_image

    Image.new("RGB", (20, 10), (9, 80, 200)).save(tmp_path / "a.png")
    Image.new("RGB", (20, 10), (9, 80, 200)).save(tmp_path / "a.bmp")
    a, b = (decode_image((tmp_path / n).read_bytes()) for n in ("a.png", "a.bmp"))
    assert a.key == b.key and a.data == b.data


def test_a_synthetic_model_loads_a_projector_and_answers(synth_model, tmp_path):
    from tallow.runtime.engine import Engine
    from tallow.runtime.types import LoadSettings

    proj = write_colour_projector(tmp_path / "synth-mmproj.gguf", synth_model)
    with Engine(synth_model, LoadSettings(n_ctx=256, mmproj=proj)) as engine:
        req, final = _ask(engine, [_image_message([_image(tmp_path, (0, 255, 0))])])
    assert final.usage.media_tokens == 4 and final.usage.completion_tokens > 0
    assert all(t < 0 for t in req.prompt_tokens[req.media[0].start:req.media[0].end])


def test_a_projector_of_another_width_is_refused(default_model, tmp_path):
    from tallow.runtime.engine import Engine
    from tallow.runtime.errors import BackendError
    from tallow.runtime.types import LoadSettings

    proj = write_colour_projector(tmp_path / "wide-mmproj.gguf", default_model, n_embd=640)
    with pytest.raises(BackendError, match="could not load the projector"):
        Engine(default_model, LoadSettings(n_ctx=256, mmproj=proj))


def test_images_for_an_engine_without_a_projector_are_refused(synth_engine, tmp_path):
    with pytest.raises(MediaError, match="has no projector"):
        synth_engine.request([_image_message([_image(tmp_path, (1, 1, 1))])])


def test_the_scheduler_evaluates_images_beside_text_streams(default_model, colour_projector, tmp_path):
    from tallow.runtime.scheduling.scheduler import Scheduler
    from tallow.runtime.types import LoadSettings, Sampling, SchedulerSettings

    settings = SchedulerSettings(parallel=3)
    scheduler = Scheduler.load([default_model], LoadSettings(n_ctx=3 * 512, mmproj=colour_projector), settings)
    try:
        engine, greedy = scheduler.engine, Sampling(temperature=0.0)
        asks = [[_image_message([_image(tmp_path, (255, 0, 0), "r.png")])],
                [{"role": "user", "content": "Count from one to ten."}],
                [_image_message([_image(tmp_path, (0, 0, 255), "b.png")])]]
        handles = [scheduler.submit(engine.request(m, sampling=greedy, max_tokens=12)) for m in asks]
        red, text, blue = (h.result() for h in handles)
        again = scheduler.submit(engine.request(asks[0], sampling=greedy, max_tokens=12)).result()
    finally:
        scheduler.close()
    assert "red" in red.text.lower() and "blue" in blue.text.lower() and text.usage.media_tokens == 0
    assert red.usage.media_tokens == 4 and red.timings.media_ms > 0
    assert again.text == red.text and again.usage.cached_tokens > 4 and again.timings.media_ms == 0


def test_the_marker_as_text_is_refused():
    with pytest.raises(MediaError, match="media marker"):
        with_markers(f"say {MARKER}", [])


def test_chat_attaches_images_to_the_next_message_and_reuses_them(default_home, colour_projector, tmp_path):
    red, blue = solid_png(tmp_path / "red.png", (255, 0, 0)), solid_png(tmp_path / "blue.png", (0, 0, 255))
    script = (f"/image {red}\n{QUESTION}\nAnd again?\n/image {blue}\n{QUESTION}\n/image {tmp_path / 'none.png'}\n"
              "/bye\n").encode()
    out = run_tallow(["chat", "smollm2:135m", "--mmproj", str(colour_projector), "--temperature", "0",
                      "--max-tokens", "12", "--no-log", "--stats"], home=default_home, input=script)
    assert out.returncode == 0, out.stderr.decode()
    err = out.stderr.decode()
    assert err.count("image 64x64 attached to the next message") == 2
    assert "error: cannot read the image" in err
    stats = [line for line in err.splitlines() if line.startswith("prompt ")]
    assert len(stats) == 3 and "+ image 4 tok" in stats[0] and "+ image 8 tok" in stats[2]
    assert "image encode" in stats[0] and "image encode" not in stats[1]  # turn 2 reuses the image's cells
    answers = out.stdout.decode().lower()
    assert answers.index("red") < answers.rindex("blue")


def test_chat_without_a_projector_refuses_an_image(default_home, tmp_path):
    red = solid_png(tmp_path / "red.png", (255, 0, 0))
    out = run_tallow(["chat", "smollm2:135m", "--no-log"], home=default_home, input=f"/image {red}\n/bye\n".encode())
    assert out.returncode == 0
    assert "error: this model has no projector: it cannot take images" in out.stderr.decode()
