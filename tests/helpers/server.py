"""A real `tallow serve` process for a test, and a raw HTTP way to talk to it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import urllib.error
import urllib.request


class Server:
    """`tallow serve` in a child process on a free loopback port, its stderr kept."""

    def __init__(self, model, home, *args: str, env: dict | None = None) -> None:
        """`tallow serve MODEL` (no MODEL when None: every stored model on demand)."""
        env = {**os.environ, "TALLOW_HOME": str(home), "TALLOW_NO_LOG": "1", **(env or {})}
        env.pop("TALLOW_API_KEY", None)
        named = [] if model is None else [str(model)]
        self.proc = subprocess.Popen([sys.executable, "-m", "tallow.cli", "serve", *named, "--port", "0", *args],
                                     stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env, text=True)
        self.log: list[str] = []
        line = ""
        while "serving" not in line:
            line = self.proc.stderr.readline()
            self.log.append(line)
            if not line:
                raise AssertionError("tallow serve did not start:\n" + "".join(self.log))
        self.url = re.search(r"http://\S+", line).group(0)
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        for line in self.proc.stderr:
            self.log.append(line)

    def client(self, key: str = "none"):
        import openai

        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, timeout=120)

    def raw(self, path: str, body: bytes | None = None, headers: dict | None = None, method: str | None = None):
        """(status, headers, parsed JSON or text) without any client library in the way."""
        req = urllib.request.Request(self.url + path, data=body, headers=headers or {}, method=method)
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                status, hdrs, data = r.status, r.headers, r.read()
        except urllib.error.HTTPError as e:
            status, hdrs, data = e.code, e.headers, e.read()
        try:
            return status, hdrs, json.loads(data)
        except ValueError:
            return status, hdrs, data.decode()

    def health(self) -> dict:
        return self.raw("/health")[2]

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
