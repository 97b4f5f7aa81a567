"""Audio in a prompt: WAV files read under limits into mono float samples, and resampled to
the rate a projector takes.

Like images, audio is read by tallow before anything reaches libmtmd (whose bundled
decoders have no size limit): a RIFF parser that checks every chunk length against the
bytes there are, PCM (8, 16, 24 or 32 bits) or IEEE float (32 or 64 bits), any number of
channels averaged to one. A file is named by a hash of its samples and rate, so the same
clip reuses its KV cells as a picture does (docs/DESIGN.md, "Media").
"""

from __future__ import annotations

import hashlib
import struct

import numpy as np

from tallow.runtime.media import MAX_BYTES, Media, MediaError

MAX_SECONDS = 30 * 60
_PCM, _FLOAT, _EXTENSIBLE = 1, 3, 0xFFFE
_TAPS = 16  # each side of the resampling filter, in input samples at the lower rate


def _chunks(raw: bytes, name: str) -> dict[bytes, bytes]:
    """A RIFF/WAVE file's chunks by id (the first of each), every length checked."""
    if len(raw) < 12 or raw[:4] != b"RIFF" or raw[8:12] != b"WAVE":
        raise MediaError(f"{name} is not a WAV file", "give a .wav file (PCM or float samples)")
    out: dict[bytes, bytes] = {}
    pos = 12
    while pos + 8 <= len(raw):
        cid, size = raw[pos:pos + 4], struct.unpack_from("<I", raw, pos + 4)[0]
        body = raw[pos + 8:pos + 8 + size]
        if len(body) < size:
            if cid == b"data":
                raise MediaError(f"{name} claims {size:,} bytes of samples but holds {len(body):,}",
                                 "the file is truncated")
            raise MediaError(f"{name} is truncated (its {cid.decode('latin-1')!r} chunk is cut short)")
        out.setdefault(cid, body)
        pos += 8 + size + (size & 1)  # chunks are padded to an even length
    return out


def _format(fmt: bytes, name: str) -> tuple[int, int, int, int]:
    """(format tag, channels, rate, bits) from a fmt chunk."""
    if len(fmt) < 16:
        raise MediaError(f"{name} has no usable format chunk")
    tag, channels, rate, _, align, bits = struct.unpack_from("<HHIIHH", fmt)
    if tag == _EXTENSIBLE and len(fmt) >= 26:
        tag = struct.unpack_from("<H", fmt, 24)[0]  # the sub-format GUID starts with the tag
    if tag not in (_PCM, _FLOAT):
        raise MediaError(f"{name} holds compressed audio (format {tag:#06x})", "give PCM or float WAV samples")
    if not 1 <= channels <= 64 or not 1_000 <= rate <= 384_000:
        raise MediaError(f"{name} claims {channels} channels at {rate:,} Hz")
    if (tag == _PCM and bits not in (8, 16, 24, 32)) or (tag == _FLOAT and bits not in (32, 64)):
        raise MediaError(f"{name} has {bits}-bit {'float' if tag == _FLOAT else 'integer'} samples, which tallow does not read")
    if align != channels * bits // 8:
        raise MediaError(f"{name}: its block size {align} does not match {channels} channels of {bits} bits")
    return tag, channels, rate, bits


def _samples(data: bytes, tag: int, channels: int, bits: int) -> np.ndarray:
    frame = channels * bits // 8
    data = data[: len(data) // frame * frame]
    if tag == _FLOAT:
        values = np.frombuffer(data, "<f4" if bits == 32 else "<f8").astype(np.float32)
    elif bits == 8:
        values = (np.frombuffer(data, np.uint8).astype(np.float32) - 128.0) / 128.0
    elif bits == 24:
        b = np.frombuffer(data, np.uint8).reshape(-1, 3).astype(np.int32)
        values = (((b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)) ^ 0x800000) - 0x800000).astype(np.float32) / np.float32(2**23)
    else:
        values = np.frombuffer(data, "<i2" if bits == 16 else "<i4").astype(np.float32) / float(2 ** (bits - 1))
    mono = np.nan_to_num(values.reshape(-1, channels).mean(axis=1), nan=0.0, posinf=1.0, neginf=-1.0)
    return np.clip(mono, -1.0, 1.0).astype(np.float32)


