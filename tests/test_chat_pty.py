"""A real chat driven through a pseudo-terminal: turns, slash commands, Ctrl-C, and on."""

from __future__ import annotations

import os
import pty
import re
import select
import sys
import time


class Terminal:
    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        pid, fd = pty.fork()
        if pid == 0:  # the child: the pty is its controlling terminal, so ^C is SIGINT
            os.execve(sys.executable, [sys.executable, "-m", "tallow.cli", *args], env)
        self.pid, self.fd, self.buf, self.mark = pid, fd, b"", 0

    def read_until(self, pattern: str, timeout: float = 120) -> str:
        deadline = time.monotonic() + timeout
        regex = re.compile(pattern.encode())
        while not regex.search(self.buf, self.mark):
            left = deadline - time.monotonic()
            assert left > 0, f"timed out waiting for {pattern!r}; screen so far:\n{self.buf[self.mark:].decode(errors='replace')}"
            ready, _, _ = select.select([self.fd], [], [], min(left, 1.0))
            if ready:
                try:
                    self.buf += os.read(self.fd, 65536)
                except OSError:
                    break
        m = regex.search(self.buf, self.mark)
        assert m, f"{pattern!r} never appeared"
        seen, self.mark = self.buf[self.mark:m.end()].decode(errors="replace"), m.end()
        return seen

    def send(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def wait(self, timeout: float = 60) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
            try:
                if select.select([self.fd], [], [], 0.2)[0]:
                    self.buf += os.read(self.fd, 65536)
            except OSError:
                pass
        os.kill(self.pid, 9)
        raise AssertionError("the chat did not exit")


def test_chat_turns_commands_ctrl_c_and_on(default_home):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TALLOW_")}
    env.update(TALLOW_HOME=str(default_home), NO_COLOR="1", TERM="xterm")
    term = Terminal(["chat", "smollm2:135m", "--temperature", "0", "--max-tokens", "24"], env)
    term.read_until(r">>> ")
    term.send("Say hello.\r")
    first = term.read_until(r"TTFT.*\n(.|\n)*>>> ")
    assert "prompt" in first and "(0 cached)" in first

    term.send("half a line\x03")  # Ctrl-C at the prompt clears the line
    term.read_until(r">>> ")
    term.send("/stats\r")
    assert "turns 1" in term.read_until(r"turns \d+.*\n")
    term.send("/set max_tokens 2000\r")
    term.read_until(r"max_tokens = 2000")

    term.send('"""Write a very long essay\rabout the history of the oceans.\r"""\r')
    term.read_until(r"[A-Za-z]{3,}.{200,}")  # the answer is streaming
    term.send("\x03")
    interrupted = term.read_until(r"\[interrupted\](.|\n)*TTFT.*\n(.|\n)*>>> ")
    assert "interrupted" in interrupted

    term.send("Say goodbye.\r")
    last = term.read_until(r"TTFT.*\n(.|\n)*>>> ")
    cached = int(re.search(r"\((\d+) cached\)", last).group(1))
    assert cached > 0  # the earlier turns, the cut answer included, came from the KV cache
    term.send("/stats\r")
    assert "turns 3" in term.read_until(r"turns \d+.*\n")
    term.send("/bye\r")
    assert term.wait() == 0
