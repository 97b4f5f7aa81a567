"""What a transcription may be asked, declared once (`ASKED`): `tallow transcribe`'s flags and
serve's audio routes' form fields derive their names, help and ranges from here, and a value
is checked here. Light on purpose (no numpy): the CLI reads it at start-up.
"""

from __future__ import annotations

from dataclasses import dataclass

from tallow.runtime.errors import TallowError


@dataclass(frozen=True)
class Asked:
    """One thing a transcription may be asked, declared once: `tallow transcribe`'s flag and the
    audio routes' form field (None where the route says it otherwise) derive from here."""

    name: str  # Ask's field
    flag: str
    form: str | None
    help: str
    low: float | None = None
    high: float | None = None

    def check(self, value: float) -> float:
        """A number in this field's range, or a TallowError saying the range."""
        if self.low is not None and self.high is not None and not self.low <= value <= self.high:
            raise TallowError(f"'{self.form or self.flag}' must be a number from {self.low:g} to {self.high:g}")
        return value


ASKED = {a.name: a for a in (
    Asked("language", "--language", "language", "The language spoken, as a code (en, de, ja) [default: detected]."),
    Asked("translate", "--translate", None, "Write the speech in English, whatever the language spoken "
          "(the API: /v1/audio/translations)."),
    Asked("prompt", "--prompt", "prompt", "Words to expect: names, jargon, spelling (Whisper's initial prompt)."),
    Asked("temperature", "--temperature", "temperature",
          "Sampling temperature [default: 0, raised on a window that fails].", 0.0, 1.0),
    Asked("words", "--word-timestamps", "timestamp_granularities[]",
          "With verbose_json: each word's start and end too (the API: timestamp_granularities[] word)."),
    Asked("vad", "--no-vad", None, "Recognise silence too (by default a voice detector skips it; the API always skips it)."),
)}
