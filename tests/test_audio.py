"""Audio in: WAV files read under limits (runtime/media/audio.py), resampled to a projector's rate,
and hostile files refused in one line."""

from __future__ import annotations

import io
import struct
import wave

import numpy as np
import pytest

from tallow.runtime.media import MediaError
from tallow.runtime.media.audio import decode_wav, resample


def wav(rate: int, samples: np.ndarray, bits: int = 16, channels: int = 1) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(bits // 8)
        w.setframerate(rate)
        frames = np.repeat(samples[:, None], channels, 1)
        if bits == 8:
            w.writeframes(np.round(frames * 127 + 128).astype(np.uint8).tobytes())
        elif bits == 24:
            ints = (frames * (2**23 - 1)).astype("<i4").reshape(-1)
            w.writeframes(b"".join(struct.pack("<i", int(v))[:3] for v in ints))
        else:
            w.writeframes((frames * (2 ** (bits - 1) - 1)).astype("<i2" if bits == 16 else "<i4").tobytes())
    return out.getvalue()


def float_wav(rate: int, samples: np.ndarray) -> bytes:
    data = samples.astype("<f4").tobytes()
    fmt = struct.pack("<HHIIHH", 3, 1, rate, rate * 4, 4, 32)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body


def tone(rate: int, hz: float, seconds: float = 1.0, amp: float = 0.5) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return amp * np.sin(2 * np.pi * hz * t)


def peak_hz(media) -> float:
    x = np.frombuffer(media.data, np.float32)
    spectrum = np.abs(np.fft.rfft(x))
    return float(np.fft.rfftfreq(x.size, 1 / media.rate)[np.argmax(spectrum)])


@pytest.mark.parametrize("bits", [8, 16, 24, 32])
def test_integer_samples_of_every_width_read_the_same(bits):
    m = decode_wav(wav(16000, tone(16000, 440), bits=bits, channels=2))
    x = np.frombuffer(m.data, np.float32)
    assert m.kind == "audio" and m.rate == 16000 and m.width == x.size == 16000
    assert np.allclose(x, tone(16000, 440), atol=0.01)


def test_float_samples_and_the_same_clip_is_the_same_key():
    a, b = decode_wav(float_wav(16000, tone(16000, 300))), decode_wav(wav(16000, tone(16000, 300), bits=32))
    assert np.allclose(np.frombuffer(a.data, np.float32), np.frombuffer(b.data, np.float32), atol=1e-6)
    assert decode_wav(float_wav(16000, tone(16000, 300))).key == a.key != decode_wav(float_wav(8000, tone(8000, 300))).key


@pytest.mark.parametrize("rate", [8000, 22050, 44100, 48000])
def test_resampling_keeps_the_tone_and_drops_what_the_new_rate_cannot_hold(rate):
    clip = tone(rate, 1000) + (tone(rate, 10000, amp=0.3) if rate > 20000 else 0)
    m = resample(decode_wav(wav(rate, clip)), 16000)
    x = np.frombuffer(m.data, np.float32)
    assert m.rate == 16000 and abs(x.size - 16000) <= 1
    assert abs(peak_hz(m) - 1000) < 2
    spectrum = np.abs(np.fft.rfft(x))
    freqs = np.fft.rfftfreq(x.size, 1 / 16000)
    assert spectrum[np.abs(freqs - 6000) < 50].max() < 0.01 * spectrum.max()  # 10 kHz would fold to 6 kHz
    assert 0.45 < np.abs(x[1000:-1000]).max() < 0.55


def _riff(*chunks: tuple[bytes, bytes], claimed: int | None = None) -> bytes:
    body = b"WAVE" + b"".join(cid + struct.pack("<I", len(data) if claimed is None or cid != b"data" else claimed) + data
                              for cid, data in chunks)
    return b"RIFF" + struct.pack("<I", len(body)) + body


PCM16 = struct.pack("<HHIIHH", 1, 1, 8000, 16000, 2, 16)


@pytest.mark.parametrize("raw,message", [
    (b"", "is empty"),
    (b"ID3\x03\x00" + b"\x00" * 64, "is not a WAV file"),
    (_riff((b"fmt ", PCM16), (b"data", b"\x00\x01" * 100), claimed=2_000_000), "claims 2,000,000 bytes of samples but holds 200"),
    (_riff((b"fmt ", struct.pack("<HHIIHH", 0x55, 1, 8000, 1000, 1, 0)), (b"data", b"\x00" * 10)), "compressed audio"),
    (_riff((b"fmt ", struct.pack("<HHIIHH", 1, 0, 8000, 0, 0, 16)), (b"data", b"")), "0 channels"),
    (_riff((b"fmt ", struct.pack("<HHIIHH", 1, 1, 8000, 12000, 2, 12)), (b"data", b"\x00" * 10)), "12-bit integer"),
    (_riff((b"fmt ", struct.pack("<HHIIHH", 1, 2, 8000, 16000, 2, 16)), (b"data", b"\x00" * 8)), "block size 2"),
    (_riff((b"data", b"\x00" * 8)), "no format chunk"),
    (_riff((b"fmt ", PCM16)), "no data chunk"),
    (_riff((b"fmt ", PCM16), (b"data", b"")), "holds no samples"),
])
def test_hostile_wav_files_are_one_line_errors(raw, message):
    with pytest.raises(MediaError, match=message) as exc:
        decode_wav(raw, "clip.wav")
    assert "\n" not in exc.value.message


def test_too_many_bytes_are_refused_before_parsing():
    with pytest.raises(MediaError, match="more than the limit of 1,000"):
        decode_wav(b"RIFF" + b"\x00" * 2000, max_bytes=1000)
