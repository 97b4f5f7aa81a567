"""Fetching a media URL for a request (serve --allow-media-urls): http and https only, under a
byte limit and one deadline for the whole fetch, redirects included. A server started offline
never builds a fetcher, so no request can make it open a socket.

Fetching for a client lets that client make the server request any address it can reach
(the server's own network included): the flag is off by default, and docs/serving.md says so.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from urllib.parse import urlsplit

from tallow.runtime.media import MAX_BYTES
from tallow.wire.fields import APIError

TIMEOUT_S = 10.0
_CHUNK = 64 * 1024


class _Redirects(urllib.request.HTTPRedirectHandler):
    """Follow a few redirects, to http(s) only."""

    max_redirections = 3

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        if urlsplit(newurl).scheme not in ("http", "https"):
            raise urllib.error.URLError(f"a redirect to {urlsplit(newurl).scheme}: is not followed")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def fetch_media(url: str, where: str, param: str, *, timeout_s: float = TIMEOUT_S, max_bytes: int = MAX_BYTES) -> bytes:
    """The bytes at an http(s) URL, or a 400 naming the field and what went wrong."""
    if urlsplit(url).scheme not in ("http", "https"):
        raise APIError(f"{where}: only http, https and data: URLs are taken", param=param)
    deadline = time.monotonic() + timeout_s
    opener = urllib.request.build_opener(_Redirects())
    request = urllib.request.Request(url, headers={"User-Agent": "tallow", "Accept": "image/*, audio/*"})
    try:
        with opener.open(request, timeout=timeout_s) as resp:
            length = resp.headers.get("Content-Length")
            if length and length.isdigit() and int(length) > max_bytes:
                raise APIError(f"{where}: {url} is {int(length):,} bytes, more than the {max_bytes:,} taken", param=param)
            body = bytearray()
            while chunk := resp.read(_CHUNK):
                body += chunk
                if len(body) > max_bytes:
                    raise APIError(f"{where}: {url} is more than the {max_bytes:,} bytes taken", param=param)
                if time.monotonic() > deadline:
                    raise APIError(f"{where}: fetching {url} took more than {timeout_s:g} s", param=param)
            return bytes(body)
    except urllib.error.HTTPError as exc:
        raise APIError(f"{where}: fetching {url} answered HTTP {exc.code}", param=param) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        if isinstance(reason, TimeoutError) or "timed out" in str(reason):
            raise APIError(f"{where}: fetching {url} took more than {timeout_s:g} s", param=param) from None
        raise APIError(f"{where}: cannot fetch {url} ({reason})", param=param) from None
