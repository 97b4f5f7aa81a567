"""Ctrl-C at any moment, native calls included (docs/DESIGN.md, "Interrupts").

CPython runs a Python signal handler only when the main thread executes bytecode. Inside
a long `llama_decode` the default KeyboardInterrupt therefore waits until the call returns
(seconds, for a big prefill chunk), and inside a ctypes callback that llama.cpp calls
(the log callback, the load's progress callback) it is raised in the callback, where
ctypes can only print "Exception ignored on calling ctypes callback" and carry on: the
load finishes and the answer is printed as if nothing happened.

So while the main thread is inside a native section:
- the Python handler records the interrupt instead of raising, and the section raises
  KeyboardInterrupt once the call has returned;
- a watcher thread reads the signal wakeup fd, which CPython's C-level handler writes at
  once whatever the main thread is doing, and raises `abort_flag`: llama.cpp's abort
  callback (checked between graph nodes) and the load's progress callback read it, so the
  native call itself stops early.

Outside native sections the watcher covers one more gap: readline's prompt waits in a bare
select() on the terminal, so a Ctrl-C that lands just before the main thread enters it (or
is taken by another thread) is recorded but not acted on until the next key. When the
Python handler has not run a short while after the signal, the watcher sends SIGINT to the
main thread again, which interrupts the select().

The abort callback is libc's `strlen` on a two-byte buffer: a callback written in C, so
llama.cpp may check it at every graph node for free, without taking the GIL. The buffer
holds "" (length 0: go on) or "\\x01" (length 1: abort), and a bool return reads the low
byte of that length.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import threading
import time
from contextlib import contextmanager
from typing import Any

_lock = threading.Lock()
_installed = False
_depth = 0  # native sections the main thread is inside
_pending = False  # an interrupt arrived during a native section
_previous: Any = signal.default_int_handler  # the handler before tallow's (a callable, SIG_IGN or SIG_DFL)
abort_flag = ctypes.create_string_buffer(2)  # b"" go on, b"\x01" abort
_handled_at = float("-inf")  # when the Python handler last ran (time.monotonic)
NUDGE_AFTER_S = 0.25  # a Ctrl-C not handled by then is sent to the main thread again


def _strlen_address() -> int | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
        return ctypes.cast(libc.strlen, ctypes.c_void_p).value
    except (OSError, AttributeError, TypeError):  # no C library to name (Windows): Python callbacks only
        return None


STRLEN = _strlen_address()


def requested() -> bool:
    """True while an interrupt asks the running native call to stop."""
    return abort_flag.raw[0] == 1


def _raise_flag() -> None:
    abort_flag.raw = b"\x01\x00"


def _on_sigint(signum, frame) -> None:
    global _pending, _handled_at
    _handled_at = time.monotonic()
    if _depth > 0:
        _pending = True
        _raise_flag()
        return
    if callable(_previous):
        _previous(signum, frame)
    else:
        raise KeyboardInterrupt


def _watch(fd: int) -> None:
    while True:
        try:
            data = os.read(fd, 64)
        except OSError:
            return
        if not data:
            return
        if signal.SIGINT in data:
            if _depth > 0:
                _raise_flag()
            else:
                threading.Timer(NUDGE_AFTER_S, _nudge, args=(time.monotonic(),)).start()


def _nudge(read_at: float) -> None:
    """Send SIGINT to the main thread again if its handler has not run since shortly
    before the watcher saw the signal (a signal the handler already took is not resent).
    Only while tallow's handler is the one installed: a server's (uvicorn's) own handler
    counts a second SIGINT as a demand to quit at once."""
    if _depth == 0 and _handled_at < read_at - NUDGE_AFTER_S and signal.getsignal(signal.SIGINT) is _on_sigint:
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)


def install() -> bool:
    """Take over SIGINT for native sections; only from the main thread (elsewhere, and
    when some other code already owns the wakeup fd, nothing changes). Idempotent."""
    global _installed, _previous
    if threading.current_thread() is not threading.main_thread():
        return False
    with _lock:
        if _installed:
            return True
        current = signal.getsignal(signal.SIGINT)
        if current in (signal.SIG_IGN, None):
            return False  # a parent asked us to ignore Ctrl-C: keep it that way
        r, w = os.pipe()
        try:
            os.set_blocking(w, False)
            old = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        except (OSError, ValueError):  # e.g. Windows, where the wakeup fd must be a socket
            os.close(r)
            os.close(w)
            return False
        if old != -1:  # an event loop owns it: give it back, do without the watcher
            signal.set_wakeup_fd(old)
            os.close(r)
            os.close(w)
        else:
            threading.Thread(target=_watch, args=(r,), name="tallow-interrupt", daemon=True).start()
        _previous = current
        signal.signal(signal.SIGINT, _on_sigint)
        _installed = True
        return True


@contextmanager
def native():
    """Run a native call that may take long or call back into Python: an interrupt during
    it stops it early and is raised as KeyboardInterrupt when it returns."""
    global _depth, _pending
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0 and _pending:
            _pending = False
            abort_flag.raw = b"\x00\x00"
            raise KeyboardInterrupt
        if _depth == 0:
            abort_flag.raw = b"\x00\x00"
