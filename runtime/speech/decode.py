"""Any audio a person has, decoded under limits into 16 kHz mono float32, a block at a time.

PyAV (FFmpeg's libraries, as faster-whisper itself uses) opens the container: WAV, FLAC,
MP3, Ogg/Opus and Vorbis, M4A/AAC, WebM, and the audio of a video file. Decoding is a
security boundary (hostile files, container bombs): the declared sample rate and channels
are checked before a sample is decoded, the duration counted as samples come out, and a
file past MAX_SECONDS stops with an error instead of filling memory or the afternoon. The
samples arrive as blocks, so a caller keeps only a window of them (runtime/speech/listen.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO, Iterator

import numpy as np

from tallow.runtime.media import MediaError

RATE = 16_000
MAX_SECONDS = 6 * 3600  # a long day of meetings; a longer file is refused as it decodes
MAX_RATE = 768_000  # no real recording has more samples a second (DXD is 352,800)
MAX_CHANNELS = 64


def _open(source: Path | BinaryIO, name: str):
    import av

    try:
        return av.open(source, mode="r", metadata_errors="ignore")
    except (av.error.FFmpegError, OSError, ValueError) as exc:
        raise MediaError(f"{name} cannot be read as audio: {_why(exc)}",
                         "give a WAV, FLAC, MP3, Ogg, M4A or WebM file") from None


def _why(exc: BaseException) -> str:
    """FFmpeg's own words for what went wrong (not its errno and file name)."""
    text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return text[0].lower() + text[1:] if text else type(exc).__name__


def blocks(source: Path | BinaryIO, name: str, max_seconds: float = MAX_SECONDS) -> Iterator[np.ndarray]:
    """The file's first audio stream as float32 blocks at 16 kHz, mono (channels averaged)."""
    import av

    container = _open(source, name)
    try:
        stream = next((s for s in container.streams if s.type == "audio"), None)
        if stream is None:
            raise MediaError(f"{name} has no audio in it")
        rate, channels = stream.codec_context.sample_rate or 0, stream.codec_context.channels or 0
        if not 0 < rate <= MAX_RATE or not 0 < channels <= MAX_CHANNELS:
            raise MediaError(f"{name} declares {rate:,} samples a second on {channels} channels, which no recording has",
                             "the file is damaged or made to mislead a decoder")
        resampler = av.AudioResampler(format="flt", layout="mono", rate=RATE)
        limit, seen = int(max_seconds * RATE), 0
        try:
            for frame in container.decode(stream):
                for out in resampler.resample(frame):
                    block = out.to_ndarray().reshape(-1).astype(np.float32, copy=False)
                    seen += len(block)
                    if seen > limit:
                        raise MediaError(f"{name} is longer than {max_seconds / 3600:g} hours",
                                         "split it, or give a shorter file")
                    yield block
            for out in resampler.resample(None):
                yield out.to_ndarray().reshape(-1).astype(np.float32, copy=False)
        except av.error.FFmpegError as exc:
            raise MediaError(f"{name} is damaged: {_why(exc)}") from None
        if seen == 0:
            raise MediaError(f"{name} holds no audio samples", "the file is empty or truncated")
    finally:
        container.close()


def whole(source: Path | BinaryIO, name: str, max_seconds: float = MAX_SECONDS) -> np.ndarray:
    """Every sample of a (short) file at once."""
    parts = list(blocks(source, name, max_seconds))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)
