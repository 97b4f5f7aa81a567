"""Video in (runtime/media/video.py): frames sampled from a clip, each an image with its time,
thinned to fit the context, through run, chat and the API.

The clips show one solid colour a second, and the designed colour projector of
tests/helpers/projector.py turns each frame into its colour's word: the model naming the
colour, and the media cells counted, prove which frames reached it.
"""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
from helpers.processes import run_tallow
from helpers.projector import write_colour_projector
from helpers.video import write_clip

from tallow.runtime.media import MediaError, with_markers, without_media
from tallow.runtime.media.video import MAX_FRAMES, clock, decode_video

pytest.importorskip("av")
RED, GREEN, BLUE = (255, 0, 0), (0, 255, 0), (0, 0, 255)
QUESTION = "What colour is this video? Answer with one word."


def _centre(frame) -> tuple[int, ...]:
    return tuple(int(v) for v in np.frombuffer(frame.data, np.uint8).reshape(frame.height, frame.width, 3)[14, 14])


@pytest.mark.parametrize("suffix,codec", [("mp4", "mpeg4"), ("webm", "libvpx"), ("mkv", "mpeg4")])
def test_frames_are_taken_once_a_second_with_their_time(tmp_path, suffix, codec):
    clip = write_clip(tmp_path / f"c.{suffix}", [RED, GREEN, BLUE], codec=codec)
    frames, note = decode_video(clip.read_bytes(), "the clip")
    assert note is None
    assert [f.label for f in frames] == ["[frame at 0:00]", "[frame at 0:01]", "[frame at 0:02]"]
    for frame, rgb in zip(frames, (RED, GREEN, BLUE)):
        assert frame.kind == "image" and (frame.width, frame.height) == (28, 28)
        assert all(abs(a - b) < 8 for a, b in zip(_centre(frame), rgb))


def test_the_frame_rate_chooses_how_many_frames_and_the_same_pixels_share_a_key(tmp_path):
    clip = write_clip(tmp_path / "c.mp4", [RED, GREEN], rate=4)
    frames, _ = decode_video(clip.read_bytes(), "the clip", fps=2)
    assert [f.label for f in frames] == ["[frame at 0:00]", "[frame at 0:00.5]", "[frame at 0:01]", "[frame at 0:01.5]"]
    assert frames[0].key == frames[1].key != frames[2].key  # a still scene is one picture to the cache
    again, _ = decode_video(clip.read_bytes(), "the clip", fps=2)
    assert [f.key for f in again] == [f.key for f in frames]


def test_a_long_clip_is_spread_over_the_frame_limit_and_says_so(tmp_path):
    clip = write_clip(tmp_path / "long.mp4", [RED] * 100 + [BLUE] * 100, rate=1, size=16)
    frames, note = decode_video(clip.read_bytes(), "the clip")
    assert len(frames) == MAX_FRAMES
    assert note is not None and "200 s long" in note and f"{MAX_FRAMES} frames taken" in note, note
    assert frames[-1].label >= "[frame at 3:1"  # the last frames come from the end of the clip


def test_labels_and_markers_go_together_and_are_dropped_together(tmp_path):
    frames, _ = decode_video(write_clip(tmp_path / "c.mp4", [RED, GREEN]).read_bytes(), "the clip")
    message = {"role": "user", "content": with_markers("what changes?", frames), "media": frames}
    assert message["content"].startswith("[frame at 0:00] <__media__>\n[frame at 0:01] <__media__>\n")
    assert without_media(message)["content"] == "what changes?"
    assert [clock(t) for t in (0, 5.5, 65, 3725)] == ["0:00", "0:05.5", "1:05", "1:02:05"]


