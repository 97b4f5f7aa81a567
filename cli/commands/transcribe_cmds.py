"""tallow transcribe: speech to text with a Whisper model, a file or many."""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Optional

import typer

from tallow.cli import options as o
from tallow.cli.render import err_console
from tallow.common.errors import TallowError
from tallow.runtime.speech.asked import ASKED

EXTENSIONS = {"text": "txt", "json": "json", "verbose_json": "json", "srt": "srt", "vtt": "vtt"}
MAX_STDIN = 2 * 1024 ** 3  # audio read from a pipe is held in memory (a container needs to seek)


def transcribe(
    files: list[str] = typer.Argument(..., help="Audio or video files: WAV, FLAC, MP3, Ogg, M4A, WebM... ('-': stdin).",
                                      show_default=False),
    model: str = typer.Option("whisper:base", "--model", "-m", help="A Whisper model, or a model whose projector hears (an audio encoder).",
                              autocompletion=o.complete_model),
    fmt: str = typer.Option("text", "--format", "-f", help="text, json, verbose_json, srt or vtt."),
    language: Optional[str] = typer.Option(None, ASKED["language"].flag, "-l", help=ASKED["language"].help, show_default=False),
    translate: bool = typer.Option(False, ASKED["translate"].flag, help=ASKED["translate"].help),
    prompt: Optional[str] = typer.Option(None, ASKED["prompt"].flag, help=ASKED["prompt"].help, show_default=False),
    temperature: Optional[float] = typer.Option(None, ASKED["temperature"].flag, min=ASKED["temperature"].low,
                                                max=ASKED["temperature"].high, help=ASKED["temperature"].help,
                                                show_default=False),
    word_timestamps: bool = typer.Option(False, ASKED["words"].flag, help=ASKED["words"].help),
    no_vad: bool = typer.Option(False, ASKED["vad"].flag, help=ASKED["vad"].help),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write one file per input into this folder (NAME.txt, .srt...); inputs already written are skipped, so a run resumes.", show_default=False),
    threads: o.Threads = None,
    offline: o.Offline = False,
) -> None:
    """Transcribe speech to text with a Whisper model.

    The text goes to stdout segment by segment as it is recognised (text, srt and vtt; json
    and verbose_json at the end), the language and the real-time factor to stderr. Audio of
    any length is read in windows, so memory holds a window, not the file.

    \b
    Examples:
      tallow transcribe meeting.m4a --format srt > meeting.srt
      tallow transcribe *.mp3 -o transcripts/ --language en
    """
    from tallow.runtime.speech.listen import Ask

    if fmt not in EXTENSIONS:
        raise typer.BadParameter(f"{fmt!r} is not one of {', '.join(EXTENSIONS)}", param_hint="--format")
    if word_timestamps and fmt != "verbose_json":
        raise typer.BadParameter("word timestamps are written in verbose_json only", param_hint="--word-timestamps")
    if files.count("-") > 1 or ("-" in files and output is not None and len(files) > 1):
        raise typer.BadParameter("stdin ('-') can be read once, and alone with --output", param_hint="FILES")
    if output is None and len(files) > 1:
        raise typer.BadParameter("several files need --output DIR (one transcript each)", param_hint="--output")
    whisper = _open(model, threads, offline)
    ask = Ask(language=language, translate=translate, prompt=prompt, temperature=temperature, words=word_timestamps,
              vad=not no_vad)
    failed = 0
    for name in files:
        try:
            _one(whisper, name, ask, fmt, output)
        except TallowError as exc:
            if output is None:
                raise
            failed += 1
            err_console().print(f"error: {name}: {exc.message}", soft_wrap=True, markup=False, highlight=False)
    if failed:
        raise typer.Exit(1)


def _open(model: str, threads: int | None, offline: bool):
    """A Whisper model, or a model whose projector hears (runtime/speech/spoken.py)."""
    from tallow.cli.models import find_model
    from tallow.runtime.host.threads import physical_cores

    local = find_model(model, offline)
    if local.kind == "whisper":
        from tallow.runtime.backend.whisper import Whisper

        return Whisper(local.path, threads or physical_cores())
    from tallow.runtime.opening import open_engine
    from tallow.runtime.speech.spoken import AudioModel

    # a model that generates text transcribes only when its projector has an audio encoder
    # (refused here, by with_projector, before anything loads)
    return AudioModel(open_engine(local, o.load_settings(None, threads, "auto", "auto"), None, "needed", {"audio"}))


def _one(whisper, name: str, ask, fmt: str, output: Path | None) -> None:
    from tallow.common.files import write_atomic
    from tallow.runtime.speech.listen import transcribe
    from tallow.runtime.speech.transcript import Transcript, document, head, piece, streams

    source = _source(name)
    shown = "stdin" if name == "-" else name
    target = None if output is None else output / f"{'stdin' if name == '-' else Path(name).stem}.{EXTENSIONS[fmt]}"
    if target is not None and target.exists():
        err_console().print(f"{shown}: {target} is there already, skipped", soft_wrap=True, markup=False)
        return
    heard = Transcript()
    live = target is None and streams(fmt)
    if live:
        sys.stdout.write(head(fmt))
    for seg in transcribe(whisper, source, shown, ask, heard):
        if live:
            sys.stdout.write(piece(fmt, seg, seg.id + 1))
            sys.stdout.flush()
    if target is not None:
        target.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(target, document(fmt, heard, ask.words).encode())
    elif not live:
        sys.stdout.write(document(fmt, heard, ask.words))
    rtf = heard.realtime_factor
    err_console().print(f"{shown}: {heard.duration:.1f} s of audio in {heard.elapsed:.1f} s"
                        f"{f' (real-time factor {rtf:.2f})' if rtf is not None else ''}, language {heard.language or 'not said'}"
                        f"{f' ({heard.language_probability:.2f})' if heard.language_probability is not None and not ask.language else ''}"
                        f"{f', written to {target}' if target else ''}", soft_wrap=True, markup=False, highlight=False)


def _source(name: str):
    if name == "-":
        data = sys.stdin.buffer.read(MAX_STDIN + 1)
        if len(data) > MAX_STDIN:
            raise TallowError("the audio on stdin is larger than 2 GiB", "give the file's path instead")
        return io.BytesIO(data)
    path = Path(name)
    if not path.is_file():
        raise TallowError(f"{name} does not exist" if not path.exists() else f"{name} is not a file")
    return path
