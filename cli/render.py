"""Rich rendering on stderr: progress bars and the stats line. stdout carries only answers."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import TYPE_CHECKING, Any, Callable, Iterator

if TYPE_CHECKING:  # rich is imported when something is rendered, not with every command
    from rich.console import Console

    from tallow.runtime.types import FinalEvent


def _plain() -> bool:
    """NO_COLOR or TERM=dumb: no ANSI codes at all (Rich's own NO_COLOR still emits dim and bold)."""
    return "NO_COLOR" in os.environ or os.environ.get("TERM") == "dumb"


def err_console() -> Console:
    from rich.console import Console

    # Rich drops styling by itself when the stream is not a terminal.
    if _plain():
        return Console(stderr=True, highlight=False, markup=False, color_system=None)
    return Console(stderr=True, highlight=False, markup=False)


def out_console() -> Console:
    """stdout; when it is not a terminal, never wrap or truncate what scripts will parse."""
    from rich.console import Console

    tty = sys.stdout.isatty()
    width = None if tty else 10_000
    if _plain():
        return Console(highlight=False, markup=False, soft_wrap=True, width=width, color_system=None)
    return Console(highlight=False, markup=False, soft_wrap=True, width=width)


def animated(console: Console) -> bool:
    """Progress bars and spinners only on a terminal that allows them (not under NO_COLOR
    or TERM=dumb, where the cursor movements they need would be escape codes in the text)."""
    return console.is_terminal and not _plain()


def stderr_is_terminal() -> bool:
    return sys.stderr.isatty()


@contextlib.contextmanager
def fetch_progress(title: str, verb: str = "pulling") -> Iterator[Callable[[str, int, int], None]]:
    """A progress bar per file on a terminal (bytes, speed, ETA); plain lines otherwise."""
    console = err_console()
    if not animated(console):
        started: set[str] = set()

        def line(label: str, done: int, total: int) -> None:
            if label not in started:
                started.add(label)
                size = f" ({total / 1e6:,.0f} MB)" if total else ""
                console.print(f"{verb} {title}: {label}{size}", soft_wrap=True)

        yield line
        return
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn
    from rich.table import Column

    # One line at any width: the name gives way (cut with an ellipsis) and the bar shrinks,
    # the figures never do; without this a long name wrapped the bar onto two lines.
    fixed = lambda: Column(no_wrap=True)  # noqa: E731
    columns = (TextColumn("{task.description}", table_column=Column(no_wrap=True, overflow="ellipsis", ratio=1)),
               BarColumn(bar_width=None, table_column=Column(ratio=1)), DownloadColumn(table_column=fixed()),
               TransferSpeedColumn(table_column=fixed()), TimeRemainingColumn(table_column=fixed()))
    with Progress(*columns, console=console, transient=True, expand=True) as progress:
        tasks: dict[str, Any] = {}  # label -> rich's task id

        def update(label: str, done: int, total: int) -> None:
            if label not in tasks:
                tasks[label] = progress.add_task(f"{title}: {label}", total=total or None)
            progress.update(tasks[label], completed=done, total=total or None)

        yield update


def human_bytes(n: int) -> str:
    """Decimal units, as in the fit estimates (one formatter for both)."""
    from tallow.models.memory import human

    return human(n)


def human_count(n: int | None) -> str:
    if not n:
        return "-"
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}".replace(".0", "")
    return str(n)


def stats_line(final: FinalEvent) -> str:
    u, t = final.usage, final.timings
    cached = "cached: not reported" if u.cached_tokens is None else \
        f"{u.cached_tokens} cached{' from disk' if u.cache_source == 'disk' else ''}"
    images = u.media_tokens - u.audio_tokens
    media = (f" + image {images} tok" if images else "") + (f" + audio {u.audio_tokens} tok" if u.audio_tokens else "")
    encode = "media" if images and u.audio_tokens else "audio" if u.audio_tokens else "image"
    parts = [
        f"prompt {(u.prompt_tokens or 0) - u.media_tokens} tok{media} ({cached})" if u.prompt_tokens is not None
        else f"prompt: not reported ({cached})",
        f"TTFT {t.ttft_ms:.0f} ms" + (f" ({encode} encode {t.media_ms:.1f} ms)" if t.media_ms else ""),
        f"prefill {t.prefill_tps:.1f} tok/s" if u.prompt_tokens is not None else "prefill: not reported",
        f"output {u.completion_tokens} tok",
        f"decode {t.decode_tps:.1f} tok/s",
        f"ITL p50 {t.itl_percentile(50):.1f} ms p95 {t.itl_percentile(95):.1f} ms",
        f"load {t.load_ms:.0f} ms" if final.source is None else f"via {final.source} (measured here)",
    ]
    if u.draft_tokens:
        by = "" if u.draft in (None, "lookup") else f" by {u.draft}"
        parts.append(f"draft{by} {u.accepted_tokens}/{u.draft_tokens} accepted ({u.acceptance:.0%}, "
                     f"{u.draft_length:.1f} a step)")
    if final.finish_reason != "stop":
        parts.append(final.finish_reason)
    return " · ".join(parts)


def emit_rows(rows: list[dict], output: str, table) -> None:
    """Result rows on stdout as json, jsonl, csv (every key any row has; lists as JSON), or
    through `table(rows, markdown)` for table and md (local and --endpoint bench alike)."""
    import csv
    import io
    import json

    out = sys.stdout
    if output == "json":
        out.write(json.dumps(rows, indent=1) + "\n")
    elif output == "jsonl":
        out.writelines(json.dumps(r) + "\n" for r in rows)
    elif output == "csv":
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=list(dict.fromkeys(k for r in rows for k in r)), extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: (json.dumps(v) if isinstance(v, list) else v) for k, v in r.items()})
        out.write(buf.getvalue())
    else:
        table(rows, markdown=output == "md")
