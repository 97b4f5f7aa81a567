"""A list to choose from with the arrow keys, drawn on stderr: the search and pull pickers.

Up/Down (or k/j) move, Enter takes the marked row, Esc or q cancels, Ctrl-C interrupts as
anywhere else. Shown only when stdin and stderr are a terminal; callers check `can_pick`."""

from __future__ import annotations

import os
import select
import sys

UP, DOWN, ENTER, CANCEL = "up", "down", "enter", "cancel"
_KEYS = {b"\x1b[A": UP, b"\x1bOA": UP, b"k": UP, b"\x1b[B": DOWN, b"\x1bOB": DOWN, b"j": DOWN,
         b"\r": ENTER, b"\n": ENTER, b"\x1b": CANCEL, b"q": CANCEL}


def can_pick() -> bool:
    return sys.stdin.isatty() and sys.stderr.isatty()


def _key(fd: int) -> str | None:
    raw = os.read(fd, 1)
    if raw == b"\x03":
        raise KeyboardInterrupt
    if raw == b"\x1b":  # an arrow is ESC [ A; ESC alone is a cancel
        while select.select([fd], [], [], 0.05)[0]:
            raw += os.read(fd, 1)
            if len(raw) == 3:
                break
    if not raw:
        raise EOFError
    return _KEYS.get(raw)


def pick(title: str, rows: list[str], start: int = 0) -> int | None:
    """The index of the row chosen, or None when cancelled."""
    import termios
    import tty

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    at = max(0, min(start, len(rows) - 1))
    out = sys.stderr
    try:
        tty.setcbreak(fd, termios.TCSANOW)  # not TCSAFLUSH: a key typed ahead of the list is kept
        out.write(f"{title}  (up/down to move, Enter to pull, Esc to cancel)\n")
        while True:
            for i, row in enumerate(rows):
                out.write("\x1b[2K" + (f"\x1b[7m> {row}\x1b[0m" if i == at else f"  {row}") + "\n")
            out.flush()
            key = _key(fd)
            if key == ENTER:
                return at
            if key == CANCEL:
                return None
            if key in (UP, DOWN):
                at = (at + (1 if key == DOWN else -1)) % len(rows)
            out.write(f"\x1b[{len(rows)}A")  # back to the first row, to draw them again
    except EOFError:
        return None
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
