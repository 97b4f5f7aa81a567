"""Rich rendering on stderr: progress bars and the stats line. stdout carries only answers."""

from __future__ import annotations

import contextlib
import sys
from typing import Callable, Iterator

from rich.console import Console

from tallow.runtime.types import FinalEvent


def err_console() -> Console:
    # Rich already honours NO_COLOR and TERM=dumb and drops styling when not a terminal.
    return Console(stderr=True, highlight=False)


def stderr_is_terminal() -> bool:
    return sys.stderr.isatty()


@contextlib.contextmanager
def fetch_progress(title: str) -> Iterator[Callable[[str, int, int], None]]:
    """A progress bar on a terminal; a single status line otherwise."""
    console = err_console()
    if not console.is_terminal:
        console.print(f"fetching {title} ...")
        yield lambda phase, done, total: None
        return
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        tasks: dict[str, int] = {}

        def update(phase: str, done: int, total: int) -> None:
            if phase not in tasks:
                tasks[phase] = progress.add_task(f"{phase} {title}", total=total or None)
            progress.update(tasks[phase], completed=done, total=total or None)

        yield update


def stats_line(final: FinalEvent) -> str:
    u, t = final.usage, final.timings
    parts = [
        f"prompt {u.prompt_tokens} tok ({u.cached_tokens} cached)",
        f"TTFT {t.ttft_ms:.0f} ms",
        f"prefill {t.prefill_tps:.1f} tok/s",
        f"output {u.completion_tokens} tok",
        f"decode {t.decode_tps:.1f} tok/s",
        f"ITL p50 {t.itl_percentile(50):.1f} ms p95 {t.itl_percentile(95):.1f} ms",
        f"load {t.load_ms:.0f} ms",
    ]
    if final.finish_reason != "stop":
        parts.append(final.finish_reason)
    return " · ".join(parts)
