"""Ctrl-C at readline's prompt is answered even when the main thread was not the one in
select() when it came (the signal landed just before, or another thread took it)."""

from __future__ import annotations

import sys

from helpers.terminal import Terminal

# The signal is run by a helper thread's own C handler (pthread_kill to itself), exactly what
# happens when SIGINT arrives as the main thread is about to enter readline's select(): the
# handler is recorded, the wakeup fd written, and the main thread's select() never sees EINTR.
PROGRAM = r"""
import readline, signal, threading, time
from tallow.runtime.host import interrupt
assert interrupt.install()
def elsewhere():
    time.sleep(1.0)
    signal.pthread_kill(threading.get_ident(), signal.SIGINT)
threading.Thread(target=elsewhere, daemon=True).start()
try:
    input("prompt> ")
    print("NO INTERRUPT")
except KeyboardInterrupt:
    print("INTERRUPTED")
"""


def test_a_ctrl_c_the_prompt_missed_is_delivered_to_the_main_thread():
    term = Terminal(["-c", PROGRAM], {"TERM": "xterm", "PATH": "/usr/bin:/bin"}, program=sys.executable)
    term.read_until(r"prompt> ")
    assert "INTERRUPTED" in term.read_until(r"INTERRUPTED|NO INTERRUPT", timeout=30)
    assert term.wait() == 0


# A server (uvicorn) installs its own SIGINT handler after tallow's and counts a second
# SIGINT as "quit now": the watcher must never resend one there.
REPLACED = r"""
import signal, threading, time
from tallow.runtime.host import interrupt
assert interrupt.install()
seen = []
signal.signal(signal.SIGINT, lambda *a: seen.append(1))
def elsewhere():
    time.sleep(0.5)
    signal.pthread_kill(threading.get_ident(), signal.SIGINT)
threading.Thread(target=elsewhere, daemon=True).start()
for _ in range(40):  # the main thread runs Python, so the handler runs at once
    time.sleep(0.05)
print("handled", len(seen))
"""


def test_no_signal_is_resent_once_another_handler_owns_sigint():
    import subprocess

    out = subprocess.run([sys.executable, "-c", REPLACED], capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr.decode()
    assert out.stdout.decode().split() == ["handled", "1"]
