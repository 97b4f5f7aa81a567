"""Whisper through faster-whisper (CTranslate2): the only module that imports it, as the rest
of runtime/backend/ is the only code that touches llama.cpp.

Why faster-whisper: a Whisper model people can get offline is on the package index in its
format (CTranslate2), it runs int8 on the CPU with the threads it is given, it bundles
Silero's voice activity detector (silence is skipped, not decoded), and it takes samples as
a numpy array, so tallow decodes any container itself and feeds it window by window. It is
an optional extra (`pip install "tallow[speech]"`): ctranslate2 and onnxruntime are about
60 MB that a text-only user does not need.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from tallow.runtime.errors import TallowError

SAMPLE_RATE = 16_000  # what Whisper's feature extractor takes


@dataclass(frozen=True)
class Heard:
    """One recognised segment, its times in seconds from the start of the samples given."""

    start: float
    end: float
    text: str
    tokens: tuple[int, ...]
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float
    temperature: float
    words: tuple[tuple[float, float, str], ...] = ()  # (start, end, word), when asked for


def missing_extra() -> TallowError:
    return TallowError("speech to text needs faster-whisper, which is not installed",
                       'pip install "tallow[speech]"')


class Whisper:
    """A loaded Whisper model (a CTranslate2 folder), on the CPU."""

    window_s: float | None = None  # any window: it finds the segments in it, with their times
    whole_windows = False

    def __init__(self, folder: Path, threads: int, compute_type: str = "int8") -> None:
        try:
            from faster_whisper import WhisperModel
        except ImportError:
            raise missing_extra() from None
        try:  # a local folder: faster-whisper opens no connection for it
            self.model = WhisperModel(str(folder), device="cpu", compute_type=compute_type, cpu_threads=threads,
                                      local_files_only=True)
        except (RuntimeError, ValueError, OSError) as exc:
            raise TallowError(f"the Whisper model in {folder} could not be loaded: {exc}") from exc
        self.multilingual = bool(self.model.model.is_multilingual)

    def recognise(self, samples, *, language: str | None, task: str, prompt: str | None,
                  temperature: float | tuple[float, ...], vad: bool, words: bool = False
                  ) -> tuple[Iterator[Heard], dict[str, Any]]:
        """Segments of `samples` (16 kHz mono float32) as they are recognised, and what was
        detected: {"language", "language_probability"}."""
        try:
            segments, info = self.model.transcribe(samples, language=language, task=task, initial_prompt=prompt or None,
                                                   temperature=temperature, vad_filter=vad, beam_size=5,
                                                   word_timestamps=words)
        except ValueError as exc:  # e.g. a language code Whisper does not know
            raise TallowError(str(exc)) from exc
        heard = (Heard(s.start, s.end, s.text, tuple(s.tokens), s.avg_logprob, s.compression_ratio, s.no_speech_prob,
                       s.temperature, tuple((w.start, w.end, w.word) for w in s.words or ())) for s in segments)
        return heard, {"language": info.language, "language_probability": info.language_probability}

    def languages(self) -> list[str]:
        return list(self.model.supported_languages)
