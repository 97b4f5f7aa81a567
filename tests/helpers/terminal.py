"""A program on a pseudo-terminal, as a person at a keyboard would drive it: send keys, read
the screen's byte stream until a pattern shows. Used by the chat, completion and newcomer
tests."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import struct
import sys
import termios
import time


class Terminal:
    def __init__(self, args: list[str], env: dict[str, str], *, program: str | None = None,
                 columns: int = 120, rows: int = 40, cwd: str | None = None) -> None:
        """Run `program` with `args` (by default: tallow, as `python -m tallow.cli ARGS`)."""
        argv = [program, *args] if program else [sys.executable, "-m", "tallow.cli", *args]
        pid, fd = pty.fork()
        if pid == 0:  # the child: the pty is its controlling terminal, so ^C is SIGINT
            try:
                signal.signal(signal.SIGINT, signal.SIG_DFL)  # not an ignored one inherited from a background job
                if cwd:
                    os.chdir(cwd)
                os.execve(argv[0], argv, env)
            finally:
                os._exit(127)
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
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
        assert m, f"{pattern!r} never appeared; screen:\n{self.buf[self.mark:].decode(errors='replace')}"
        seen, self.mark = self.buf[self.mark:m.end()].decode(errors="replace"), m.end()
        return seen

    def send(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def completed(self, typed: str, timeout: float = 60) -> str:
        """In an interactive shell: what Tab makes of `typed`. Ctrl-A (start of line) and Ctrl-E
        (end) then wrap the line in `echo OUT<n> ... END<n>` and Enter runs it, so the shell
        prints the completed line itself, free of the escapes it redraws lines with. Keys are
        read in order, so the completion has run before Ctrl-A is seen."""
        self._marks = getattr(self, "_marks", 0) + 1
        n = self._marks
        self.send(f"{typed}\t\x01echo OUT{n} \x05 END{n}\r")
        seen = plain(self.read_until(rf"(?<!echo )OUT{n} [^\n]*END{n}\r?\n", timeout=timeout))
        return re.findall(rf"(?<!echo )OUT{n} (.*?) *END{n}", seen)[-1].strip()

    def wait(self, timeout: float = 60) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self._drain()  # what it wrote just before exiting is still in the pty
                return os.waitstatus_to_exitcode(status)
            try:
                if select.select([self.fd], [], [], 0.2)[0]:
                    self.buf += os.read(self.fd, 65536)
            except OSError:
                pass
        self.kill()
        raise AssertionError("the program did not exit")

    def _drain(self) -> None:
        while True:
            try:
                if not select.select([self.fd], [], [], 0.2)[0]:
                    return
                chunk = os.read(self.fd, 65536)
            except OSError:  # EIO: the other side is closed and empty
                return
            if not chunk:
                return
            self.buf += chunk

    def kill(self) -> None:
        try:
            os.kill(self.pid, 9)
            os.waitpid(self.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


def plain(text: str) -> str:
    """The text without terminal escape sequences and carriage returns."""
    text = re.sub(r"\x1b\[[0-9;?=>]*[ -/]*[@-~]", "", text)
    text = re.sub(r"\x1b\][^\x07\x1b]*(\x07|\x1b\\)", "", text)
    text = re.sub(r"\x1b[()][0-9A-Za-z]|\x1b[=>78]", "", text)
    return text.replace("\r", "")
