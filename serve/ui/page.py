"""The chat page's files: read once from the package, served with the headers that keep the
page to its own origin (docs/DESIGN.md, "The chat page").

Every file ships in the package (serve/ui/static/, vendored libraries included), so the page
needs nothing from the network. Each answer carries a Content-Security-Policy that allows
scripts, styles and connections to this origin only and no inline script, and headers that
stop other sites framing the page or sniffing a file's type.
"""

from __future__ import annotations

import gzip
import hashlib
from dataclasses import dataclass
from importlib import resources

from starlette.requests import Request as HTTPRequest
from starlette.responses import PlainTextResponse, Response

from tallow.serve.http.guard import PAGE_PREFIX

ASSETS = PAGE_PREFIX  # where the files are served (the page itself is GET /); open without a key
TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml", ".txt": "text/plain; charset=utf-8",
         ".md": "text/plain; charset=utf-8", ".png": "image/png"}
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
       "connect-src 'self'; font-src 'self'; manifest-src 'self'; base-uri 'none'; form-action 'none'; "
       "frame-ancestors 'none'")
SECURITY = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
            "X-Frame-Options": "DENY", "Cross-Origin-Opener-Policy": "same-origin",
            "Cross-Origin-Resource-Policy": "same-origin"}


@dataclass(frozen=True)
class Asset:
    body: bytes
    gzipped: bytes
    media_type: str
    etag: str


def load_assets() -> dict[str, Asset]:
    """Every file of the page by its path under static/ ('index.html', 'vendor/marked.esm.js')."""
    root = resources.files("tallow.serve.ui") / "static"
    found: dict[str, Asset] = {}

    def walk(folder, prefix: str) -> None:
        for entry in folder.iterdir():
            if entry.is_dir():
                walk(entry, f"{prefix}{entry.name}/")
            elif "." + entry.name.rsplit(".", 1)[-1] in TYPES:
                body = entry.read_bytes()
                found[prefix + entry.name] = Asset(body, gzip.compress(body, 9, mtime=0),
                                                   TYPES["." + entry.name.rsplit(".", 1)[-1]],
                                                   '"' + hashlib.sha256(body).hexdigest()[:20] + '"')
    walk(root, "")
    return found


def wants_html(request: HTTPRequest) -> bool:
    """A browser asks for HTML; Ollama's clients probing GET / send no such Accept."""
    return "text/html" in request.headers.get("accept", "")


class Page:
    """GET / (the page, or Ollama's liveness text) and GET /ui/assets/{path}."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.assets = load_assets() if enabled else {}

    def answer(self, name: str, request: HTTPRequest) -> Response:
        asset = self.assets.get(name)
        if asset is None:
            return PlainTextResponse("not found", 404, headers=SECURITY)
        headers = {**SECURITY, "ETag": asset.etag, "Cache-Control": "no-cache", "Vary": "Accept-Encoding"}
        if request.headers.get("if-none-match") == asset.etag:
            return Response(status_code=304, headers=headers)
        body = asset.body
        if "gzip" in request.headers.get("accept-encoding", "") and len(asset.gzipped) < len(body):
            body, headers["Content-Encoding"] = asset.gzipped, "gzip"
        return Response(body, headers=headers, media_type=asset.media_type)  # uvicorn sends no body to a HEAD

    async def root(self, request: HTTPRequest) -> Response:
        if not self.enabled or not wants_html(request):
            return PlainTextResponse("tallow is running")
        return self.answer("index.html", request)

    async def asset(self, request: HTTPRequest) -> Response:
        return self.answer(request.path_params["path"], request)