def decode_wav(raw: bytes, name: str = "the audio", max_bytes: int = MAX_BYTES) -> Media:
    """A WAV file's bytes as mono float samples at its own rate, or a one-line MediaError."""
    if not raw:
        raise MediaError(f"{name} is empty")
    if len(raw) > max_bytes:
        raise MediaError(f"{name} is {len(raw):,} bytes, more than the limit of {max_bytes:,}")
    chunks = _chunks(raw, name)
    if b"fmt " not in chunks or b"data" not in chunks:
        raise MediaError(f"{name} has no {'format' if b'fmt ' not in chunks else 'data'} chunk")
    tag, channels, rate, bits = _format(chunks[b"fmt "], name)
    samples = _samples(chunks[b"data"], tag, channels, bits)
    if samples.size == 0:
        raise MediaError(f"{name} holds no samples")
    if samples.size > MAX_SECONDS * rate:
        raise MediaError(f"{name} is {samples.size / rate / 60:.0f} minutes long, more than the {MAX_SECONDS // 60} taken")
    data = samples.tobytes()
    key = hashlib.sha256(b"audio %d:" % rate + data).hexdigest()[:32]
    return Media("audio", key, data, samples.size, 1, rate)


FORMATS = ("wav", "mp3", "flac", "ogg", "opus", "m4a", "aac", "webm")  # what input_audio's format may name


def decode_audio(raw: bytes, name: str = "the audio", max_bytes: int = MAX_BYTES) -> Media:
    """Audio of any format as mono float samples: WAV read here, every other container
    decoded by PyAV (runtime/speech/decode.py, the speech extra) at 16 kHz, under the same
    limits."""
    if raw[:4] == b"RIFF" and raw[8:12] == b"WAVE" or not raw:
        return decode_wav(raw, name, max_bytes)
    if len(raw) > max_bytes:
        raise MediaError(f"{name} is {len(raw):,} bytes, more than the limit of {max_bytes:,}")
    import io

    from tallow.runtime.speech.decode import RATE, whole  # imports PyAV only when it decodes

    try:
        samples = whole(io.BytesIO(raw), name, MAX_SECONDS)
    except ImportError:
        raise MediaError(f"{name} is not a WAV file, and reading other formats needs PyAV",
                         'pip install "tallow[speech]", or give a WAV file') from None
    data = samples.tobytes()
    key = hashlib.sha256(b"audio %d:" % RATE + data).hexdigest()[:32]
    return Media("audio", key, data, samples.size, 1, RATE)


def wav_bytes(samples: np.ndarray, rate: int) -> bytes:
    """Mono samples as a 32-bit float WAV file (what `decode_wav` reads back unchanged)."""
    data = np.asarray(samples, "<f4").tobytes()
    fmt = struct.pack("<HHIIHH", _FLOAT, 1, rate, rate * 4, 4, 32)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body


def resample(media: Media, rate: int) -> Media:
    """Audio at `rate` samples a second (a windowed-sinc filter, cut off below the lower
    rate's Nyquist frequency); the key stays the clip's."""
    if media.rate == rate:
        return media
    x = np.frombuffer(media.data, np.float32).astype(np.float64)
    ratio = rate / media.rate
    n_out = max(1, int(round(x.size * ratio)))
    cutoff = min(1.0, ratio)  # as a fraction of the input's Nyquist frequency
    half = int(np.ceil(_TAPS / cutoff))
    padded = np.concatenate([np.zeros(half), x, np.zeros(half + 1)])
    out = np.empty(n_out)
    step = 4096
    offsets = np.arange(-half, half + 1)
    for start in range(0, n_out, step):
        t = np.arange(start, min(n_out, start + step)) / ratio  # positions in input samples
        base = np.floor(t).astype(np.int64)
        idx = base[:, None] + offsets[None, :]
        d = t[:, None] - idx
        window = 0.5 + 0.5 * np.cos(np.pi * np.clip(d / (half + 1), -1, 1))
        out[start:start + len(t)] = (padded[idx + half] * cutoff * np.sinc(cutoff * d) * window).sum(axis=1)
    samples = np.clip(out, -1.0, 1.0).astype(np.float32)
    return Media("audio", media.key, samples.tobytes(), samples.size, 1, rate)
