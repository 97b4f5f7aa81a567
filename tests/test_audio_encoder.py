"""Audio through a real encoder: libmtmd's Whisper front end and a Voxtral-type projector whose
designed weights (tests/helpers/audio_projector.py) tell a low tone from a high one. The
default model, asked the colour question, says "red" for a 440 Hz tone and "blue" for a
3 kHz one, so the samples went all the way: WAV reader, resampler, mel spectrogram, encoder,
projector, the right cells."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from helpers.audio_projector import HIGH_HZ, LOW_HZ, tone_clip, write_tone_projector
from helpers.processes import run_tallow
from helpers.server import Server
from test_audio import wav

pytestmark = pytest.mark.slow
QUESTION = "What colour is this? Answer with one word."
MODEL = "hears"


@pytest.fixture(scope="module")
def audio_home(default_model, tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("audio-encoder")
    proj = write_tone_projector(folder / "mmproj-tone.gguf", default_model)
    home = folder / "home"
    r = run_tallow(["import", str(default_model), "--name", MODEL, "--link", "--mmproj", str(proj)], home=home)
    assert r.returncode == 0, r.stderr.decode()
    return home, folder


def _clip(folder: Path, hz: float, rate: int = 16000) -> Path:
    path = folder / f"tone-{int(hz)}-{rate}.wav"
    if not path.exists():
        path.write_bytes(wav(rate, tone_clip(hz, rate=rate)))
    return path


def _run(home: Path, clip: Path) -> dict:
    r = run_tallow(["run", MODEL, QUESTION, "--audio", str(clip), "--temperature", "0", "--max-tokens", "12",
                    "--json", "--no-cache"], home=home)
    assert r.returncode == 0, r.stderr.decode()
    return json.loads(r.stdout)


@pytest.mark.parametrize("hz,rate,colour,other", [(LOW_HZ, 16000, "red", "blue"), (HIGH_HZ, 16000, "blue", "red"),
                                                  (LOW_HZ, 44100, "red", "blue"), (HIGH_HZ, 8000, "blue", "red")])
def test_run_hears_the_pitch(audio_home, hz, rate, colour, other):
    """At the projector's 16 kHz and resampled to it from 44.1 and 8 kHz."""
    home, folder = audio_home
    data = _run(home, _clip(folder, hz, rate))
    text = data["text"].lower()
    assert colour in text and other not in text
    assert data["usage"]["audio_tokens"] == data["usage"]["media_tokens"] == 15
    assert data["timings"]["media_ms"] > 0


def test_the_api_hears_it_too_and_reuses_the_clip(audio_home):
    home, folder = audio_home
    expected = _run(home, _clip(folder, HIGH_HZ))["text"]
    data = base64.b64encode(_clip(folder, HIGH_HZ).read_bytes()).decode()
    messages = [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": data, "format": "wav"}},
                                             {"type": "text", "text": "\n" + QUESTION}]}]  # as run places it
    server = Server(MODEL, home, "--no-cache")
    try:
        client = server.client()
        first = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=12, messages=messages)
        again = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=12, messages=messages)
    finally:
        server.close()
    assert first.choices[0].message.content == expected
    assert again.choices[0].message.content == expected
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1  # the clip's included


def test_the_store_reads_the_audio_projectors_width_and_kind(audio_home, tmp_path, default_model):
    from tallow.models.projector import read_projector

    home, folder = audio_home
    facts = read_projector(folder / "mmproj-tone.gguf")
    assert (facts.types, facts.capabilities, facts.width) == (("voxtral",), ["audio"], 576)
    shown = run_tallow(["show", MODEL], home=home).stdout.decode()
    assert "audio" in shown and "voxtral" in shown
    narrow = write_tone_projector(tmp_path / "mmproj-narrow.gguf", default_model, n_embd=512)
    r = run_tallow(["import", str(default_model), "--name", "deaf", "--link", "--mmproj", str(narrow)], home=home)
    assert r.returncode == 1
    assert "mmproj-narrow.gguf gives embeddings 512 wide, but" in r.stderr.decode() and "takes 576" in r.stderr.decode()


def test_chat_attaches_the_clip_to_the_next_message(audio_home):
    home, folder = audio_home
    script = f"/audio {_clip(folder, LOW_HZ)}\n{QUESTION}\n/bye\n".encode()
    r = run_tallow(["chat", MODEL, "--temperature", "0", "--max-tokens", "12", "--no-log", "--no-cache", "--stats"],
                   home=home, input=script)
    assert r.returncode == 0, r.stderr.decode()
    assert "red" in r.stdout.decode().lower() and "blue" not in r.stdout.decode().lower()
    assert "+ audio 15 tok" in r.stderr.decode()


def test_transcribe_hears_through_the_projector(audio_home):
    """tallow transcribe with a model whose projector hears: the clip reaches the model (the
    high tone says "blue"), as one segment over the whole window."""
    home, folder = audio_home
    r = run_tallow(["transcribe", str(_clip(folder, HIGH_HZ)), "--model", MODEL, "--format", "verbose_json"], home=home)
    assert r.returncode == 0, r.stderr.decode()
    data = json.loads(r.stdout)
    assert "blue" in data["text"].lower() and "red" not in data["text"].lower()
    assert [(s["start"], s["end"]) for s in data["segments"]] == [(0.0, data["duration"])]
    assert data["language"] is None and "language not said" in r.stderr.decode()
    words = run_tallow(["transcribe", str(_clip(folder, HIGH_HZ)), "--model", MODEL, "--format", "verbose_json",
                        "--word-timestamps"], home=home)
    assert words.returncode == 1 and "word timestamps need a Whisper model" in words.stderr.decode()


def test_the_transcriptions_route_hears_through_the_models_runner(audio_home):
    """/v1/audio/transcriptions with a model whose projector hears: the window goes to its
    runner with the transcription prompt (the high tone says "blue"), streamed or not; a
    model that cannot hear is a 400 naming it."""
    import openai

    home, folder = audio_home
    expected = run_tallow(["transcribe", str(_clip(folder, HIGH_HZ)), "--model", MODEL, "--temperature", "0"],
                          home=home).stdout.decode().strip()
    assert "blue" in expected.lower()
    server = Server(MODEL, home, "--no-cache")
    try:
        client = server.client()
        with open(_clip(folder, HIGH_HZ), "rb") as f:
            heard = client.audio.transcriptions.create(model=MODEL, file=f, temperature=0)
        # the same prompt and clip as transcribe's; 448 tokens of a tiny model's repetition may
        # part late on a near-tie between the two engines' batch shapes, so the head is compared
        assert heard.text[:100] == expected[:100] and "red" not in heard.text.lower()
        with open(_clip(folder, HIGH_HZ), "rb") as f:
            events = list(client.audio.transcriptions.create(model=MODEL, file=f, temperature=0, stream=True))
        assert events[-1].type == "transcript.text.done" and events[-1].text[:100] == expected[:100]
        assert "".join(e.delta for e in events[:-1]) == events[-1].text
        with open(_clip(folder, HIGH_HZ), "rb") as f, pytest.raises(openai.BadRequestError, match="word timestamps"):
            client.audio.transcriptions.create(model=MODEL, file=f, response_format="verbose_json",
                                               timestamp_granularities=["word"])
    finally:
        server.close()
