"""A transcript's segments, and the shapes they are written in: OpenAI's response formats
(text, json, verbose_json, srt, vtt), the same from `tallow transcribe --format` and from
serve's /v1/audio routes."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

FORMATS = ("text", "json", "verbose_json", "srt", "vtt")

# verbose_json names the language as OpenAI does, in English words; Whisper's codes, by name
_NAMES = (
    "en english, zh chinese, de german, es spanish, ru russian, ko korean, fr french, ja japanese, pt portuguese, "
    "tr turkish, pl polish, ca catalan, nl dutch, ar arabic, sv swedish, it italian, id indonesian, hi hindi, "
    "fi finnish, vi vietnamese, he hebrew, uk ukrainian, el greek, ms malay, cs czech, ro romanian, da danish, "
    "hu hungarian, ta tamil, no norwegian, th thai, ur urdu, hr croatian, bg bulgarian, lt lithuanian, la latin, "
    "mi maori, ml malayalam, cy welsh, sk slovak, te telugu, fa persian, lv latvian, bn bengali, sr serbian, "
    "az azerbaijani, sl slovenian, kn kannada, et estonian, mk macedonian, br breton, eu basque, is icelandic, "
    "hy armenian, ne nepali, mn mongolian, bs bosnian, kk kazakh, sq albanian, sw swahili, gl galician, mr marathi, "
    "pa punjabi, si sinhala, km khmer, sn shona, yo yoruba, so somali, af afrikaans, oc occitan, ka georgian, "
    "be belarusian, tg tajik, sd sindhi, gu gujarati, am amharic, yi yiddish, lo lao, uz uzbek, fo faroese, "
    "ht haitian creole, ps pashto, tk turkmen, nn nynorsk, mt maltese, sa sanskrit, lb luxembourgish, my myanmar, "
    "bo tibetan, tl tagalog, mg malagasy, as assamese, tt tatar, haw hawaiian, ln lingala, ha hausa, ba bashkir, "
    "jw javanese, su sundanese, yue cantonese")
LANGUAGES = dict(pair.split(" ", 1) for pair in _NAMES.split(", "))


def language_name(code: str | None) -> str | None:
    """`en` -> `english` (a code Whisper does not list stays as it is)."""
    return LANGUAGES.get(code, code) if code else code


@dataclass(frozen=True)
class Word:
    start: float
    end: float
    word: str


@dataclass(frozen=True)
class Segment:
    """One recognised stretch of speech, its times in seconds from the start of the file."""

    id: int
    start: float
    end: float
    text: str
    tokens: tuple[int, ...] = ()
    temperature: float = 0.0
    avg_logprob: float = 0.0
    compression_ratio: float = 0.0
    no_speech_prob: float = 0.0
    words: tuple[Word, ...] = ()


@dataclass
class Transcript:
    """What was heard, filled in as it streams."""

    task: str = "transcribe"
    language: str | None = None
    language_probability: float | None = None
    duration: float = 0.0  # seconds of audio decoded
    segments: list[Segment] = field(default_factory=list)
    elapsed: float = 0.0  # seconds spent

    @property
    def text(self) -> str:
        return "".join(s.text for s in self.segments).strip()

    @property
    def realtime_factor(self) -> float | None:
        """Seconds spent per second of audio (below 1: faster than real time)."""
        return self.elapsed / self.duration if self.duration else None


def clock(seconds: float, comma: bool) -> str:
    """00:01:02,345 (SRT) or 00:01:02.345 (WebVTT)."""
    ms = max(0, round(seconds * 1000))
    h, rest = divmod(ms, 3_600_000)
    m, rest = divmod(rest, 60_000)
    s, ms = divmod(rest, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{',' if comma else '.'}{ms:03d}"


def head(fmt: str) -> str:
    """What a streamed file starts with, before any segment."""
    return "WEBVTT\n\n" if fmt == "vtt" else ""


def piece(fmt: str, seg: Segment, number: int) -> str:
    """One segment as a streamed text, SRT or WebVTT file writes it (`number` from 1)."""
    text = seg.text.strip()
    if fmt == "srt":
        return f"{number}\n{clock(seg.start, True)} --> {clock(seg.end, True)}\n{text}\n\n"
    if fmt == "vtt":
        return f"{clock(seg.start, False)} --> {clock(seg.end, False)}\n{text}\n\n"
    return text + "\n"


def streams(fmt: str) -> bool:
    """Whether a format is written segment by segment (JSON waits for the end)."""
    return fmt in ("text", "srt", "vtt")


def document(fmt: str, t: Transcript, words: bool = False) -> str:
    """The whole transcript in one format, as a file or a response body holds it."""
    if fmt == "text":
        return t.text + "\n"
    if fmt in ("srt", "vtt"):
        return head(fmt) + "".join(piece(fmt, s, i) for i, s in enumerate(t.segments, 1))
    import json

    return json.dumps(as_json(fmt, t, words), ensure_ascii=False) + "\n"


def as_json(fmt: str, t: Transcript, words: bool = False) -> dict[str, Any]:
    usage = {"type": "duration", "seconds": round(t.duration, 3)}
    if fmt == "json":
        return {"text": t.text, "usage": usage}
    out: dict[str, Any] = {"task": t.task, "language": language_name(t.language), "duration": round(t.duration, 3),
                           "text": t.text,
                           "segments": [_segment_json(s) for s in t.segments], "usage": usage}
    if words:
        out["words"] = [asdict(w) for s in t.segments for w in s.words]
    return out


def _segment_json(s: Segment) -> dict[str, Any]:
    return {"id": s.id, "seek": 0, "start": round(s.start, 3), "end": round(s.end, 3), "text": s.text,
            "tokens": list(s.tokens), "temperature": s.temperature, "avg_logprob": s.avg_logprob,
            "compression_ratio": s.compression_ratio, "no_speech_prob": s.no_speech_prob}
