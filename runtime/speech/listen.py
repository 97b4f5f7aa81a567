"""Recognising a whole file in windows, so memory holds a window and never the file.

The samples gather into a window of WINDOW_S seconds; Whisper recognises it; the segments
that end before the window's last MARGIN_S seconds are kept and the next window starts
where the first one not kept began (or MARGIN_S before the end when none was cut), so no
word is split between windows and the timestamps run on across them. The language found in
the first window holds for the rest, and each window is prompted with the end of the text
before it, as Whisper conditions on its previous text within a window.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Iterator, Protocol

import numpy as np

from tallow.runtime.speech.decode import RATE, blocks
from tallow.runtime.speech.transcript import Segment, Transcript, Word

WINDOW_S = 300.0
MARGIN_S = 10.0
PROMPT_TAIL = 200  # characters of the text before a window given as its prompt


@dataclass(frozen=True)
class Ask:
    """What a transcription request asks for (the CLI's flags, the API's form fields)."""

    language: str | None = None  # None: detected from the first window
    translate: bool = False  # into English
    prompt: str | None = None  # words to expect (names, jargon), as Whisper's initial prompt
    temperature: float | None = None  # None: Whisper's fallback from 0 up to 1 on a failed window
    words: bool = False  # word timestamps too
    vad: bool = True  # skip what the voice activity detector finds silent
    window_s: float = WINDOW_S


class Recogniser(Protocol):
    """What `transcribe` drives: Whisper (runtime/backend/whisper.py), or an audio language
    model in this process (spoken.AudioModel) or behind a runner (serve's RunnerEars)."""

    window_s: float | None  # the longest window it takes at once; None: any
    whole_windows: bool  # one segment a window, with no times inside: nothing to cut windows at

    def recognise(self, samples: np.ndarray, *, language: str | None, task: str, prompt: str | None,
                  temperature: float | tuple[float, ...], vad: bool, words: bool = False
                  ) -> tuple[Iterator[Any], dict[str, Any]]: ...


def transcribe(whisper: Recogniser, source: Path | BinaryIO, name: str, ask: Ask, out: Transcript) -> Iterator[Segment]:
    """The file's segments as they are recognised; `out` gathers them and the totals."""
    started = time.perf_counter()
    out.task = "translate" if ask.translate else "transcribe"
    language, prompt, t0, number = ask.language, ask.prompt, 0.0, 0
    pending: list[np.ndarray] = []
    held, more = 0, blocks(source, name)
    done, window_s = False, min(ask.window_s, whisper.window_s or ask.window_s)
    margin = 0.0 if whisper.whole_windows else MARGIN_S
    while True:
        while held < window_s * RATE and not done:
            block = next(more, None)
            if block is None:
                done = True
            else:
                pending.append(block)
                held += len(block)
                out.duration += len(block) / RATE
        if not held:
            break
        window = np.concatenate(pending)
        kept, cut = _recognise(whisper, window, ask, language, prompt, out, last=done, margin=margin)
        language = language or out.language
        for seg in kept:
            number += 1
            seg = Segment(number - 1, seg.start + t0, seg.end + t0, seg.text, seg.tokens, seg.temperature,
                          seg.avg_logprob, seg.compression_ratio, seg.no_speech_prob,
                          tuple(Word(w.start + t0, w.end + t0, w.word) for w in seg.words))
            out.segments.append(seg)
            out.elapsed = time.perf_counter() - started
            yield seg
        if done and cut >= len(window) / RATE:
            break
        rest = window[int(cut * RATE):]
        pending, held, t0 = [rest], len(rest), t0 + cut
        prompt = "".join(s.text for s in out.segments)[-PROMPT_TAIL:] or ask.prompt
    out.elapsed = time.perf_counter() - started


def _recognise(whisper: Recogniser, window: np.ndarray, ask: Ask, language: str | None, prompt: str | None, out: Transcript,
               last: bool, margin: float = MARGIN_S) -> tuple[list[Segment], float]:
    """One window's kept segments (times within it) and where the next window starts."""
    span = len(window) / RATE
    temperature = ask.temperature if ask.temperature is not None else (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
    heard, info = whisper.recognise(window, language=language, task=out.task, prompt=prompt, temperature=temperature,
                                    vad=ask.vad, words=ask.words)
    if out.language is None:
        out.language, out.language_probability = info["language"], info["language_probability"]
    kept: list[Segment] = []
    for h in heard:
        if not last and margin and h.end > span - margin:
            return kept, max(h.start, 0.5)  # (never stand still on a window)
        kept.append(Segment(0, h.start, h.end, h.text, h.tokens, h.temperature, h.avg_logprob, h.compression_ratio,
                            h.no_speech_prob, tuple(Word(*w) for w in h.words)))
    return kept, span if last else max(span - margin, 0.5)
