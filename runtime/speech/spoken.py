"""An audio language model as a recogniser: a model whose projector hears (Voxtral,
Qwen2-Audio, Ultravox, Gemma 3n and the other audio encoders libmtmd knows) transcribes
through `listen.transcribe` as Whisper does (docs/DESIGN.md, "Speech to text").

Each window (30 s: what Whisper-style audio encoders take at once) goes to the model with a
prompt that asks for the words spoken, or their English; its answer, reasoning set aside
(the engine splits it off), is the window's one segment. Such a model gives no timestamps
inside a window and no word times, and says no language unless it was told one.
"""

from __future__ import annotations

import hashlib
from typing import Any, Iterator

from tallow.runtime.errors import TallowError
from tallow.runtime.media import Media, with_markers
from tallow.runtime.protocol import final_of
from tallow.runtime.types import Sampling

ASK = {"transcribe": "Transcribe the speech in this audio. Write only the words spoken, nothing else.",
       "translate": "Translate the speech in this audio into English. Write only the English, nothing else."}
RATE = 16_000
WINDOW_S = 30.0  # what Whisper-style audio encoders take at once
MAX_TOKENS = 448  # an answer per window: Whisper's own limit, far more than 30 s of speech needs


def instruction(task: str, language: str | None, prompt: str | None) -> str:
    """What an audio language model is asked of a window: the words spoken (or their English),
    in a language if one was given, with the caller's vocabulary hints."""
    return ASK[task] + (f" The speech is in {language}." if language else "") + \
        (f" Words it may contain: {prompt}" if prompt else "")


def heat_of(temperature: float | tuple[float, ...]) -> float:
    """One temperature (Whisper takes a ladder of fallbacks; a language model, the first)."""
    return temperature if isinstance(temperature, float) else temperature[0]


def heard(answer: str, seconds: float, heat: float) -> tuple[Iterator[Any], dict[str, Any]]:
    """A window's answer as `Whisper.recognise` gives its result: one segment over the window."""
    from tallow.runtime.backend.whisper import Heard  # here: the server's front imports this module

    answer = answer.strip()
    segments = [Heard(0.0, seconds, " " + answer, (), 0.0, 0.0, 0.0, heat)] if answer else []
    return iter(segments), {"language": None, "language_probability": None}


def no_words() -> TallowError:
    return TallowError("word timestamps need a Whisper model: an audio language model gives none")


class AudioModel:
    """An engine with an audio projector, answering `Whisper.recognise`'s call."""

    window_s: float | None = WINDOW_S
    whole_windows = True  # one segment a window: its answer

    def __init__(self, engine, max_tokens: int = MAX_TOKENS) -> None:
        self.engine, self.max_tokens = engine, max_tokens

    def recognise(self, samples, *, language: str | None, task: str, prompt: str | None,
                  temperature: float | tuple[float, ...], vad: bool, words: bool = False
                  ) -> tuple[Iterator[Any], dict[str, Any]]:
        if words:
            raise no_words()
        data = samples.tobytes()
        clip = Media("audio", hashlib.sha256(b"audio %d:" % RATE + data).hexdigest()[:32], data, len(samples), 1, RATE)
        text, heat = instruction(task, language, prompt), heat_of(temperature)
        request = self.engine.request([{"role": "user", "content": with_markers(text, [clip]), "media": [clip]}],
                                      sampling=Sampling(temperature=heat), max_tokens=self.max_tokens)
        final = final_of(self.engine.stream(request))
        answer, info = heard(final.text, len(samples) / RATE, heat)
        return answer, {**info, "language": language}
