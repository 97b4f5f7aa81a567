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
from tallow.runtime import interrupt
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