def _bad_clips(tmp_path):
    from helpers.speech import write_wav

    good = write_clip(tmp_path / "good.mp4", [RED, GREEN]).read_bytes()
    wav = write_wav(tmp_path / "tone.wav", np.zeros(1600, np.float32), 16000).read_bytes()
    return {"empty": (b"", "is empty"), "garbage": (b"\x00garbage" * 200, "is not a video tallow can read"),
            "cut short": (good[: len(good) // 3], "video"), "sound only": (wav, "has no video stream")}


def test_hostile_and_broken_clips_are_refused_in_one_line(tmp_path):
    for what, (raw, message) in _bad_clips(tmp_path).items():
        with pytest.raises(MediaError, match=message) as caught:
            decode_video(raw, "the clip")
        assert "\n" not in caught.value.message, what
    with pytest.raises(MediaError, match="frame rate"):
        decode_video(write_clip(tmp_path / "c.mp4", [RED]).read_bytes(), "the clip", fps=0)
    with pytest.raises(MediaError, match="more than the limit"):
        decode_video(b"x" * 100, "the clip", max_bytes=10)


def _sparse(path, gap_s: int):
    """Two frames `gap_s` seconds apart: a clip that claims hours and holds almost nothing."""
    import fractions

    import av

    with av.open(str(path), "w") as out:
        stream = out.add_stream("mpeg4", rate=1)
        stream.width = stream.height = 16
        stream.pix_fmt = "yuv420p"
        for t in (0, gap_s):
            frame = av.VideoFrame.from_ndarray(np.full((16, 16, 3), RED, np.uint8), format="rgb24")
            frame.pts, frame.time_base = t, fractions.Fraction(1, 1)
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return path


def test_a_clip_that_claims_hours_is_refused_or_costs_only_its_frames(tmp_path):
    with pytest.raises(MediaError, match="is 10.0 hours long, more than the 3 taken"):
        decode_video(_sparse(tmp_path / "ten.mp4", 36_000).read_bytes(), "the clip")
    frames, note = decode_video(_sparse(tmp_path / "two.mp4", 7_200).read_bytes(), "the clip")
    assert [f.label for f in frames] == ["[frame at 0:00]", "[frame at 2:00:00]"]
    assert note is not None and "2 frames taken" in note


def test_frames_too_large_are_refused_from_the_header(tmp_path):
    clip = write_clip(tmp_path / "huge.mp4", [RED], rate=1, size=6000)
    with pytest.raises(MediaError, match="6000x6000: outside 1 to"):
        decode_video(clip.read_bytes(), "the clip")


# -- through the model -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def colour_projector(default_model, tmp_path_factory):
    return write_colour_projector(tmp_path_factory.mktemp("mmproj") / "colour-mmproj.gguf", default_model)


def _ask(engine, frames, question=QUESTION):
    from tallow.runtime.types import Sampling

    request = engine.request([{"role": "user", "content": with_markers(question, frames), "media": frames}],
                             sampling=Sampling(temperature=0.0), max_tokens=12)
    *_, final = engine.stream(request)
    return request, final


@pytest.mark.slow
def test_frames_beyond_half_the_context_are_thinned_evenly_and_reused(default_model, colour_projector, tmp_path):
    import re

    from tallow.runtime.engine import Engine
    from tallow.runtime.media.spans import text_only
    from tallow.runtime.types import LoadSettings

    frames, _ = decode_video(write_clip(tmp_path / "c.mp4", [RED] * 20 + [BLUE] * 20, rate=1).read_bytes(), "the clip")
    assert len(frames) == 40
    with Engine(default_model, LoadSettings(n_ctx=2048, mmproj=colour_projector)) as engine:
        request, final = _ask(engine, frames)
        assert final.usage.media_tokens == 40 * 4 and request.notes == ()  # 28x28 pixels: 4 cells a frame
    with Engine(default_model, LoadSettings(n_ctx=256, mmproj=colour_projector)) as engine:
        request, final = _ask(engine, frames)
        assert len(request.notes) == 1 and "40 video frames would take" in request.notes[0], request.notes
        kept = int(re.search(r"(\d+) kept", request.notes[0]).group(1))
        assert 2 <= kept < 40 and final.usage.media_tokens == 4 * kept
        labels = re.findall(r"\[frame at [0-9:]+\]", engine.model.detokenize(text_only(request.prompt_tokens)).decode())
        assert labels[0] == "[frame at 0:00]" and labels[-1] == "[frame at 0:39]" and len(labels) == kept
        _, second = _ask(engine, frames, "And what colour is it? One word.")
        assert second.usage.cached_tokens >= 4 * kept  # thinned the same way: the frames' cells are reused


@pytest.mark.slow
def test_run_takes_a_video_and_names_its_colour(default_home, colour_projector, tmp_path):
    clip = write_clip(tmp_path / "red.webm", [RED, RED], codec="libvpx")
    out = run_tallow(["run", "smollm2:135m", QUESTION, "--video", str(clip), "--mmproj", str(colour_projector),
                      "--video-fps", "2", "--temperature", "0", "--max-tokens", "12", "--json"], home=default_home)
    assert out.returncode == 0, out.stderr.decode()
    data = json.loads(out.stdout)
    assert "red" in data["text"].lower() and "blue" not in data["text"].lower()
    assert data["usage"]["media_tokens"] == 4 * 4  # two seconds at two frames a second, 4 cells each


@pytest.mark.slow
def test_run_refuses_a_broken_video_before_loading(default_home, tmp_path):
    bad = tmp_path / "bad.mp4"
    bad.write_bytes(b"\x00garbage" * 64)
    out = run_tallow(["run", "smollm2:135m", QUESTION, "--video", str(bad)], home=default_home)
    assert out.returncode == 1
    err = out.stderr.decode()
    assert f"the video {bad} is not a video tallow can read" in err and "Traceback" not in err


@pytest.mark.slow
def test_chat_attaches_a_videos_frames(default_home, colour_projector, tmp_path):
    clip = write_clip(tmp_path / "red.mp4", [RED] * 3)
    script = f"/video {clip} 0.5\n{QUESTION}\n/video {tmp_path / 'none.mp4'}\n/bye\n".encode()
    out = run_tallow(["chat", "smollm2:135m", "--mmproj", str(colour_projector), "--temperature", "0",
                      "--max-tokens", "12", "--no-log", "--stats"], home=default_home, input=script)
    assert out.returncode == 0, out.stderr.decode()
    err = out.stderr.decode()
    assert "2 frames attached to the next message" in err and "error: cannot read the video" in err
    assert "+ image 8 tok" in err
    assert "red" in out.stdout.decode().lower()


@pytest.mark.slow
def test_the_openai_client_sends_video_parts(default_home, default_model, tmp_path):
    import openai
    from helpers.server import Server

    proj = write_colour_projector(tmp_path / "colour-mmproj.gguf", default_model)
    green = base64.b64encode(write_clip(tmp_path / "g.mp4", [GREEN, GREEN]).read_bytes()).decode()
    server = Server("smollm2:135m", default_home, "--mmproj", str(proj))
    try:
        client = server.client()
        answer = client.chat.completions.create(model="smollm2:135m", temperature=0, max_tokens=12, messages=[
            {"role": "user", "content": [{"type": "video_url", "video_url": {"url": f"data:video/mp4;base64,{green}"}},
                                         {"type": "text", "text": QUESTION}]}])
        assert "green" in answer.choices[0].message.content.lower()
        assert answer.usage.prompt_tokens > 8
        reply = client.responses.create(model="smollm2:135m", temperature=0, max_output_tokens=12, input=[
            {"role": "user", "content": [{"type": "input_video", "video_url": f"data:video/mp4;base64,{green}", "fps": 0.5},
                                         {"type": "input_text", "text": QUESTION}]}])
        assert "green" in reply.output_text.lower()
        with pytest.raises(openai.BadRequestError, match=r"messages\[0\].content\[0\].video_url.fps"):
            client.chat.completions.create(model="smollm2:135m", max_tokens=4, messages=[
                {"role": "user", "content": [{"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA",
                                                                                  "fps": 100}}]}])
        with pytest.raises(openai.BadRequestError, match="is not a video tallow can read"):
            client.chat.completions.create(model="smollm2:135m", max_tokens=4, messages=[
                {"role": "user", "content": [{"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}}]}])
        assert "green" in client.chat.completions.create(model="smollm2:135m", temperature=0, max_tokens=12, messages=[
            {"role": "user", "content": [{"type": "video_url", "video_url": {"url": f"data:video/mp4;base64,{green}"}},
                                         {"type": "text", "text": QUESTION}]}]).choices[0].message.content.lower()
    finally:
        server.close()
