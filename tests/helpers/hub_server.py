"""A local HTTP server that answers the hub endpoints huggingface_hub calls.

It serves real GGUF bytes from files on disk, so the real client code runs:
  GET  /api/models?search=...&filter=gguf&sort=...   a search, with each repository's facts
  GET  /api/models/ORG/REPO/tree/REV?recursive=...   the file listing, with LFS sha256s
  GET  /ORG/REPO/resolve/REV/PATH                    the bytes, with Range support
Modes make it misbehave: cut a download halfway, serve bytes that differ from the
advertised sha256, demand a token (private), refuse as gated, or go slowly.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import re
import threading
import time
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse

from helpers.package_index import send_file


class FakeHub:
    def __init__(self) -> None:
        self.repos: dict[str, dict[str, Path]] = {}
        self.requests: list[tuple[str, str, dict]] = []
        self.ranges: list[int] = []  # where resumed downloads started
        self.bounded: list[tuple[int, int]] = []  # bounded range reads: (start, stop)
        self.mode = "ok"  # ok | cut | corrupt | private | gated | slow
        self.meta: dict[str, dict] = {}  # repo -> downloads, likes, lastModified, license (search answers)
        self.delay = 0.0  # seconds before each answer: a round trip to a far hub
        self.token = "hf_secret"
        self._sha: dict[Path, str] = {}
        self._facts: dict[Path, dict] = {}
        handler = self._handler()
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def add(self, repo: str, path: str, file: Path) -> None:
        self.repos.setdefault(repo, {})[path] = Path(file)

    def describe(self, repo: str, **facts) -> None:
        """A repository's facts for searches: downloads, likes, lastModified, license (and gguf, in
        place of the one read from its first GGUF)."""
        self.meta[repo] = facts

    def _gguf_facts(self, repo: str) -> dict:
        from tallow.models.gguf_file import read_gguf

        weights = sorted(p for p in self.repos[repo] if p.endswith(".gguf") and "mmproj" not in p)
        if not weights:
            return {}
        path = self.repos[repo][weights[0]]
        if path not in self._facts:  # the hub reads a repository's header once, not per search
            info = read_gguf(path)
            self._facts[path] = {"total": info.n_params, "architecture": info.architecture,
                                 "context_length": info.context_length}
        return self._facts[path]

    def search(self, query: dict) -> list[dict]:
        words = query.get("search", [""])[0].lower()
        wanted = [r for r in self.repos if words in r.lower()
                  and ("gguf" not in query.get("filter", []) or any(p.endswith(".gguf") for p in self.repos[r]))]
        key = query.get("sort", ["downloads"])[0]
        wanted.sort(key=lambda r: self.meta.get(r, {}).get(key, 0 if key != "lastModified" else ""), reverse=True)
        out = []
        for repo in wanted[: int(query.get("limit", ["1000"])[0])]:
            m = self.meta.get(repo, {})
            out.append({"id": repo, "_id": repo, "modelId": repo, "downloads": m.get("downloads", 0),
                        "likes": m.get("likes", 0), "lastModified": m.get("lastModified", "2026-01-01T00:00:00.000Z"),
                        "tags": ["gguf"] + ([f"license:{m['license']}"] if "license" in m else []),
                        "cardData": {"license": m["license"]} if "license" in m else {},
                        "gguf": m.get("gguf") or self._gguf_facts(repo)})
        return out

    def sha256(self, file: Path) -> str:
        if file not in self._sha:
            self._sha[file] = hashlib.sha256(file.read_bytes()).hexdigest()
        return self._sha[file]

    def downloads(self, path: str) -> int:
        """GETs of a file, not counting bounded range reads (a header read before a download)."""
        return sum(1 for method, p, headers in self.requests if method == "GET" and p.endswith("/" + path)
                   and "/resolve/" in p and not re.fullmatch(r"bytes=\d+-\d+", headers.get("Range", "")))

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _handler(self):
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _error(self, status: int, code: str) -> None:
                body = json.dumps({"error": code}).encode()
                self.send_response(status)
                self.send_header("X-Error-Code", code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":  # a body after a HEAD's headers would be read as the next answer
                    self.wfile.write(body)

            def _json(self, data) -> None:
                body = json.dumps(data).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _authorized(self) -> bool:
                if hub.mode == "private":
                    if self.headers.get("Authorization") != f"Bearer {hub.token}":
                        self._error(401, "RepoNotFound")
                        return False
                if hub.mode == "gated":
                    self._error(403, "GatedRepo")
                    return False
                return True

            def do_HEAD(self):
                self.do_GET(head=True)

            def do_GET(self, head: bool = False):
                url = urlparse(self.path)
                path = unquote(url.path)
                hub.requests.append(("HEAD" if head else "GET", path, dict(self.headers)))
                if hub.delay:
                    time.sleep(hub.delay)
                if path == "/api/models":
                    return self._json(hub.search(parse_qs(url.query)))
                if path.startswith("/api/models/"):
                    rest = path[len("/api/models/"):]
                    repo, _, tail = rest.partition("/tree/")
                    if repo not in hub.repos:
                        return self._error(404, "RepoNotFound")
                    if not self._authorized():
                        return
                    listing = [
                        {"type": "file", "path": p, "size": f.stat().st_size, "oid": "0" * 40,
                         "lfs": {"oid": hub.sha256(f), "size": f.stat().st_size, "pointerSize": 134}}
                        for p, f in hub.repos[repo].items()
                    ]
                    return self._json(listing)
                if "/resolve/" in path:
                    repo, _, tail = path.lstrip("/").partition("/resolve/")
                    file_path = tail.partition("/")[2]
                    if repo not in hub.repos or file_path not in hub.repos[repo]:
                        return self._error(404, "EntryNotFound" if repo in hub.repos else "RepoNotFound")
                    if not self._authorized():
                        return
                    file = hub.repos[repo][file_path]
                    if hub.mode == "corrupt":
                        bad = file.with_suffix(".corrupt")
                        data = bytearray(file.read_bytes())
                        data[len(data) // 2] ^= 0xFF
                        bad.write_bytes(bytes(data))
                        file = bad
                    header_read = bool(re.fullmatch(r"bytes=\d+-\d+", self.headers.get("Range", "")))
                    cut = hub.mode == "cut" and not header_read
                    state = {"mode": "truncate" if cut else "ok", "ranges": hub.ranges, "bounded": hub.bounded,
                             "delay": 0.05 if hub.mode == "slow" else 0}
                    if cut:
                        hub.mode = "ok"  # only the first download is cut
                    send_file(self, file, state, head=head)
                    return
                self._error(404, "RepoNotFound")

        return Handler
